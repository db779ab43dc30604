"""Compose one cell's configuration in one visible order, and say which step set each key.

``compose(preset, framework=, dataset=, partition=, head=, protocol=, overrides=)`` returns the
:class:`~npsemiseg.config.RunConfig` and its provenance. The steps run in this order, each a small
function below; a later step wins over an earlier one:

0. ``cell``      the cell's coordinates; the framework class (a switch whose target is ``framework``,
                 ``mt_framework``, chooses it here, before the framework's settings are known:
                 ``npsemiseg.protocol.protocol_framework``; ``switches.<name>`` overrides it here too)
1. ``preset``    the preset's values for the cell's dataset (its paper settings; ``npsemiseg.presets``)
2. ``defaults``  the framework's and the head's own settings: options, DeepLabv3+ decoder, schedule
                 changes, augmentation pipeline, head options and gradient clipping
3. ``switch``    every switch of the cell's protocol that applies to it (``npsemiseg.protocol``)
4. ``scale``     the preset's crop, batches, LR and epochs of the cell (``paper``: by ``schedule.head_settings``,
                 the head schedule; ``smoke``: seconds on a CPU)
5. ``derived``   fields that follow others, where nothing set them: the canonical partition, the labels, the
                 second batch, the evaluation's mode, crop and sliding stride, the representation head, the
                 labeled strong view
6. ``override``  the user's overrides (``--set``, a spec's ``overrides`` and ``cell_overrides``), in order

Steps 4 and 5 read the values as the overrides will leave them, so a field follows an overridden input (a
new ``evaluation.crop_size`` moves the derived stride; ``switches.head_settings=per_head`` moves the crop).
:func:`with_overrides` composes again from a record's ``inputs`` plus more overrides: nothing is reset.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from npsemiseg.config.overrides import apply_overrides
from npsemiseg.config.schema import CellInputs, RunConfig, ScheduleConfig
from npsemiseg.constants import sliding_stride
from npsemiseg.data import dataset_info
from npsemiseg.data.info import dataset_root
from npsemiseg.data.augmentation import paper_augmentation
from npsemiseg.frameworks import framework_spec
from npsemiseg.heads import head_spec
from npsemiseg.presets import PRESETS, Cell
from npsemiseg.protocol import (
    FRAMEWORK_TARGET,
    SWITCH_PREFIX,
    Switch,
    check_protocol,
    get_switch,
    protocol_framework,
    protocol_switches,
    switch_target,
)
from npsemiseg.renames import read_renamed

#: the steps in their order (``cell``: the coordinates asked for; ``record``: a record composed again as it is)
STEPS = ("cell", "record", "preset", "defaults", "switch", "scale", "derived", "override")
#: override keys that name the cell (they change what is composed rather than one value)
CELL_KEYS = {"framework": "framework", "dataset": "dataset", "partition": "partition", "head.name": "head",
             "protocol": "protocol"}


@dataclass(frozen=True)
class Setting:
    """One step's setting of one key: which step, the value it wrote and why."""

    step: str
    value: Any
    why: str


@dataclass(frozen=True)
class Composition:
    """A composed configuration and, for every key (dotted), the settings that wrote it in order (the last one
    holds; none = the record's default)."""

    config: RunConfig
    provenance: dict[str, tuple[Setting, ...]]

    def value(self, key: str) -> Any:
        """The configuration's value of dotted ``key``."""
        return _read(self.config.model_dump(mode="json"), key)

    def keys(self, prefix: str = "") -> list[str]:
        """The keys equal to ``prefix`` or under it (every key for ""); ``ValueError`` when none is."""
        key = switch_target(prefix) if prefix.startswith(SWITCH_PREFIX) else prefix
        keys = [k for k in self.provenance if not key or k == key or k.startswith(f"{key}.")]
        if not keys:
            sections = sorted({k.split(".")[0] for k in self.provenance})
            raise ValueError(f"--explain: unknown configuration key {prefix!r}, expected a key of `npsemiseg config "
                             f"show` or a section ({', '.join(sections)})")
        return keys

    def explain(self, key: str) -> str:
        """Each key at or under ``key`` with its value and every setting of it, oldest first."""
        lines: list[str] = []
        for k in self.keys(key):
            lines.append(f"{k} = {_text(self.value(k))}")
            for setting in self.provenance[k] or (Setting("default", self.value(k), "the record's default"),):
                lines.append(f"  {setting.step:<9} {_text(setting.value):<24} {setting.why}")
        return "\n".join(lines)

    def show(self) -> str:
        """Every key with its value and the step that set it last (and why)."""
        rows = [(k, _text(self.value(k)), _last(self.provenance[k])) for k in self.keys()]
        width = max(len(k) + len(v) for k, v, _ in rows) + 3
        return "\n".join(f"{f'{k} = {v}':<{width}} <- {last.step}: {last.why}" for k, v, last in rows)

    def to_json(self) -> dict[str, Any]:
        """``{key: {"value": ..., "set_by": [{"step", "value", "why"}, ...]}}`` (``config_provenance.json``)."""
        return {k: {"value": self.value(k), "set_by": [vars(s) for s in history]}
                for k, history in self.provenance.items()}


