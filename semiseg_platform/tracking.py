"""MLflow tracking of cells: the store, one run per cell, rank-0 logging, orphan sweep.

The schema (run name, tags, params, metric and artifact names) is the one of
``docs/CONTRACTS.md`` ("Tracking schema"): the grid, the tables and the UI read it.

Who does what:

- The launching process (the driver of a Ray Train cell, or the process running an
  in-process cell) owns the run's life: :meth:`CellRun.open` creates the store and
  experiment if needed, finds the cell's run by ``cell_id`` (+ ``grid_id``) or creates it,
  logs tags, params and the configuration, and the ``with`` block ends it FINISHED, FAILED
  (``error`` tag) or KILLED whatever happens. A restarted cell reuses its run.
- Rank 0 of the training loop logs into that run through :class:`MLflowCallbacks`
  (metrics per step and evaluation, final metrics, figures, tables).
- :func:`sweep_orphaned_runs` ends RUNNING runs whose owning process is gone
  (killed with SIGKILL, machine lost), so no run stays RUNNING forever.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import math
import os
import signal
import socket
import subprocess
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import urlparse

from mlflow.entities import Metric, Param, RunTag
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from npsemiseg.callbacks import Callbacks

logger = logging.getLogger(__name__)

DEFAULT_EXPERIMENT = "npsemiseg"
DEFAULT_STORE_FILE = "mlruns.db"
DEFAULT_ARTIFACT_DIR = "mlartifacts"

#: Tags naming the process that owns a RUNNING run (for the orphan sweep)
OWNER_HOST_TAG = "npsemiseg.owner_host"
OWNER_PID_TAG = "npsemiseg.owner_pid"
OWNER_START_TAG = "npsemiseg.owner_start"
KIND_TAG = "npsemiseg.kind"
ERROR_TAG = "error"
ATTEMPTS_TAG = "npsemiseg.attempts"
CHECKPOINT_URI_ARTIFACT = "checkpoint_uri.txt"
CONFIG_ARTIFACT = "config/config.yaml"
PER_CLASS_IOU_TABLE = "tables/per_class_iou.json"
#: MLflow's tag holding a run's description (Markdown, shown on the run's page)
NOTE_TAG = "mlflow.note.content"

#: Final metrics logged without prefix (the tables read these)
FINAL_METRICS = ("miou", "pavpu", "ece", "nll", "brier", "auroc", "pixel_acc")

_MAX_TAG_LENGTH = 4000
_MLFLOW_BATCH = 1000  # log_batch accepts at most 1000 metrics per call


# ----------------------------------------------------------------------------- store
def resolve_tracking_uri(tracking: str | os.PathLike | None = None) -> str:
    """The tracking URI: ``tracking``, else ``MLFLOW_TRACKING_URI``, else ``sqlite:///<cwd>/mlruns.db``.

    Relative SQLite paths and plain paths to a ``.db`` file are made absolute, because Ray
    workers run in other working directories.
    """
    uri = os.fspath(tracking) if tracking else os.environ.get("MLFLOW_TRACKING_URI") or str(Path.cwd() / DEFAULT_STORE_FILE)
    if "://" not in uri:
        return f"sqlite:///{Path(uri).expanduser().resolve()}"
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        return f"sqlite:///{Path(uri[len('sqlite:///'):]).resolve()}"
    return uri


def _sqlite_path(tracking_uri: str) -> Path | None:
    return Path(tracking_uri[len("sqlite:///"):]) if tracking_uri.startswith("sqlite:///") else None


@contextlib.contextmanager
def _store_lock(tracking_uri: str) -> Iterator[None]:
    """An exclusive file lock next to a SQLite store: concurrent creation of a fresh store crashes."""
    path = _sqlite_path(tracking_uri)
    if path is None:
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{path}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def prepare_experiment(tracking_uri: str, experiment: str = DEFAULT_EXPERIMENT) -> str:
    """Create the store (SQLite: its tables) and the experiment if missing; returns the experiment id.

    Call in the driver before any worker starts. A SQLite store keeps its artifacts in
    ``mlartifacts/`` next to the database file (absolute, so every process finds them).
    """
    if not experiment:
        raise ValueError("experiment: expected a non-empty experiment name")
    with _store_lock(tracking_uri):
        client = MlflowClient(tracking_uri)
        found = client.get_experiment_by_name(experiment)
        if found is not None:
            if found.lifecycle_stage == "deleted":
                client.restore_experiment(found.experiment_id)
            return found.experiment_id
        db = _sqlite_path(tracking_uri)
        location = (db.parent / DEFAULT_ARTIFACT_DIR).as_uri() if db is not None else None
        try:
            return client.create_experiment(experiment, artifact_location=location)
        except MlflowException:  # created meanwhile by another process (not SQLite-locked)
            found = client.get_experiment_by_name(experiment)
            if found is None:
                raise
            return found.experiment_id


def run_url(tracking_uri: str, experiment_id: str, run_id: str) -> str:
    """Where to look at a run: the server's page, or for a local store the page ``npsemiseg ui`` serves."""
    scheme = urlparse(tracking_uri).scheme
    base = tracking_uri.rstrip("/") if scheme in ("http", "https") else "http://127.0.0.1:5000"
    return f"{base}/#/experiments/{experiment_id}/runs/{run_id}"


