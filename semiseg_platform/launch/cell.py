"""Run one cell: on Ray Train (DDP workers, or Ray Train's local mode) or in-process.

Same loop, same checkpoints, same tracking; only the launcher differs:

- :func:`run_cell` builds a Ray Train V2 ``TorchTrainer`` whose workers run
  :func:`train_worker` (NCCL on GPU, gloo on CPU; ``workers=0`` = Ray Train's local mode,
  training in this process). Checkpoints go through ``ray.train.report`` into the storage
  under ``<storage>/<name>/checkpoint_<step>``; ``FailureConfig(max_failures)`` restarts
  failed workers from the last checkpoint, and running the same ``name`` again resumes
  from it.
- :func:`run_cell_in_process` runs the loop in the calling process (a reused Ray Tune actor
  in a grid or search): checkpoints through a :class:`~.reporters.TuneReporter` or to the
  storage through a :class:`~.reporters.StoreReporter`.

Both open the cell's MLflow run in the launching process (:class:`~semiseg_platform.tracking.CellRun`:
one run per cell, reused on restart, always ended) and run :func:`execute`, which wraps
``npsemiseg.training.train`` with the same callbacks: a checkpoint reporter, rank 0's MLflow
logging, optional progress lines, and the caller's own callbacks (``callbacks=``: they travel
to every worker, e.g. a test's fault injection).
"""

from __future__ import annotations

import dataclasses
import os
import re
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray.train
from mlflow import MlflowClient
from mlflow.entities import Metric, RunTag
from ray.train import CheckpointConfig, FailureConfig, ScalingConfig
from ray.train import RunConfig as TrainRunConfig
from ray.train.torch import TorchConfig, TorchTrainer

from npsemiseg.callbacks import CallbackList, Callbacks
from npsemiseg.config import RunConfig, with_overrides
from npsemiseg.data import DATA_ROOT_ENV
from npsemiseg.hardware_plan import Replan, elastic_world_size_problem, replanned_config, run_record
from npsemiseg.training import batch_scaling, train
from semiseg_platform.data_staging import is_remote, resolve_data_root
from semiseg_platform.launch.ray_runtime import ensure_ray, worker_env
from semiseg_platform.launch.reporters import CheckpointReporter, ProgressLogger, StoreReporter, TrainReporter
from semiseg_platform.logs import ensure_visible
from semiseg_platform.storage import CheckpointStore, Storage, parse_storage
from semiseg_platform.tracking import DEFAULT_EXPERIMENT, CellRun, MLflowCallbacks, format_error, mlflow_names

#: Keys the launchers add to the metrics of the final checkpoint report (not evaluation metrics)
_RUN_KEYS = ("step", "seconds", "train_seconds", "interrupted")


@dataclass
class CellResult:
    """The outcome of one cell.

    metrics: the final evaluation (``miou``, ``pavpu``, ``ece``, ...; empty unless FINISHED);
    status: ``FINISHED`` | ``FAILED`` | ``KILLED`` (the MLflow run's status);
    wall_seconds: the launcher's wall time; loop_seconds: ``train()``'s own wall time (of the
    last attempt); train_seconds: time in training steps only; checkpoint_uri: the last
    checkpoint in the storage (local path or ``s3://...``).
    """

    name: str
    cell_id: str
    status: str
    metrics: dict[str, float] = field(default_factory=dict)
    steps: int = 0
    run_id: str = ""
    run_url: str = ""
    checkpoint_uri: str | None = None
    wall_seconds: float = 0.0
    loop_seconds: float = 0.0
    train_seconds: float = 0.0
    error: str | None = None

    @property
    def overhead_seconds(self) -> float:
        """Orchestration overhead: the launcher's wall time minus the training loop's own."""
        return self.wall_seconds - self.loop_seconds


class CellFailedError(RuntimeError):
    """A cell ended FAILED or KILLED; ``result`` holds its run id, URL and error."""

    def __init__(self, result: CellResult) -> None:
        super().__init__(f"cell {result.name} {result.status}: {result.error}")
        self.result = result


@dataclass(frozen=True)
class Membership:
    """Where a cell belongs in MLflow: its grid or search (at most one) and its parent run."""

    grid_id: str | None = None
    search_id: str | None = None
    parent_run_id: str | None = None

    @property
    def submission(self) -> str | None:
        return self.search_id or self.grid_id