def compose(preset: str, *, framework: str, dataset: str, partition: str | int, head: str,
            protocol: str = "corrected", overrides: Mapping[str, Any] | None = None) -> Composition:
    """The configuration of one cell, composed in the module's order, with its provenance.

    ``overrides``: dotted keys (``{"optim.lr": 0.01}``) or sections (``{"optim": {"lr": 0.01}}``); strings are
    parsed as YAML scalars (``"0.01"``); ``switches.<name>`` sets one switch of ``npsemiseg.protocol``; a dict
    for an option dict (``head.options`` ...) is merged into it. Keys naming the cell (``framework``,
    ``dataset``, ``partition``, ``head.name``, ``protocol``) change the cell instead, and so does a switch that
    chooses the framework class (``switches.mt_framework``: it wins over the protocol). ``ValueError`` names a bad
    key or value.
    """
    given = read_renamed(dict(overrides or {}))
    with dataset_root(given.get("data.root", (given.get("data") or {}).get("root"))):
        return _compose(preset, framework, dataset, partition, head, protocol, given)


def _compose(preset: str, framework: str, dataset: str, partition: str | int, head: str, protocol: str,
             given: dict[str, Any]) -> Composition:
    """:func:`compose`'s steps (``given``: the overrides, renamed keys read)."""
    cell_changes, rest = _split_cell_keys(given)
    coordinates = {"framework": framework, "dataset": dataset, "partition": str(partition), "head": head,
                   "protocol": protocol, **cell_changes}
    check_protocol(coordinates["protocol"])
    chosen = {k: v for k, v in rest.items() if _chooses_framework(k)}
    framework_settings = _framework_settings(coordinates, chosen)
    cell = Cell(preset=PRESETS.check(preset), **{**coordinates, "framework": framework_settings[-1].value},
                asked_framework=coordinates["framework"])
    values = _Values(_targets({k: v for k, v in rest.items() if k not in chosen}))
    _cell_step(values, cell, framework_settings)
    _preset_step(values, cell)
    _defaults_step(values, cell)
    _switch_step(values, cell)
    _scale_step(values, cell)
    _derived_step(values, cell)
    values.apply_overrides()
    inputs = CellInputs(preset=cell.preset, **coordinates, overrides=rest)
    return values.composition(inputs)


def cell_config(preset: str, *, framework: str = "supervised", dataset: str = "synthetic", partition: str | int = "1/16",
                head: str = "baseline", protocol: str = "corrected", **overrides: Any) -> RunConfig:
    """:func:`compose`'s configuration alone, overrides as keywords (``cell_config("smoke", head="np",
    **{"optim.lr": 0.01})``)."""
    return compose(preset, framework=framework, dataset=dataset, partition=partition, head=head, protocol=protocol,
                   overrides=overrides).config


def with_overrides(config: RunConfig, overrides: Mapping[str, Any] | None = None, /, *, from_inputs: bool = True,
                   **more: Any) -> RunConfig:
    """:func:`recompose`'s configuration, overrides also as keywords."""
    return recompose(config, {**dict(overrides or {}), **more}, from_inputs=from_inputs).config


def recompose(config: RunConfig, overrides: Mapping[str, Any] | None = None, *,
              from_inputs: bool = True) -> Composition:
    """``config`` with more overrides: composed again from its ``inputs`` and every override (an override of a
    key already overridden replaces it). With ``from_inputs=False``, or for a record without inputs (written by
    hand), the record is the start instead: its values, its unset derived fields, the overrides."""
    new = read_renamed(dict(overrides or {}))
    inputs = config.inputs
    if not from_inputs or inputs is None:
        return compose_record(config, new)
    kept = {k: v for k, v in inputs.overrides.items() if k not in new}
    return compose(inputs.preset, framework=inputs.framework, dataset=inputs.dataset, partition=inputs.partition,
                   head=inputs.head, protocol=inputs.protocol, overrides={**kept, **new})


