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
import statistics
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NamedTuple

import yaml
from mlflow import MlflowClient
from mlflow.entities import Metric, Param
from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, PositiveFloat, PositiveInt, ValidationError, field_validator, model_validator

from npsemiseg.config import HEAD_NAMES, RunConfig
from npsemiseg.data.info import DATASET_NAMES, dataset_info
from npsemiseg.frameworks import FRAMEWORK_MODULES
from npsemiseg.presets import PRESET_NAMES

from ray.tune import Callback

from semiseg_platform.tables import (ABLATION_HEADS, PAPER_FRAMEWORKS, PAPER_HEADS, markdown_report,
                                     protocol_partitions, search_all_runs)
from semiseg_platform.tracking import KIND_TAG, ending_run, error_reason

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


class ScopedOverrides(_Strict):
    """Dotted RunConfig overrides for the cells matching ``when`` (applied after the global ones)."""

    when: Selection
    overrides: dict[str, Any] = Field(min_length=1)


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
    cell_overrides: list[ScopedOverrides] = Field(default_factory=list)
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
        return one_of("preset", value, PRESET_NAMES)

    @field_validator("frameworks")
    @classmethod
    def _known_frameworks(cls, value: list[str]) -> list[str]:
        return [one_of("frameworks", name, tuple(FRAMEWORK_MODULES)) for name in value]

    @field_validator("datasets")
    @classmethod
    def _known_datasets_and_partitions(cls, value: dict[str, Any]) -> dict[str, Any]:
        resolved = {}
        for dataset, partitions in value.items():
            one_of("datasets", dataset, DATASET_NAMES)
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
                one_of("heads", label, HEAD_NAMES)
                variant = HeadVariant(head=label)
            resolved[label] = variant
        return resolved

    @model_validator(mode="after")
    def _rules_name_known_values(self) -> GridSpec:
        axes = {"frameworks": set(self.frameworks), "datasets": set(self.datasets),
                "partitions": {p for parts in self.datasets.values() for p in parts},
                "heads": set(self.heads), "seeds": set(self.seeds)}
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

    @property
    def resolved_partitions(self) -> dict[str, list[str]]:
        """Dataset -> canonical partition names (``all`` expanded, aliases resolved)."""
        return {dataset: list(partitions) for dataset, partitions in self.datasets.items()}


def one_of(field: str, value: str, valid: tuple[str, ...]) -> str:
    if value not in valid:
        raise ValueError(f"{field}: unknown value {value!r}; expected one of {list(valid)}")
    return value


def read_spec(source: str | Path | Mapping[str, Any], kind: str) -> tuple[dict[str, Any], str]:
    """The raw mapping of a ``kind`` spec ("grid", "search") from a YAML file path or a mapping, and
    how to name it in errors (``"grid spec jobs/specs/x.yaml"``). ``ValueError`` for a missing file,
    invalid YAML or a document that is not a mapping."""
    if isinstance(source, Mapping):
        return dict(source), f"{kind} spec"
    path = Path(source)
    where = f"{kind} spec {path}"
    if not path.is_file():
        raise ValueError(f"{where}: no such file")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        raise ValueError(f"{where}: not valid YAML: {error}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected a mapping of {kind} settings, got {type(data).__name__}")
    return data, where


def load_spec(source: str | Path | Mapping[str, Any]) -> GridSpec:
    """A validated :class:`GridSpec` from a YAML file path or a mapping.

    Raises ``ValueError`` naming the file and every offending key/value.
    """
    data, where = read_spec(source, "grid")
    try:
        return GridSpec.model_validate(data)
    except ValidationError as error:
        raise ValueError(f"{where} is invalid: {describe_error(error)}") from None


def describe_error(error: Exception) -> str:
    """A validation error on one line: ``key.path: message; ...``."""
    if isinstance(error, ValidationError):
        return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'value'}: {e['msg'].removeprefix('Value error, ')}"
                         for e in error.errors())
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
    for scoped in spec.cell_overrides:
        if scoped.when.matches(key):
            overrides.update(scoped.overrides)
    try:
        return RunConfig.from_preset(spec.preset, framework=key.framework, dataset=key.dataset,
                                     partition=key.partition, head=variant.head, **overrides)
    except (ValueError, TypeError) as error:
        raise ValueError(f"grid spec {spec.name!r}, cell {key.framework}/{key.dataset}/{key.partition}/"
                         f"{key.head} seed {key.seed}: {describe_error(error)}") from None


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


