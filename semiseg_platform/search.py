"""Hyper-parameter search: Ray Tune + Optuna (TPE) + ASHA over one framework x dataset x partition.

A :class:`SearchSpec` (YAML) names the cell (framework, dataset, partition, head, preset,
overrides) and a space over dotted :class:`~npsemiseg.config.RunConfig` keys, e.g. the NP
head's memory length Q (``head.options.memory_size``), ``head.options.lambda_kl``, the number
of latent samples T (``head.options.num_samples``), ``head.options.latent_dim`` and
``optim.lr``. :func:`run_search` runs ``num_samples`` trials under Ray Tune:

- Each trial is one cell, reporting its metrics to Tune at every evaluation so ASHA can stop
  it: a single-device cell trains in-process in a reused Tune actor (:class:`EvaluationReporter`);
  a multi-worker cell launches its ``TorchTrainer`` (``semiseg_platform.cell.run_cell``), whose
  workers' reports reach Tune through Ray's ``TuneReportCallback`` (stopping such a trial kills
  its Train run; the driver then ends its MLflow run KILLED). The trial's final result is
  reported after its MLflow run has ended, so a scheduler decision on that last report cannot
  cut the run's own bookkeeping short.
- Suggestions come from :class:`StudySearch`, Ray's ``OptunaSearch`` (seeded TPE) on an
  Optuna study in an RDB storage (SQLite file by default, PostgreSQL on a cluster). Running
  the same spec again loads that study and continues it: more trials, and a configuration
  whose ``cell_id`` the study already evaluated is never trained again (the sampler's
  duplicate proposal is recorded in the study as a FAIL trial tagged ``npsemiseg.duplicate_of``
  and another configuration is asked for).
- Trials stopped by ASHA end their MLflow run KILLED with the tag ``search.stopped = asha``
  (the tables read FINISHED cell runs only) and are told to Optuna as PRUNED (their
  intermediate mIoU values are in the study).

MLflow: a parent run per submission (``npsemiseg.kind = search``, ``grid_id`` = ``search_id``,
``search_id``, ``study_name``, ``submission_id``, ``spec_name``); each trial is the cell run of the
tracking schema, child of the parent, tagged ``search_id`` and ``search.<key>`` for each searched
key (``search.trial`` = the Optuna trial number). The best configuration of the study is
written as a RunConfig YAML (``npsemiseg run --config FILE`` runs it) and logged as the parent's
``search/best_config.yaml``, with ``search/trials.csv`` and the hyper-parameter figure
``figures/hparams.png`` (mIoU against Q, lambda_kl and T, :func:`hparams_figure`).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from mlflow import MlflowClient
from mlflow.entities import Metric, Param, RunTag
from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, PositiveInt, ValidationError, model_validator

from npsemiseg.callbacks import Callbacks
from npsemiseg.config import HEAD_NAMES, RunConfig
from npsemiseg.frameworks import FRAMEWORK_MODULES
from npsemiseg.presets import PRESET_NAMES

from ray.tune import Callback
from ray.tune.integration.ray_train import TuneReportCallback
from ray.tune.search.optuna import OptunaSearch

from semiseg_platform.grid import (Resources, cells_at_once, describe_error, one_of, open_submission, read_spec,
                                   trial_resources)
from semiseg_platform.tracking import (ERROR_TAG, FINAL_METRICS, KIND_TAG, CellKilled, ending_run, error_reason,
                                       find_cell_run)

DEFAULT_EXPERIMENT = "npsemiseg-search"
DEFAULT_OPTUNA_FILE = "optuna.db"
SEARCH_ID_TAG = "search_id"
STUDY_TAG = "study_name"
STOPPED_TAG = "search.stopped"
TRIAL_TAG = "search.trial"
SEARCH_TAG_PREFIX = "search."
#: Optuna user attributes of the study's trials
CELL_ATTR = "npsemiseg.cell_id"
DUPLICATE_ATTR = "npsemiseg.duplicate_of"
#: Key of a trial's last Tune result marking that the cell ran to its end (absent when ASHA stopped it)
FINAL_KEY = "cell_finished"
#: How many duplicate proposals in a row end the search (the space is exhausted or nearly)
MAX_DUPLICATE_PROPOSALS = 50
#: Seconds a reused Tune actor waits for the previous trial's thread to end before giving up on reuse
#: (Tune's default, 2 s, is too short for a stopped trial's MLflow bookkeeping on a loaded machine)
THREAD_TIMEOUT_S = "120"
#: Tune's time attribute for each ``asha.time_attr``
TIME_ATTRS = {"evaluations": "training_iteration", "steps": "step"}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


Scalar = bool | int | float | str
#: ``int`` under another name: inside :class:`Distribution` the field ``int`` shadows the builtin
_Integer = int


class Distribution(_Strict):
    """One searched key: exactly one of ``choice: [values]``, ``uniform: [low, high]``,
    ``loguniform: [low, high]`` (low > 0) or ``int: [low, high]`` (inclusive)."""

    choice: list[Scalar] | None = Field(None, min_length=1)
    uniform: tuple[float, float] | None = None
    loguniform: tuple[float, float] | None = None
    int: tuple[_Integer, _Integer] | None = None  # noqa: A003 - the YAML spelling

    @model_validator(mode="after")
    def _exactly_one(self) -> Distribution:
        given = [name for name in ("choice", "uniform", "loguniform", "int") if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError(f"expected exactly one of choice / uniform / loguniform / int, got {given or 'none'}")
        kind = given[0]
        if kind == "choice":
            if len(set(map(json.dumps, self.choice))) != len(self.choice):
                raise ValueError(f"choice: values must be distinct, got {self.choice}")
            return self
        low, high = getattr(self, kind)
        if not low < high:
            raise ValueError(f"{kind}: expected [low, high] with low < high, got [{low}, {high}]")
        if kind == "loguniform" and low <= 0:
            raise ValueError(f"loguniform: expected low > 0, got {low}")
        return self

    @property
    def kind(self) -> str:
        return next(name for name in ("choice", "uniform", "loguniform", "int") if getattr(self, name) is not None)

    def optuna(self) -> Any:
        """The Optuna distribution."""
        from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

        if self.choice is not None:
            return CategoricalDistribution(self.choice)
        if self.int is not None:
            return IntDistribution(*self.int)
        low, high = self.uniform or self.loguniform
        return FloatDistribution(low, high, log=self.loguniform is not None)

    def representatives(self) -> list[Any]:
        """Values checked when the spec is loaded: every choice, or both bounds."""
        return list(self.choice) if self.choice is not None else list(getattr(self, self.kind))


class Asha(_Strict):
    """ASHA early stopping: rungs at ``grace_period x reduction_factor^k`` up to ``max_t``.

    ``time_attr``: ``evaluations`` (Tune reports, one per evaluation of the cell) or ``steps``
    (training iterations). ``max_t``: the length of a full trial in that unit.
    """

    time_attr: Literal["evaluations", "steps"] = "evaluations"
    grace_period: PositiveInt = 1
    reduction_factor: float = Field(2.0, gt=1.0)
    max_t: PositiveInt

    @model_validator(mode="after")
    def _grace_within_max_t(self) -> Asha:
        if self.grace_period > self.max_t:
            raise ValueError(f"grace_period: expected <= max_t ({self.max_t}), got {self.grace_period}")
        return self


class SearchSpec(_Strict):
    """A search: one cell's preset and overrides, a space, the sampler, ASHA, storage and tracking.

    ``space``: dotted RunConfig key -> :class:`Distribution`. ``points_to_evaluate``: complete
    assignments of the space tried first (a known-good or known-bad configuration).
    ``num_samples``: trials per submission. ``seed``: the TPE sampler's seed (the cell's own
    seed is an override). ``optuna_storage``: Optuna RDB URL (None = ``sqlite:///<cwd>/optuna.db``;
    ``postgresql://...`` on a cluster). ``study_name``: None = ``<name>-<search_id>``.
    ``asha``: null = no early stopping. ``max_concurrent``: None = as many trials as the
    cluster's resources allow.
    """

    name: str = Field(min_length=1)
    experiment: str = DEFAULT_EXPERIMENT
    preset: str = "paper"
    framework: str
    dataset: str
    partition: str
    head: str = "np"
    overrides: dict[str, Any] = Field(default_factory=dict)
    space: dict[str, Distribution] = Field(min_length=1)
    points_to_evaluate: list[dict[str, Any]] = Field(default_factory=list)
    num_samples: PositiveInt = 8
    metric: str = "miou"
    mode: Literal["max", "min"] = "max"
    seed: NonNegativeInt = 0
    n_startup_trials: PositiveInt = 10
    asha: Asha | None = None
    resources: Resources = Field(default_factory=Resources)
    max_concurrent: PositiveInt | None = None
    optuna_storage: str | None = None
    study_name: str | None = None
    tracking_uri: str | None = None
    storage: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _partition_is_a_string(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and isinstance(data.get("partition"), int):
            data = {**data, "partition": str(data["partition"])}
        return data

    @model_validator(mode="after")
    def _known_names(self) -> SearchSpec:
        one_of("preset", self.preset, PRESET_NAMES)
        one_of("framework", self.framework, tuple(FRAMEWORK_MODULES))
        one_of("head", self.head, HEAD_NAMES)
        one_of("metric", self.metric, FINAL_METRICS)
        for index, point in enumerate(self.points_to_evaluate):
            missing = sorted(set(self.space) - set(point))
            unknown = sorted(set(point) - set(self.space))
            if missing or unknown:
                raise ValueError(f"points_to_evaluate[{index}]: expected a value for every key of space; "
                                 f"missing {missing}, not in space {unknown}")
        return self

    def base_config(self) -> RunConfig:
        """The cell before any searched value is applied (the preset, then ``overrides``)."""
        return RunConfig.from_preset(self.preset, framework=self.framework, dataset=self.dataset,
                                     partition=self.partition, head=self.head, **self.overrides)


def load_search_spec(source: str | Path | Mapping[str, Any], *, overrides: Mapping[str, Any] | None = None,
                     **changes: Any) -> SearchSpec:
    """A validated :class:`SearchSpec` from a YAML file or a mapping, with top-level ``changes``
    (e.g. ``dataset=``, ``partition=`` from the command line; None = keep the spec's) and
    ``overrides`` (dotted RunConfig keys, merged over the spec's) applied before validation.

    Also builds the base configuration and one configuration per choice / bound of every
    searched key and per point to evaluate, so a bad key or value fails here, by name.
    Raises ``ValueError`` naming the file and the offending keys.
    """
    data, where = read_spec(source, "search")
    data.update({key: value for key, value in changes.items() if value is not None})
    if overrides:
        data["overrides"] = {**dict(data.get("overrides") or {}), **dict(overrides)}
    try:
        spec = SearchSpec.model_validate(data)
    except ValidationError as error:
        raise ValueError(f"{where} is invalid: {describe_error(error)}") from None
    try:
        base = spec.base_config()
    except (ValueError, TypeError) as error:
        raise ValueError(f"{where}: the cell is invalid: {describe_error(error)}") from None
    for key, distribution in spec.space.items():
        for value in distribution.representatives():
            try:
                base.with_overrides({key: value})
            except (ValueError, TypeError) as error:
                raise ValueError(f"{where}: space.{key} = {value!r} is not a valid setting: {describe_error(error)}") from None
    for index, point in enumerate(spec.points_to_evaluate):
        try:
            base.with_overrides(point)
        except (ValueError, TypeError) as error:
            raise ValueError(f"{where}: points_to_evaluate[{index}] is not a valid setting: {describe_error(error)}") from None
    return spec


def search_id(spec: SearchSpec, base: RunConfig | None = None) -> str:
    """Stable id of a search: hash of the base cell, the space and the objective.

    Re-running a spec keeps it (and so its default study, its MLflow ``grid_id`` and the
    trials' checkpoint names); changing the cell, the space or the metric starts another search.
    """
    base = base or spec.base_config()
    identity = {"cell": base.cell_id, "space": {k: v.model_dump(mode="json", exclude_none=True) for k, v in sorted(spec.space.items())},
                "metric": spec.metric, "mode": spec.mode}
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:12]


def default_optuna_storage() -> str:
    """``$NPSEMISEG_OPTUNA_STORAGE`` (the local stack exports its PostgreSQL URL there), else
    ``sqlite:///<cwd>/optuna.db`` (absolute)."""
    return os.environ.get("NPSEMISEG_OPTUNA_STORAGE") or f"sqlite:///{(Path.cwd() / DEFAULT_OPTUNA_FILE).resolve()}"


# ----------------------------------------------------------------------------- the study
@dataclass(frozen=True)
class CellOfParams:
    """Maps sampled values to the trial's RunConfig and ``cell_id`` (picklable: Tune saves the searcher)."""

    base: RunConfig
    keys: tuple[str, ...]

    def config(self, params: Mapping[str, Any]) -> RunConfig:
        return self.base.with_overrides({key: params[key] for key in self.keys})

    def __call__(self, params: Mapping[str, Any]) -> str:
        return self.config(params).cell_id


@dataclass(frozen=True)
class Evaluated:
    """A configuration the study already evaluated: its Optuna trial number, state and value
    (the last intermediate value of a PRUNED trial)."""

    number: int
    state: str
    value: float | None


def evaluated_cells(study: Any, cell_of: CellOfParams) -> dict[str, Evaluated]:
    """``cell_id -> Evaluated`` for the study's COMPLETE and PRUNED trials over exactly this space."""
    from optuna.trial import TrialState

    out: dict[str, Evaluated] = {}
    for trial in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)):
        if set(trial.params) != set(cell_of.keys):
            continue
        try:
            cell_id = cell_of(trial.params)
        except (ValueError, TypeError):  # a value the current code rejects: not this search's cell
            continue
        if trial.state == TrialState.COMPLETE:
            value = trial.value
        else:
            steps = sorted(trial.intermediate_values)
            value = trial.intermediate_values[steps[-1]] if steps else None
        out.setdefault(cell_id, Evaluated(trial.number, trial.state.name, value))
    return out


def sampler_seed(seed: int, trials_in_study: int) -> int:
    """The TPE seed of one submission: ``seed`` for a new study, else derived from the study's size,
    so a continued study draws new values instead of replaying the first submission's."""
    if trials_in_study == 0:
        return seed
    digest = hashlib.sha256(f"{seed}:{trials_in_study}".encode()).digest()
    return int.from_bytes(digest[:4], "little")


class StudySearch(OptunaSearch):
    """``OptunaSearch`` that never proposes a cell the study already evaluated (or that is running),
    tells trials stopped by the scheduler as PRUNED, and records each trial's ``cell_id``.

    Uses ``OptunaSearch``'s ``_ot_study`` / ``_ot_trials`` (Ray 2.60) to re-ask after a duplicate.
    """

    def __init__(self, *, cell_of: CellOfParams, evaluated: Mapping[str, Evaluated], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.cell_of = cell_of
        self.evaluated = dict(evaluated)
        self.running: dict[str, str] = {}  # cell_id -> Tune trial id
        self.cells: dict[str, str] = {}  # Tune trial id -> cell_id
        self.numbers: dict[str, int] = {}  # Tune trial id -> Optuna trial number
        self.duplicates = 0

    def suggest(self, trial_id: str) -> dict | None:
        from optuna.trial import TrialState

        for _ in range(MAX_DUPLICATE_PROPOSALS):
            config = super().suggest(trial_id)
            if not isinstance(config, dict):
                return config
            params = {key: config[key] for key in self.cell_of.keys}
            cell_id = self.cell_of(params)
            ot_trial = self._ot_trials[trial_id]
            ot_trial.set_user_attr(CELL_ATTR, cell_id)
            known = self.evaluated.get(cell_id)
            if known is None and cell_id not in self.running:
                self.running[cell_id] = trial_id
                self.cells[trial_id] = cell_id
                self.numbers[trial_id] = ot_trial.number
                return {**config, "cell_id": cell_id, "optuna_trial": ot_trial.number}
            # already evaluated (or being evaluated): record the proposal, never train the cell twice
            original = f"trial {known.number}" if known is not None else f"Tune trial {self.running[cell_id]}"
            ot_trial.set_user_attr(DUPLICATE_ATTR, f"{cell_id} ({original})")
            self._ot_study.tell(ot_trial, state=TrialState.FAIL)
            del self._ot_trials[trial_id]
            self.duplicates += 1
        return OptunaSearch.FINISHED

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        if self.metric in result and trial_id in self._ot_trials:
            super().on_trial_result(trial_id, result)

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        if trial_id not in self._ot_trials:
            return
        cell_id = self.cells.get(trial_id)
        self.running.pop(cell_id, None)
        if error or not result or result.get(FINAL_KEY):
            super().on_trial_complete(trial_id, result, error)
        else:  # stopped by the scheduler before the cell's end: PRUNED, with its intermediate values
            from optuna.trial import TrialState

            self._ot_study.tell(self._ot_trials[trial_id], state=TrialState.PRUNED)
            self._completed_trials.add(trial_id)
        if cell_id is not None and not error:
            value = (result or {}).get(self.metric)
            self.evaluated[cell_id] = Evaluated(self.numbers.get(trial_id, -1), "COMPLETE" if (result or {}).get(FINAL_KEY)
                                                else "PRUNED", value)


# ----------------------------------------------------------------------------- one trial
class EvaluationReporter(Callbacks):
    """Reports every evaluation before the last to Tune (``ray.tune.report``), so ASHA can stop the trial.

    Tune stops a function trainable by raising ``SystemExit`` inside ``report``; that becomes
    :class:`~semiseg_platform.tracking.CellKilled` here, so the cell's run ends KILLED with
    the reason in its ``error`` tag. ``stopped_after`` then holds the evaluation count.
    """

    def __init__(self) -> None:
        self.total_steps = 0
        self.evaluations = 0
        self.stopped_after: int | None = None

    def on_start(self, config, *, total_steps, start_step, rank, world_size) -> None:
        self.total_steps = total_steps

    def on_evaluation(self, step: int, metrics: dict[str, float]) -> None:
        if step >= self.total_steps:
            return
        from ray import tune

        self.evaluations += 1
        try:
            tune.report({**metrics, "step": step})
        except SystemExit:
            self.stopped_after = self.evaluations
            raise CellKilled(f"stopped early by the ASHA scheduler after evaluation {self.evaluations} "
                             f"(step {step})") from None


class EvaluationsToTune(TuneReportCallback):
    """Ray Train callback of a multi-worker trial: passes the workers' evaluation reports (those
    without a checkpoint) on to Tune, so ASHA can stop the trial. Checkpoint reports stay Train's:
    the cell's final result reaches Tune from the trial once the cell's MLflow run has ended."""

    def after_report(self, run_context: Any, metrics: list[dict[str, Any]], checkpoint: Any) -> None:
        if checkpoint is None:
            super().after_report(run_context, metrics, checkpoint)


@dataclass(frozen=True)
class _TrialContext:
    """What every trial needs besides its sampled values (travels once, through the object store)."""

    cell_of: CellOfParams
    search_id: str
    storage: str
    tracking_uri: str
    experiment: str
    parent_run_id: str
    resources: Resources


def tag_trial_run(client: MlflowClient, run_id: str, *, search: str, params: Mapping[str, Any], trial: int | None,
                  stopped_after: int | None = None) -> None:
    """Tag a trial's cell run: ``search_id``, ``search.<key>``, ``search.trial``; a trial stopped by
    ASHA also gets ``search.stopped = asha`` and ends KILLED (idempotent: the trial and the driver
    both call it)."""
    tags = [RunTag(SEARCH_ID_TAG, search)] + [RunTag(f"{SEARCH_TAG_PREFIX}{k}", str(v)) for k, v in params.items()]
    if trial is not None:
        tags.append(RunTag(TRIAL_TAG, str(trial)))
    if stopped_after is not None:
        tags.append(RunTag(STOPPED_TAG, "asha"))
        tags.append(RunTag("search.stopped_after_evaluation", str(stopped_after)))
    client.log_batch(run_id, tags=tags)
    if stopped_after is not None:
        run = client.get_run(run_id)
        if ERROR_TAG not in run.data.tags:
            client.set_tag(run_id, ERROR_TAG, f"stopped early by the ASHA scheduler after evaluation {stopped_after}")
        if run.info.status != "KILLED":
            client.set_terminated(run_id, status="KILLED")


def _search_trial(tune_config: dict[str, Any], *, context: _TrialContext) -> None:
    """One Tune trial = one cell with the sampled values; its final result is reported after its run ended."""
    from ray import tune

    from semiseg_platform.cell import run_cell, run_cell_in_process
    from semiseg_platform.tracking import prepare_experiment

    # read by this actor's reset_config() before it is reused for the next trial
    os.environ.setdefault("TUNE_FUNCTION_THREAD_TIMEOUT_S", THREAD_TIMEOUT_S)
    params = {key: tune_config[key] for key in context.cell_of.keys}
    config = context.cell_of.config(params)
    trial = tune_config.get("optuna_trial")
    client = MlflowClient(context.tracking_uri)
    launch = dict(storage=context.storage, tracking=context.tracking_uri, experiment=context.experiment,
                  grid_id=context.search_id, parent_run_id=context.parent_run_id)
    if context.resources.in_process:
        reporter = EvaluationReporter()
        try:
            result = run_cell_in_process(config, callbacks=[reporter], **launch)
        except CellKilled:
            if reporter.stopped_after is None:
                raise
            run = find_cell_run(client, prepare_experiment(context.tracking_uri, context.experiment),
                                config.cell_id, context.search_id)
            if run is not None:
                tag_trial_run(client, run.info.run_id, search=context.search_id, params=params, trial=trial,
                              stopped_after=reporter.stopped_after)
            # end the trial as Tune's stop asked; a normal return would make Tune's wrapper report
            # once more and wait for a resume that never comes (the actor could not be reused)
            raise SystemExit(0)
    else:
        resources = context.resources
        result = run_cell(config, workers=resources.workers, gpus_per_worker=resources.gpus_per_worker,
                          cpus_per_worker=resources.cpus_per_worker, train_callbacks=[EvaluationsToTune()], **launch)
    tag_trial_run(client, result.run_id, search=context.search_id, params=params, trial=trial)
    tune.report({**result.metrics, "step": result.steps, FINAL_KEY: 1.0, "run_id": result.run_id,
                 "cell_id": config.cell_id, "loop_seconds": result.loop_seconds})


# ----------------------------------------------------------------------------- the driver
@dataclass
class TrialOutcome:
    """One trial of a submission: ``finished`` | ``stopped`` (by ASHA) | ``failed``."""

    cell_id: str
    params: dict[str, Any]
    status: str
    optuna_trial: int | None = None
    run_id: str | None = None
    value: float | None = None
    evaluations: int = 0
    reason: str = ""


@dataclass
class SearchSummary:
    """The result of :func:`run_search`."""

    spec_name: str
    search_id: str
    study_name: str
    optuna_storage: str
    submission_id: str
    experiment: str
    tracking_uri: str
    parent_run_id: str
    metric: str
    trials: list[TrialOutcome]
    study_trials: int
    duplicates: int
    wall_seconds: float
    concurrency: int
    best_value: float | None = None
    best_params: dict[str, Any] = field(default_factory=dict)
    best_config_path: Path | None = None
    figure_path: Path | None = None

    def count(self, status: str) -> int:
        return sum(t.status == status for t in self.trials)

    @property
    def ok(self) -> bool:
        """True when the study has a best configuration (at least one trial ran to its end)."""
        return self.best_config_path is not None

    def format(self) -> str:
        lines = [
            f"search {self.spec_name} ({self.search_id}), submission {self.submission_id}: {len(self.trials)} trials: "
            f"{self.count('finished')} finished, {self.count('stopped')} stopped by ASHA, {self.count('failed')} failed; "
            f"{self.duplicates} duplicate proposal(s) skipped",
            f"Optuna study {self.study_name!r} ({self.optuna_storage}): {self.study_trials} trials in all",
            f"wall {self.wall_seconds:.1f} s, {self.concurrency} trial(s) at once",
            f"MLflow: experiment {self.experiment!r}, parent run {self.parent_run_id} ({self.tracking_uri})",
        ]
        for trial in self.trials:
            if trial.status == "failed":
                lines.append(f"  FAILED trial {trial.optuna_trial} {trial.params}: {trial.reason}")
        if self.best_value is not None:
            lines.append(f"best {self.metric} {self.best_value:.4f} with {self.best_params}")
            lines.append(f"best configuration: {self.best_config_path} (npsemiseg run --config FILE)")
        if self.figure_path is not None:
            lines.append(f"figure: {self.figure_path}")
        return "\n".join(lines)


class SearchProgress(Callback):
    """Tune callback printing one line per started / finished / stopped / failed trial."""

    def __init__(self, label: str, total: int, emit: Callable[[str], None] = print) -> None:
        self.label, self.total, self.emit = label, total, emit
        self.started = time.monotonic()
        self.counts = {"finished": 0, "stopped": 0, "failed": 0}

    def _line(self, trial: Any, event: str) -> None:
        done = sum(self.counts.values())
        values = {k: v for k, v in trial.config.items() if k not in ("cell_id", "optuna_trial")}
        self.emit(f"[search {self.label}] {done}/{self.total} done ({self.counts['finished']} finished, "
                  f"{self.counts['stopped']} stopped, {self.counts['failed']} failed) | "
                  f"{time.monotonic() - self.started:.0f} s | {event} trial {trial.config.get('optuna_trial')} {values}")

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._line(trial, "started")

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        result = trial.last_result or {}
        status = "finished" if result.get(FINAL_KEY) else "stopped"
        self.counts[status] += 1
        self._line(trial, f"{status} ({result.get('miou', float('nan')):.4f} miou)" if status == "finished" else status)

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self.counts["failed"] += 1
        self._line(trial, "FAILED")


def _trial_dirname(trial: Any) -> str:
    return f"trial_{trial.config.get('optuna_trial')}_{trial.config.get('cell_id')}"


def run_search(
    spec: SearchSpec | str | Path, *, tracking_uri: str | None = None, storage: str | None = None,
    optuna_storage: str | None = None, out_dir: str | Path | None = None, emit: Callable[[str], None] = print,
    ray_init: Mapping[str, Any] | None = None,
) -> SearchSummary:
    """Run ``spec.num_samples`` more trials of the search's Optuna study under Ray Tune.

    ``tracking_uri`` / ``storage`` / ``optuna_storage`` override the spec's (defaults:
    ``MLFLOW_TRACKING_URI`` or ``./mlruns.db``; ``./ray_results``; ``./optuna.db``). ``out_dir``:
    where ``best_config.yaml``, ``trials.csv`` and ``hparams.png`` go (default
    ``<storage>/search/<name>-<search_id>``). Never raises for a failing trial: see
    :attr:`SearchSummary.ok` and the counts.
    """
    import optuna
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler

    from semiseg_platform.ray_runtime import ensure_ray

    started = time.monotonic()
    spec = spec if isinstance(spec, SearchSpec) else load_search_spec(spec)
    base = spec.base_config()
    sid = search_id(spec, base)
    cell_of = CellOfParams(base, tuple(spec.space))
    store, uri, experiment_id, client, submission = open_submission(storage or spec.storage,
                                                                    tracking_uri or spec.tracking_uri, spec.experiment)
    study_name = spec.study_name or f"{spec.name}-{sid}"
    optuna_url = optuna_storage or spec.optuna_storage or default_optuna_storage()
    rdb = optuna.storages.RDBStorage(optuna_url)
    direction = "maximize" if spec.mode == "max" else "minimize"
    study = optuna.create_study(storage=rdb, study_name=study_name, direction=direction, load_if_exists=True)
    if study.direction.name.lower() != direction:
        raise ValueError(f"study_name: study {study_name!r} in {optuna_url} is {study.direction.name.lower()}d, "
                         f"the spec asks mode {spec.mode!r}")
    before = len(study.trials)
    evaluated = evaluated_cells(study, cell_of)
    points = [p for p in spec.points_to_evaluate if cell_of(p) not in evaluated]
    out = Path(out_dir) if out_dir is not None else Path(store.uri if store.is_local else ".") / "search" / f"{spec.name}-{sid}"

    parent = client.create_run(experiment_id, run_name=f"search/{spec.name}", tags={
        KIND_TAG: "search", "grid_id": sid, SEARCH_ID_TAG: sid, STUDY_TAG: study_name, "submission_id": submission,
        "spec_name": spec.name, "framework": base.framework, "dataset": base.dataset, "partition": base.partition,
        "head": base.head.variant})
    parent_id = parent.info.run_id
    client.log_text(parent_id, yaml.safe_dump(spec.model_dump(mode="json", exclude_none=True), sort_keys=False),
                    "search/spec.yaml")
    client.log_batch(parent_id, params=[Param("spec_name", spec.name), Param("num_samples", str(spec.num_samples)),
                                        Param("metric", spec.metric), Param("mode", spec.mode), Param("seed", str(spec.seed)),
                                        Param("space", json.dumps(sorted(spec.space))), Param("search_id", sid)])
    emit(f"[search {spec.name}] search_id {sid}, study {study_name!r} ({before} trials so far, {len(evaluated)} "
         f"configurations evaluated), {spec.num_samples} new trial(s); parent run {parent_id}")
    with ending_run(client, parent_id):
        ensure_ray(**dict(ray_init or {}))
        import ray

        concurrency = cells_at_once(spec.resources, ray.cluster_resources(), spec.max_concurrent)
        searcher = StudySearch(
            cell_of=cell_of, evaluated=evaluated,
            space={key: d.optuna() for key, d in spec.space.items()}, metric=spec.metric, mode=spec.mode,
            points_to_evaluate=points or None, study_name=study_name, storage=rdb,
            sampler=optuna.samplers.TPESampler(seed=sampler_seed(spec.seed, before), n_startup_trials=spec.n_startup_trials),
        )
        if spec.asha is not None:
            scheduler = ASHAScheduler(time_attr=TIME_ATTRS[spec.asha.time_attr], metric=spec.metric, mode=spec.mode,
                                      max_t=spec.asha.max_t, grace_period=spec.asha.grace_period,
                                      reduction_factor=spec.asha.reduction_factor)
        else:
            scheduler = FIFOScheduler()
        context = _TrialContext(cell_of=cell_of, search_id=sid, storage=store.uri if store.is_local else (storage or spec.storage),
                                tracking_uri=uri, experiment=spec.experiment, parent_run_id=parent_id,
                                resources=spec.resources)
        progress = SearchProgress(spec.name, spec.num_samples, emit)
        tuner = tune.Tuner(
            tune.with_resources(tune.with_parameters(_search_trial, context=context), trial_resources(spec.resources)),
            tune_config=tune.TuneConfig(search_alg=searcher, scheduler=scheduler, num_samples=spec.num_samples,
                                        max_concurrent_trials=concurrency, reuse_actors=spec.resources.in_process,
                                        trial_dirname_creator=_trial_dirname),
            run_config=tune.RunConfig(name=f"search-{spec.name}-{sid}-{submission}", verbose=0, callbacks=[progress],
                                      **store.ray_arguments()),
        )
        results = tuner.fit()
        trials = [_outcome(result, spec) for result in results]
        _reconcile_trials(client, experiment_id, sid, trials)
        summary = SearchSummary(spec.name, sid, study_name, _redacted(optuna_url), submission, spec.experiment, uri,
                                parent_id, spec.metric, trials, len(study.trials), searcher.duplicates,
                                time.monotonic() - started, concurrency)
        _write_outputs(client, parent_id, summary, study, cell_of, out)
        summary.wall_seconds = time.monotonic() - started
        _log_summary(client, parent_id, summary)
        return summary


def _redacted(url: str) -> str:
    """A storage URL without its password (for logs and tags)."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    if parts.password:
        netloc = f"{parts.username}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
        return urlunsplit(parts._replace(netloc=netloc))
    return url


def _outcome(result: Any, spec: SearchSpec) -> TrialOutcome:
    config = dict(result.config or {})
    metrics = dict(result.metrics or {})
    params = {key: config.get(key) for key in spec.space}
    if result.error is not None:
        status = "failed"
    else:
        status = "finished" if metrics.get(FINAL_KEY) else "stopped"
    return TrialOutcome(cell_id=config.get("cell_id", ""), params=params, status=status,
                        optuna_trial=config.get("optuna_trial"), run_id=metrics.get("run_id"),
                        value=metrics.get(spec.metric), evaluations=int(metrics.get("training_iteration", 0) or 0),
                        reason=error_reason(result.error) if result.error is not None else "")


def _reconcile_trials(client: MlflowClient, experiment_id: str, sid: str, trials: list[TrialOutcome]) -> None:
    """MLflow is the record: every trial's cell run gets its search tags; a stopped trial's run ends
    KILLED with ``search.stopped = asha`` even when its actor was torn down before it could say so."""
    for trial in trials:
        run = find_cell_run(client, experiment_id, trial.cell_id, sid) if trial.cell_id else None
        if run is None:
            continue
        trial.run_id = trial.run_id or run.info.run_id
        if trial.status == "stopped":
            tag_trial_run(client, run.info.run_id, search=sid, params=trial.params, trial=trial.optuna_trial,
                          stopped_after=int(run.data.tags.get("search.stopped_after_evaluation", trial.evaluations)))
        else:
            tag_trial_run(client, run.info.run_id, search=sid, params=trial.params, trial=trial.optuna_trial)
            if trial.status == "failed" and run.data.tags.get(ERROR_TAG):
                trial.reason = run.data.tags[ERROR_TAG]


def best_config(study: Any, cell_of: CellOfParams) -> tuple[RunConfig, Any] | None:
    """The configuration of the study's best COMPLETE trial over this space, with that trial (None if none)."""
    from optuna.trial import TrialState

    complete = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                if set(t.params) == set(cell_of.keys) and t.value is not None and math.isfinite(t.value)]
    if not complete:
        return None
    pick = max if study.direction.name == "MAXIMIZE" else min
    trial = pick(complete, key=lambda t: t.value)
    return cell_of.config(trial.params), trial


def _write_outputs(client: MlflowClient, parent_id: str, summary: SearchSummary, study: Any, cell_of: CellOfParams,
                   out: Path) -> None:
    """``best_config.yaml``, ``trials.csv`` and ``hparams.png`` into ``out``, logged on the parent run."""
    out.mkdir(parents=True, exist_ok=True)
    found = best_config(study, cell_of)
    if found is not None:
        config, trial = found
        path = out / "best_config.yaml"
        header = (f"# best configuration of search {summary.spec_name} ({summary.search_id}): Optuna trial {trial.number}, "
                  f"{summary.metric} {trial.value:.6f}\n# run it with: npsemiseg run --config {path.name}\n")
        path.write_text(header + config.to_yaml())
        client.log_artifact(parent_id, str(path), "search")
        summary.best_value, summary.best_params, summary.best_config_path = trial.value, dict(trial.params), path
        client.set_tag(parent_id, "best_cell_id", config.cell_id)
    rows = ["optuna_trial,cell_id,status,value,evaluations,run_id," + ",".join(cell_of.keys) + ",reason"]
    for t in summary.trials:
        reason = t.reason.replace('"', "'")
        rows.append(f"{t.optuna_trial},{t.cell_id},{t.status},{'' if t.value is None else t.value},{t.evaluations},"
                    f"{t.run_id or ''}," + ",".join(str(t.params.get(k)) for k in cell_of.keys) + f',"{reason}"')
    (out / "trials.csv").write_text("\n".join(rows) + "\n")
    client.log_artifact(parent_id, str(out / "trials.csv"), "search")
    summary.figure_path = write_hparams_figure(summary.tracking_uri, summary.experiment, out, search=summary.search_id)
    if summary.figure_path is not None:
        client.log_artifact(parent_id, str(summary.figure_path), "figures")


def _log_summary(client: MlflowClient, parent_id: str, summary: SearchSummary) -> None:
    metrics = {f"trials_{s}": float(summary.count(s)) for s in ("finished", "stopped", "failed")}
    metrics.update(duplicates=float(summary.duplicates), study_trials=float(summary.study_trials),
                   wall_seconds=summary.wall_seconds)
    if summary.best_value is not None:
        metrics[f"best_{summary.metric}"] = float(summary.best_value)
    now = int(time.time() * 1000)
    client.log_batch(parent_id, metrics=[Metric(k, v, now, 0) for k, v in metrics.items()])
    client.log_text(parent_id, summary.format() + "\n", "search/summary.txt")


# ----------------------------------------------------------------------------- the figure
#: The paper's hyper-parameter figure: panel title per searched key (Appendix, "Hyper-parameter Exploration")
PAPER_PANELS: dict[str, str] = {
    "head.options.memory_size": "(a) memory length Q",
    "head.options.lambda_kl": "(b) lambda_kl",
    "head.options.num_samples": "(c) latent samples T",
}


def load_search_trials(tracking_uri: str, experiment: str, *, search: str | None = None,
                       keys: Sequence[str] = tuple(PAPER_PANELS), metric: str = "miou") -> list[dict[str, Any]]:
    """The FINISHED trial runs of the searches in ``experiment`` (cell runs tagged ``search_id``;
    only ``search`` when given) as ``{dataset, partition, framework, head, search_id, metric, <key>...}``.

    Values of ``keys`` come from the run's params (``config.flat()``), so a key that a search did
    not vary still has the value it ran with.
    """
    from semiseg_platform.tables import search_all_runs

    client = MlflowClient(tracking_uri)
    found = client.get_experiment_by_name(experiment)
    if found is None:
        return []
    filter_string = f"tags.`{KIND_TAG}` = 'cell' and attributes.status = 'FINISHED'"
    filter_string += f" and tags.{SEARCH_ID_TAG} = '{search}'" if search else f" and tags.{SEARCH_ID_TAG} != ''"
    rows = []
    for run in search_all_runs(client, [found.experiment_id], filter_string):
        if metric not in run.data.metrics or STOPPED_TAG in run.data.tags:
            continue
        tags, params = run.data.tags, run.data.params
        row = {k: tags.get(k, "") for k in ("dataset", "partition", "framework", "head", SEARCH_ID_TAG)}
        row["metric"] = float(run.data.metrics[metric])
        for key in keys:
            row[key] = _number(params.get(key))
        rows.append(row)
    return rows


def _number(text: str | None) -> float | None:
    try:
        value = float(json.loads(text)) if text is not None else None
    except (ValueError, TypeError):
        return None
    return value if value is not None and math.isfinite(value) else None


def profile(xs: Sequence[float], ys: Sequence[float], *, aggregate: Literal["max", "mean"] = "max",
            max_points: int = 8) -> tuple[list[float], list[float]]:
    """``y`` per value of ``x`` (best or mean), sorted by ``x``; more than ``max_points`` distinct
    values (a continuous parameter such as lambda_kl) are binned on a log scale (linear when some
    value is <= 0), each bin plotted at the geometric (arithmetic) mean of its values."""
    pairs = sorted((float(x), float(y)) for x, y in zip(xs, ys) if x is not None)
    if not pairs:
        return [], []
    groups: dict[Any, list[tuple[float, float]]] = {}
    if len({x for x, _ in pairs}) <= max_points:
        for x, y in pairs:
            groups.setdefault(x, []).append((x, y))
    else:
        log = pairs[0][0] > 0
        scale = (lambda v: math.log(v)) if log else (lambda v: v)
        low, high = scale(pairs[0][0]), scale(pairs[-1][0])
        width = (high - low) / max_points
        for x, y in pairs:
            groups.setdefault(min(int((scale(x) - low) / width), max_points - 1), []).append((x, y))
    out_x, out_y = [], []
    for members in (groups[k] for k in sorted(groups)):
        xs_ = [x for x, _ in members]
        ys_ = [y for _, y in members]
        if len(set(xs_)) == 1:
            centre = xs_[0]
        elif all(x > 0 for x in xs_):
            centre = math.exp(sum(math.log(x) for x in xs_) / len(xs_))
        else:
            centre = sum(xs_) / len(xs_)
        out_x.append(centre)
        out_y.append(max(ys_) if aggregate == "max" else sum(ys_) / len(ys_))
    return out_x, out_y


def hparams_figure(tracking_uri: str, experiment: str, *, search: str | None = None,
                   panels: Mapping[str, str] = PAPER_PANELS, metric: str = "miou",
                   aggregate: Literal["max", "mean"] = "max", scale: float = 100.0) -> Any:
    """The paper's hyper-parameter figure from MLflow: one panel per key (mIoU against Q, lambda_kl, T),
    one line per dataset x partition, ``aggregate`` of the FINISHED trials at each value (x ``scale``).

    Returns a matplotlib ``Figure`` (``tables.line_panels``), or None when no finished trial exists.
    """
    from semiseg_platform.tables import dataset_label, line_panels, protocol_partitions

    rows = load_search_trials(tracking_uri, experiment, search=search, keys=tuple(panels), metric=metric)
    if not rows:
        return None
    series_of: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in rows:
        series_of.setdefault((row["dataset"], row["partition"]), []).append(row)
    data: dict[str, dict[str, tuple[list[float], list[float]]]] = {}
    for key, title in panels.items():
        for (dataset, partition), members in sorted(series_of.items()):
            xs, ys = profile([m[key] for m in members], [m["metric"] * scale for m in members], aggregate=aggregate)
            if xs:
                labels = dict(protocol_partitions(dataset)) if dataset else {}
                data.setdefault(title, {})[f"{dataset_label(dataset)} {labels.get(partition, partition)}"] = (xs, ys)
    if not data:
        return None
    return line_panels(data, xlabel="value (log scale)", ylabel=f"{metric} ({aggregate}, x{scale:g})",
                       title="mIoU under different hyper-parameter settings", logx=True)


def write_hparams_figure(tracking_uri: str, experiment: str, out_dir: str | Path, *, search: str | None = None,
                         aggregate: Literal["max", "mean"] = "max") -> Path | None:
    """Write ``hparams.png`` into ``out_dir``; returns its path, or None when no finished trial exists."""
    figure = hparams_figure(tracking_uri, experiment, search=search, aggregate=aggregate)
    if figure is None:
        return None
    path = Path(out_dir) / "hparams.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    return path
