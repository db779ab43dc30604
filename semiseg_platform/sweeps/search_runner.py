"""Hyper-parameter search: Ray Tune + Optuna (TPE) + ASHA over one framework x dataset x partition.

A :class:`SearchSpec` (YAML) names the cell (framework, dataset, partition, head, preset,
overrides) and a space over dotted :class:`~npsemiseg.config.RunConfig` keys, e.g. the NP
head's memory length Q (``head.options.memory_size``), ``head.options.lambda_kl``, the number
of latent samples T at training (``head.options.training_samples``), ``head.options.latent_dim`` and
``optim.lr``. :func:`run_search` runs ``trials`` trials under Ray Tune:

- Each trial is one cell, reporting its metrics to Tune at every evaluation so ASHA can stop
  it: a single-device cell trains in-process in a reused Tune actor (:class:`EvaluationReporter`);
  a multi-worker cell launches its ``TorchTrainer`` (``semiseg_platform.launch.run_cell``), whose
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

MLflow: a parent run per submission (``npsemiseg.kind = search``, ``search_id``
(stores written before it was the search's own tag also carry ``grid_id`` = ``search_id``),
``study_name``, ``submission_id``, ``spec_name``); each trial is the cell run of the
tracking schema, child of the parent, tagged ``search_id`` (and
``grid_id`` in old stores) and ``search.<key>`` for each searched
key (``search.trial`` = the Optuna trial number). The best configuration of the study is
written as a RunConfig YAML (``npsemiseg run --config FILE`` runs it) and logged as the parent's
``search/best_config.yaml``, with ``search/trials.csv`` and the hyper-parameter figure
``figures/hparams.png`` (mIoU against Q, lambda_kl and T, ``reports.hparams_figure``).
The spec lives in :mod:`.search_spec`, the Optuna side in :mod:`.search_study`; what grid and search
share in :mod:`.submission`.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import optuna
from mlflow import MlflowClient
from mlflow.entities import RunTag
from ray import tune
from ray.tune.integration.ray_train import TuneReportCallback
from ray.tune.schedulers import ASHAScheduler, FIFOScheduler

from npsemiseg.callbacks import Callbacks
from npsemiseg.config import RunConfig
from semiseg_platform.preflight import RESOURCE_TIMEOUT_S
from semiseg_platform.reports import write_hparams_figure
from semiseg_platform.sweeps.search_spec import SearchSpec, default_optuna_storage, load_search_spec, search_id
from semiseg_platform.sweeps.search_study import FINAL_KEY, CellOfParams, StudySearch, best_config, evaluated_cells, sampler_seed
from semiseg_platform.sweeps.submission import (
    Outcome,
    Submission,
    SweepContext,
    SweepProgress,
    csv_text,
    fit,
    log_line,
    log_summary,
    open_parent,
    open_submission,
    reconcile,
    start_ray,
    trial_dirname,
)
from semiseg_platform.tracking import CellKilled, ending_run, error_reason, find_cell_run, mlflow_names, prepare_experiment

__all__ = ["SearchSummary", "TrialOutcome", "run_search"]

#: Seconds a reused Tune actor waits for the previous trial's thread to end before giving up on reuse
#: (Tune's default, 2 s, is too short for a stopped trial's MLflow bookkeeping on a loaded machine)
THREAD_TIMEOUT_S = "120"
#: Tune's time attribute for each ``asha.time_attr``
TIME_ATTRS = {"evaluations": "training_iteration", "steps": "step"}


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


def tag_trial_run(client: MlflowClient, run_id: str, *, search: str, params: Mapping[str, Any], trial: int | None,
                  stopped_after: int | None = None) -> None:
    """Tag a trial's cell run: ``search_id``, ``search.<key>``, ``search.trial``; a trial stopped by
    ASHA also gets ``search.stopped = asha`` and ends KILLED (idempotent: the trial and the driver
    both call it)."""
    tags = [RunTag(mlflow_names.SEARCH_ID, search)]
    tags += [RunTag(f"{mlflow_names.SEARCH_PREFIX}{k}", str(v)) for k, v in params.items()]
    if trial is not None:
        tags.append(RunTag(mlflow_names.SEARCH_TRIAL, str(trial)))
    if stopped_after is not None:
        tags.append(RunTag(mlflow_names.SEARCH_STOPPED, "asha"))
        tags.append(RunTag(mlflow_names.SEARCH_STOPPED_AFTER, str(stopped_after)))
    client.log_batch(run_id, tags=tags)
    if stopped_after is not None:
        run = client.get_run(run_id)
        if mlflow_names.ERROR not in run.data.tags:
            client.set_tag(run_id, mlflow_names.ERROR, f"stopped early by the ASHA scheduler after evaluation {stopped_after}")
        if run.info.status != "KILLED":
            client.set_terminated(run_id, status="KILLED")


def _search_trial(tune_config: dict[str, Any], *, cell_of: CellOfParams, context: SweepContext) -> None:
    """One Tune trial = one cell with the sampled values; its final result is reported after its run ended."""
    # read by this actor's reset_config() before it is reused for the next trial
    os.environ.setdefault("TUNE_FUNCTION_THREAD_TIMEOUT_S", THREAD_TIMEOUT_S)
    params = {key: tune_config[key] for key in cell_of.keys}
    config = cell_of.config(params)
    trial = tune_config.get("optuna_trial")
    client = MlflowClient(context.tracking_uri)
    reporter = EvaluationReporter()
    try:
        result = context.launch(config, callbacks=[reporter], train_callbacks=[EvaluationsToTune()])
    except CellKilled:
        if reporter.stopped_after is None:
            raise
        run = find_cell_run(client, prepare_experiment(context.tracking_uri, context.experiment),
                            config.cell_id, context.sweep_id)
        if run is not None:
            tag_trial_run(client, run.info.run_id, search=context.sweep_id, params=params, trial=trial,
                          stopped_after=reporter.stopped_after)
        # end the trial as Tune's stop asked; a normal return would make Tune's wrapper report
        # once more and wait for a resume that never comes (the actor could not be reused)
        raise SystemExit(0) from None
    tag_trial_run(client, result.run_id, search=context.sweep_id, params=params, trial=trial)
    tune.report({**result.metrics, "step": result.steps, FINAL_KEY: 1.0, "run_id": result.run_id,
                 "cell_id": config.cell_id, "loop_seconds": result.loop_seconds})


# ----------------------------------------------------------------------------- the driver
@dataclass
class TrialOutcome(Outcome):
    """One trial of a submission: ``finished`` | ``stopped`` (by ASHA) | ``failed``."""

    params: dict[str, Any] = field(default_factory=dict)
    optuna_trial: int | None = None
    value: float | None = None
    evaluations: int = 0


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


class SearchProgress(SweepProgress):
    """Tune callback logging one line per started / finished / stopped / failed trial."""

    def __init__(self, label: str, total: int, emit: Callable[[str], None] = log_line) -> None:
        super().__init__(emit)
        self.label, self.total = label, total
        self.counts = {"finished": 0, "stopped": 0, "failed": 0}

    def line(self, trial: Any, event: str, seconds: float | None) -> str:
        if event == "finished":
            result = trial.last_result or {}
            event = "finished" if result.get(FINAL_KEY) else "stopped"
            self.counts[event] += 1
            if event == "finished":
                event = f"finished ({result.get('miou', float('nan')):.4f} miou)"
        elif event == "failed":
            self.counts["failed"] += 1
            event = "FAILED"
        done = sum(self.counts.values())
        values = {k: v for k, v in trial.config.items() if k not in ("cell_id", "optuna_trial")}
        return (f"[search {self.label}] {done}/{self.total} done ({self.counts['finished']} finished, "
                f"{self.counts['stopped']} stopped, {self.counts['failed']} failed) | "
                f"{time.monotonic() - self.started:.0f} s | {event} trial {trial.config.get('optuna_trial')} {values}")


def _open_study(spec: SearchSpec, sid: str, optuna_storage: str | None) -> tuple[Any, str, str, Any]:
    """The search's Optuna study (created or continued): ``(study, name, url, rdb storage)``."""
    study_name = spec.study_name or f"{spec.name}-{sid}"
    optuna_url = optuna_storage or spec.optuna_storage or default_optuna_storage()
    rdb = optuna.storages.RDBStorage(optuna_url)
    direction = "maximize" if spec.mode == "max" else "minimize"
    study = optuna.create_study(storage=rdb, study_name=study_name, direction=direction, load_if_exists=True)
    if study.direction.name.lower() != direction:
        raise ValueError(f"study_name: study {study_name!r} in {optuna_url} is {study.direction.name.lower()}d, "
                         f"the spec asks mode {spec.mode!r}")
    return study, study_name, optuna_url, rdb