def ui_hint(tracking_uri: str) -> str | None:
    """The command that serves a local store's UI (None for a tracking server): ``npsemiseg ui``,
    which also serves the store's artifacts and binds loopback only."""
    if urlparse(tracking_uri).scheme in ("http", "https"):
        return None
    return f"npsemiseg ui --tracking {tracking_uri}"


# ----------------------------------------------------------------------------- tags
def git_commit() -> str:
    """The commit of the checkout this package runs from (``NPSEMISEG_GIT_COMMIT`` overrides; else "unknown")."""
    if os.environ.get("NPSEMISEG_GIT_COMMIT"):
        return os.environ["NPSEMISEG_GIT_COMMIT"]
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else "unknown"


def package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("npsemiseg")
    except PackageNotFoundError:
        return "unknown"


def cell_tags(config: Any, *, grid_id: str | None = None, parent_run_id: str | None = None) -> dict[str, str]:
    """The schema's tags of a cell run (``config`` is a ``npsemiseg.RunConfig``), with the run's
    description (``mlflow.note.content``: what the cell is, shown on its page in the UI)."""
    from semiseg_platform.ui import cell_description

    tags = {
        "framework": config.framework,
        "dataset": config.dataset,
        "partition": str(config.partition),
        "head": config.head.variant,
        "head_name": config.head.name,
        "seed": str(config.seed),
        "cell_id": config.cell_id,
        "git_commit": git_commit(),
        "npsemiseg_version": package_version(),
        KIND_TAG: "cell",
        NOTE_TAG: cell_description(config, grid_id=grid_id),
    }
    if grid_id:
        tags["grid_id"] = grid_id
    if parent_run_id:
        tags["mlflow.parentRunId"] = parent_run_id
    return tags


def format_error(error: BaseException | str) -> str:
    """``Type: message`` on one line, unwrapping Ray Train's worker-group errors to the first worker's."""
    if isinstance(error, str):
        text = error
    else:
        failures = getattr(error, "worker_failures", None)
        if failures:
            rank = min(failures)
            inner = failures[rank]
            cause = getattr(inner, "cause", None) or inner.__cause__ or inner
            text = f"rank {rank}: {type(cause).__name__}: {cause}"
        else:
            text = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    text = " ".join(text.split())
    return text if len(text) <= _MAX_TAG_LENGTH else text[: _MAX_TAG_LENGTH - 3] + "..."


def error_reason(error: BaseException) -> str:
    """The innermost cause of an error raised through Ray (a trial's, a task's), on one line."""
    cause = error
    while True:
        inner = getattr(cause, "cause", None) or cause.__cause__  # RayTaskError.cause: the trial's exception
        if not isinstance(inner, BaseException) or inner is cause:
            return format_error(cause)
        cause = inner


