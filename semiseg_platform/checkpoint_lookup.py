"""A trained cell's checkpoint, found from its MLflow run or a URI, and the runs of its re-evaluations.

A cell run names its last checkpoint in the ``checkpoint_uri`` tag (``<storage>/<lineage>/checkpoint_<step>``,
a local directory or ``s3://...``) and, when the run kept one, its best in ``best_checkpoint_uri``.
A URI given directly may be a checkpoint directory (``state.pt`` + ``config.yaml``), a lineage
(its newest complete ``checkpoint_*``; ``--select best``: its ``best/``) or a file ``npsemiseg
export`` wrote. Remote checkpoints are downloaded to a temporary directory, their own files only
(:func:`semiseg_platform.storage.download_checkpoint`). A URI from a tag is the tracking server's, written by
others: it may name no S3 endpoint but the user's own. Every evaluation of
a cell is logged as a nested run of the cell's run (``mlflow.parentRunId``), so the MLflow UI
shows them under the cell.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
from mlflow.entities import Param, RunTag
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from semiseg_platform.storage import (
    STATE_FILE,
    CheckpointStore,
    Storage,
    checkpoint_dir_name,
    download_checkpoint,
    parse_storage,
)
from semiseg_platform.tracking import mlflow_names
from semiseg_platform.tracking.metric_logging import log_metrics
from semiseg_platform.tracking.store import resolve_tracking_uri, run_url, search_all_runs, sqlite_path

#: A lineage's best checkpoint (written by best-checkpoint selection)
BEST_DIR = "best"
SELECTIONS = ("last", "best")


@dataclass
class Checkpoint:
    """A checkpoint to load: its ``uri``, a ``local`` path to it, the cell's MLflow ``run`` when known and
    the user's S3 ``endpoint_url`` it was read through (a URI from the checkpoint's files may name that one only)."""

    uri: str
    local: Path
    run: Any | None = None
    client: MlflowClient | None = None
    tracking_uri: str | None = None
    endpoint_url: str | None = None


def store_client(tracking: str | None, *, required: bool) -> tuple[MlflowClient | None, str]:
    """A client of the tracking store; a SQLite store that does not exist is never created (an
    error when ``required``, else no client)."""
    tracking_uri = resolve_tracking_uri(tracking)
    database = sqlite_path(tracking_uri)
    if database is not None and not database.is_file():
        if required:
            raise ValueError(f"--tracking: no MLflow store at {database}")
        return None, tracking_uri
    return MlflowClient(tracking_uri), tracking_uri


def cell_run(client: MlflowClient, run_id: str) -> Any:
    """The MLflow run ``run_id``; ``ValueError`` when there is none or it is not a cell's run."""
    try:
        run = client.get_run(run_id)
    except MlflowException:
        raise ValueError(f"--run: no MLflow run {run_id!r} in {client.tracking_uri}") from None
    kind = run.data.tags.get(mlflow_names.KIND)
    if kind != mlflow_names.KIND_CELL:
        raise ValueError(f"--run: run {run_id} is a {kind or 'untagged'} run, expected a cell run "
                         f"(tag {mlflow_names.KIND}={mlflow_names.KIND_CELL})")
    return run


def run_checkpoint_uri(run: Any, select: str) -> str:
    """The checkpoint URI a cell run names: its last, or its best (``ValueError`` when it has none)."""
    tags, run_id = run.data.tags, run.info.run_id
    if select == "best":
        best = tags.get(mlflow_names.BEST_CHECKPOINT_URI)
        if not best:
            raise ValueError(f"--select best: run {run_id} records no best checkpoint (no {mlflow_names.BEST_CHECKPOINT_URI} "
                             "tag); use --select last")
        return best
    if not tags.get(mlflow_names.CHECKPOINT_URI):
        raise ValueError(f"--run: run {run_id} records no checkpoint (no {mlflow_names.CHECKPOINT_URI} tag: it did not "
                         "finish a checkpoint or ran without storage)")
    return tags[mlflow_names.CHECKPOINT_URI]


def _kind(storage: Storage, *parts: str) -> pafs.FileType:
    return storage.filesystem.get_file_info(storage.path(*parts)).type


def _below(storage: Storage, *parts: str) -> Storage:
    """The location ``parts`` below ``storage``, on the same filesystem (endpoint kept)."""
    return replace(storage, uri=storage.uri_of(*parts), root=storage.path(*parts))


def _parent(storage: Storage) -> Storage:
    return replace(storage, uri=storage.uri.rsplit("/", 1)[0], root=storage.root.rsplit("/", 1)[0])


def resolve(uri: str, select: str = "last", *, named_by: str | None = None) -> Storage:
    """The checkpoint directory (or exported file) that ``uri`` and ``select`` name; ``ValueError``
    naming ``uri`` when it does not exist, holds no checkpoint or cannot be reached. ``named_by``: the
    tag ``uri`` comes from (it may name no endpoint but the user's: :func:`parse_storage`)."""
    storage = parse_storage(uri, named_by=named_by)
    try:
        return _resolve(storage, select)
    except OSError as error:  # pyarrow's S3 errors: an unreachable endpoint, a refused request
        raise ValueError(f"checkpoint {storage.uri} cannot be read: {' '.join(str(error).split())[:300]}") from None


