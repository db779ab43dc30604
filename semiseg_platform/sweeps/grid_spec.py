"""Grid specs: the axes (frameworks, datasets with their partitions, head variants, seeds), rules
restricting which combinations are cells, the preset and overrides every cell's
:class:`~npsemiseg.config.RunConfig` is built from, the per-cell resources and where runs are
tracked and stored. :func:`expand` turns a spec into the cells' RunConfigs (de-duplicated by
``cell_id``), validating everything before anything starts.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, NonNegativeInt, PositiveInt, field_validator, model_validator

from npsemiseg.config import RunConfig, compose
from npsemiseg.data import dataset_info, dataset_names, protocol_partitions
from npsemiseg.frameworks import framework_names
from npsemiseg.heads import head_names
from npsemiseg.presets import preset_names
from npsemiseg.protocol import PROTOCOLS
from semiseg_platform.sweeps.spec_base import (
    DEFAULT_MAX_CELLS,
    Resources,
    Strict,
    describe_error,
    one_of,
    read_spec,
    validate_spec,
)

#: ``partitions: all`` = the dataset's four partition protocols (1/16, 1/8, 1/4, 1/2)
ALL_PARTITIONS = "all"


class HeadVariant(Strict):
    """A head variant: the head class (``head``) and options merged over the preset's head options.

    ``np_mean: {head: np, options: {attention: mean}}`` is NP-SemiSeg with the mean aggregator.
    """

    head: str
    options: dict[str, Any] = Field(default_factory=dict)

    @field_validator("head")
    @classmethod
    def _known_head(cls, value: str) -> str:
        return one_of("head", value, head_names())


class FrameworkVariant(Strict):
    """A framework variant: the framework class (``framework``), options merged over the preset's framework
    options, and dotted RunConfig ``overrides`` for its cells (before the grid's ``cell_overrides``).

    ``supervised_psmt: {framework: supervised, overrides: {model.decoder: psmt}}`` is the supervised reference
    trained on PS-MT's network (a framework's gain over supervised, measured on one network);
    ``cps_mt: {framework: mt_cps}`` is CPS's MeanTeacher beside the shared-trainer MT under either protocol.
    The variant's label is the cell's ``framework`` in run names, tags, tables and claims.
    """

    framework: str
    options: dict[str, Any] = Field(default_factory=dict)
    overrides: dict[str, Any] = Field(default_factory=dict)

    @field_validator("framework")
    @classmethod
    def _known_framework(cls, value: str) -> str:
        return one_of("framework", value, framework_names())


class Selection(Strict):
    """A set of cells: those whose value on each named axis is one of the listed values."""

    frameworks: list[str] | None = None
    datasets: list[str] | None = None
    partitions: list[str] | None = None
    heads: list[str] | None = None
    seeds: list[NonNegativeInt] | None = None
    protocols: list[str] | None = None

    @field_validator("partitions", mode="before")
    @classmethod
    def _partition_names_are_strings(cls, value: Any) -> Any:
        return [str(v) for v in value] if isinstance(value, list) else value

    def matches(self, cell: CellKey) -> bool:
        checks = ((self.frameworks, cell.framework), (self.datasets, cell.dataset),
                  (self.partitions, cell.partition), (self.heads, cell.head), (self.seeds, cell.seed),
                  (self.protocols, cell.protocol))
        return all(allowed is None or value in allowed for allowed, value in checks)


class Rule(Strict):
    """Restricts the cross product: cells matching ``when`` must also match ``only``;
    without ``only``, cells matching ``when`` are left out.

    ``{when: {heads: [np_mean]}, only: {frameworks: [u2pl]}}``: the ablation only for U2PL.
    """

    when: Selection
    only: Selection | None = None

    def allows(self, cell: CellKey) -> bool:
        if not self.when.matches(cell):
            return True
        return self.only is not None and self.only.matches(cell)


class ScopedOverrides(Strict):
    """Dotted RunConfig overrides for the cells matching ``when`` (applied after the global ones)."""

    when: Selection
    overrides: dict[str, Any] = Field(min_length=1)


class GridSpec(Strict):
    """A study: axes, rules, preset, overrides, resources, tracking and storage (see module docs).

    ``frameworks`` maps variant labels to :class:`FrameworkVariant` (``null``: the framework of that name); a
    list of framework names is accepted too.
    ``datasets`` maps each dataset to its partitions: ``all`` (the four protocols) or a list of
    names, labeled counts or aliases (``"1/16"``). ``heads`` maps variant labels to
    :class:`HeadVariant` (``null``: the head of that name with the preset's options); a list of
    head names is accepted too. ``overrides`` are dotted RunConfig keys applied to every cell.
    ``tracking_uri`` / ``storage``: None = the platform's defaults (``MLFLOW_TRACKING_URI`` or the
    local store; the local checkpoint directory). ``max_concurrent``: None = as many cells as the
    cluster's resources allow. ``max_failures``: retries of a cell whose process or node died (from its
    last checkpoint, in the same MLflow run); a cell that fails on its own is not retried. ``max_cells``: the most
    combinations of the axes (before the rules) the spec may have, counted before any is built
    (:data:`DEFAULT_MAX_CELLS`; raise it for a larger grid). ``protocols``: the cells'
    protocols (``npsemiseg.protocol``: ``released`` reproduces the code behind the paper's numbers,
    ``corrected`` is the paper done right); naming both runs every cell under each.
    """

    name: str = Field(min_length=1)
    experiment: str = "npsemiseg"
    preset: str = "paper"
    frameworks: dict[str, FrameworkVariant | None] = Field(min_length=1)
    datasets: dict[str, Literal["all"] | list[str | int]] = Field(min_length=1)
    heads: dict[str, HeadVariant | None] = Field(min_length=1)
    seeds: list[NonNegativeInt] = Field(default_factory=lambda: [0], min_length=1)
    protocols: list[str] = Field(default_factory=lambda: ["corrected"], min_length=1)
    rules: list[Rule] = Field(default_factory=list)
    overrides: dict[str, Any] = Field(default_factory=dict)
    cell_overrides: list[ScopedOverrides] = Field(default_factory=list)
    resources: Resources = Field(default_factory=Resources)
    tracking_uri: str | None = None
    storage: str | None = None
    max_concurrent: PositiveInt | None = None
    max_failures: NonNegativeInt = 2
    max_cells: PositiveInt = DEFAULT_MAX_CELLS

    @field_validator("frameworks", "heads", mode="before")
    @classmethod
    def _axis_from_list(cls, value: Any) -> Any:
        if isinstance(value, list):
            return {name: None for name in value}
        return value

    @field_validator("preset")
    @classmethod
    def _known_preset(cls, value: str) -> str:
        return one_of("preset", value, preset_names())

    @field_validator("protocols")
    @classmethod
    def _known_protocols(cls, value: list[str]) -> list[str]:
        return [one_of("protocols", name, PROTOCOLS) for name in value]

    @field_validator("frameworks")
    @classmethod
    def _variants_name_a_framework(cls, value: dict[str, FrameworkVariant | None]) -> dict[str, FrameworkVariant]:
        resolved = {}
        for label, variant in value.items():
            if variant is None:
                one_of("frameworks", label, framework_names())
                variant = FrameworkVariant(framework=label)
            resolved[label] = variant
        return resolved

    @field_validator("datasets")
    @classmethod
    def _known_datasets_and_partitions(cls, value: dict[str, Any]) -> dict[str, Any]:
        resolved = {}
        for dataset, partitions in value.items():
            one_of("datasets", dataset, dataset_names())
            if partitions == ALL_PARTITIONS:
                resolved[dataset] = [name for name, _ in protocol_partitions(dataset)]
            else:
                info = dataset_info(dataset)
                resolved[dataset] = [info.resolve_partition(p) for p in partitions]
                if not resolved[dataset]:
                    raise ValueError(f"datasets.{dataset}: expected '{ALL_PARTITIONS}' or a non-empty list of partitions")
        return resolved

    @field_validator("heads")
    @classmethod
    def _variants_name_a_head(cls, value: dict[str, HeadVariant | None]) -> dict[str, HeadVariant]:
        resolved = {}
        for label, variant in value.items():
            if variant is None:
                one_of("heads", label, head_names())
                variant = HeadVariant(head=label)
            resolved[label] = variant
        return resolved

    @model_validator(mode="after")
    def _cells_within_max_cells(self) -> GridSpec:
        """The cross product counted, not enumerated: a short spec can name millions of cells."""
        count = combinations(self)
        if count > self.max_cells:
            raise ValueError(f"max_cells: the axes make {count:,} combinations (before rules), more than max_cells "
                             f"({self.max_cells:,}); refused before building any (raise max_cells to run them all)")
        return self

    @model_validator(mode="after")
    def _rules_name_known_values(self) -> GridSpec:
        axes = {"frameworks": set(self.frameworks), "datasets": set(self.datasets),
                "partitions": {p for parts in self.datasets.values() for p in parts},
                "heads": set(self.heads), "seeds": set(self.seeds), "protocols": set(self.protocols)}
        selections = [(f"rules[{i}].{part}", selection) for i, rule in enumerate(self.rules)
                      for part, selection in (("when", rule.when), ("only", rule.only)) if selection is not None]
        selections += [(f"cell_overrides[{i}].when", scoped.when) for i, scoped in enumerate(self.cell_overrides)]
        for where, selection in selections:
            for axis, known in axes.items():
                for value in getattr(selection, axis) or []:
                    if value not in known:
                        raise ValueError(f"{where}.{axis}: {value!r} is not on the grid's {axis} axis "
                                         f"{sorted(known, key=str)}")
        return self

    @model_validator(mode="after")
    def _no_oracle_cells(self) -> GridSpec:
        """A grid's cells are results (tables, claims): the oracle of ``data.unlabeled_truth`` is a diagnostic."""
        scopes = [("overrides", self.overrides)]
        scopes += [(f"frameworks.{label}.overrides", v.overrides) for label, v in self.frameworks.items()]
        scopes += [(f"cell_overrides[{i}].overrides", s.overrides) for i, s in enumerate(self.cell_overrides)]
        for where, overrides in scopes:
            if overrides.get("data.unlabeled_truth") == "oracle":
                raise ValueError(f"{where}: data.unlabeled_truth 'oracle' replaces the teachers by the ground truth; "
                                 "a grid's cells become tables and claims, so expected 'hidden' or 'measured' (run the "
                                 "oracle with `npsemiseg run` or benchmarks/study_gap.py)")
        return self

    @property
    def resolved_partitions(self) -> dict[str, list[str]]:
        """Dataset -> canonical partition names (``all`` expanded, aliases resolved)."""
        return {dataset: list(partitions) for dataset, partitions in self.datasets.items()}