def _searcher(spec: SearchSpec, cell_of: CellOfParams, study: Any, study_name: str, rdb: Any) -> StudySearch:
    evaluated = evaluated_cells(study, cell_of)
    points = [p for p in spec.points_to_evaluate if cell_of(p) not in evaluated]
    return StudySearch(
        cell_of=cell_of, evaluated=evaluated,
        space={key: d.optuna() for key, d in spec.space.items()}, metric=spec.metric, mode=spec.mode,
        points_to_evaluate=points or None, study_name=study_name, storage=rdb,
        sampler=optuna.samplers.TPESampler(seed=sampler_seed(spec.seed, len(study.trials)),
                                           n_startup_trials=spec.n_startup_trials),
    )


def _scheduler(spec: SearchSpec) -> Any:
    if spec.asha is None:
        return FIFOScheduler()
    return ASHAScheduler(time_attr=TIME_ATTRS[spec.asha.time_attr], metric=spec.metric, mode=spec.mode,
                         max_t=spec.asha.max_t, grace_period=spec.asha.grace_period,
                         reduction_factor=spec.asha.reduction_factor)


def _open_parent(sub: Submission, spec: SearchSpec, base: RunConfig, sid: str, study_name: str) -> str:
    return open_parent(
        sub, kind=mlflow_names.KIND_SEARCH, name=spec.name, sweep_id=sid, spec=spec.model_dump(mode="json", exclude_none=True),
        params={mlflow_names.SPEC_NAME: spec.name, "trials": spec.trials, "metric": spec.metric, "mode": spec.mode,
                "seed": spec.seed, "space": json.dumps(sorted(spec.space)), mlflow_names.SEARCH_ID: sid},
        tags={mlflow_names.STUDY_NAME: study_name, mlflow_names.FRAMEWORK: base.framework, mlflow_names.DATASET: base.dataset,
              mlflow_names.PARTITION: base.partition, mlflow_names.HEAD: base.head.label},
        to_run=spec.trials)  # trials >= 1 (the spec says so): a search submission always opens its parent


