"""The MLflow run of one cell, owned by the launching process, and how runs end.

:meth:`CellRun.open` creates the store and experiment if needed, finds the cell's run by
``cell_id`` (+ its grid or search) or creates it, logs tags, params and the configuration, and
the ``with`` block ends it FINISHED, FAILED (``error`` tag) or KILLED whatever happens. A
restarted cell reuses its run.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from mlflow.entities import Param, RunTag
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from npsemiseg.config import RunConfig, config_params, explain
from semiseg_platform.tracking import mlflow_names
from semiseg_platform.tracking.metric_logging import log_metrics
from semiseg_platform.tracking.store import (
    DEFAULT_EXPERIMENT,
    Heartbeat,
    find_cell_run,
    owner_alive,
    owner_tags,
    prepare_experiment,
    resolve_tracking_uri,
    run_url,
)
from semiseg_platform.tracking.tags import MAX_TAG_LENGTH, cell_tags

logger = logging.getLogger(__name__)


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
    return text if len(text) <= MAX_TAG_LENGTH else text[: MAX_TAG_LENGTH - 3] + "..."


def error_reason(error: BaseException) -> str:
    """The innermost cause of an error raised through Ray (a trial's, a task's), on one line."""
    cause = error
    while True:
        inner = getattr(cause, "cause", None) or cause.__cause__  # RayTaskError.cause: the trial's exception
        if not isinstance(inner, BaseException) or inner is cause:
            return format_error(cause)
        cause = inner


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
    another), FAILED if the block raised, KILLED on Ctrl-C or SIGTERM (:class:`CellKilled`).
    The run's :class:`Heartbeat` beats meanwhile."""
    end = RunEnd()
    try:
        with Heartbeat(client, run_id):
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
    def open(cls, config: RunConfig, *, tracking: str | None = None, experiment: str = DEFAULT_EXPERIMENT,
             grid_id: str | None = None, search_id: str | None = None, parent_run_id: str | None = None,
             params: dict[str, str] | None = None) -> CellRun:
        """Find the cell's run (``cell_id`` + its grid or search) or create it, mark it RUNNING and owned here.

        A run still RUNNING under another live process on this host is not taken over
        (``RuntimeError``): the same cell must not train twice at once into one lineage.

        Logs the schema's tags, ``npsemiseg.config.config_params`` and ``params`` as params (a reused run keeps its
        params; keys whose value changed are listed in the ``npsemiseg.params_changed`` tag), the configuration
        YAML and its provenance (``config_provenance.json``: the step that set each key, and why).
        """
        tracking_uri = resolve_tracking_uri(tracking)
        experiment_id = prepare_experiment(tracking_uri, experiment)
        client = MlflowClient(tracking_uri)
        tags = {**cell_tags(config, grid_id=grid_id, search_id=search_id, parent_run_id=parent_run_id), **owner_tags()}
        existing = find_cell_run(client, experiment_id, config.cell_id, search_id or grid_id)
        if existing is None:
            run_id, old_params = client.create_run(experiment_id, run_name=config.run_name, tags=tags).info.run_id, {}
        else:
            run_id, old_params = existing.info.run_id, existing.data.params
            _take_over(client, existing, config)
        params = {**config_params(config), **dict(params or {})}
        changed = sorted(k for k, v in params.items() if k in old_params and old_params[k] != v)
        if changed:
            tags[mlflow_names.PARAMS_CHANGED] = ",".join(changed)[:MAX_TAG_LENGTH]
            logger.warning("cell %s: reused run %s was logged with other values of %s", config.cell_name, run_id, changed)
        new_params = [Param(k, v) for k, v in params.items() if k not in old_params]
        for start in range(0, len(new_params), 100):
            client.log_batch(run_id, params=new_params[start:start + 100])
        client.log_batch(run_id, tags=[RunTag(k, v) for k, v in tags.items()])
        client.log_text(run_id, config.to_yaml(), mlflow_names.CONFIG_ARTIFACT)
        client.log_dict(run_id, explain(config).to_json(), mlflow_names.PROVENANCE_ARTIFACT)
        return cls(client, tracking_uri, experiment_id, run_id, reused=existing is not None)

    def log_checkpoint_uri(self, uri: str | None) -> None:
        if uri:
            self.client.log_text(self.run_id, uri + "\n", mlflow_names.CHECKPOINT_URI_ARTIFACT)
            self.client.set_tag(self.run_id, mlflow_names.CHECKPOINT_URI, uri)

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        log_metrics(self.client, self.run_id, metrics, step=step)

    def finish(self, status: str = "FINISHED", error: BaseException | str | None = None) -> None:
        """End the run with ``status``; ``error`` goes to the ``error`` tag (and ``error/traceback.txt``).

        A run that another party already ended KILLED (a search driver recording an ASHA stop while
        this cell was still being torn down) stays KILLED: the error is the teardown, not a failure.
        """
        if error is not None:
            current = self.client.get_run(self.run_id)
            if status == "FAILED" and current.info.status == "KILLED":
                status = "KILLED"
            if mlflow_names.ERROR not in current.data.tags:  # rank 0 may have recorded the original exception already
                self.client.set_tag(self.run_id, mlflow_names.ERROR, format_error(error))
            if isinstance(error, BaseException) and error.__traceback__ is not None:
                text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
                self.client.log_text(self.run_id, text, mlflow_names.TRACEBACK_ARTIFACT)
        elif status == "FINISHED":
            with contextlib.suppress(MlflowException):
                self.client.delete_tag(self.run_id, mlflow_names.ERROR)  # a failure that a retry recovered from
        self.client.set_terminated(self.run_id, status=status)
        self.status = status

    def __enter__(self) -> CellRun:
        self._sigterm = sigterm_as_killed()
        self._sigterm.__enter__()
        self._heartbeat = Heartbeat(self.client, self.run_id).__enter__()
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        self._heartbeat.__exit__()
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


def _take_over(client: MlflowClient, existing: Any, config: RunConfig) -> None:
    """Mark an earlier run of the cell RUNNING again, unless another live process on this host owns it."""
    run_id, owner = existing.info.run_id, existing.data.tags
    if existing.info.status == "RUNNING" and owner_alive(owner) and owner.get(mlflow_names.OWNER_PID) != str(os.getpid()):
        raise RuntimeError(f"cell {config.cell_name} ({config.cell_id}) is already running: MLflow run {run_id} "
                           f"owned by process {owner.get(mlflow_names.OWNER_PID)} on {owner.get(mlflow_names.OWNER_HOST)}")
    client.update_run(run_id, status="RUNNING")
    if mlflow_names.ERROR in existing.data.tags:
        client.delete_tag(run_id, mlflow_names.ERROR)
