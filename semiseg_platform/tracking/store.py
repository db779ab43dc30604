"""The MLflow store: where it is, its experiments, paging through its runs, finding a cell's run,
and ending RUNNING runs whose owning process is gone (the orphan sweep, and the reconciliation of
a study's earlier submissions).

Whether a RUNNING run's owner is gone: an owner on this host is asked directly (its pid exists
and has the recorded start time); an owner on another host cannot be asked, so it counts as gone
once it has not been heard from for ``stale_after_s``: its :class:`Heartbeat` stamps the run's
``npsemiseg.heartbeat`` tag every :data:`HEARTBEAT_INTERVAL_S`, and the reconciliation of a
submission waits :data:`REMOTE_STALE_AFTER_S` (ten missed heartbeats) after the last stamp (or
the run's start) before ending it.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from mlflow.entities import ViewType
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from semiseg_platform.tracking import mlflow_names
from semiseg_platform.tracking.experiment_page import describe_experiment, experiment_tags

DEFAULT_EXPERIMENT = "npsemiseg"
DEFAULT_STORE_FILE = "mlruns.db"
DEFAULT_ARTIFACT_DIR = "mlartifacts"
#: Seconds between two heartbeats of a RUNNING run's owner
HEARTBEAT_INTERVAL_S = 30.0
#: Seconds without a heartbeat after which an owner on another host counts as gone
REMOTE_STALE_AFTER_S = 10 * HEARTBEAT_INTERVAL_S

logger = logging.getLogger(__name__)


def resolve_tracking_uri(tracking: str | os.PathLike | None = None) -> str:
    """The tracking URI: ``tracking``, else ``MLFLOW_TRACKING_URI``, else ``sqlite:///<cwd>/mlruns.db``.

    Relative SQLite paths and plain paths to a ``.db`` file are made absolute, because Ray
    workers run in other working directories. A URI with a scheme (``file:/abs/mlruns`` too, which
    has no ``//``) is not a path.
    """
    uri = os.fspath(tracking) if tracking else os.environ.get("MLFLOW_TRACKING_URI") or str(Path.cwd() / DEFAULT_STORE_FILE)
    if len(urlparse(uri).scheme) < 2:  # a path (a one-letter "scheme" would be a Windows drive)
        return f"sqlite:///{Path(uri).expanduser().resolve()}"
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        return f"sqlite:///{Path(uri[len('sqlite:///'):]).resolve()}"
    return uri


def sqlite_path(tracking_uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` store, else None."""
    return Path(tracking_uri[len("sqlite:///"):]) if tracking_uri.startswith("sqlite:///") else None


@contextlib.contextmanager
def _store_lock(tracking_uri: str) -> Iterator[None]:
    """An exclusive file lock next to a SQLite store: concurrent creation of a fresh store crashes."""
    path = sqlite_path(tracking_uri)
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
    ``mlartifacts/`` next to the database file (absolute, so every process finds them). The
    experiment carries what the MLflow UI shows of it (:mod:`.experiment_page`: its kind, description
    and saved view), also when it was created before.
    """
    if not experiment:
        raise ValueError("experiment: expected a non-empty experiment name")
    with _store_lock(tracking_uri):
        client = MlflowClient(tracking_uri)
        found = client.get_experiment_by_name(experiment)
        if found is not None:
            if found.lifecycle_stage == "deleted":
                client.restore_experiment(found.experiment_id)
            describe_experiment(client, found)
            return found.experiment_id
        db = sqlite_path(tracking_uri)
        location = (db.parent / DEFAULT_ARTIFACT_DIR).as_uri() if db is not None else None
        try:
            return client.create_experiment(experiment, artifact_location=location, tags=experiment_tags(experiment))
        except MlflowException:  # created meanwhile by another process (not SQLite-locked)
            found = client.get_experiment_by_name(experiment)
            if found is None:
                raise
            return found.experiment_id


def experiment_id(client: MlflowClient, experiment: str) -> str | None:
    """The id of ``experiment``, or None when the store has no such experiment."""
    found = client.get_experiment_by_name(experiment)
    return None if found is None else found.experiment_id


def existing_experiment(tracking_uri: str, experiment: str) -> str:
    """The id of ``experiment`` in a store that must already hold it (readers: claims, tables).

    ``ValueError`` naming the store or the experiment (and the ones there are) otherwise; a
    missing SQLite file is never created by asking.
    """
    db = sqlite_path(tracking_uri)
    if db is not None and not db.is_file():
        raise ValueError(f"tracking: no MLflow store at {db} (expected the database file of a store with runs)")
    client = MlflowClient(tracking_uri)
    found = client.get_experiment_by_name(experiment)
    if found is None or found.lifecycle_stage == "deleted":
        names = [e.name for e in client.search_experiments()]
        raise ValueError(f"experiment: no experiment {experiment!r} in {tracking_uri}, expected one of {names}")
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


def search_all_runs(client: MlflowClient, experiment_ids: Sequence[str], filter_string: str, *,
                    newest_first: bool = False) -> list:
    """Every active run matching ``filter_string`` (follows MLflow's pagination)."""
    runs, token = [], None
    order = ["attributes.start_time DESC"] if newest_first else None
    while True:
        page = client.search_runs(list(experiment_ids), filter_string=filter_string, run_view_type=ViewType.ACTIVE_ONLY,
                                  max_results=1000, page_token=token, order_by=order)
        runs.extend(page)
        token = page.token
        if not token:
            return runs


def submission_runs(client: MlflowClient, experiment_ids: Sequence[str], submission: str, extra: str = "") -> list:
    """The runs of one grid or search (tagged ``grid_id`` or ``search_id``; old stores tagged search
    runs ``grid_id`` too), newest first. ``extra``: more filter clauses, ``" and ..."``."""
    found: dict[str, Any] = {}
    for tag in (mlflow_names.SEARCH_ID, mlflow_names.GRID_ID):
        for run in search_all_runs(client, experiment_ids, f"tags.{tag} = '{submission}'{extra}", newest_first=True):
            found.setdefault(run.info.run_id, run)
    return sorted(found.values(), key=lambda r: r.info.start_time or 0, reverse=True)


def find_cell_run(client: MlflowClient, experiment_id: str, cell_id: str, submission: str | None = None):
    """The newest run of ``cell_id`` in this grid or search (``submission=None``: outside any), or None."""
    if submission:
        runs = submission_runs(client, [experiment_id], submission, f" and tags.{mlflow_names.CELL_ID} = '{cell_id}'")
        return runs[0] if runs else None
    for run in search_all_runs(client, [experiment_id], f"tags.{mlflow_names.CELL_ID} = '{cell_id}'", newest_first=True):
        if mlflow_names.submission_of(run.data.tags) is None:
            return run
    return None


# ----------------------------------------------------------------------------- owners
def _process_start(pid: int) -> str:
    """The kernel's start time of ``pid`` (clock ticks since boot, Linux), or "" where unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rsplit(")", 1)[1].split()[19]


def owner_tags() -> dict[str, str]:
    """The tags naming this process as the owner of a RUNNING run."""
    pid = os.getpid()
    return {mlflow_names.OWNER_HOST: socket.gethostname(), mlflow_names.OWNER_PID: str(pid),
            mlflow_names.OWNER_START: _process_start(pid), mlflow_names.HEARTBEAT: heartbeat_stamp()}


def heartbeat_stamp() -> str:
    """Now, as a heartbeat tag value: epoch seconds to the millisecond (a whole-second stamp
    rounds up to half a second into the future and reads as "heard from later than now")."""
    return f"{time.time():.3f}"


def owner_alive(tags: dict[str, str]) -> bool | None:
    """True/False for an owner on this host; None when the owner is elsewhere (cannot tell)."""
    if tags.get(mlflow_names.OWNER_HOST) != socket.gethostname() or not tags.get(mlflow_names.OWNER_PID, "").isdigit():
        return None
    pid = int(tags[mlflow_names.OWNER_PID])
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    start = tags.get(mlflow_names.OWNER_START, "")
    return not start or _process_start(pid) == start


def last_heard_ms(run: Any) -> float:
    """When ``run``'s owner was last heard from (epoch ms): its newest heartbeat, else the run's start."""
    try:
        beat_ms = float(run.data.tags.get(mlflow_names.HEARTBEAT, "")) * 1000
    except ValueError:
        beat_ms = 0.0
    return max(float(run.info.start_time or 0), beat_ms)


def _orphan_reason(run: Any, now_ms: float, stale_after_s: float | None) -> str | None:
    """Why ``run`` is orphaned, or None when its owner may still be alive."""
    tags = run.data.tags
    alive = owner_alive(tags)
    if alive is None:
        if stale_after_s is None or now_ms - last_heard_ms(run) < stale_after_s * 1000:
            return None
        return (f"orphaned: owner {tags.get(mlflow_names.OWNER_HOST, '?')}:{tags.get(mlflow_names.OWNER_PID, '?')} "
                f"silent for over {stale_after_s:.0f} s")
    if alive:
        return None
    return f"orphaned: owner process {tags.get(mlflow_names.OWNER_PID)} on {tags.get(mlflow_names.OWNER_HOST)} is gone"


def end_orphans(client: MlflowClient, runs: Sequence[Any], *, stale_after_s: float | None,
                status: str = "KILLED", ended_parent: str | None = None) -> list[str]:
    """End the RUNNING ``runs`` whose owner is gone with ``status`` and ``error = "orphaned: ..."``;
    returns their ids (a run ended meanwhile by its owner is left as it is). ``ended_parent``: a
    parent run whose trials are all over, so that a child of it still RUNNING is orphaned too."""
    swept = []
    now_ms = time.time() * 1000
    for run in runs:
        reason = None if run.info.status != "RUNNING" else _orphan_reason(run, now_ms, stale_after_s)
        if reason is None and ended_parent and run.data.tags.get(mlflow_names.PARENT_RUN_ID) == ended_parent \
                and run.info.status == "RUNNING" and run.info.run_id != ended_parent:
            reason = f"orphaned: the trials of submission {ended_parent} are over and none ended this run"
        if reason is None or client.get_run(run.info.run_id).info.status != "RUNNING":
            continue
        client.set_tag(run.info.run_id, mlflow_names.ERROR, reason)
        client.set_terminated(run.info.run_id, status=status)
        swept.append(run.info.run_id)
    return swept


def sweep_orphaned_runs(experiment: str = DEFAULT_EXPERIMENT, *, tracking: str | None = None,
                        stale_after_s: float | None = None, status: str = "KILLED") -> list[str]:
    """End RUNNING runs whose owner is gone; returns their ids.

    An owner on this host is gone when its process no longer exists (or the pid was reused).
    Runs owned on other hosts are ended only when ``stale_after_s`` is given and their owner
    was last heard from (heartbeat, else start) longer ago than that. Each swept run gets
    ``error = "orphaned: ..."`` and ``status``.
    """
    client = MlflowClient(resolve_tracking_uri(tracking))
    found = experiment_id(client, experiment)
    if found is None:
        return []
    runs = search_all_runs(client, [found], "attributes.status = 'RUNNING'", newest_first=True)
    return end_orphans(client, runs, stale_after_s=stale_after_s, status=status)


def reconcile_submission(client: MlflowClient, experiment_ids: Sequence[str], submission: str, *,
                         stale_after_s: float = REMOTE_STALE_AFTER_S, ended_parent: str | None = None) -> list[str]:
    """End KILLED every RUNNING run of grid or search ``submission`` (parent runs of earlier
    submissions, cell runs) whose owner is gone; returns their ids. Run on every submission
    (before its parent run is created) and after its trials (``ended_parent``: its parent run)."""
    runs = submission_runs(client, experiment_ids, submission, " and attributes.status = 'RUNNING'")
    swept = end_orphans(client, runs, stale_after_s=stale_after_s, ended_parent=ended_parent)
    if swept:
        logger.warning("%s: ended %d run(s) left RUNNING by a dead process: %s", submission, len(swept), swept)
    return swept


class Heartbeat:
    """Stamps ``npsemiseg.heartbeat`` (epoch seconds) on a run every ``interval_s`` from a daemon
    thread while the ``with`` block runs (the first stamp is one of :func:`owner_tags`), so that the
    owner's liveness is visible from other hosts. A store that cannot be reached is skipped (the
    next beat retries)."""

    def __init__(self, client: MlflowClient, run_id: str, interval_s: float = HEARTBEAT_INTERVAL_S) -> None:
        self.client, self.run_id, self.interval_s = client, run_id, interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat_until_stopped, name=f"heartbeat-{run_id}", daemon=True)

    def beat(self) -> None:
        try:
            self.client.set_tag(self.run_id, mlflow_names.HEARTBEAT, heartbeat_stamp())
        except Exception as error:  # noqa: BLE001 - a missed beat is retried; the run must not fail for it
            logger.debug("heartbeat of run %s missed: %s", self.run_id, error)

    def _beat_until_stopped(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.beat()

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