def run_search(
    spec: SearchSpec | str | Path, *, tracking_uri: str | None = None, storage: str | None = None,
    optuna_storage: str | None = None, out_dir: str | Path | None = None, emit: Callable[[str], None] = log_line,
    ray_init: Mapping[str, Any] | None = None,
    resource_timeout: float = RESOURCE_TIMEOUT_S, shared_filesystem: bool | None = None,
) -> SearchSummary:
    """Run ``spec.trials`` more trials of the search's Optuna study under Ray Tune.

    ``tracking_uri`` / ``storage`` / ``optuna_storage`` override the spec's (defaults:
    ``MLFLOW_TRACKING_URI`` or ``./mlruns.db``; ``./ray_results``; ``./optuna.db``). ``out_dir``:
    where ``best_config.yaml``, ``trials.csv`` and ``hparams.png`` go (default
    ``<storage>/search/<name>-<search_id>``). Never raises for a failing trial: see
    :attr:`SearchSummary.ok` and the counts; bad inputs raise ``PreflightError`` before anything is written
    (as :func:`~.grid_runner.run_grid`, ``shared_filesystem`` too).
    """
    started = time.monotonic()
    spec = spec if isinstance(spec, SearchSpec) else load_search_spec(spec)
    base = spec.base_config()
    sid = search_id(spec, base)
    cell_of = CellOfParams(base, tuple(spec.space))
    sub = open_submission(storage or spec.storage, tracking_uri or spec.tracking_uri, spec.experiment, configs=[base],
                          resources=spec.resources, ray_init=ray_init, resource_timeout=resource_timeout,
                          shared_filesystem=shared_filesystem)
    study, study_name, optuna_url, rdb = _open_study(spec, sid, optuna_storage)
    searcher = _searcher(spec, cell_of, study, study_name, rdb)
    out = Path(out_dir) if out_dir is not None else sub.out_dir("search", spec.name, sid)
    parent_id = _open_parent(sub, spec, base, sid, study_name)
    emit(f"[search {spec.name}] search_id {sid}, study {study_name!r} ({len(study.trials)} trials so far, "
         f"{len(searcher.evaluated)} configurations evaluated), {spec.trials} new trial(s); parent run {parent_id}")
    with ending_run(sub.client, parent_id):
        concurrency = start_ray(spec.resources, spec.max_concurrent, ray_init)
        context = SweepContext(mlflow_names.KIND_SEARCH, sid, sub.trial_storage, sub.tracking_uri, spec.experiment,
                               parent_id, spec.resources)
        results = fit(_search_trial, context, parameters={"cell_of": cell_of},
                      name=f"search-{spec.name}-{sid}-{sub.submission_id}",
                      progress=SearchProgress(spec.name, spec.trials, emit), store=sub.store,
                      concurrency=concurrency, search_alg=searcher, scheduler=_scheduler(spec),
                      num_samples=spec.trials, reuse_actors=spec.resources.in_process,
                      trial_dirname_creator=trial_dirname("trial", "optuna_trial", "cell_id"))
        trials = [_outcome(result, spec) for result in results]
        _reconcile_trials(sub.client, sub.experiment_id, sid, trials)
        summary = SearchSummary(spec.name, sid, study_name, _redacted(optuna_url), sub.submission_id, spec.experiment,
                                sub.tracking_uri, parent_id, spec.metric, trials, len(study.trials),
                                searcher.duplicates, time.monotonic() - started, concurrency)
        _write_outputs(sub.client, parent_id, summary, study, cell_of, out)
        summary.wall_seconds = time.monotonic() - started
        _log_summary(sub.client, parent_id, summary)
        return summary