# ----------------------------------------------------------------------------- owner
def _process_start(pid: int) -> str:
    """The kernel's start time of ``pid`` (clock ticks since boot, Linux), or "" where unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rsplit(")", 1)[1].split()[19]


def _owner_tags() -> dict[str, str]:
    pid = os.getpid()
    return {OWNER_HOST_TAG: socket.gethostname(), OWNER_PID_TAG: str(pid), OWNER_START_TAG: _process_start(pid)}


def _owner_alive(tags: dict[str, str]) -> bool | None:
    """True/False for an owner on this host; None when the owner is elsewhere (cannot tell)."""
    if tags.get(OWNER_HOST_TAG) != socket.gethostname() or not tags.get(OWNER_PID_TAG, "").isdigit():
        return None
    pid = int(tags[OWNER_PID_TAG])
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    start = tags.get(OWNER_START_TAG, "")
    return not start or _process_start(pid) == start


def sweep_orphaned_runs(experiment: str = DEFAULT_EXPERIMENT, *, tracking: str | None = None,
                        stale_after_s: float | None = None, status: str = "KILLED") -> list[str]:
    """End RUNNING runs whose owner is gone; returns their ids.

    An owner on this host is gone when its process no longer exists (or the pid was reused).
    Runs owned on other hosts are ended only when ``stale_after_s`` is given and they started
    longer ago than that. Each swept run gets ``error = "orphaned: ..."`` and ``status``.
    """
    tracking_uri = resolve_tracking_uri(tracking)
    client = MlflowClient(tracking_uri)
    found = client.get_experiment_by_name(experiment)
    if found is None:
        return []
    swept = []
    now_ms = time.time() * 1000
    for run in _search_all(client, found.experiment_id, "attributes.status = 'RUNNING'"):
        tags = run.data.tags
        alive = _owner_alive(tags)
        if alive is None:
            if stale_after_s is None or now_ms - run.info.start_time < stale_after_s * 1000:
                continue
            reason = f"orphaned: owner {tags.get(OWNER_HOST_TAG, '?')}:{tags.get(OWNER_PID_TAG, '?')} silent for over {stale_after_s:.0f} s"
        elif alive:
            continue
        else:
            reason = f"orphaned: owner process {tags.get(OWNER_PID_TAG)} on {tags.get(OWNER_HOST_TAG)} is gone"
        client.set_tag(run.info.run_id, ERROR_TAG, reason)
        client.set_terminated(run.info.run_id, status=status)
        swept.append(run.info.run_id)
    return swept


def _search_all(client: MlflowClient, experiment_id: str, filter_string: str) -> list[Any]:
    runs, token = [], None
    while True:
        page = client.search_runs([experiment_id], filter_string=filter_string, max_results=1000, page_token=token,
                                  order_by=["attributes.start_time DESC"])
        runs.extend(page)
        token = page.token
        if not token:
            return runs


def find_cell_run(client: MlflowClient, experiment_id: str, cell_id: str, grid_id: str | None = None):
    """The newest run of ``cell_id`` in this grid (``grid_id=None``: outside any grid), or None."""
    filter_string = f"tags.cell_id = '{cell_id}'"
    if grid_id:
        filter_string += f" and tags.grid_id = '{grid_id}'"
    for run in _search_all(client, experiment_id, filter_string):
        if grid_id or "grid_id" not in run.data.tags:
            return run
    return None


# ----------------------------------------------------------------------------- the cell's run
class CellKilled(BaseException):
    """Raised in the owning process by SIGTERM while a cell runs (the run then ends KILLED)."""


@contextlib.contextmanager
def sigterm_as_killed() -> Iterator[None]:
    """Turn SIGTERM into :class:`CellKilled` for the duration (main thread only; else a no-op)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise CellKilled(f"terminated by signal {signum}")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@dataclass
class RunEnd:
    """The status a run ends with when its :func:`ending_run` block exits; the block may set it
    (a grid with failed cells ends its parent run FAILED)."""

    status: str = "FINISHED"


@contextlib.contextmanager
def ending_run(client: MlflowClient, run_id: str) -> Iterator[RunEnd]:
    """End ``run_id`` when the block exits: with ``end.status`` (FINISHED unless the block set
    another), FAILED if the block raised, KILLED on Ctrl-C or SIGTERM (:class:`CellKilled`)."""
    end = RunEnd()
    try:
        yield end
    except (KeyboardInterrupt, CellKilled):
        end.status = "KILLED"
        raise
    except BaseException:
        end.status = "FAILED"
        raise
    finally:
        client.set_terminated(run_id, end.status)


