"""What running a grid and a search share: many cells as Ray Tune trials under one MLflow parent run.

A *sweep* is one submission of a grid or a search: :func:`open_submission` checks the storage
and draws the submission's id, :func:`open_parent` creates the parent run (every cell run is its
child), :class:`SweepContext` travels to the trials and launches each cell (in-process in a reused
Tune actor, or through the cell's ``TorchTrainer``), :func:`fit` assembles and runs the Tune
``Tuner`` with a :class:`SweepProgress` callback, :func:`reconcile` makes MLflow the record of
each trial's outcome, and :func:`log_summary` writes the submission's metrics, its CSV of
outcomes and its text summary onto the parent run. :mod:`.grid_runner` and :mod:`.search_runner` keep what
differs: their specs, what a trial is, and their summaries.
"""

from __future__ import annotations

import csv
import io
import logging
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray
import yaml
from mlflow import MlflowClient
from mlflow.entities import Metric, Param
from ray import tune
from ray.tune import Callback

from npsemiseg.callbacks import Callbacks
from npsemiseg.config import RunConfig
from semiseg_platform.launch import CellResult, ensure_ray, run_cell, run_cell_in_process, validate_min_workers
from semiseg_platform.logs import PROGRESS
from semiseg_platform.preflight import RESOURCE_TIMEOUT_S, Needed, preflight
from semiseg_platform.storage import Storage
from semiseg_platform.sweeps.spec_base import Resources, cells_at_once, trial_resources
from semiseg_platform.tracking import mlflow_names, owner_tags, prepare_experiment, reconcile_submission

logger = logging.getLogger(__name__)


#: The key of a trial's last result that carries the error of a cell that failed on its own (not retried)
CELL_ERROR = "cell_error"


#: Ray's errors of a process or node that went away (not an exception of the code it ran)
LOST_PROCESS_ERRORS = (ray.exceptions.RayActorError, ray.exceptions.NodeDiedError, ray.exceptions.WorkerCrashedError,
                       ray.exceptions.LocalRayletDiedError)


def lost_process(error: BaseException) -> bool:
    """Whether ``error`` (through its causes, and a Ray Train error's ``worker_failures``) comes from a
    Ray worker, actor or node that died rather than from an exception of the code it ran."""
    seen: set[int] = set()
    pending: list[Any] = [error]
    while pending:
        current = pending.pop()
        if not isinstance(current, BaseException) or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, LOST_PROCESS_ERRORS):
            return True
        pending += [current.__cause__, getattr(current, "cause", None)]
        failures = getattr(current, "worker_failures", None)
        if isinstance(failures, Mapping):
            pending += list(failures.values())
    return False


def log_line(line: str) -> None:
    """The default ``emit`` of a sweep's progress lines: the ``semiseg_platform.progress`` logger."""
    logging.getLogger(PROGRESS).info("%s", line)


# ----------------------------------------------------------------------------- submission and parent run
@dataclass(frozen=True)
class Submission:
    """Where one grid or search submission writes (see :func:`open_submission`)."""

    store: Storage
    tracking_uri: str
    experiment_id: str
    client: MlflowClient
    submission_id: str
    #: the storage as given (a remote store's URI keeps its query, e.g. the endpoint)
    storage_arg: str | None = None

    @property
    def trial_storage(self) -> str:
        """The storage the trials write to: the canonical local path, or the remote URI as given."""
        return self.store.uri if self.store.is_local else self.storage_arg

    def out_dir(self, folder: str, name: str, sweep_id: str) -> Path:
        """``<storage>/<folder>/<name>-<id>`` (``./<folder>/...`` for a remote storage)."""
        return Path(self.store.uri if self.store.is_local else ".") / folder / f"{name}-{sweep_id}"


#: Seconds a submission waits for an unreachable checkpoint storage (an S3 server restarting) before giving up
STORAGE_WAIT_S = 60.0


def open_submission(storage: str | None, tracking_uri: str | None, experiment: str, *, configs: Sequence[RunConfig] = (),
                    resources: Resources | None = None, ray_init: Mapping[str, Any] | None = None,
                    resource_timeout: float = RESOURCE_TIMEOUT_S, shared_filesystem: bool | None = None) -> Submission:
    """Check the cells' data and weights, one cell's ``resources`` against the cluster, the MLflow store
    and the checkpoint storage (an unreachable S3 store is retried for :data:`STORAGE_WAIT_S`: a store
    restarting) before anything is written (:func:`~semiseg_platform.preflight.preflight`; on a cluster of
    several hosts, local paths only with ``shared_filesystem``), then create the experiment if needed and
    draw the submission's id."""
    resources = resources or Resources()
    if resources.min_workers is not None and resources.min_workers < resources.workers:
        for config in configs:  # an elastic cell keeps its global batch on every world size it may get
            validate_min_workers(config, resources.min_workers, resources.workers)
    needed = Needed.of(resources.min_workers or resources.workers, resources.gpus_per_worker, resources.cpus_per_worker,
                       in_process=resources.in_process, custom_per_worker=resources.custom_per_worker)
    uri, store = preflight(configs, needed, tracking=tracking_uri, storage=storage, resource_timeout=resource_timeout,
                           ray_init=ray_init, storage_wait_s=STORAGE_WAIT_S, shared_filesystem=shared_filesystem)
    return Submission(store, uri, prepare_experiment(uri, experiment), MlflowClient(uri), uuid.uuid4().hex[:8],
                      storage)


