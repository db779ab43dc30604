"""Fields of a :class:`~npsemiseg.config.RunConfig` that depend on other fields, resolved once at validation.

The partition alias (``"1/16"`` -> ``"92"``), the dataset's evaluation convention, whether the model needs
the framework's representation head, the framework's augmentation pipeline and the labeled strong view;
the head's options are checked against the head class here (without building a head).
"""

from __future__ import annotations

import inspect
import json
import math
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from npsemiseg.data import dataset_info
from npsemiseg.data.info import DatasetInfo
from npsemiseg.data.transforms import paper_augmentation, train_transform
from npsemiseg.frameworks import framework_names, get_framework
from npsemiseg.heads import head_class, head_names
from npsemiseg.presets import dataset_family

#: ``flat()``'s value of an option that the cell's framework or head does not take
NOT_APPLICABLE = "n/a"


def resolved_values(config: Any) -> dict[str, Any]:
    """``config`` as JSON values with every dependent field resolved (``config`` is a validated RunConfig)."""
    info = dataset_info(config.dataset, **dict(config.data.options))
    if config.list_variant not in info.list_variants:
        raise ValueError(f"list_variant: {config.dataset} has lists {list(info.list_variants)}, got {config.list_variant!r}")
    values = config.model_dump(mode="json")
    values["partition"] = info.resolve_partition(config.partition)
    values["evaluation"].update(_evaluation(config.evaluation, info))
    if config.model.representation_head is None:
        values["model"]["representation_head"] = get_framework(config.framework).representation_head
    check_head_options(config.head.name, config.head.options)
    values["data"]["augmentation"] = _augmentation(config.framework, info, config.data.augmentation)
    if config.data.labeled_strong_view is None:
        # as the framework asks (PS-MT's ``strong_labeled`` option; no other framework uses it)
        values["data"]["labeled_strong_view"] = bool(config.framework_options.get("strong_labeled", False))
    return values


def _evaluation(evaluation: Any, info: DatasetInfo) -> dict[str, Any]:
    """Evaluation mode and crop from the dataset's convention when unset; stride ceil(2/3 x crop) when sliding."""
    mode = evaluation.mode or info.eval_mode
    crop = evaluation.crop_size or info.eval_crop_size
    stride = evaluation.stride
    if stride is None and mode in ("sliding", "sliding_global"):
        stride = math.ceil(crop * 2 / 3)
    elif stride is not None and mode in ("sliding", "sliding_global") and stride > crop:
        raise ValueError(f"evaluation.stride: expected at most evaluation.crop_size={crop} so windows cover the image, "
                         f"got {stride}")
    return {"mode": mode, "crop_size": crop, "stride": stride}


def check_head_options(name: str, options: Mapping[str, Any]) -> None:
    """``ValueError`` naming an unknown or invalid option of head ``name`` (checked on the class)."""
    try:
        head_class(name).check_options(options)
    except (TypeError, ValueError) as error:
        raise ValueError(f"head.options for head {name!r}: {error}") from None


def _augmentation(framework: str, info: DatasetInfo, given: Mapping[str, Any]) -> dict[str, Any]:
    """The training augmentation: the framework's paper pipeline updated with ``given``, checked
    against ``train_transform``'s keywords (unknown keys -> ValueError naming them).

    On synthetic data a long-side resize is relative to the synthetic image size, not VOC's 500 px.
    """
    allowed = set(inspect.signature(train_transform).parameters) - {"crop_size"}
    unknown = sorted(set(given) - allowed)
    if unknown:
        raise ValueError(f"data.augmentation: unknown key(s) {unknown}, expected some of {sorted(allowed)}")
    paper = paper_augmentation(get_framework(framework).augmentation, dataset_family(info.name))
    if info.synthetic and paper.get("base_size") is not None:
        size = info.options.get("image_size", 64)
        paper["base_size"] = int(max(size) if isinstance(size, (tuple, list)) else size)
    resolved = {**paper, **dict(given)}
    if "scale_range" in resolved and resolved["scale_range"] is not None:
        resolved["scale_range"] = [float(v) for v in resolved["scale_range"]]
    return resolved


# --------------------------------------------------------------------------- defaults for flat()
def framework_option_keys() -> tuple[str, ...]:
    """Every option name of every registered framework (sorted)."""
    return tuple(sorted({key for name in framework_names() for key in get_framework(name).Options.model_fields}))


def head_option_defaults(name: str) -> dict[str, Any]:
    """Every option name of every registered head -> head ``name``'s default (JSON types), or ``NOT_APPLICABLE``."""
    keys = sorted({key for head in head_names() for key in head_class(head).option_defaults()})
    own = {key: value for key, value in head_class(name).option_defaults().items() if value is not inspect.Parameter.empty}
    return {key: json_value(own[key]) if key in own else NOT_APPLICABLE for key in keys}


@lru_cache(maxsize=1)
def augmentation_defaults() -> dict[str, Any]:
    """``train_transform``'s keywords besides the crop -> their defaults (JSON types)."""
    parameters = inspect.signature(train_transform).parameters.values()
    return {p.name: json_value(p.default) for p in parameters if p.name != "crop_size"}


def json_value(value: Any) -> Any:
    """A default as it reads after a JSON round trip (tuples become lists)."""
    return json.loads(json.dumps(value))