class CellRun:
    """The MLflow run of one cell, owned by the launching process.

    Use :meth:`open` as a context manager: the block's outcome sets the final status
    (normal exit FINISHED, ``KeyboardInterrupt``/:class:`CellKilled` KILLED, any other
    exception FAILED with the ``error`` tag), and SIGTERM inside the block counts as KILLED.
    """

    def __init__(self, client: MlflowClient, tracking_uri: str, experiment_id: str, run_id: str, *, reused: bool) -> None:
        self.client = client
        self.tracking_uri = tracking_uri
        self.experiment_id = experiment_id
        self.run_id = run_id
        self.reused = reused
        self.status: str | None = None

    @property
    def url(self) -> str:
        return run_url(self.tracking_uri, self.experiment_id, self.run_id)

    @classmethod
    def open(cls, config: Any, *, tracking: str | None = None, experiment: str = DEFAULT_EXPERIMENT,
             grid_id: str | None = None, parent_run_id: str | None = None) -> CellRun:
        """Find the cell's run (``cell_id`` + ``grid_id``) or create it, mark it RUNNING and owned here.

        A run still RUNNING under another live process on this host is not taken over
        (``RuntimeError``): the same cell must not train twice at once into one lineage.

        Logs the schema's tags, ``config.flat()`` as params (a reused run keeps its params; keys
        whose value changed are listed in the ``npsemiseg.params_changed`` tag) and the
        configuration YAML.
        """
        tracking_uri = resolve_tracking_uri(tracking)
        experiment_id = prepare_experiment(tracking_uri, experiment)
        client = MlflowClient(tracking_uri)
        tags = {**cell_tags(config, grid_id=grid_id, parent_run_id=parent_run_id), **_owner_tags()}
        existing = find_cell_run(client, experiment_id, config.cell_id, grid_id)
        if existing is None:
            run = client.create_run(experiment_id, run_name=config.cell_name, tags=tags)
            run_id, old_params = run.info.run_id, {}
        else:
            run_id, old_params = existing.info.run_id, existing.data.params
            owner = existing.data.tags
            if (existing.info.status == "RUNNING" and _owner_alive(owner)
                    and owner.get(OWNER_PID_TAG) != str(os.getpid())):
                raise RuntimeError(f"cell {config.cell_name} ({config.cell_id}) is already running: MLflow run {run_id} "
                                   f"owned by process {owner.get(OWNER_PID_TAG)} on {owner.get(OWNER_HOST_TAG)}")
            client.update_run(run_id, status="RUNNING")
            if ERROR_TAG in existing.data.tags:
                client.delete_tag(run_id, ERROR_TAG)
        cell = cls(client, tracking_uri, experiment_id, run_id, reused=existing is not None)
        params = config.flat()
        changed = sorted(k for k, v in params.items() if k in old_params and old_params[k] != v)
        if changed:
            tags["npsemiseg.params_changed"] = ",".join(changed)[:_MAX_TAG_LENGTH]
            logger.warning("cell %s: reused run %s was logged with other values of %s", config.cell_name, run_id, changed)
        new_params = [Param(k, v) for k, v in params.items() if k not in old_params]
        for start in range(0, len(new_params), 100):
            client.log_batch(run_id, params=new_params[start:start + 100])
        client.log_batch(run_id, tags=[RunTag(k, v) for k, v in tags.items()])
        client.log_text(run_id, config.to_yaml(), CONFIG_ARTIFACT)
        return cell

    def log_checkpoint_uri(self, uri: str | None) -> None:
        if uri:
            self.client.log_text(self.run_id, uri + "\n", CHECKPOINT_URI_ARTIFACT)
            self.client.set_tag(self.run_id, "checkpoint_uri", uri)

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        _log_metrics(self.client, self.run_id, metrics, step=step)

    def finish(self, status: str = "FINISHED", error: BaseException | str | None = None) -> None:
        """End the run with ``status``; ``error`` goes to the ``error`` tag (and ``error/traceback.txt``).

        A run that another party already ended KILLED (a search driver recording an ASHA stop while
        this cell was still being torn down) stays KILLED: the error is the teardown, not a failure.
        """
        if error is not None:
            current = self.client.get_run(self.run_id)
            tags = current.data.tags
            if status == "FAILED" and current.info.status == "KILLED":
                status = "KILLED"
            if ERROR_TAG not in tags:  # rank 0 may have recorded the original exception already
                self.client.set_tag(self.run_id, ERROR_TAG, format_error(error))
            if isinstance(error, BaseException) and error.__traceback__ is not None:
                text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
                self.client.log_text(self.run_id, text, "error/traceback.txt")
        elif status == "FINISHED":
            with contextlib.suppress(MlflowException):
                self.client.delete_tag(self.run_id, ERROR_TAG)  # a failure that a retry recovered from
        self.client.set_terminated(self.run_id, status=status)
        self.status = status

    def __enter__(self) -> CellRun:
        self._sigterm = sigterm_as_killed()
        self._sigterm.__enter__()
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        self._sigterm.__exit__(None, None, None)
        if exc is None:
            if self.status is None:
                self.finish("FINISHED")
            return False
        try:
            self.finish("KILLED" if isinstance(exc, (KeyboardInterrupt, CellKilled)) else "FAILED", exc)
        except Exception:  # noqa: BLE001 - the store failing too must not replace the cell's own error
            logger.exception("could not end MLflow run %s; `sweep_orphaned_runs` will", self.run_id)
        return False