# ----------------------------------------------------------------------------- running a grid
#: CPUs reserved for the Tune trial that drives a multi-worker cell's TorchTrainer (Ray rejects 0)
DRIVER_CPUS = 0.5
SUBMISSION_TAG = "submission_id"
SPEC_NAME_TAG = "spec_name"


@dataclass
class CellOutcome:
    """What happened to one cell in a submission.

    status: ``finished`` | ``failed`` | ``skipped`` (finished under an earlier submission);
    trial_seconds: the cell's wall time as the grid driver saw it (start to end of its Tune
    trial); loop_seconds: ``train()``'s own wall time; overhead = the difference.
    """

    cell_id: str
    cell_name: str
    status: str
    reason: str = ""
    run_id: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    trial_seconds: float | None = None
    loop_seconds: float | None = None

    @property
    def overhead_seconds(self) -> float | None:
        if self.trial_seconds is None or self.loop_seconds is None:
            return None
        return self.trial_seconds - self.loop_seconds


@dataclass
class GridSummary:
    """The result of :func:`run_grid`: one outcome per cell, the parent run and the tables."""

    spec_name: str
    grid_id: str
    submission_id: str
    experiment: str
    tracking_uri: str
    parent_run_id: str
    outcomes: list[CellOutcome]
    wall_seconds: float
    concurrency: int
    tables_dir: Path | None = None
    tables_markdown: str = ""

    def cells(self, status: str) -> list[CellOutcome]:
        return [o for o in self.outcomes if o.status == status]

    @property
    def ok(self) -> bool:
        """True when no cell failed."""
        return not self.cells("failed")

    @property
    def median_overhead_seconds(self) -> float | None:
        """Median per-cell orchestration overhead of the cells trained in this submission."""
        values = [o.overhead_seconds for o in self.cells("finished") if o.overhead_seconds is not None]
        return statistics.median(values) if values else None

    def format(self) -> str:
        """The end-of-job summary: counts, timing, and every failed cell with its reason."""
        counts = {s: len(self.cells(s)) for s in ("finished", "failed", "skipped")}
        overhead = self.median_overhead_seconds
        lines = [
            f"grid {self.spec_name} ({self.grid_id}), submission {self.submission_id}: {len(self.outcomes)} cells: "
            f"{counts['finished']} finished, {counts['failed']} failed, {counts['skipped']} skipped "
            f"(finished earlier)",
            f"wall {_duration(self.wall_seconds)}, {self.concurrency} cell(s) at once"
            + (f", median orchestration overhead {overhead:.2f} s per cell" if overhead is not None else ""),
            f"MLflow: experiment {self.experiment!r}, parent run {self.parent_run_id} ({self.tracking_uri})",
        ]
        for outcome in self.cells("failed"):
            lines.append(f"  FAILED {outcome.cell_name} [{outcome.cell_id}]: {outcome.reason}")
        if self.tables_dir is not None:
            lines.append(f"tables: {self.tables_dir}")
        return "\n".join(lines)


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m{seconds % 60:02d}s" if seconds >= 3600 else \
        f"{seconds // 60}m{seconds % 60:02d}s"


class GridProgress(Callback):
    """Tune callback printing one line per started / finished / failed cell: counts and ETA."""

    def __init__(self, names: Mapping[str, str], *, skipped: int, label: str,
                 emit: Callable[[str], None] = print) -> None:
        self.names = dict(names)
        self.total = len(names)
        self.skipped = skipped
        self.label = label
        self.emit = emit
        self.started = time.monotonic()
        self.starts: dict[str, float] = {}
        self.durations: dict[str, float] = {}
        self.done = self.failed = 0

    def _cell(self, trial: Any) -> str:
        return trial.config["cell_id"]

    def _line(self, event: str) -> None:
        elapsed = time.monotonic() - self.started
        ended = self.done + self.failed
        remaining = self.total - ended
        eta = _duration(elapsed / ended * remaining) if ended else "?"
        self.emit(f"[grid {self.label}] {ended + self.skipped}/{self.total + self.skipped} done "
                  f"({self.done} finished, {self.failed} failed, {self.skipped} skipped), "
                  f"{len(self.starts)} running | {_duration(elapsed)} elapsed, ETA {eta} | {event}")

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self.starts[self._cell(trial)] = time.monotonic()
        self._line(f"started {self.names[self._cell(trial)]}")

    def on_trial_recover(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self.starts.pop(self._cell(trial), None)
        self._line(f"retrying {self.names[self._cell(trial)]}")

    def _end(self, trial: Any) -> float:
        cell = self._cell(trial)
        seconds = time.monotonic() - self.starts.pop(cell, time.monotonic())
        self.durations[cell] = seconds
        return seconds

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        seconds = self._end(trial)
        self.done += 1
        self._line(f"finished {self.names[self._cell(trial)]} in {seconds:.1f} s")

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        seconds = self._end(trial)
        self.failed += 1
        self._line(f"FAILED {self.names[self._cell(trial)]} after {seconds:.1f} s")


@dataclass(frozen=True)
class _CellContext:
    """What every trial needs besides its cell's config (travels once, through the object store)."""

    storage: str
    tracking_uri: str
    experiment: str
    grid_id: str
    parent_run_id: str
    resources: Resources
    max_failures: int


def _cell_trainable(tune_config: dict[str, Any], *, configs: dict[str, RunConfig], context: _CellContext) -> None:
    """One Tune trial = one cell: in-process (reused actor) or through the cell's TorchTrainer.

    Raises (the trial errors) when the cell fails; its MLflow run has been ended FAILED by then.
    """
    from ray import tune

    from semiseg_platform.cell import run_cell, run_cell_in_process

    config = configs[tune_config["cell_id"]]
    launch = dict(storage=context.storage, tracking=context.tracking_uri, experiment=context.experiment,
                  grid_id=context.grid_id, parent_run_id=context.parent_run_id)
    if context.resources.in_process:
        result = run_cell_in_process(config, **launch)
    else:
        resources = context.resources
        result = run_cell(config, workers=resources.workers, gpus_per_worker=resources.gpus_per_worker,
                          cpus_per_worker=resources.cpus_per_worker, max_failures=context.max_failures,
                          **launch)
    tune.report({"cell_id": config.cell_id, "run_id": result.run_id, "loop_seconds": result.loop_seconds,
                 "cell_wall_seconds": result.wall_seconds,
                 **{key: result.metrics[key] for key in ("miou", "pavpu") if key in result.metrics}})


def _trial_dirname(trial: Any) -> str:
    return f"cell_{trial.config['cell_id']}"


def trial_resources(resources: Resources) -> dict[str, float]:
    """What one cell's Tune trial reserves: the whole device for an in-process cell, a small
    driver for a TorchTrainer cell (whose workers reserve their own)."""
    if resources.in_process:
        return {"CPU": resources.cpus_per_worker, "GPU": resources.gpus_per_worker}
    return {"CPU": DRIVER_CPUS, "GPU": 0.0}


class Submission(NamedTuple):
    """Where one grid or search submission writes (see :func:`open_submission`)."""

    store: Any  # semiseg_platform.storage.Storage
    tracking_uri: str
    experiment_id: str
    client: MlflowClient
    submission_id: str


def open_submission(storage: str | None, tracking_uri: str | None, experiment: str) -> Submission:
    """Check the checkpoint storage (before anything is written), resolve the MLflow store, create
    the experiment if needed and draw the submission's id."""
    from semiseg_platform.storage import parse_storage
    from semiseg_platform.tracking import prepare_experiment, resolve_tracking_uri

    store = parse_storage(storage)
    store.check()
    uri = resolve_tracking_uri(tracking_uri)
    return Submission(store, uri, prepare_experiment(uri, experiment), MlflowClient(uri), uuid.uuid4().hex[:8])


def cells_at_once(resources: Resources, cluster: Mapping[str, float], limit: int | None = None) -> int:
    """How many cells fit the cluster at once (at least 1), capped by ``limit``."""
    if resources.in_process:
        cpu, gpu = resources.cpus_per_worker, resources.gpus_per_worker
    else:
        cpu = DRIVER_CPUS + resources.workers * resources.cpus_per_worker
        gpu = resources.workers * resources.gpus_per_worker
    fits = [int(cluster.get("CPU", 0) // cpu + 1e-9)]
    if gpu:
        fits.append(int(cluster.get("GPU", 0) // gpu + 1e-9))
    count = max(1, min(fits))
    return min(count, limit) if limit else count


def previous_cell_runs(tracking_uri: str, experiment: str, grid: str) -> dict[str, Any]:
    """The newest MLflow run of every cell of grid ``grid`` (by ``cell_id``)."""
    client = MlflowClient(tracking_uri)
    found = client.get_experiment_by_name(experiment)
    if found is None:
        return {}
    runs = search_all_runs(client, [found.experiment_id],
                           f"tags.`{KIND_TAG}` = 'cell' and tags.grid_id = '{grid}'")
    newest: dict[str, Any] = {}
    for run in sorted(runs, key=lambda r: r.info.start_time or 0):
        newest[run.data.tags.get("cell_id", "")] = run
    return newest


def table_layout(spec: GridSpec) -> dict[str, Any]:
    """``build_tables`` arguments for a spec: its datasets, its frameworks and heads in the paper's order."""
    frameworks = [f for f in PAPER_FRAMEWORKS if f in spec.frameworks]
    frameworks += [f for f in spec.frameworks if f not in frameworks]
    heads = [h for h in PAPER_HEADS if h in spec.heads]
    heads += [h for h in spec.heads if h not in heads and h not in ABLATION_HEADS]
    return {"datasets": list(spec.datasets), "frameworks": frameworks, "heads": heads}


def run_grid(
    spec: GridSpec | str | Path, *, tracking_uri: str | None = None, storage: str | None = None,
    tables_dir: str | Path | None = None, emit: Callable[[str], None] = print,
    ray_init: Mapping[str, Any] | None = None,
) -> GridSummary:
    """Run every cell of ``spec`` under Ray Tune; returns the :class:`GridSummary`.

    ``tracking_uri`` / ``storage`` override the spec's (default: ``MLFLOW_TRACKING_URI`` or the
    local store; ``<cwd>/ray_results``). Cells whose run in this grid (same ``grid_id``)
    FINISHED are skipped; the others run, resuming from their last checkpoint. Connects to
    Ray (``RAY_ADDRESS`` / ``ray job submit``) or starts the embedded one (``ray_init``: its
    ``ensure_ray`` arguments). The tables are written to ``tables_dir`` (default: a folder
    next to the storage) and logged as artifacts of the parent run. Never raises for a
    failing cell: see :attr:`GridSummary.ok`.
    """
    from ray import tune

    from semiseg_platform.ray_runtime import ensure_ray
    from semiseg_platform.tables import write_report

    started = time.monotonic()
    spec = spec if isinstance(spec, GridSpec) else load_spec(spec)
    configs = expand(spec)  # validates every cell before anything starts
    gid = grid_id(configs)
    store, uri, experiment_id, client, submission = open_submission(storage or spec.storage,
                                                                    tracking_uri or spec.tracking_uri, spec.experiment)
    names = {c.cell_id: c.cell_name for c in configs}

    previous = previous_cell_runs(uri, spec.experiment, gid)
    outcomes: dict[str, CellOutcome] = {}
    for config in configs:
        run = previous.get(config.cell_id)
        if run is not None and run.info.status == "FINISHED":
            outcomes[config.cell_id] = CellOutcome(config.cell_id, config.cell_name, "skipped",
                                                   f"finished in run {run.info.run_id}", run.info.run_id,
                                                   dict(run.data.metrics))
    to_run = [c for c in configs if c.cell_id not in outcomes]

    parent = client.create_run(experiment_id, run_name=f"grid/{spec.name}", tags={
        KIND_TAG: "grid", "grid_id": gid, SUBMISSION_TAG: submission, SPEC_NAME_TAG: spec.name})
    parent_id = parent.info.run_id
    client.log_text(parent_id, yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=False), "grid/spec.yaml")
    client.log_batch(parent_id, params=[Param("spec_name", spec.name), Param("preset", spec.preset),
                                        Param("cells", str(len(configs))), Param("grid_id", gid)])
    emit(f"[grid {spec.name}] {len(configs)} cells ({len(outcomes)} finished earlier, {len(to_run)} to run); "
         f"grid_id {gid}, parent run {parent_id}")
    concurrency = 0
    with ending_run(client, parent_id) as end:
        if to_run:
            ensure_ray(**dict(ray_init or {}))
            import ray

            concurrency = cells_at_once(spec.resources, ray.cluster_resources(), spec.max_concurrent)
            emit(f"[grid {spec.name}] running {concurrency} cell(s) at once "
                 f"({'in-process, reused actors' if spec.resources.in_process else 'one TorchTrainer per cell'})")
            progress = GridProgress({c.cell_id: c.cell_name for c in to_run}, skipped=len(outcomes),
                                    label=spec.name, emit=emit)
            context = _CellContext(storage=store.uri if store.is_local else (storage or spec.storage),
                                   tracking_uri=uri, experiment=spec.experiment, grid_id=gid,
                                   parent_run_id=parent_id, resources=spec.resources, max_failures=spec.max_failures)
            trainable = tune.with_resources(
                tune.with_parameters(_cell_trainable, configs={c.cell_id: c for c in to_run}, context=context),
                trial_resources(spec.resources))
            tuner = tune.Tuner(
                trainable,
                param_space={"cell_id": tune.grid_search([c.cell_id for c in to_run])},
                tune_config=tune.TuneConfig(max_concurrent_trials=concurrency, reuse_actors=True,
                                            trial_dirname_creator=_trial_dirname),
                run_config=tune.RunConfig(
                    name=f"grid-{spec.name}-{gid}-{submission}", verbose=0, callbacks=[progress],
                    failure_config=tune.FailureConfig(max_failures=spec.max_failures if spec.resources.in_process else 0),
                    **store.ray_arguments()),
            )
            results = tuner.fit()
            for result in results:
                cell_id = result.config["cell_id"]
                metrics = dict(result.metrics or {})
                outcome = CellOutcome(cell_id, names[cell_id], "finished" if result.error is None else "failed",
                                      run_id=metrics.get("run_id"), trial_seconds=progress.durations.get(cell_id),
                                      loop_seconds=metrics.get("loop_seconds"),
                                      metrics={k: metrics[k] for k in ("miou", "pavpu") if k in metrics})
                if result.error is not None:
                    outcome.reason = error_reason(result.error)
                outcomes[cell_id] = outcome
        _reconcile_with_mlflow(outcomes, previous_cell_runs(uri, spec.experiment, gid), configs)
        ordered = [outcomes[c.cell_id] for c in configs]
        summary = GridSummary(spec.name, gid, submission, spec.experiment, uri, parent_id, ordered,
                              time.monotonic() - started, concurrency)
        out = Path(tables_dir) if tables_dir is not None else Path(store.uri if store.is_local else ".") / "tables" / f"{spec.name}-{gid}"
        tables, _ = write_report(uri, spec.experiment, out, grid_id=gid, **table_layout(spec))
        client.log_artifacts(parent_id, str(out), "tables")
        summary.tables_dir, summary.tables_markdown = out, markdown_report(tables)
        summary.wall_seconds = time.monotonic() - started
        _log_summary(client, parent_id, summary)
        end.status = "FINISHED" if summary.ok else "FAILED"
        return summary


def _reconcile_with_mlflow(outcomes: dict[str, CellOutcome], runs: Mapping[str, Any], configs: list[RunConfig]) -> None:
    """MLflow is the record: fill run ids, prefer the run's ``error`` tag as the failure reason,
    and mark cells that never produced a Tune result as failed."""
    for config in configs:
        outcome = outcomes.get(config.cell_id)
        run = runs.get(config.cell_id)
        if outcome is None:
            reason = "no result from Ray Tune"
            if run is not None:
                reason += f"; MLflow run {run.info.run_id} is {run.info.status}"
            outcomes[config.cell_id] = CellOutcome(config.cell_id, config.cell_name, "failed", reason,
                                                   run.info.run_id if run else None)
            continue
        if run is None:
            continue
        outcome.run_id = outcome.run_id or run.info.run_id
        if outcome.status == "failed" and run.data.tags.get("error"):
            outcome.reason = run.data.tags["error"]
        if outcome.status == "finished" and run.info.status != "FINISHED":
            outcome.status, outcome.reason = "failed", f"MLflow run {run.info.run_id} ended {run.info.status}"


def _log_summary(client: MlflowClient, parent_id: str, summary: GridSummary) -> None:
    metrics = {f"cells_{s}": float(len(summary.cells(s))) for s in ("finished", "failed", "skipped")}
    metrics["wall_seconds"] = summary.wall_seconds
    if summary.median_overhead_seconds is not None:
        metrics["median_overhead_seconds"] = summary.median_overhead_seconds
    now = int(time.time() * 1000)
    client.log_batch(parent_id, metrics=[Metric(k, v, now, 0) for k, v in metrics.items()])
    rows = ["cell_id,cell_name,status,run_id,trial_seconds,loop_seconds,reason"]
    for o in summary.outcomes:
        reason = o.reason.replace('"', "'")
        rows.append(f'{o.cell_id},{o.cell_name},{o.status},{o.run_id or ""},{_num(o.trial_seconds)},'
                    f'{_num(o.loop_seconds)},"{reason}"')
    client.log_text(parent_id, "\n".join(rows) + "\n", "grid/cells.csv")
    client.log_text(parent_id, summary.format() + "\n", "grid/summary.txt")


def _num(value: float | None) -> str:
    return "" if value is None else f"{value:.3f}"