def compose_record(config: RunConfig, overrides: Mapping[str, Any] | None = None) -> Composition:
    """A record composed again as it is (step ``record``), its unset derived fields, then ``overrides``."""
    with dataset_root(config.data.root):
        return _compose_record(config, _targets(read_renamed(dict(overrides or {}))))


def _compose_record(config: RunConfig, overrides: dict[str, Any]) -> Composition:
    values = _Values(overrides)
    record = config.model_dump(mode="json", exclude={"inputs"})
    values.set_all(record, "record", "the record as given")
    cell = Cell(preset="", framework=config.framework, dataset=config.dataset, partition=config.partition,
                head=config.head.name, protocol=config.protocol)
    _derived_step(values, cell)
    values.apply_overrides()
    return values.composition(None)


def explain(config: RunConfig) -> Composition:
    """Where ``config``'s values come from: its ``inputs`` composed again where they give ``config`` back, else
    the record as it is (a record written or edited by hand)."""
    if config.inputs is not None:
        composed = recompose(config)
        if composed.config == config:
            return composed
    return compose_record(config)


def read_config(source: str | Path) -> RunConfig:
    """A record from a YAML file: its ``inputs`` kept only where they compose to the file's values (a file edited
    by hand is taken as it is, and overrides apply to it)."""
    config = RunConfig.from_yaml(source)
    if config.inputs is not None and explain(config).config.inputs is None:
        return config.model_copy(update={"inputs": None})
    return config


# --------------------------------------------------------------------------- the steps
def _framework_settings(coordinates: Mapping[str, str], chosen: Mapping[str, Any]) -> list[Setting]:
    """The settings of ``framework`` at the cell step: the name asked for, the protocol's switch that chooses the
    class (:func:`~npsemiseg.protocol.protocol_framework`), then each override of such a switch by name (``chosen``:
    ``{"switches.mt_framework": "mt"}``), which wins; the last one holds."""
    asked, protocol = coordinates["framework"], coordinates["protocol"]
    cell = {"dataset": coordinates["dataset"], "head": coordinates["head"]}
    settings = [Setting("cell", asked, "the cell asked for")]
    name, switch = protocol_framework(protocol, asked, **cell)
    if switch is not None:
        settings.append(Setting("switch", name, _switch_why(switch, protocol)))
    for key, value in chosen.items():
        switch = get_switch(key.removeprefix(SWITCH_PREFIX))
        if not switch.applies(framework=asked, **cell):
            raise ValueError(f"{key}: the switch chooses between frameworks {'/'.join(switch.frameworks or ())}, "
                             f"the cell asks for {asked!r}")
        if value not in (switch.released, switch.corrected):
            raise ValueError(f"{key}: expected {switch.released!r} (released) or {switch.corrected!r} (corrected), "
                             f"got {value!r}")
        settings.append(Setting("override", value, f"{key}={_text(value)}"))
    return settings


def _chooses_framework(key: str) -> bool:
    """Whether override ``key`` is a switch by name whose target is the framework class."""
    return key.startswith(SWITCH_PREFIX) and switch_target(key) == FRAMEWORK_TARGET


def _cell_step(values: _Values, cell: Cell, framework: list[Setting]) -> None:
    for setting in framework:
        values.set("framework", setting.value, setting.step, setting.why)
    for key in ("dataset", "partition", "protocol"):
        values.set(key, getattr(cell, key), "cell", "the cell asked for")
    values.set("head.name", cell.head, "cell", "the cell asked for")


def _preset_step(values: _Values, cell: Cell) -> None:
    values.set_all(PRESETS.get(cell.preset).values(cell), "preset", f"{cell.preset} preset, {cell.info.recipe} recipe")


