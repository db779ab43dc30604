"""Run one cell: on Ray Train (DDP workers, or Ray Train's local mode) or in-process.

Same loop, same checkpoints, same tracking; only the launcher differs:

- :func:`run_cell` builds a Ray Train V2 ``TorchTrainer`` whose workers run
  :func:`train_worker` (NCCL on GPU, gloo on CPU; ``workers=0`` = Ray Train's local mode,
  training in this process). Checkpoints go through ``ray.train.report`` into the storage
  under ``<storage>/<name>/checkpoint_<step>``; ``FailureConfig(max_failures)`` restarts
  failed workers from the last checkpoint, and running the same ``name`` again resumes
  from it.
- :func:`run_cell_in_process` runs the loop in the calling process (a reused Ray Tune actor
  in a grid or search): checkpoints through a :class:`TuneReporter` or to the storage
  through a :class:`StoreReporter`.

Both open the cell's MLflow run in the launching process (:class:`~.tracking.CellRun`: one
run per cell, reused on restart, always ended) and run :func:`execute`, which wraps
``npsemiseg.training.train`` with the same callbacks: a checkpoint reporter, rank 0's
MLflow logging, optional progress lines, and the test-only fault injection.

Fault injection (tests only): ``NPSEMISEG_INJECT_FAULT="rank=1,step=2,marker=/tmp/x[,action=exit|raise]"``
in the launching process makes that rank, after that step, exit abruptly (``os._exit(1)``,
like a lost worker) or raise ``InjectedFault``, once: the marker file records that it
happened, so the restarted attempt runs through.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from npsemiseg.callbacks import CallbackList, Callbacks

from semiseg_platform.storage import CheckpointStore, Storage, checkpoint_dir_name, mark_complete, parse_storage
from semiseg_platform.tracking import DEFAULT_EXPERIMENT, CellRun, MLflowCallbacks, format_error

FAULT_ENV = "NPSEMISEG_INJECT_FAULT"

#: Keys the launchers add to the metrics of the final checkpoint report (not evaluation metrics)
_RUN_KEYS = ("step", "seconds", "train_seconds", "interrupted")


# ----------------------------------------------------------------------------- results
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


def cell_run_name(config: Any, grid_id: str | None = None, experiment: str | None = None) -> str:
    """Default name of a cell's checkpoint lineage: readable, filesystem-safe, unique per cell, grid
    and experiment (two experiments sharing a storage never resume each other's checkpoints)."""
    def safe(text: str) -> str:
        return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_")

    parts = [safe(experiment) if experiment else None, grid_id, safe(config.cell_name), config.cell_id]
    return "-".join(part for part in parts if part)


# ----------------------------------------------------------------------------- callbacks
class InjectedFault(RuntimeError):
    """The failure raised by :class:`FaultInjection` with ``action="raise"``."""


@dataclass
class FaultInjection(Callbacks):
    """Test-only: after ``step`` on ``rank``, exit abruptly or raise, once (``marker`` records it)."""

    rank: int
    step: int
    marker: str
    action: str = "exit"

    @classmethod
    def from_env(cls) -> FaultInjection | None:
        """Parse ``NPSEMISEG_INJECT_FAULT`` (see the module docstring); None when unset."""
        text = os.environ.get(FAULT_ENV)
        if not text:
            return None
        try:
            fields = dict(item.split("=", 1) for item in text.split(","))
            fault = cls(rank=int(fields["rank"]), step=int(fields["step"]), marker=fields["marker"],
                        action=fields.get("action", "exit"))
        except (KeyError, ValueError) as error:
            raise ValueError(f"{FAULT_ENV}: expected 'rank=R,step=S,marker=PATH[,action=exit|raise]', got {text!r} ({error})") from None
        if fault.action not in ("exit", "raise"):
            raise ValueError(f"{FAULT_ENV}: action must be 'exit' or 'raise', got {fault.action!r}")
        return fault

    this_rank: int | None = None

    def on_start(self, config, *, total_steps, start_step, rank, world_size) -> None:
        self.this_rank = rank

    def on_step(self, step: int, total_steps: int, logs: dict[str, float]) -> None:
        if self.this_rank != self.rank or step != self.step or os.path.exists(self.marker):
            return
        Path(self.marker).write_text(f"rank {self.rank} failed after step {step}\n")
        if self.action == "raise":
            raise InjectedFault(f"injected failure on rank {self.rank} after step {step}")
        sys.stdout.flush()
        os._exit(1)


class ProgressPrinter(Callbacks):
    """Rank 0 prints one line per ``every_s`` seconds of training, per evaluation and at the end."""

    def __init__(self, every_s: float = 5.0, prefix: str = "") -> None:
        self.every_s = every_s
        self.prefix = prefix
        self.rank = 0
        self._last = 0.0

    def _print(self, text: str) -> None:
        if self.rank == 0:
            print(f"{self.prefix}{text}", flush=True)

    def on_start(self, config, *, total_steps, start_step, rank, world_size) -> None:
        self.rank = rank
        resumed = f", resumed at step {start_step}" if start_step else ""
        self._print(f"{config.cell_name}: {total_steps} steps on {world_size} process(es){resumed}")
        self._last = time.monotonic()

    def on_step(self, step, total_steps, logs) -> None:
        if time.monotonic() - self._last >= self.every_s or step == total_steps:
            self._last = time.monotonic()
            self._print(f"step {step}/{total_steps} loss {logs.get('train/loss', float('nan')):.4f} "
                        f"({logs.get('train/sec_per_iter', float('nan')):.2f} s/it)")

    def on_evaluation(self, step, metrics) -> None:
        shown = ", ".join(f"{k} {metrics[k]:.4f}" for k in ("miou", "pavpu", "ece") if k in metrics)
        self._print(f"evaluation at step {step}: {shown}")


class CheckpointReporter(Callbacks):
    """Hands the loop's checkpoints to a launcher and finds the one to resume from.

    The run's last checkpoint (at ``total_steps``, or at ``runtime.stop_at_step``) is reported
    from ``on_end``, so that report carries the loop's outcome with its metrics: ``step``,
    ``seconds``, ``train_seconds`` and ``interrupted`` (1.0 when stopped early).
    Subclasses implement :meth:`report` and :meth:`resume_from`.
    """

    def __init__(self) -> None:
        self.rank = 0
        self.total_steps = 0
        self.stop_at_step: int | None = None
        self.last_uri: str | None = None
        self._last: tuple[int, Path, dict[str, float]] | None = None
        self._temporary: list[Path] = []

    def on_start(self, config, *, total_steps, start_step, rank, world_size) -> None:
        self.rank = rank
        self.total_steps = total_steps
        self.stop_at_step = config.runtime.stop_at_step

    def on_checkpoint(self, step: int, directory: Path, metrics: dict[str, float]) -> None:
        if step >= self.total_steps or step == self.stop_at_step:
            self._last = (step, Path(directory), dict(metrics))
        else:
            self.report(step, Path(directory), {**metrics, "step": step})

    def on_end(self, result: Any) -> None:
        if self._last is not None:
            step, directory, metrics = self._last
            self._last = None
            self.report(step, directory, {**metrics, "step": step, "seconds": result.seconds,
                                          "train_seconds": result.train_seconds,
                                          "interrupted": float(bool(result.interrupted))})

    def report(self, step: int, directory: Path, metrics: dict[str, float]) -> None:
        raise NotImplementedError

    def temporary_dir(self) -> Path:
        """A local directory for a downloaded checkpoint, removed by :meth:`close`."""
        path = Path(tempfile.mkdtemp(prefix="npsemiseg-resume-"))
        self._temporary.append(path)
        return path

    def latest_in(self, store: CheckpointStore) -> Path | None:
        """``store``'s newest complete checkpoint as a local directory (downloaded when remote), or None."""
        latest = store.latest()
        if latest is None:
            return None
        return store.local_copy(latest[0], None if store.storage.is_local else self.temporary_dir())

    def close(self) -> None:
        """Remove downloaded checkpoints (after the loop has restored from them)."""
        for path in self._temporary:
            shutil.rmtree(path, ignore_errors=True)
        self._temporary.clear()


class TrainReporter(CheckpointReporter):
    """Ray Train workers: every rank reports, rank 0 with the checkpoint (persisted by Ray).

    Resumes from ``ray.train.get_checkpoint()`` (the last one Ray registered, after a worker
    failure or when the same name runs again), else from the storage's newest complete
    checkpoint (a lineage started by another launcher).
    """

    def __init__(self, store: CheckpointStore) -> None:
        super().__init__()
        self.store = store

    def on_evaluation(self, step, metrics) -> None:
        """Evaluations before the end are reported too (every rank, no checkpoint), so a Train callback
        such as a search's (``run_cell(train_callbacks=...)``) can pass them on to a Tune scheduler."""
        if step < self.total_steps:
            import ray.train

            ray.train.report({**metrics, "step": step})

    def report(self, step, directory, metrics) -> None:
        import ray.train

        checkpoint = None
        if self.rank == 0:
            mark_complete(directory, step)
            checkpoint = ray.train.Checkpoint.from_directory(str(directory))
            self.last_uri = self.store.storage.uri_of(self.store.name, checkpoint_dir_name(step))
        ray.train.report(metrics, checkpoint=checkpoint, checkpoint_dir_name=checkpoint_dir_name(step))

    def resume_from(self) -> Path | None:
        import ray.train

        checkpoint = ray.train.get_checkpoint()
        if checkpoint is None:
            return self.latest_in(self.store)
        if self.store.storage.is_local:
            return Path(checkpoint.path)
        return Path(checkpoint.to_directory(str(self.temporary_dir())))


class StoreReporter(CheckpointReporter):
    """One process (Ray Train's local mode, or in-process): checkpoints copied to the storage.

    ``also_ray_train``: also ``ray.train.report`` the metrics (Ray Train's local mode does not
    persist checkpoints; the report gives its ``Result`` the final metrics).
    """

    def __init__(self, store: CheckpointStore, *, also_ray_train: bool = False, keep: int = 2) -> None:
        super().__init__()
        self.store = store
        self.also_ray_train = also_ray_train
        self.keep = keep

    def report(self, step, directory, metrics) -> None:
        self.last_uri = self.store.save(step, directory)
        self.store.prune(self.keep)
        if self.also_ray_train:
            import ray.train

            ray.train.report(metrics)

    def resume_from(self) -> Path | None:
        return self.latest_in(self.store)


class TuneReporter(CheckpointReporter):
    """In-process cell inside a Ray Tune trial: ``ray.tune.report`` with Tune checkpoints.

    Evaluations before the end are reported too (without a checkpoint) so schedulers such as
    ASHA see them; resumes from ``ray.tune.get_checkpoint()`` (Tune restores it after a trial
    failure or when the experiment is resumed).
    """

    def on_evaluation(self, step, metrics) -> None:
        if step < self.total_steps:
            import ray.tune

            ray.tune.report({**metrics, "step": step})

    def report(self, step, directory, metrics) -> None:
        import ray.tune

        mark_complete(directory, step)
        ray.tune.report(metrics, checkpoint=ray.tune.Checkpoint.from_directory(str(directory)))
        self.last_uri = None  # Tune persists it under the trial's directory; its path is Tune's

    def resume_from(self) -> Path | None:
        import ray.tune

        checkpoint = ray.tune.get_checkpoint()
        return None if checkpoint is None else Path(checkpoint.to_directory(str(self.temporary_dir())))


# ----------------------------------------------------------------------------- the shared body
@dataclass(frozen=True)
class CellSpec:
    """What every launcher hands to :func:`execute` (picklable: it travels to Ray workers)."""

    config: Any
    name: str
    storage_uri: str
    storage_endpoint: str | None
    tracking_uri: str
    run_id: str
    fault: FaultInjection | None = None
    progress: bool = False
    flush_every_s: float = 10.0
    #: Ray Train's local mode (``workers=0``): Ray does not persist checkpoints there
    local_mode: bool = False

    def store(self) -> CheckpointStore:
        return CheckpointStore(parse_storage(self.storage_uri, endpoint_url=self.storage_endpoint), self.name)


def execute(spec: CellSpec, reporter: CheckpointReporter, extra: list[Callbacks] | None = None) -> Any:
    """Run ``npsemiseg.training.train`` for the cell with the platform's callbacks; returns its ``RunResult``.

    Checkpoints are written to a temporary ``runtime.output_dir`` and handed to ``reporter``;
    rank 0 logs into the MLflow run ``spec.run_id``. An exception is recorded on the run
    (rank 0) and re-raised; buffered metrics are written in every case.
    """
    from npsemiseg.training import train

    tracker = MLflowCallbacks(spec.tracking_uri, spec.run_id, flush_every_s=spec.flush_every_s)
    callbacks: list[Callbacks] = [reporter, tracker]
    if spec.progress:
        callbacks.append(ProgressPrinter())
    callbacks.extend(extra or [])
    if spec.fault is not None:
        callbacks.append(spec.fault)
    with tempfile.TemporaryDirectory(prefix="npsemiseg-run-") as output_dir:
        config = spec.config.with_overrides({"runtime.output_dir": output_dir})
        try:
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


def train_worker(spec: CellSpec) -> None:
    """The Ray Train worker loop (also Ray Train's local mode, in the driver)."""
    reporter = StoreReporter(spec.store(), also_ray_train=True) if spec.local_mode else TrainReporter(spec.store())
    execute(spec, reporter)


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


@dataclass
class _LoopOutcome:
    """What a launcher learnt from the loop: final metrics, steps, timing, last checkpoint."""

    metrics: dict[str, float]
    steps: int
    loop_seconds: float
    train_seconds: float
    checkpoint_uri: str | None
    interrupted: bool = False


def _tracked(config: Any, *, storage: Storage, name: str, tracking: str | None, experiment: str,
             grid_id: str | None, parent_run_id: str | None, progress: bool, local_mode: bool,
             launch: Callable[[CellSpec], _LoopOutcome]) -> CellResult:
    """Open the cell's MLflow run, ``launch`` the loop, record the outcome; shared by every launcher."""
    started = time.perf_counter()
    fault = FaultInjection.from_env()
    result = CellResult(name=name, cell_id=config.cell_id, status="RUNNING")
    run = CellRun.open(config, tracking=tracking, experiment=experiment, grid_id=grid_id, parent_run_id=parent_run_id)
    result.run_id, result.run_url = run.run_id, run.url
    spec = CellSpec(config=config, name=name, storage_uri=storage.uri, storage_endpoint=storage.endpoint_url,
                    tracking_uri=run.tracking_uri, run_id=run.run_id, fault=fault, progress=progress,
                    local_mode=local_mode)
    try:
        with run:
            outcome = launch(spec)
            result.metrics = {k: float(v) for k, v in outcome.metrics.items() if k not in _RUN_KEYS}
            result.steps, result.checkpoint_uri = outcome.steps, outcome.checkpoint_uri
            result.loop_seconds, result.train_seconds = outcome.loop_seconds, outcome.train_seconds
            run.log_checkpoint_uri(result.checkpoint_uri)
            result.wall_seconds = time.perf_counter() - started
            run.log_metrics({"time/cell_wall_seconds": result.wall_seconds,
                             "time/orchestration_seconds": result.overhead_seconds}, step=result.steps)
            if outcome.interrupted:
                run.finish("KILLED", f"stopped at step {outcome.steps} by runtime.stop_at_step; run the cell again to resume")
    except Exception as error:
        result.status, result.error = run.status or "FAILED", format_error(error)
        result.wall_seconds = time.perf_counter() - started
        raise CellFailedError(result) from error
    result.status = run.status or "FINISHED"
    return result


def run_cell(config: Any, *, workers: int = 1, gpus_per_worker: float = 0, cpus_per_worker: float = 1.0,
             storage: str | os.PathLike | Storage | None = None, tracking: str | None = None,
             experiment: str = DEFAULT_EXPERIMENT, max_failures: int = 0, grid_id: str | None = None,
             parent_run_id: str | None = None, name: str | None = None, progress: bool = False,
             train_callbacks: list[Any] | None = None) -> CellResult:
    """Train one cell with Ray Train (V2): ``workers`` DDP workers, or ``workers=0`` for local mode.

    ``storage``: local directory or ``s3://bucket/prefix[?endpoint_override=...]`` (default
    ``<cwd>/ray_results``), checked for reachability first; checkpoints live under
    ``<storage>/<name>`` (``name`` defaults to :func:`cell_run_name`), and the same name resumes
    from its last checkpoint. ``tracking``: MLflow tracking URI (default ``MLFLOW_TRACKING_URI``,
    else ``sqlite:///<cwd>/mlruns.db``). ``max_failures``: worker-group restarts from the last
    checkpoint (Ray Train's ``FailureConfig``; -1 = forever). Embedded Ray is started when
    needed (``ray_runtime.ensure_ray``); inside ``ray job submit`` the job's cluster is used.

    Returns a :class:`CellResult`: FINISHED, or KILLED when ``runtime.stop_at_step`` stopped it
    early (run it again to resume). A failed cell raises :class:`CellFailedError`
    (``result.status`` FAILED, ``result.error``) after its MLflow run ended; Ctrl-C and SIGTERM
    end the run KILLED and propagate (``KeyboardInterrupt``, ``tracking.CellKilled``).
    ``train_callbacks``: Ray Train ``UserCallback``s for the trainer's ``RunConfig`` (a search passes
    the workers' evaluations on to Tune with one).
    """
    validate_resources(workers, gpus_per_worker, cpus_per_worker, max_failures)
    storage = parse_storage(storage)
    storage.check()
    name = name or cell_run_name(config, grid_id, experiment)

    def launch(spec: CellSpec) -> _LoopOutcome:
        fit = _fit(spec, storage, workers=workers, gpus_per_worker=gpus_per_worker,
                   cpus_per_worker=cpus_per_worker, max_failures=max_failures, train_callbacks=train_callbacks)
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

    return _tracked(config, storage=storage, name=name, tracking=tracking, experiment=experiment, grid_id=grid_id,
                    parent_run_id=parent_run_id, progress=progress, local_mode=workers == 0, launch=launch)


def _fit(spec: CellSpec, storage: Storage, *, workers: int, gpus_per_worker: float, cpus_per_worker: float,
         max_failures: int, train_callbacks: list[Any] | None = None) -> Any:
    """Build and fit the ``TorchTrainer``; returns its ``Result`` (raises ``TrainingFailedError``)."""
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    from semiseg_platform.ray_runtime import ensure_ray, worker_env

    if workers > 0:
        ensure_ray()
    resources = {"CPU": cpus_per_worker, **({"GPU": gpus_per_worker} if gpus_per_worker else {})}
    scaling = ScalingConfig(num_workers=workers, use_gpu=gpus_per_worker > 0,
                            resources_per_worker=resources if workers else None)
    run_config = RunConfig(
        name=spec.name,
        failure_config=FailureConfig(max_failures=max_failures),
        checkpoint_config=CheckpointConfig(num_to_keep=2),
        worker_runtime_env={"env_vars": worker_env()} if workers else None,
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


def run_cell_in_process(config: Any, *, reporter: CheckpointReporter | None = None,
                        storage: str | os.PathLike | Storage | None = None, tracking: str | None = None,
                        experiment: str = DEFAULT_EXPERIMENT, grid_id: str | None = None,
                        parent_run_id: str | None = None, name: str | None = None, progress: bool = False,
                        callbacks: list[Callbacks] | None = None) -> CellResult:
    """Train one single-device cell in this process (e.g. a reused Ray Tune actor of a grid).

    ``reporter``: :class:`TuneReporter` inside a Tune trial; default a :class:`StoreReporter`
    on ``<storage>/<name>`` (resumes from its newest checkpoint). Same callbacks, checkpoints
    and MLflow run as :func:`run_cell`; ``callbacks`` are added to the platform's. Returns or
    raises as :func:`run_cell` does.
    """
    storage = parse_storage(storage)
    name = name or cell_run_name(config, grid_id, experiment)
    reporter = reporter or StoreReporter(CheckpointStore(storage, name))

    def launch(spec: CellSpec) -> _LoopOutcome:
        loop = execute(spec, reporter, callbacks)
        return _LoopOutcome(metrics=dict(loop.metrics), steps=loop.steps, loop_seconds=loop.seconds,
                            train_seconds=loop.train_seconds, checkpoint_uri=reporter.last_uri,
                            interrupted=loop.interrupted)

    return _tracked(config, storage=storage, name=name, tracking=tracking, experiment=experiment, grid_id=grid_id,
                    parent_run_id=parent_run_id, progress=progress, local_mode=False, launch=launch)
