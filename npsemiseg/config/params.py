"""A configuration as flat parameters: ``{"optim.lr": "0.001", ...}`` (MLflow's params, the UI's columns).

The key set is the same for every cell, whatever its framework and head, so a compare view lines cells
up: ``framework_options.*`` lists the options of *every* framework, ``head.options.*`` those of every
head and ``data.augmentation.*`` every augmentation setting; each holds the cell's value, else the
default of the cell's framework / head / transform, else :data:`~npsemiseg.constants.NOT_APPLICABLE`.
Free-form dicts (``model.options``, ``data.options``) are as given. ``switches.<name>`` is each switch of
``npsemiseg.protocol`` (its value in the cell, ``n/a`` where it does not apply). ``inputs`` (how the record
was composed) is not a parameter: the run's ``config_provenance.json`` artifact holds it.
"""

from __future__ import annotations

import functools
import inspect
import json
from collections.abc import Iterator
from typing import Any

from npsemiseg.config.schema import RunConfig
from npsemiseg.constants import NOT_APPLICABLE
from npsemiseg.data.augmentation import TRANSFORM_DEFAULTS
from npsemiseg.frameworks import framework_names, framework_spec
from npsemiseg.heads import head_names, head_spec
from npsemiseg.protocol import SWITCH_PREFIX, switch_values


def config_params(config: RunConfig) -> dict[str, str]:
    """Every setting of ``config`` as ``{dotted key: string value}`` (strings as they are, the rest as JSON)."""
    data = config.model_dump(mode="json", exclude={"inputs"})
    data["framework_options"] = {**dict.fromkeys(_framework_option_keys(), NOT_APPLICABLE), **data["framework_options"]}
    data["head"]["options"] = {**_head_option_defaults(config.head.name), **data["head"]["options"]}
    data["data"]["augmentation"] = {**_augmentation_defaults(), **data["data"]["augmentation"]}
    data[SWITCH_PREFIX.rstrip(".")] = switches(config)
    return dict(_flatten("", data))


def switches(config: RunConfig) -> dict[str, Any]:
    """Every switch of ``npsemiseg.protocol`` -> its value in ``config`` (``n/a`` where it does not apply)."""
    return switch_values(config.model_dump(mode="json"))


def _flatten(prefix: str, value: Any) -> Iterator[tuple[str, str]]:
    if isinstance(value, dict) and value:
        for key, item in value.items():
            yield from _flatten(f"{prefix}.{key}" if prefix else str(key), item)
    else:
        yield prefix, value if isinstance(value, str) else json.dumps(value)


@functools.cache
def _framework_option_keys() -> tuple[str, ...]:
    """Every option name of every registered framework (sorted)."""
    return tuple(sorted({key for name in framework_names() for key in framework_spec(name).Options.model_fields}))


@functools.cache
def _head_option_defaults(name: str) -> dict[str, Any]:
    """Every option name of every registered head -> head ``name``'s default (JSON types), or ``NOT_APPLICABLE``."""
    keys = sorted({key for head in head_names() for key in head_spec(head).option_defaults()})
    own = {k: v for k, v in head_spec(name).option_defaults().items() if v is not inspect.Parameter.empty}
    return {key: _json_value(own[key]) if key in own else NOT_APPLICABLE for key in keys}


@functools.cache
def _augmentation_defaults() -> dict[str, Any]:
    """``train_transform``'s keywords besides the crop -> their defaults (JSON types)."""
    return {key: _json_value(value) for key, value in TRANSFORM_DEFAULTS.items()}


def _json_value(value: Any) -> Any:
    return json.loads(json.dumps(value))
