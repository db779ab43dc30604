"""Names that changed: the one map from each configuration key (and value) to its earlier name.

Every reader goes through it, so an old name keeps reading wherever it was written: a record (a YAML file, a
checkpoint's stored configuration: ``RunConfig`` reads it before validation), an override (``--set
head.variant=np_mean``, a grid spec's ``overrides`` and ``cell_overrides``: composition reads them), a switch by
name (``switches.mt_variant``: ``npsemiseg.protocol.get_switch``), an old run's MLflow parameters
(``semiseg_platform.tracking.mlflow_names.param_value``). The cell id hashes each key under its earlier name
(``RunConfig.identity``), so a rename keeps every id. A renamed key keeps its parent section (only its last part
changes); the import-time check below says so for each entry.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: current dotted key -> the name runs, records and specs written before it carry (a leaf renamed in place)
RENAMED_KEYS: dict[str, str] = {
    "head.options.training_samples": "head.options.num_samples",
    "head.options.train_mode_passes": "head.options.train_samples",
    "framework_options.cutmix_boxes": "framework_options.cutmix_variant",
    # "variant" meant six things; each now says which: a head's and a framework's label in tables, run names and
    # tags
    "head.label": "head.variant",
    "framework_label": "framework_variant",
    # the DeepLabv3+ decoder a framework's paper uses
    "model.decoder": "model.variant",
    # whose partition lists a cell reads (U2PL's or CPS's)
    "partition_lists": "list_variant",
    # the switch that chooses the framework class of the MT cells (released mt_cps, corrected mt)
    "switches.mt_framework": "switches.mt_variant",
}
#: current dotted key -> {earlier value: current value}, for values renamed with their key (read only under the
#: earlier key: a value is renamed once, with the key that carried it)
RENAMED_VALUES: dict[str, dict[Any, Any]] = {
    "framework_options.cutmix_boxes": {"voc": "beta_box", "cityscapes": "random_boxes"},
}

#: earlier dotted key -> current one
CURRENT_KEYS: dict[str, str] = {old: new for new, old in RENAMED_KEYS.items()}

for _new, _old in RENAMED_KEYS.items():
    if _new.rpartition(".")[0] != _old.rpartition(".")[0]:
        raise AssertionError(f"RENAMED_KEYS: {_old!r} -> {_new!r} moves the key to another section")


def current_key(key: str) -> str:
    """The current name of dotted ``key`` (``"head.variant"`` -> ``"head.label"``; a current key as it is)."""
    return CURRENT_KEYS.get(key, key)


def current_value(key: str, value: Any) -> Any:
    """``value`` given under ``key``'s earlier name, as the current value (``"voc"`` -> ``"beta_box"``)."""
    renamed = RENAMED_VALUES.get(current_key(key), {})
    return renamed.get(value, value) if isinstance(value, str) else value


def read_renamed(values: Mapping[Any, Any], prefix: str = "") -> dict[Any, Any]:
    """``values`` (nested sections, dotted keys or both; ``prefix``: the section they are under) with every
    earlier key under its current name and its value as the current one; of a key given under both names, the later
    one holds (as of any key given twice in overrides)."""
    out: dict[Any, Any] = {}
    for key, value in values.items():
        dotted = f"{prefix}.{key}" if prefix else str(key)
        new = current_key(dotted)
        if isinstance(value, Mapping):
            value = read_renamed(value, new)
        if new == dotted:
            out[key] = value
        else:
            out[new.removeprefix(f"{prefix}.") if prefix else new] = current_value(dotted, value)
    return out


def earlier_names(data: dict[str, Any]) -> dict[str, Any]:
    """Nested ``data`` (a record's JSON values) with every renamed key present under its earlier name and value (in
    place; returned): what a cell id hashes, so that a rename keeps every id."""
    for new, old in RENAMED_KEYS.items():
        *parents, leaf = new.split(".")
        node: Any = data
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict) and leaf in node:
            value = node.pop(leaf)
            before = {current: earlier for earlier, current in RENAMED_VALUES.get(new, {}).items()}
            node[old.rpartition(".")[2]] = before.get(value, value) if isinstance(value, str) else value
    return data