def _defaults_step(values: _Values, cell: Cell) -> None:
    """The framework's paper options, decoder, schedule changes and augmentation pipeline; the head's paper
    options and gradient clipping."""
    framework, head, info = framework_spec(cell.framework), head_spec(cell.head), cell.info
    settings, name = info.settings, cell.framework
    recipe = settings.recipe
    options = {**framework.paper_options(info.paper_dataset, cell.partition),
               **settings.options_for(name, info.resolve_partition(cell.partition))}
    values.set("framework_options", options, "defaults", f"{name}'s paper options on {info.paper_dataset}")
    values.set("model.decoder", framework.decoder, "defaults", f"{name}'s DeepLabv3+")
    values.set_all(settings.framework_schedule(name), "defaults",
                   f"{name}'s own {recipe} schedule", prefix="schedule")
    values.set("optim.grad_clip", head.paper_grad_clip, "defaults", f"the {cell.head} head's paper clipping")
    values.set("head.options", dict(head.paper_options), "defaults", f"the {cell.head} head's paper options")
    pipeline = paper_augmentation(framework.augmentation, settings.augmentation_kind)
    why = f"{name}'s {framework.augmentation} augmentation pipeline ({recipe})"
    if info.synthetic and pipeline.get("base_size") is not None:
        size = dataset_info(cell.dataset, **values.view()["data"].get("options", {})).options.get("image_size", 64)
        pipeline["base_size"] = int(max(size) if isinstance(size, (tuple, list)) else size)
        why += ", resized relative to the synthetic image size"
    values.set_all(pipeline, "defaults", why, prefix="data.augmentation")


def _switch_step(values: _Values, cell: Cell) -> None:
    for switch, value in protocol_switches(cell.protocol, framework=cell.framework, dataset=cell.dataset,
                                           head=cell.head, values=values.tree):
        values.set(switch.target, value, "switch", _switch_why(switch, cell.protocol))


def _switch_why(switch: Switch, protocol: str) -> str:
    if protocol == "released":
        return f"switch {switch.name} (released: {switch.changes})"
    return f"switch {switch.name} (corrected, rather than: {switch.changes})"


def _scale_step(values: _Values, cell: Cell) -> None:
    for key, value, why in PRESETS.get(cell.preset).scale(cell, values.view()):
        values.set(key, value, "scale", why)


def _derived_step(values: _Values, cell: Cell) -> None:
    """Fields that follow others, computed from the values as the overrides leave them, where they are unset."""
    view = values.view()
    info = dataset_info(cell.dataset, **(view["data"].get("options") or {}))
    partition = info.resolve_partition(view["partition"])
    if partition != view["partition"]:
        values.set("partition", partition, "derived", f"{view['partition']!r} of {cell.dataset}")
    for key, value, why in _labels(view, cell.label) + _evaluation(view, info) + _framework_needs(view):
        values.set(key, value, "derived", why)


def _labels(view: Mapping[str, Any], framework: str) -> list[tuple[str, Any, str]]:
    """The framework's and head's labels (their names as asked for where not given: ``framework``, which a protocol
    switch may run as another class), the unlabeled batch (the labeled one)."""
    out = []
    if not view.get("framework_label"):
        out.append(("framework_label", framework, "the framework's name as asked for"))
    if not view["head"].get("label"):
        out.append(("head.label", view["head"]["name"], "the head's name"))
    schedule = view.get("schedule", {})
    if schedule.get("unlabeled_batch_size") is None:
        batch = schedule.get("batch_size", ScheduleConfig.model_fields["batch_size"].default)
        out.append(("schedule.unlabeled_batch_size", batch, "schedule.batch_size"))
    return out


def _evaluation(view: Mapping[str, Any], info: Any) -> list[tuple[str, Any, str]]:
    """The dataset's evaluation mode and crop where unset; the sliding stride ceil(2/3 x crop) where unset."""
    evaluation = view.get("evaluation", {})
    out = []
    mode, crop = evaluation.get("mode"), evaluation.get("crop_size")
    if mode is None:
        mode = info.eval_mode
        out.append(("evaluation.mode", mode, f"{info.name}'s evaluation convention"))
    if crop is None:
        crop = info.eval_crop_size
        out.append(("evaluation.crop_size", crop, f"{info.name}'s evaluation convention"))
    if evaluation.get("stride") is None and mode in ("sliding", "sliding_global"):
        out.append(("evaluation.stride", sliding_stride(crop), f"ceil(2/3 x evaluation.crop_size {crop})"))
    return out