# ----------------------------------------------------------------------------- rank-0 logging
def _finite(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _defined_or_nan(value: Any) -> float | None:
    """A finite number, or NaN for an undefined one (None for non-numbers and infinities).

    NaN is kept for evaluation metrics, e.g. the IoU of a class absent from the evaluated
    images: every cell then has the same metric keys (MLflow stores and shows NaN).
    """
    number = _finite(value)
    if number is None and isinstance(value, (int, float)) and math.isnan(value):
        return math.nan
    return number


def _log_metrics(client: MlflowClient, run_id: str, metrics: dict[str, Any], *, step: int | None) -> None:
    timestamp = int(time.time() * 1000)
    entries = [Metric(key, number, timestamp, step or 0) for key, value in metrics.items()
               if (number := _defined_or_nan(value)) is not None]
    for start in range(0, len(entries), _MLFLOW_BATCH):
        client.log_batch(run_id, metrics=entries[start:start + _MLFLOW_BATCH])


def _prefixed(prefix: str, metrics: dict[str, Any]) -> dict[str, Any]:
    return {key if key.startswith(prefix) else f"{prefix}{key}": value for key, value in metrics.items()}


#: Where files reported through ``on_artifact`` go, by suffix
_ARTIFACT_DIRS = {".png": "figures", ".jpg": "figures", ".jpeg": "figures", ".pdf": "figures", ".svg": "figures",
                  ".csv": "tables", ".json": "tables", ".parquet": "tables", ".md": "tables", ".tex": "tables"}


def artifact_path(name: str, path: Path) -> str:
    """The stable artifact path of a reported file: ``name`` if it has a folder, else by suffix.

    ``("uncertainty_maps", x.png)`` -> ``figures/uncertainty_maps.png``;
    ``("per_class_iou", x.csv)`` -> ``tables/per_class_iou.csv``; ``("figures/a.png", ...)`` as is.
    """
    suffix = Path(path).suffix.lower()
    if "/" in name:
        return name if Path(name).suffix else f"{name}{suffix}"
    stem = name if Path(name).suffix else f"{name}{suffix}"
    folder = _ARTIFACT_DIRS.get(suffix)
    return f"{folder}/{stem}" if folder else stem


class MLflowCallbacks(Callbacks):
    """Rank 0's logging into the cell's run (created by :class:`CellRun` in the launcher).

    Step metrics are buffered and written in batches (every ``flush_every_s`` seconds, and at
    every evaluation, checkpoint and the end) so a long run does not write the store at each
    step. Only rank 0 logs: on other ranks every hook returns at once.
    """

    def __init__(self, tracking_uri: str, run_id: str, *, flush_every_s: float = 10.0) -> None:
        self.tracking_uri = tracking_uri
        self.run_id = run_id
        self.flush_every_s = flush_every_s
        self.client = MlflowClient(tracking_uri)
        self.rank = 0
        self._pending: list[Metric] = []
        self._last_flush = time.monotonic()

    @property
    def active(self) -> bool:
        return self.rank == 0

    def on_start(self, config: Any, *, total_steps: int, start_step: int, rank: int, world_size: int) -> None:
        self.rank = rank
        if not self.active:
            return
        attempts = int(self.client.get_run(self.run_id).data.tags.get(ATTEMPTS_TAG, "0")) + 1
        self.client.log_batch(self.run_id, tags=[RunTag(ATTEMPTS_TAG, str(attempts)), RunTag("world_size", str(world_size))])
        self.client.log_batch(self.run_id, metrics=[Metric("train/total_steps", float(total_steps), int(time.time() * 1000), start_step)])

    def on_step(self, step: int, total_steps: int, logs: dict[str, float]) -> None:
        if not self.active:
            return
        timestamp = int(time.time() * 1000)
        self._pending.extend(Metric(key, number, timestamp, step) for key, value in _prefixed("train/", logs).items()
                             if (number := _finite(value)) is not None)
        if time.monotonic() - self._last_flush >= self.flush_every_s or len(self._pending) >= _MLFLOW_BATCH:
            self.flush()

    def flush(self) -> None:
        """Write the buffered step metrics."""
        pending, self._pending = self._pending, []
        for start in range(0, len(pending), _MLFLOW_BATCH):
            self.client.log_batch(self.run_id, metrics=pending[start:start + _MLFLOW_BATCH])
        self._last_flush = time.monotonic()

    def on_evaluation(self, step: int, metrics: dict[str, float]) -> None:
        if not self.active:
            return
        self.flush()
        _log_metrics(self.client, self.run_id, _prefixed("eval/", metrics), step=step)

    def on_checkpoint(self, step: int, directory: Path, metrics: dict[str, float]) -> None:
        if self.active:
            self.flush()

    def on_artifact(self, name: str, path: Path) -> None:
        if not self.active:
            return
        target = artifact_path(name, Path(path))
        folder, _, filename = target.rpartition("/")
        if Path(path).is_dir():
            self.client.log_artifacts(self.run_id, str(path), target)
        elif filename == Path(path).name:
            self.client.log_artifact(self.run_id, str(path), folder or None)
        else:  # MLflow keeps the file's own name: copy it under the stable one
            with tempfile.TemporaryDirectory() as tmp:
                renamed = Path(tmp) / filename
                renamed.write_bytes(Path(path).read_bytes())
                self.client.log_artifact(self.run_id, str(renamed), folder or None)
        if target == PER_CLASS_IOU_TABLE:
            self._log_per_class_iou_figure(Path(path))

    def _log_per_class_iou_figure(self, table: Path) -> None:
        """``figures/per_class_iou.png``: the per-class IoU table as a bar chart."""
        import json

        from semiseg_platform.ui import PER_CLASS_IOU_FIGURE, per_class_iou_figure

        iou = json.loads(table.read_text())
        if iou:
            name = self.client.get_run(self.run_id).info.run_name
            self.client.log_figure(self.run_id, per_class_iou_figure(iou, title=name), PER_CLASS_IOU_FIGURE)

    def on_end(self, result: Any) -> None:
        """Final metrics (unprefixed, at the last step) and the loop's timing (``time/...``)."""
        if not self.active:
            return
        self.flush()
        metrics = dict(getattr(result, "metrics", {}) or {})
        step = int(getattr(result, "steps", 0) or 0)
        final = {key: value for key, value in metrics.items() if not key.startswith(("train/", "eval/"))}
        for key in ("seconds", "train_seconds"):
            if getattr(result, key, None) is not None:
                final[f"time/{key}"] = getattr(result, key)
        _log_metrics(self.client, self.run_id, final, step=step)

    def close(self) -> None:
        """Write what is still buffered (call in a ``finally``: a failing run keeps its last steps)."""
        if self.active and self._pending:
            try:
                self.flush()
            except Exception:  # noqa: BLE001 - never mask the run's own error
                logger.exception("could not write the last metrics of run %s", self.run_id)

    def record_error(self, error: BaseException) -> None:
        """Tag the run with the exception that ended training on this rank (rank 0 only)."""
        if self.active:
            self.client.set_tag(self.run_id, ERROR_TAG, format_error(error))