def open_parent(sub: Submission, *, kind: str, name: str, sweep_id: str, spec: Mapping[str, Any],
                params: Mapping[str, Any], to_run: int, tags: Mapping[str, str] | None = None) -> str | None:
    """Create the submission's parent run (``<kind>/<name>``, owned by this process) with its tags,
    spec and params; returns its id. First, the runs that earlier submissions of ``sweep_id`` left
    RUNNING with their owner gone end KILLED (:func:`reconcile_submission`).

    ``to_run``: how many cells or trials the submission will run. None (no run) when it is 0, e.g. a
    grid whose cells all finished earlier: a parent that ran nothing would only add an empty row at the
    top of the experiment's runs list on every re-submission.
    """
    reconcile_submission(sub.client, [sub.experiment_id], sweep_id)
    if not to_run:
        return None
    parent = sub.client.create_run(sub.experiment_id, run_name=f"{kind}/{name}", tags={
        mlflow_names.KIND: kind, **mlflow_names.submission_tags(kind, sweep_id), mlflow_names.SUBMISSION_ID: sub.submission_id,
        mlflow_names.SPEC_NAME: name, **owner_tags(), **dict(tags or {})})
    parent_id = parent.info.run_id
    sub.client.log_text(parent_id, yaml.safe_dump(dict(spec), sort_keys=False),
                        mlflow_names.sweep_artifact(kind, mlflow_names.SPEC_FILE))
    sub.client.log_batch(parent_id, params=[Param(k, str(v)) for k, v in params.items()])
    return parent_id


# ----------------------------------------------------------------------------- trials
@dataclass(frozen=True)
class SweepContext:
    """What every trial needs besides its own values (travels once, through the object store)."""

    kind: str
    sweep_id: str
    storage: str
    tracking_uri: str
    experiment: str
    parent_run_id: str
    resources: Resources
    max_failures: int = 0
    #: loop callbacks added to every cell (tests: a fault injection)
    cell_callbacks: tuple[Callbacks, ...] = ()

    def membership(self) -> dict[str, str]:
        """``run_cell``'s keywords naming the grid or search and the parent run."""
        key = "search_id" if self.kind == mlflow_names.KIND_SEARCH else "grid_id"
        return {key: self.sweep_id, "parent_run_id": self.parent_run_id}

    def launch(self, config: RunConfig, *, callbacks: Sequence[Callbacks] = (), train_callbacks: Sequence[Any] = ()
               ) -> CellResult:
        """Train one cell: in-process in this (reused) actor, or through its ``TorchTrainer``."""
        launch = dict(storage=self.storage, tracking=self.tracking_uri, experiment=self.experiment,
                      **self.membership())
        if self.resources.in_process:
            return run_cell_in_process(config, callbacks=[*callbacks, *self.cell_callbacks], **launch)
        resources = self.resources
        return run_cell(config, workers=resources.workers, gpus_per_worker=resources.gpus_per_worker,
                        cpus_per_worker=resources.cpus_per_worker, custom_per_worker=resources.custom_per_worker,
                        max_failures=self.max_failures, min_workers=resources.min_workers,
                        train_callbacks=list(train_callbacks), callbacks=list(self.cell_callbacks), **launch)


def start_ray(resources: Resources, max_concurrent: int | None, ray_init: Mapping[str, Any] | None) -> int:
    """Connect to (or start) Ray; returns how many cells run at once."""
    ensure_ray(**dict(ray_init or {}))
    return cells_at_once(resources, ray.cluster_resources(), max_concurrent)


def trial_dirname(prefix: str, *keys: str) -> Callable[[Any], str]:
    """Tune's ``trial_dirname_creator``: ``<prefix>_<config[key]>_...`` (short: Windows-safe and readable)."""
    def name(trial: Any) -> str:
        return "_".join([prefix, *(str(trial.config.get(key)) for key in keys)])

    return name