def _resolve(storage: Storage, select: str) -> Storage:
    found = _kind(storage)
    if found == pafs.FileType.NotFound:
        raise ValueError(f"checkpoint {storage.uri} does not exist")
    if found == pafs.FileType.File:
        if select == "best":
            raise ValueError(f"--select best: {storage.uri} is an exported model file, not a checkpoint lineage")
        return storage
    is_checkpoint = _kind(storage, STATE_FILE) == pafs.FileType.File
    if select == "best":
        lineage = _parent(storage) if is_checkpoint else storage
        if _kind(lineage, BEST_DIR, STATE_FILE) != pafs.FileType.File:
            raise ValueError(f"--select best: {lineage.uri} holds no best checkpoint ({BEST_DIR}/{STATE_FILE}); "
                             "use --select last")
        return _below(lineage, BEST_DIR)
    if is_checkpoint:
        return storage
    latest = CheckpointStore(storage, "").latest()
    if latest is not None:
        return _below(storage, checkpoint_dir_name(latest[0]))
    if storage.is_local and any(Path(storage.root).glob(f"step_*/{STATE_FILE}")):
        return storage  # a training output's checkpoint root (``step_*`` + ``latest``)
    raise ValueError(f"{storage.uri} holds no checkpoint (no {STATE_FILE}, no complete "
                     "checkpoint_* directory)")


def local_path(storage: Storage, scratch: Path) -> Path:
    """The checkpoint at ``storage`` as a local path: itself when local, else its files downloaded under ``scratch``."""
    if storage.is_local:
        return Path(storage.root)
    return download_checkpoint(storage, scratch / "checkpoint")


def cell_run_of_checkpoint(client: MlflowClient | None, uri: str) -> Any | None:
    """The cell run whose ``checkpoint_uri`` or ``best_checkpoint_uri`` is ``uri``, newest first, or None."""
    if client is None:
        return None
    experiments = [e.experiment_id for e in client.search_experiments()]
    for tag in (mlflow_names.CHECKPOINT_URI, mlflow_names.BEST_CHECKPOINT_URI):
        quoted = uri.replace("'", "\\'")
        runs = search_all_runs(client, experiments, f"tags.`{mlflow_names.KIND}` = '{mlflow_names.KIND_CELL}' and "
                               f"tags.{tag} = '{quoted}'", newest_first=True)
        if runs:
            return runs[0]
    return None


@contextlib.contextmanager
def open_checkpoint(*, run_id: str | None, uri: str | None, select: str = "last",
                    tracking: str | None = None) -> Iterator[Checkpoint]:
    """The checkpoint of cell run ``run_id`` or at ``uri`` (exactly one of them), local for the block
    (a download is removed afterwards); its cell run found from the URI when not given."""
    if (run_id is None) == (uri is None):
        raise ValueError("give exactly one of --run RUN_ID and --checkpoint URI")
    if select not in SELECTIONS:
        raise ValueError(f"--select: expected one of {list(SELECTIONS)}, got {select!r}")
    client, tracking_uri = store_client(tracking, required=run_id is not None)
    run = cell_run(client, run_id) if run_id is not None else None  # type: ignore[arg-type]
    if run is not None:
        tag = mlflow_names.BEST_CHECKPOINT_URI if select == "best" else mlflow_names.CHECKPOINT_URI
        resolved = resolve(run_checkpoint_uri(run, select), select, named_by=f"the {tag} tag of run {run_id}")
    else:
        resolved = resolve(uri, select)  # type: ignore[arg-type]
    if run is None:
        run = cell_run_of_checkpoint(client, resolved.uri)
    with tempfile.TemporaryDirectory(prefix="npsemiseg-checkpoint-") as scratch:
        try:
            local = local_path(resolved, Path(scratch))
        except OSError as error:
            reason = " ".join(str(error).split())[:300]
            raise ValueError(f"checkpoint {resolved.uri} could not be downloaded: {reason}") from None
        yield Checkpoint(resolved.uri, local, run, client, tracking_uri, resolved.endpoint_url)


def log_evaluation(checkpoint: Checkpoint, metrics: dict[str, float], *, mode: str, num_samples: int | None,
                   select: str, step: int) -> str | None:
    """Log ``metrics`` as a nested run of the checkpoint's cell run (None when no cell run is known);
    returns the nested run's URL."""
    if checkpoint.run is None or checkpoint.client is None:
        return None
    client, parent = checkpoint.client, checkpoint.run
    experiment_id = parent.info.experiment_id
    name = f"{parent.info.run_name or 'cell'}/eval-{mode}-T{num_samples or 1}"
    tags = {mlflow_names.KIND: mlflow_names.KIND_EVALUATION, mlflow_names.PARENT_RUN_ID: parent.info.run_id,
            mlflow_names.EVAL_MODE: mode}
    run_id = client.create_run(experiment_id, run_name=name, tags=tags).info.run_id
    params = {"mode": mode, "num_samples": str(num_samples) if num_samples else "n/a (deterministic head)",
              "select": select, "step": str(step), mlflow_names.CHECKPOINT_URI: checkpoint.uri}
    try:
        client.log_batch(run_id, params=[Param(k, v) for k, v in params.items()],
                         tags=[RunTag(k, v) for k, v in tags.items()])
        log_metrics(client, run_id, metrics, step=step)
    except BaseException:
        client.set_terminated(run_id, "FAILED")
        raise
    client.set_terminated(run_id, "FINISHED")
    return run_url(checkpoint.tracking_uri or "", experiment_id, run_id)