def combinations(spec: GridSpec) -> int:
    """How many combinations of the axes :func:`cell_keys` walks (the rules may leave fewer cells)."""
    partitions = sum(len(parts) for parts in spec.datasets.values())
    return len(spec.protocols) * partitions * len(spec.frameworks) * len(spec.heads) * len(spec.seeds)


def load_spec(source: str | Path | Mapping[str, Any]) -> GridSpec:
    """A validated :class:`GridSpec` from a YAML file path or a mapping.

    Raises ``ValueError`` naming the file and every offending key/value.
    """
    data, where = read_spec(source, "grid")
    return validate_spec(GridSpec, data, where)


@dataclass(frozen=True)
class CellKey:
    """A cell's coordinates on the grid's axes."""

    framework: str
    dataset: str
    partition: str
    head: str
    seed: int
    protocol: str = "corrected"


def cell_keys(spec: GridSpec) -> Iterator[CellKey]:
    """Every combination of the axes that the rules allow, protocol- then dataset-major (the tables' order)."""
    for protocol in spec.protocols:
        for dataset, partitions in spec.resolved_partitions.items():
            for partition in partitions:
                for framework in spec.frameworks:
                    for head in spec.heads:
                        for seed in spec.seeds:
                            key = CellKey(framework, dataset, partition, head, seed, protocol)
                            if all(rule.allows(key) for rule in spec.rules):
                                yield key


