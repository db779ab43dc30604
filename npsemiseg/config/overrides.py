"""Dotted-key overrides of a nested dict of configuration values, checked against the schema.

``apply_overrides(RunConfig, values, {"optim.lr": "0.01"})`` walks the pydantic models of the
configuration so an unknown key fails by name; command-line strings are parsed as YAML scalars.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

from npsemiseg.untrusted import InvalidYamlError, load_yaml

#: option dicts whose keys the schema does not list (their own validators check them); merged, not replaced
FREE_FORM = frozenset({"framework_options", "head.options", "model.options", "data.options", "data.augmentation"})


def parse_scalar(value: Any) -> Any:
    """A command-line string as the value it spells: ``"null"`` -> None, ``"true"`` -> True,
    ``"3"`` -> 3, ``"1e-3"`` -> 0.001, ``"[1, 2]"`` -> [1, 2]; anything else stays a string
    (YAML 1.1's ``on``/``off``/``yes``/``no`` are *not* booleans here)."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    lowered = text.lower()
    if lowered in ("null", "~"):  # not "none": a valid string value of some options (ema_buffers)
        return None
    if lowered in ("true", "false"):
        return lowered == "true"
    for number in (int, float):
        try:
            return number(text)
        except ValueError:
            pass
    if text[:1] in "[{" and text[-1:] in "]}":
        try:
            return load_yaml(text, where=f"value {text[:40]!r}")
        except InvalidYamlError:
            return value
    return value


def apply_overrides(root: type[BaseModel], values: dict[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Apply dotted-key or section overrides to a nested dict of ``root``'s configuration values.

    Keys must exist in ``root``'s schema, except below the free-form option dicts (:data:`FREE_FORM`),
    which their own validators check. Raises ``ValueError`` naming an unknown key.
    """
    result = json.loads(json.dumps(values))  # deep copy of plain data
    sections = _section_models(root)
    for key, raw in overrides.items():
        if isinstance(raw, Mapping) and key in sections:
            for sub, item in raw.items():
                _set_dotted(root, result, f"{key}.{sub}", item)
        else:
            _set_dotted(root, result, key, raw)
    return result


def _section_models(root: type[BaseModel]) -> dict[str, type[BaseModel]]:
    return {name: model for name, field in root.model_fields.items() if (model := _model_of(field.annotation))}


def _model_of(annotation: Any) -> type[BaseModel] | None:
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def _next_model(root: type[BaseModel], model: type[BaseModel], key: str, path: list[str], last: bool) -> type[BaseModel] | None:
    """The section model below ``path[-1]`` of ``model`` (None for a value); ValueError naming an unknown key."""
    part, dotted = path[-1], ".".join(path)
    if part not in model.model_fields:
        valid = ", ".join(sorted(model.model_fields))
        where = ".".join(path[:-1]) or "the configuration"
        raise ValueError(f"unknown configuration key {key!r}: {where} has no field {part!r} (valid: {valid})")
    next_model = _model_of(model.model_fields[part].annotation)
    if not last and next_model is None and dotted not in FREE_FORM:
        raise ValueError(f"unknown configuration key {key!r}: {dotted} is a value, not a section")
    return next_model


def _set_dotted(root: type[BaseModel], values: dict[str, Any], key: str, raw: Any) -> None:
    parts = key.split(".")
    model: type[BaseModel] | None = root
    node = values
    path: list[str] = []
    for index, part in enumerate(parts):
        path.append(part)
        last = index == len(parts) - 1
        next_model = _next_model(root, model, key, path, last) if model is not None else None
        if last:
            _set_leaf(root, values, node, key, ".".join(path), part, raw)
            return
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
        model = next_model


def _set_leaf(root: type[BaseModel], values: dict[str, Any], node: dict[str, Any], key: str, dotted: str,
              part: str, raw: Any) -> None:
    if isinstance(raw, Mapping) and isinstance(node.get(part), dict):
        if dotted in FREE_FORM:  # option dicts are merged: the preset's other options stay
            node[part] = {**node[part], **{k: parse_scalar(v) for k, v in raw.items()}}
        else:
            for sub, item in raw.items():
                _set_dotted(root, values, f"{key}.{sub}", item)
    else:
        node[part] = parse_scalar(raw)