def _framework_needs(view: Mapping[str, Any]) -> list[tuple[str, Any, str]]:
    """The representation head where the framework needs one (U2PL), the labeled strong view where its options
    ask for one (PS-MT's ``strong_labeled``); scale ranges as floats."""
    framework = framework_spec(view["framework"])
    out = []
    if view["model"].get("representation_head") is None:
        out.append(("model.representation_head", framework.representation_head, f"{framework.name}'s needs"))
    if view["data"].get("labeled_strong_view") is None:
        try:
            options = framework.Options.model_validate(view.get("framework_options", {}))
        except ValueError:
            options = None  # the record's check names the bad option
        strong = bool(getattr(options, "strong_labeled", False))
        out.append(("data.labeled_strong_view", strong, "framework_options.strong_labeled"))
    scale = view["data"].get("augmentation", {}).get("scale_range")
    if scale is not None and any(not isinstance(v, float) for v in scale):
        out.append(("data.augmentation.scale_range", [float(v) for v in scale], "as floats"))
    return out


# --------------------------------------------------------------------------- values and their history
class _Values:
    """The nested values being composed, the user's overrides still to apply, and what set each key."""

    def __init__(self, overrides: dict[str, Any]) -> None:
        self.tree: dict[str, Any] = {}
        self.history: dict[str, list[Setting]] = {}
        self.overrides = overrides

    def set(self, key: str, value: Any, step: str, why: str) -> None:
        """Write ``value`` at dotted ``key`` (a non-empty dict as its leaves) and remember who did."""
        if isinstance(value, Mapping) and value:
            self.set_all(value, step, why, prefix=key)
            return
        *parents, leaf = key.split(".")
        node = self.tree
        for part in parents:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        node[leaf] = json.loads(json.dumps(value))
        self.history.setdefault(key, []).append(Setting(step, node[leaf], why))

    def set_all(self, values: Mapping[str, Any], step: str, why: str, prefix: str = "") -> None:
        for key, value in values.items():
            self.set(f"{prefix}.{key}" if prefix else key, value, step, why)

    def view(self) -> dict[str, Any]:
        """The values as the user's overrides will leave them."""
        return apply_overrides(RunConfig, self.tree, self.overrides)

    def apply_overrides(self) -> None:
        """Step ``override``: each override in order, every key it changes remembered."""
        for key, raw in self.overrides.items():
            self.tree = apply_overrides(RunConfig, self.tree, {key: raw})
            for leaf, _ in _leaves(apply_overrides(RunConfig, {}, {key: raw})):
                value = _read(self.tree, leaf)
                self.history.setdefault(leaf, []).append(Setting("override", value, f"{key}={_text(raw)}"))

    def composition(self, inputs: CellInputs | None) -> Composition:
        config = RunConfig.model_validate({**self.tree, "inputs": inputs.model_dump(mode="json") if inputs else None})
        record = config.model_dump(mode="json", exclude={"inputs"})
        return Composition(config, {key: tuple(self.history.get(key, ())) for key, _ in _leaves(record)})


def _split_cell_keys(overrides: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``overrides`` split into the cell's coordinates they change (``framework`` ...) and the others."""
    cell: dict[str, Any] = {}
    rest: dict[str, Any] = {}
    for key, value in overrides.items():
        if key in CELL_KEYS:
            cell[CELL_KEYS[key]] = str(value)
        elif key == "head" and isinstance(value, Mapping) and "name" in value:
            cell["head"] = str(value["name"])
            others = {k: v for k, v in value.items() if k != "name"}
            if others:
                rest[key] = others
        else:
            rest[key] = value
    return cell, rest


def _targets(overrides: dict[str, Any]) -> dict[str, Any]:
    """``overrides`` with each ``switches.<name>`` key as the switch's configuration key."""
    return {switch_target(k) if k.startswith(SWITCH_PREFIX) else k: v for k, v in overrides.items()}


def _leaves(tree: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """``(dotted key, value)`` of every leaf of a nested dict (an empty dict is a leaf)."""
    for key, value in tree.items():
        dotted = f"{prefix}.{key}" if prefix else key
        if isinstance(value, Mapping) and value:
            yield from _leaves(value, dotted)
        else:
            yield dotted, value


def _read(tree: Mapping[str, Any], dotted: str) -> Any:
    node: Any = tree
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, Mapping) else None
    return node


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _last(history: tuple[Setting, ...]) -> Setting:
    return history[-1] if history else Setting("default", None, "the record's default")