def cell_run_name(config: RunConfig, grid_id: str | None = None, experiment: str | None = None) -> str:
    """Default name of a cell's checkpoint lineage: readable, filesystem-safe, unique per cell, grid
    (or search) and experiment (two experiments sharing a storage never resume each other's checkpoints)."""
    def safe(text: str) -> str:
        return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_")

    parts = [safe(experiment) if experiment else None, grid_id, safe(config.cell_name), config.cell_id]
    return "-".join(part for part in parts if part)


# ----------------------------------------------------------------------------- the shared body
@dataclass(frozen=True)
class CellSpec:
    """What every launcher hands to :func:`execute` (picklable: it travels to Ray workers)."""

    config: RunConfig
    name: str
    storage_uri: str
    storage_endpoint: str | None
    tracking_uri: str
    run_id: str
    progress: bool = False
    flush_every_s: float = 10.0
    #: Ray Train's local mode (``workers=0``): Ray does not persist checkpoints there
    local_mode: bool = False
    #: the caller's own loop callbacks (picklable), run on every rank after the platform's
    callbacks: tuple[Callbacks, ...] = ()
    #: ``(min, max)`` workers of an elastic cell: its batches are planned for ``max``; each worker group
    #: re-plans them for the world size it got (:func:`npsemiseg.hardware_plan.replanned_config`)
    elastic_workers: tuple[int, int] | None = None

    def store(self) -> CheckpointStore:
        return CheckpointStore(parse_storage(self.storage_uri, endpoint_url=self.storage_endpoint), self.name)


def staged_config(config: RunConfig) -> RunConfig:
    """``config`` with an S3 ``data.root`` (or ``$NPSEMISEG_DATA``) replaced by its copy staged on this node
    (:func:`semiseg_platform.data_staging.stage`: downloaded once per node, verified, shared by its cells)."""
    root = config.data.root if config.data.root is not None else os.environ.get(DATA_ROOT_ENV)
    if not is_remote(root) or config.dataset_info.synthetic:  # generated data reads no root
        return config
    ensure_visible()
    return with_overrides(config, {"data.root": resolve_data_root(root, config.dataset)})


def execute(spec: CellSpec, reporter: CheckpointReporter, extra: list[Callbacks] | None = None) -> Any:
    """Run ``npsemiseg.training.train`` for the cell with the platform's callbacks; returns its ``RunResult``.

    An S3 ``data.root`` is staged on this node first (:func:`staged_config`); ``npsemiseg`` reads the local copy.

    Checkpoints are written to a temporary ``runtime.output_dir`` and handed to ``reporter``;
    rank 0 logs into the MLflow run ``spec.run_id``. An exception is recorded on the run
    (rank 0) and re-raised; buffered metrics are written in every case.
    """
    tracker = MLflowCallbacks(spec.tracking_uri, spec.run_id, flush_every_s=spec.flush_every_s)
    callbacks: list[Callbacks] = [reporter, tracker]
    if spec.progress:
        ensure_visible()
        callbacks.append(ProgressLogger())
    callbacks.extend(extra or [])
    callbacks.extend(spec.callbacks)
    with tempfile.TemporaryDirectory(prefix="npsemiseg-run-") as output_dir:
        try:
            config = with_overrides(staged_config(spec.config), {"runtime.output_dir": output_dir})
            return train(config, CallbackList(callbacks))
        except BaseException as error:
            if not isinstance(error, (KeyboardInterrupt, SystemExit)):
                try:
                    tracker.record_error(error)
                except Exception:  # noqa: BLE001 - the store being down must not hide the run's error
                    pass
            raise
        finally:
            tracker.close()
            reporter.close()


@dataclass
class ObtainedPlanRecord(Callbacks):
    """Rank 0 records, at each attempt's start, the world size an elastic cell got (metric
    :data:`~mlflow_names.PLAN_WORLD_SIZE` at the start step) and the plan re-made for it (``plan.obtained.*`` tags:
    params cannot change once logged, and a restart after a lost node changes them)."""

    tracking_uri: str
    run_id: str
    replan: Replan

    def on_start(self, config: Any, *, total_steps: int, start_step: int, rank: int, world_size: int) -> None:
        if rank != 0:
            return
        tags = [RunTag(f"{mlflow_names.PLAN_OBTAINED_PREFIX}{key}", value) for key, value in self.replan.record().items()]
        metric = Metric(mlflow_names.PLAN_WORLD_SIZE, float(world_size), int(time.time() * 1000), start_step)
        MlflowClient(self.tracking_uri).log_batch(self.run_id, metrics=[metric], tags=tags)


