"""The study as a grid: YAML specs, their expansion into cells, and the Ray Tune job that runs them.

A :class:`GridSpec` lists the axes (frameworks, datasets with their partitions, head
variants, seeds), rules restricting which combinations are cells, the preset and overrides
every cell's :class:`~npsemiseg.config.RunConfig` is built from, the per-cell resources and
where runs are tracked and stored. :func:`expand` turns it into the cells' RunConfigs
(de-duplicated by ``cell_id``), validating everything before anything starts.

:func:`run_grid` runs the cells under Ray Tune, as many at once as the cluster's resources
allow: a cell with several DDP workers is a Tune trial that launches the cell's
``TorchTrainer`` (``semiseg_platform.cell.run_cell``); a single-device cell trains in-process
in a reused Tune actor (about 1 s of overhead instead of about 27 s, ``notes/ray_mlflow.md``).
A parent MLflow run per submission holds every cell's run as its child; re-submission skips
cells whose run FINISHED and resumes interrupted ones from their checkpoints; one failing cell
does not stop the others. The tables are built last and logged as the parent run's artifacts.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, PositiveFloat, PositiveInt, ValidationError, field_validator, model_validator

from npsemiseg.config import HEAD_NAMES, RunConfig
from npsemiseg.data.info import DATASET_NAMES, dataset_info
from npsemiseg.frameworks import FRAMEWORK_MODULES
from npsemiseg.presets import PRESET_NAMES

from semiseg_platform.tables import protocol_partitions

#: ``partitions: all`` = the dataset's four partition protocols (1/16, 1/8, 1/4, 1/2)
ALL_PARTITIONS = "all"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class HeadVariant(_Strict):
    """A head variant: the head class (``head``) and options merged over the preset's head options.

    ``np_mean: {head: np, options: {attention: mean}}`` is NP-SemiSeg with the mean aggregator.
    """

    head: Literal["baseline", "mc_dropout", "np"]
    options: dict[str, Any] = Field(default_factory=dict)


class Selection(_Strict):
    """A set of cells: those whose value on each named axis is one of the listed values."""

    frameworks: list[str] | None = None
    datasets: list[str] | None = None
    partitions: list[str] | None = None
    heads: list[str] | None = None
    seeds: list[NonNegativeInt] | None = None

    @field_validator("partitions", mode="before")
    @classmethod
    def _partition_names_are_strings(cls, value: Any) -> Any:
        return [str(v) for v in value] if isinstance(value, list) else value

    def matches(self, cell: CellKey) -> bool:
        checks = ((self.frameworks, cell.framework), (self.datasets, cell.dataset),
                  (self.partitions, cell.partition), (self.heads, cell.head), (self.seeds, cell.seed))
        return all(allowed is None or value in allowed for allowed, value in checks)


class Rule(_Strict):
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


class Resources(_Strict):
    """Per-cell resources: ``workers`` DDP workers of ``gpus_per_worker`` GPUs and ``cpus_per_worker`` CPUs.

    One worker (and at most one GPU) trains in-process in a reused Tune actor; several workers
    launch a ``TorchTrainer``. ``launcher`` forces one or the other (``auto``: by ``workers``).
    """

    workers: PositiveInt = 1
    gpus_per_worker: float = Field(0.0, ge=0.0)
    cpus_per_worker: PositiveFloat = 1.0
    launcher: Literal["auto", "trainer", "in_process"] = "auto"

    @model_validator(mode="after")
    def _in_process_is_one_device(self) -> Resources:
        if self.launcher == "in_process" and (self.workers > 1 or self.gpus_per_worker > 1):
            raise ValueError(f"resources.launcher: in_process runs one worker on at most one GPU, "
                             f"got workers={self.workers}, gpus_per_worker={self.gpus_per_worker:g}")
        return self

    @property
    def in_process(self) -> bool:
        """Whether cells train in the Tune actor itself (no TorchTrainer)."""
        if self.launcher != "auto":
            return self.launcher == "in_process"
        return self.workers == 1 and self.gpus_per_worker <= 1


class GridSpec(_Strict):
    """A study: axes, rules, preset, overrides, resources, tracking and storage (see module docs).

    ``datasets`` maps each dataset to its partitions: ``all`` (the four protocols) or a list of
    names, labeled counts or aliases (``"1/16"``). ``heads`` maps variant labels to
    :class:`HeadVariant` (``null``: the head of that name with the preset's options); a list of
    head names is accepted too. ``overrides`` are dotted RunConfig keys applied to every cell.
    ``tracking_uri`` / ``storage``: None = the platform's defaults (``MLFLOW_TRACKING_URI`` or the
    local store; the local checkpoint directory). ``max_concurrent``: None = as many cells as the
    cluster's resources allow. ``max_failures``: retries of a failed cell.
    """

    name: str = Field(min_length=1)
    experiment: str = "npsemiseg"
    preset: str = "paper"
    frameworks: list[str] = Field(min_length=1)
    datasets: dict[str, Literal["all"] | list[str | int]] = Field(min_length=1)
    heads: dict[str, HeadVariant | None] = Field(min_length=1)
    seeds: list[NonNegativeInt] = Field(default_factory=lambda: [0], min_length=1)
    rules: list[Rule] = Field(default_factory=list)
    overrides: dict[str, Any] = Field(default_factory=dict)
    resources: Resources = Field(default_factory=Resources)
    tracking_uri: str | None = None
    storage: str | None = None
    max_concurrent: PositiveInt | None = None
    max_failures: NonNegativeInt = 0

    @field_validator("heads", mode="before")
    @classmethod
    def _heads_from_list(cls, value: Any) -> Any:
        if isinstance(value, list):
            return {name: None for name in value}
        return value

    @field_validator("preset")
    @classmethod
    def _known_preset(cls, value: str) -> str:
        return _one_of("preset", value, PRESET_NAMES)

    @field_validator("frameworks")
    @classmethod
    def _known_frameworks(cls, value: list[str]) -> list[str]:
        return [_one_of("frameworks", name, tuple(FRAMEWORK_MODULES)) for name in value]

    @field_validator("datasets")
    @classmethod
    def _known_datasets_and_partitions(cls, value: dict[str, Any]) -> dict[str, Any]:
        resolved = {}
        for dataset, partitions in value.items():
            _one_of("datasets", dataset, DATASET_NAMES)
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
                _one_of("heads", label, HEAD_NAMES)
                variant = HeadVariant(head=label)
            resolved[label] = variant
        return resolved

    @model_validator(mode="after")
    def _rules_name_known_values(self) -> GridSpec:
        axes = {"frameworks": set(self.frameworks), "datasets": set(self.datasets),
                "partitions": {p for parts in self.datasets.values() for p in parts},
                "heads": set(self.heads), "seeds": set(self.seeds)}
        for index, rule in enumerate(self.rules):
            for part, selection in (("when", rule.when), ("only", rule.only)):
                for axis, known in axes.items():
                    for value in (getattr(selection, axis) or []) if selection else []:
                        if value not in known:
                            raise ValueError(f"rules[{index}].{part}.{axis}: {value!r} is not on the grid's "
                                             f"{axis} axis {sorted(known, key=str)}")
        return self

    @property
    def resolved_partitions(self) -> dict[str, list[str]]:
        """Dataset -> canonical partition names (``all`` expanded, aliases resolved)."""
        return {dataset: list(partitions) for dataset, partitions in self.datasets.items()}


def _one_of(field: str, value: str, valid: tuple[str, ...]) -> str:
    if value not in valid:
        raise ValueError(f"{field}: unknown value {value!r}; expected one of {list(valid)}")
    return value


def load_spec(source: str | Path | Mapping[str, Any]) -> GridSpec:
    """A validated :class:`GridSpec` from a YAML file path or a mapping.

    Raises ``ValueError`` naming the file and every offending key/value.
    """
    where = "grid spec"
    if isinstance(source, Mapping):
        data = dict(source)
    else:
        path = Path(source)
        where = f"grid spec {path}"
        if not path.is_file():
            raise ValueError(f"{where}: no such file")
        try:
            data = yaml.safe_load(path.read_text())
        except yaml.YAMLError as error:
            raise ValueError(f"{where}: not valid YAML: {error}") from None
        if not isinstance(data, dict):
            raise ValueError(f"{where}: expected a mapping of grid settings, got {type(data).__name__}")
    try:
        return GridSpec.model_validate(data)
    except ValidationError as error:
        raise ValueError(f"{where} is invalid: {_describe(error)}") from None


def _describe(error: Exception) -> str:
    """A validation error on one line: ``key.path: message; ...``."""
    if isinstance(error, ValidationError):
        return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'value'}: {e['msg']}" for e in error.errors())
    return " ".join(str(error).split())


@dataclass(frozen=True)
class CellKey:
    """A cell's coordinates on the grid's axes."""

    framework: str
    dataset: str
    partition: str
    head: str
    seed: int


def cell_keys(spec: GridSpec) -> Iterator[CellKey]:
    """Every combination of the axes that the rules allow, dataset-major (the tables' order)."""
    for dataset, partitions in spec.resolved_partitions.items():
        for partition in partitions:
            for framework in spec.frameworks:
                for head in spec.heads:
                    for seed in spec.seeds:
                        key = CellKey(framework, dataset, partition, head, seed)
                        if all(rule.allows(key) for rule in spec.rules):
                            yield key


def cell_config(spec: GridSpec, key: CellKey) -> RunConfig:
    """The RunConfig of one cell: the preset, the head variant's options, the seed, the overrides."""
    variant = spec.heads[key.head]
    overrides = {f"head.options.{name}": value for name, value in variant.options.items()}
    overrides.update({"head.variant": key.head, "seed": key.seed, **spec.overrides})
    try:
        return RunConfig.from_preset(spec.preset, framework=key.framework, dataset=key.dataset,
                                     partition=key.partition, head=variant.head, **overrides)
    except (ValueError, TypeError) as error:
        raise ValueError(f"grid spec {spec.name!r}, cell {key.framework}/{key.dataset}/{key.partition}/"
                         f"{key.head} seed {key.seed}: {_describe(error)}") from None


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