def _redacted(url: str) -> str:
    """A storage URL without its password (for logs and tags)."""
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
        reconcile(trial, run)
        stopped = None
        if trial.status == "stopped":
            stopped = int(run.data.tags.get(mlflow_names.SEARCH_STOPPED_AFTER, trial.evaluations))
        tag_trial_run(client, run.info.run_id, search=sid, params=trial.params, trial=trial.optuna_trial,
                      stopped_after=stopped)


def _write_outputs(client: MlflowClient, parent_id: str, summary: SearchSummary, study: Any, cell_of: CellOfParams,
                   out: Path) -> None:
    """``best_config.yaml``, ``trials.csv`` and ``hparams.png`` into ``out``, logged on the parent run."""
    out.mkdir(parents=True, exist_ok=True)
    found = best_config(study, cell_of)
    if found is not None:
        config, trial = found
        path = out / mlflow_names.BEST_CONFIG_FILE
        header = (f"# best configuration of search {summary.spec_name} ({summary.search_id}): Optuna trial {trial.number}, "
                  f"{summary.metric} {trial.value:.6f}\n# run it with: npsemiseg run --config {path.name}\n")
        path.write_text(header + config.to_yaml())
        client.log_artifact(parent_id, str(path), mlflow_names.SEARCH_DIR)
        summary.best_value, summary.best_params, summary.best_config_path = trial.value, dict(trial.params), path
        client.set_tag(parent_id, mlflow_names.BEST_CELL_ID, config.cell_id)
    rows = [(t.optuna_trial, t.cell_id, t.status, t.value, t.evaluations, t.run_id,
             *(str(t.params.get(k)) for k in cell_of.keys), t.reason) for t in summary.trials]
    header = ("optuna_trial", "cell_id", "status", "value", "evaluations", "run_id", *cell_of.keys, "reason")
    (out / mlflow_names.TRIALS_FILE).write_text(csv_text(header, rows))
    client.log_artifact(parent_id, str(out / mlflow_names.TRIALS_FILE), mlflow_names.SEARCH_DIR)
    summary.figure_path = write_hparams_figure(summary.tracking_uri, summary.experiment, out, search=summary.search_id)
    if summary.figure_path is not None:
        client.log_artifact(parent_id, str(summary.figure_path), mlflow_names.FIGURES_DIR)


def _log_summary(client: MlflowClient, parent_id: str, summary: SearchSummary) -> None:
    metrics = {f"trials_{s}": float(summary.count(s)) for s in ("finished", "stopped", "failed")}
    metrics.update(duplicates=float(summary.duplicates), study_trials=float(summary.study_trials),
                   wall_seconds=summary.wall_seconds)
    if summary.best_value is not None:
        metrics[f"best_{summary.metric}"] = float(summary.best_value)
    log_summary(client, parent_id, mlflow_names.KIND_SEARCH, metrics=metrics, text=summary.format())