def train_worker(spec: CellSpec) -> None:
    """The Ray Train worker loop (also Ray Train's local mode, in the driver). An elastic cell's loop runs its
    configuration re-planned for the world size this worker group got (the same global batch and cell id)."""
    reporter = StoreReporter(spec.store(), also_ray_train=True) if spec.local_mode else TrainReporter(spec.store())
    extra: list[Callbacks] = []
    if spec.elastic_workers is not None:
        world_size = ray.train.get_context().get_world_size()
        config, replan = replanned_config(spec.config, spec.elastic_workers[1], world_size)
        spec = dataclasses.replace(spec, config=config)
        extra.append(ObtainedPlanRecord(spec.tracking_uri, spec.run_id, replan))
    execute(spec, reporter, extra)


# ----------------------------------------------------------------------------- launchers
def validate_resources(workers: int, gpus_per_worker: float, cpus_per_worker: float, max_failures: int) -> None:
    """``ValueError`` naming the first invalid resource argument of :func:`run_cell` (checked before anything starts)."""
    if not isinstance(workers, int) or workers < 0:
        raise ValueError(f"workers: expected an integer >= 0 (0 = Ray Train's local mode), got {workers!r}")
    if gpus_per_worker < 0:
        raise ValueError(f"gpus_per_worker: expected >= 0, got {gpus_per_worker!r}")
    if cpus_per_worker <= 0:
        raise ValueError(f"cpus_per_worker: expected > 0, got {cpus_per_worker!r}")
    if max_failures < -1:
        raise ValueError(f"max_failures: expected >= 0 (or -1 = retry forever), got {max_failures!r}")
    if workers == 0 and gpus_per_worker:
        raise ValueError("gpus_per_worker: local mode (workers=0) trains in this process; ask for workers >= 1 to get GPUs")
    if workers == 0 and max_failures:
        raise ValueError("max_failures: local mode (workers=0) cannot restart workers; re-run the cell to resume it")


def validate_min_workers(config: RunConfig, min_workers: int | None, workers: int) -> None:
    """``ValueError`` when an elastic cell's ``min_workers`` is out of ``1..workers`` or some world size in
    between cannot keep the cell's global batch (checked before anything starts)."""
    if min_workers is None:
        return
    if not isinstance(min_workers, int) or not 1 <= min_workers <= max(workers, 1) or workers == 0:
        raise ValueError(f"min_workers: expected an integer from 1 to workers ({workers}; local mode has no "
                         f"elastic workers), got {min_workers!r}")
    problem = elastic_world_size_problem(config, min_workers, workers)
    if problem:
        raise ValueError(f"min_workers: {problem}")


@dataclass
class _LoopOutcome:
    """What a launcher learnt from the loop: final metrics, steps, timing, last checkpoint."""

    metrics: dict[str, float]
    steps: int
    loop_seconds: float
    train_seconds: float
    checkpoint_uri: str | None
    interrupted: bool = False


def _record(run: CellRun, result: CellResult, outcome: _LoopOutcome, started: float) -> None:
    """Copy the loop's outcome into ``result`` and its timing and checkpoint into the run."""
    result.metrics = {k: float(v) for k, v in outcome.metrics.items() if k not in _RUN_KEYS}
    result.steps, result.checkpoint_uri = outcome.steps, outcome.checkpoint_uri
    result.loop_seconds, result.train_seconds = outcome.loop_seconds, outcome.train_seconds
    run.log_checkpoint_uri(result.checkpoint_uri)
    result.wall_seconds = time.perf_counter() - started
    run.log_metrics({mlflow_names.CELL_WALL_SECONDS: result.wall_seconds,
                     mlflow_names.ORCHESTRATION_SECONDS: result.overhead_seconds}, step=result.steps)
    if outcome.interrupted:
        run.finish("KILLED", f"stopped at step {outcome.steps} by runtime.stop_at_step; run the cell again to resume")