def fit(trainable: Callable[..., None], context: SweepContext, *, name: str, progress: Callback,
        store: Storage, concurrency: int, parameters: Mapping[str, Any] | None = None, trial_failures: int = 0,
        param_space: Mapping[str, Any] | None = None, **tune_options: Any) -> Any:
    """Assemble the ``Tuner`` (trainable with its context, ``parameters`` and resources, concurrency,
    progress, storage) and fit it; returns Tune's ``ResultGrid``. ``tune_options`` go to ``TuneConfig``.
    Afterwards no run of this submission is left RUNNING (a trial whose process died, or whose
    store was away when it ended, ends KILLED: a re-submission resumes it)."""
    with_parameters = tune.with_parameters(trainable, context=context, **dict(parameters or {}))
    tuner = tune.Tuner(
        tune.with_resources(with_parameters, trial_resources(context.resources)),
        param_space=dict(param_space or {}),
        tune_config=tune.TuneConfig(max_concurrent_trials=concurrency, **tune_options),
        run_config=tune.RunConfig(name=name, verbose=0, callbacks=[progress],
                                  failure_config=tune.FailureConfig(max_failures=trial_failures),
                                  **store.ray_arguments()),
    )
    results = tuner.fit()
    client = MlflowClient(context.tracking_uri)
    reconcile_submission(client, [client.get_experiment_by_name(context.experiment).experiment_id], context.sweep_id,
                         ended_parent=context.parent_run_id)
    return results


def duration(seconds: float) -> str:
    """``1m05s`` / ``2h03m07s``."""
    seconds = int(round(seconds))
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m{seconds % 60:02d}s" if seconds >= 3600 else \
        f"{seconds // 60}m{seconds % 60:02d}s"


class SweepProgress(Callback):
    """Tune callback emitting one line per started / retried / ended trial; subclasses word the lines.

    ``durations``: each trial's wall time as the driver saw it (start to end), by :meth:`key`.
    """

    def __init__(self, emit: Callable[[str], None] = log_line) -> None:
        self.emit = emit
        self.started = time.monotonic()
        self.starts: dict[str, float] = {}
        self.durations: dict[str, float] = {}

    def key(self, trial: Any) -> str:
        return str(trial.config.get("cell_id"))

    def line(self, trial: Any, event: str, seconds: float | None) -> str:
        """The line of ``event`` (``started``, ``retrying``, ``finished``, ``stopped``, ``failed``)."""
        raise NotImplementedError

    def _end(self, trial: Any) -> float:
        seconds = time.monotonic() - self.starts.pop(self.key(trial), time.monotonic())
        self.durations[self.key(trial)] = seconds
        return seconds

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self.starts[self.key(trial)] = time.monotonic()
        self.emit(self.line(trial, "started", None))

    def on_trial_recover(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self.starts.pop(self.key(trial), None)
        self.emit(self.line(trial, "retrying", None))

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        failed = bool((getattr(trial, "last_result", None) or {}).get(CELL_ERROR))
        self.emit(self.line(trial, "failed" if failed else "finished", self._end(trial)))

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self.emit(self.line(trial, "failed", self._end(trial)))


# ----------------------------------------------------------------------------- outcomes
@dataclass
class Outcome:
    """What happened to one trial's cell: ``status`` (the sweep's words), its MLflow run, why it failed."""

    cell_id: str
    status: str
    reason: str = ""
    run_id: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)


def reconcile(outcome: Outcome, run: Any | None) -> None:
    """MLflow is the record: fill the run id and prefer a failed run's ``error`` tag as the reason."""
    if run is None:
        return
    outcome.run_id = outcome.run_id or run.info.run_id
    if outcome.status == "failed" and run.data.tags.get(mlflow_names.ERROR):
        outcome.reason = run.data.tags[mlflow_names.ERROR]


def csv_text(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A CSV document (the ``csv`` module quotes what needs quoting)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(["" if value is None else value for value in row] for row in rows)
    return out.getvalue()


def log_summary(client: MlflowClient, parent_id: str, kind: str, *, metrics: Mapping[str, float],
                text: str, csv_name: str | None = None, csv_body: str | None = None) -> None:
    """The submission's metrics, its outcomes' CSV (``<kind>/<csv_name>``) and ``<kind>/summary.txt``
    (the paths of :func:`mlflow_names.sweep_artifact`)."""
    now = int(time.time() * 1000)
    client.log_batch(parent_id, metrics=[Metric(k, float(v), now, 0) for k, v in metrics.items()])
    if csv_name is not None and csv_body is not None:
        client.log_text(parent_id, csv_body, mlflow_names.sweep_artifact(kind, csv_name))
    client.log_text(parent_id, text + "\n", mlflow_names.sweep_artifact(kind, mlflow_names.SUMMARY_FILE))