def cell_config(spec: GridSpec, key: CellKey) -> RunConfig:
    """The RunConfig of one cell: the preset, the head and framework variants' options, the seed, the grid's
    overrides, the framework variant's overrides, the matching cell overrides (later ones win)."""
    variant = spec.heads[key.head]
    framework = spec.frameworks[key.framework]
    overrides = {f"head.options.{name}": value for name, value in variant.options.items()}
    overrides.update({f"framework_options.{name}": value for name, value in framework.options.items()})
    overrides.update({"head.label": key.head, "framework_label": key.framework, "seed": key.seed,
                      **spec.overrides, **framework.overrides})
    for scoped in spec.cell_overrides:
        if scoped.when.matches(key):
            overrides.update(scoped.overrides)
    try:
        return compose(spec.preset, framework=framework.framework, dataset=key.dataset, partition=key.partition,
                       head=variant.head, protocol=key.protocol, overrides=overrides).config
    except (ValueError, TypeError) as error:
        raise ValueError(f"grid spec {spec.name!r}, cell {key.framework}/{key.dataset}/{key.partition}/"
                         f"{key.head} seed {key.seed} ({key.protocol}): {describe_error(error)}") from None


def expand(spec: GridSpec) -> list[RunConfig]:
    """The cells' RunConfigs in grid order, one per ``cell_id`` (first occurrence kept).

    Builds (and so validates) every cell before returning: an invalid override or head option
    fails here, before anything starts.
    """
    cells: dict[str, RunConfig] = {}
    for key in cell_keys(spec):
        config = cell_config(spec, key)
        cells.setdefault(config.cell_id, config)
    if not cells:
        raise ValueError(f"grid spec {spec.name!r}: the rules leave no cell to run")
    return list(cells.values())


def grid_id(configs: list[RunConfig]) -> str:
    """Stable id of a grid: a hash of its sorted cell ids (re-submitting a spec keeps it)."""
    digest = hashlib.sha256(",".join(sorted(c.cell_id for c in configs)).encode())
    return digest.hexdigest()[:12]