def _tracked(config: RunConfig, *, storage: Storage, name: str, tracking: str | None, experiment: str,
             member: Membership, progress: bool, local_mode: bool, callbacks: list[Callbacks] | None,
             launch: Callable[[CellSpec], _LoopOutcome], world_size: int = 1,
             elastic_workers: tuple[int, int] | None = None) -> CellResult:
    """Open the cell's MLflow run (with the global batch and learning rate of ``world_size`` processes),
    ``launch`` the loop, record the outcome; shared by every launcher."""
    started = time.perf_counter()
    result = CellResult(name=name, cell_id=config.cell_id, status="RUNNING")
    run = CellRun.open(config, tracking=tracking, experiment=experiment, grid_id=member.grid_id,
                       search_id=member.search_id, parent_run_id=member.parent_run_id,
                       params={**mlflow_names.effective_params(batch_scaling(config, world_size)),
                               **mlflow_names.plan_params(run_record(config, world_size)),
                               **({mlflow_names.PLAN_MIN_PROCESSES: str(elastic_workers[0])} if elastic_workers else {})})
    result.run_id, result.run_url = run.run_id, run.url
    spec = CellSpec(config=config, name=name, storage_uri=storage.uri, storage_endpoint=storage.endpoint_url,
                    tracking_uri=run.tracking_uri, run_id=run.run_id, progress=progress, local_mode=local_mode,
                    callbacks=tuple(callbacks or ()), elastic_workers=elastic_workers)
    try:
        with run:
            _record(run, result, launch(spec), started)
    except Exception as error:
        result.status, result.error = run.status or "FAILED", format_error(error)
        result.wall_seconds = time.perf_counter() - started
        raise CellFailedError(result) from error
    result.status = run.status or "FINISHED"
    return result


def run_cell(config: RunConfig, *, workers: int = 1, gpus_per_worker: float = 0, cpus_per_worker: float = 1.0,
             custom_per_worker: Mapping[str, float] | None = None,
             storage: str | os.PathLike | Storage | None = None, tracking: str | None = None,
             experiment: str = DEFAULT_EXPERIMENT, max_failures: int = 0, grid_id: str | None = None,
             search_id: str | None = None, parent_run_id: str | None = None, name: str | None = None,
             progress: bool = False, train_callbacks: list[Any] | None = None,
             callbacks: list[Callbacks] | None = None, min_workers: int | None = None) -> CellResult:
    """Train one cell with Ray Train (V2): ``workers`` DDP workers, or ``workers=0`` for local mode.

    ``storage``: local directory or ``s3://bucket/prefix[?endpoint_override=...]`` (default
    ``<cwd>/ray_results``), checked for reachability first; checkpoints live under
    ``<storage>/<name>`` (``name`` defaults to :func:`cell_run_name`), and the same name resumes
    from its last checkpoint. ``tracking``: MLflow tracking URI (default ``MLFLOW_TRACKING_URI``,
    else ``sqlite:///<cwd>/mlruns.db``). ``max_failures``: worker-group restarts from the last
    checkpoint (Ray Train's ``FailureConfig``; -1 = forever). ``custom_per_worker``: Ray custom
    resources each worker reserves besides its CPUs and GPUs (e.g. one of a resource every node has
    once: one worker per node). Embedded Ray is started when
    needed (``ray_runtime.ensure_ray``); inside ``ray job submit`` the job's cluster is used.
    ``grid_id`` / ``search_id``: the grid or search the cell belongs to (its run's tag).

    Returns a :class:`CellResult`: FINISHED, or KILLED when ``runtime.stop_at_step`` stopped it
    early (run it again to resume). A failed cell raises :class:`CellFailedError`
    (``result.status`` FAILED, ``result.error``) after its MLflow run ended; Ctrl-C and SIGTERM
    end the run KILLED and propagate (``KeyboardInterrupt``, ``tracking.CellKilled``).
    ``train_callbacks``: Ray Train ``UserCallback``s for the trainer's ``ray.train.RunConfig`` (a search passes
    the workers' evaluations on to Tune with one). ``callbacks``: loop callbacks run on every worker.
    ``min_workers`` (< ``workers``): an elastic cell (Ray Train's ``ScalingConfig(num_workers=(min, max))``): it
    starts on as many workers as the cluster has room for, from ``min_workers`` to ``workers``, and a worker group
    restarted after a lost node (``max_failures``) goes on with fewer; each group re-plans the per-process batch and
    accumulation steps for its world size at the global batch planned for ``workers`` (same cell id, same
    checkpoints), recorded on the run (``plan.min_processes``, ``plan/world_size``, ``plan.obtained.*``).
    """
    validate_resources(workers, gpus_per_worker, cpus_per_worker, max_failures)
    validate_min_workers(config, min_workers, workers)
    elastic = (min_workers, workers) if min_workers is not None and min_workers < workers else None
    storage = parse_storage(storage)
    storage.check()
    member = Membership(grid_id, search_id, parent_run_id)
    name = name or cell_run_name(config, member.submission, experiment)

    def launch(spec: CellSpec) -> _LoopOutcome:
        fit = _fit(spec, storage, workers=elastic or workers, gpus_per_worker=gpus_per_worker,
                   cpus_per_worker=cpus_per_worker, custom_per_worker=custom_per_worker, max_failures=max_failures,
                   train_callbacks=train_callbacks)
        reported = dict(fit.metrics or {})
        if fit.checkpoint is not None:
            uri = storage.uri_of(name, Path(fit.checkpoint.path).name)
        else:  # local mode: the reporter stored it
            latest = CheckpointStore(storage, name).latest()
            uri = latest[1] if latest else None
        return _LoopOutcome(metrics=reported, steps=int(reported.get("step", 0)),
                            loop_seconds=float(reported.get("seconds", 0.0)),
                            train_seconds=float(reported.get("train_seconds", 0.0)), checkpoint_uri=uri,
                            interrupted=bool(reported.get("interrupted", 0.0)))

    return _tracked(config, storage=storage, name=name, tracking=tracking, experiment=experiment, member=member,
                    progress=progress, local_mode=workers == 0, callbacks=callbacks, launch=launch,
                    world_size=max(1, workers), elastic_workers=elastic)


def _fit(spec: CellSpec, storage: Storage, *, workers: int | tuple[int, int], gpus_per_worker: float, cpus_per_worker: float,
         max_failures: int, train_callbacks: list[Any] | None = None,
         custom_per_worker: Mapping[str, float] | None = None) -> Any:
    """Build and fit the ``TorchTrainer`` (``workers``: a count, or ``(min, max)`` elastic); returns its ``Result``
    (raises ``TrainingFailedError``)."""
    most = workers if isinstance(workers, int) else workers[1]
    if most > 0:
        ensure_ray()
    resources = {"CPU": cpus_per_worker, **({"GPU": gpus_per_worker} if gpus_per_worker else {}),
                 **dict(custom_per_worker or {})}
    scaling = ScalingConfig(num_workers=workers, use_gpu=gpus_per_worker > 0,
                            resources_per_worker=resources if most else None)
    run_config = TrainRunConfig(
        name=spec.name,
        failure_config=FailureConfig(max_failures=max_failures),
        checkpoint_config=CheckpointConfig(num_to_keep=2),
        worker_runtime_env={"env_vars": worker_env()} if most else None,
        callbacks=list(train_callbacks or []),
        **storage.ray_arguments(),
    )
    trainer = TorchTrainer(
        train_worker,
        train_loop_config=spec,
        scaling_config=scaling,
        run_config=run_config,
        torch_config=TorchConfig(backend="nccl" if gpus_per_worker > 0 else "gloo"),
    )
    return trainer.fit()


def run_cell_in_process(config: RunConfig, *, reporter: CheckpointReporter | None = None,
                        storage: str | os.PathLike | Storage | None = None, tracking: str | None = None,
                        experiment: str = DEFAULT_EXPERIMENT, grid_id: str | None = None,
                        search_id: str | None = None, parent_run_id: str | None = None, name: str | None = None,
                        progress: bool = False, callbacks: list[Callbacks] | None = None) -> CellResult:
    """Train one single-device cell in this process (e.g. a reused Ray Tune actor of a grid).

    ``reporter``: :class:`~.reporters.TuneReporter` inside a Tune trial; default a
    :class:`~.reporters.StoreReporter` on ``<storage>/<name>`` (resumes from its newest
    checkpoint). Same callbacks, checkpoints and MLflow run as :func:`run_cell`; ``callbacks`` are
    added to the platform's. Returns or raises as :func:`run_cell` does.
    """
    storage = parse_storage(storage)
    member = Membership(grid_id, search_id, parent_run_id)
    name = name or cell_run_name(config, member.submission, experiment)
    reporter = reporter or StoreReporter(CheckpointStore(storage, name))

    def launch(spec: CellSpec) -> _LoopOutcome:
        loop = execute(spec, reporter)
        return _LoopOutcome(metrics=dict(loop.metrics), steps=loop.steps, loop_seconds=loop.seconds,
                            train_seconds=loop.train_seconds, checkpoint_uri=reporter.last_uri,
                            interrupted=loop.interrupted)

    return _tracked(config, storage=storage, name=name, tracking=tracking, experiment=experiment, member=member,
                    progress=progress, local_mode=False, callbacks=callbacks, launch=launch)
