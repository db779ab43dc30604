"""Rank 0's logging into the cell's run: step and evaluation metrics, final metrics, figures, tables, and each kept
checkpoint as a LoggedModel (the best registered under the alias ``best`` at the end)."""

from __future__ import annotations

import json
import logging
import tempfile
import time
from pathlib import Path
from typing import Any

from mlflow.entities import Metric, RunTag
from mlflow.tracking import MlflowClient

from npsemiseg.callbacks import Callbacks
from semiseg_platform.tracking import mlflow_names
from semiseg_platform.tracking.cell_run import format_error
from semiseg_platform.tracking.describe import per_class_iou_figure
from semiseg_platform.tracking.logged_models import log_checkpoint_model, register_best, registered_name
from semiseg_platform.tracking.metric_logging import MLFLOW_BATCH, finite, log_metrics, prefixed, write_batches
from semiseg_platform.tracking.system_metrics import NodeMonitor, start_node_monitor

logger = logging.getLogger(__name__)


def artifact_path(name: str, path: Path) -> str:
    """The stable artifact path of a reported file: ``name`` if it has a folder, else by suffix.

    ``("uncertainty_maps", x.png)`` -> ``figures/uncertainty_maps.png``;
    ``("per_class_iou", x.csv)`` -> ``tables/per_class_iou.csv``; ``("figures/a.png", ...)`` as is.
    """
    suffix = Path(path).suffix.lower()
    if "/" in name:
        return name if Path(name).suffix else f"{name}{suffix}"
    stem = name if Path(name).suffix else f"{name}{suffix}"
    folder = mlflow_names.ARTIFACT_DIRS.get(suffix)
    return f"{folder}/{stem}" if folder else stem


class MLflowCallbacks(Callbacks):
    """Rank 0's logging into the cell's run (created by :class:`~.cell_run.CellRun` in the launcher).

    Step metrics are buffered and written in batches (every ``flush_every_s`` seconds, and at
    every evaluation, checkpoint and the end) so a long run does not write the store at each
    step. Only rank 0 logs: on other ranks every hook returns at once, except that each node's first worker
    samples the node's system metrics into the run (``runtime.system_metrics``, :mod:`.system_metrics`) from
    :meth:`on_start` to :meth:`on_end` or :meth:`close`.
    """

    def __init__(self, tracking_uri: str, run_id: str, *, flush_every_s: float = 10.0) -> None:
        self.tracking_uri = tracking_uri
        self.run_id = run_id
        self.flush_every_s = flush_every_s
        self.client = MlflowClient(tracking_uri)
        self.rank = 0
        self._pending: list[Metric] = []
        self._last_flush = time.monotonic()
        self._cell_id: str | None = None
        self._node_monitor: NodeMonitor | None = None

    @property
    def active(self) -> bool:
        return self.rank == 0

    def on_start(self, config: Any, *, total_steps: int, start_step: int, rank: int, world_size: int) -> None:
        self.rank = rank
        mode = getattr(getattr(config, "runtime", None), "system_metrics", "off")
        self._node_monitor = start_node_monitor(mode, self.tracking_uri, self.run_id, world_size=world_size)
        if not self.active:
            return
        self._cell_id = getattr(config, "cell_id", None)
        attempts = int(self.client.get_run(self.run_id).data.tags.get(mlflow_names.ATTEMPTS, "0")) + 1
        self.client.log_batch(self.run_id, tags=[RunTag(mlflow_names.ATTEMPTS, str(attempts)),
                                                 RunTag(mlflow_names.WORLD_SIZE, str(world_size))])
        self.client.log_batch(self.run_id, metrics=[Metric(mlflow_names.TOTAL_STEPS, float(total_steps),
                                                           int(time.time() * 1000), start_step)])

    def on_step(self, step: int, total_steps: int, logs: dict[str, float]) -> None:
        if not self.active:
            return
        timestamp = int(time.time() * 1000)
        self._pending.extend(Metric(key, number, timestamp, step)
                             for key, value in prefixed(mlflow_names.TRAIN_PREFIX, logs).items()
                             if (number := finite(value)) is not None)
        if time.monotonic() - self._last_flush >= self.flush_every_s or len(self._pending) >= MLFLOW_BATCH:
            self.flush()

    def flush(self) -> None:
        """Write the buffered step metrics."""
        pending, self._pending = self._pending, []
        write_batches(self.client, self.run_id, pending)
        self._last_flush = time.monotonic()

    def on_evaluation(self, step: int, metrics: dict[str, float]) -> None:
        if not self.active:
            return
        self.flush()
        log_metrics(self.client, self.run_id, prefixed(mlflow_names.EVAL_PREFIX, metrics), step=step)

    def on_checkpoint(self, step: int, directory: Path, metrics: dict[str, float]) -> None:
        """Flush, and record the checkpoint as a LoggedModel with its step's evaluation metrics."""
        if self.active:
            self.flush()
            log_checkpoint_model(self.client, self.run_id, step, metrics)

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
        if target == mlflow_names.PER_CLASS_IOU_TABLE:
            self._log_per_class_iou_figure(Path(path))

    def _log_per_class_iou_figure(self, table: Path) -> None:
        """``figures/per_class_iou.png``: the per-class IoU table as a bar chart."""
        iou = json.loads(table.read_text())
        if iou:
            name = self.client.get_run(self.run_id).info.run_name
            self.client.log_figure(self.run_id, per_class_iou_figure(iou, title=name), mlflow_names.PER_CLASS_IOU_FIGURE)

    def on_end(self, result: Any) -> None:
        """Final metrics (unprefixed, at the last step) and the loop's timing (``time/...``); the node's system
        metrics end."""
        self._stop_node_monitor()
        if not self.active:
            return
        self.flush()
        metrics = dict(getattr(result, "metrics", {}) or {})
        step = int(getattr(result, "steps", 0) or 0)
        final = {key: value for key, value in metrics.items()
                 if not key.startswith((mlflow_names.TRAIN_PREFIX, mlflow_names.EVAL_PREFIX))}
        for key in ("seconds", "train_seconds"):
            if getattr(result, key, None) is not None:
                final[f"{mlflow_names.TIME_PREFIX}{key}"] = getattr(result, key)
        log_metrics(self.client, self.run_id, final, step=step)
        if self._cell_id:
            version = register_best(self.client, self.run_id, registered_name(self._cell_id))
            if version is not None:
                logger.info("registered %s version %s (the best checkpoint) as @best", version.name, version.version)

    def _stop_node_monitor(self) -> None:
        monitor, self._node_monitor = self._node_monitor, None
        if monitor is not None:
            try:
                monitor.stop()
            except Exception:  # noqa: BLE001 - monitoring must not fail the run
                logger.exception("could not write the last system metrics of run %s", self.run_id)

    def close(self) -> None:
        """End the node's system metrics and write what is still buffered (call in a ``finally``: a failing run keeps
        its last steps)."""
        self._stop_node_monitor()
        if self.active and self._pending:
            try:
                self.flush()
            except Exception:  # noqa: BLE001 - never mask the run's own error
                logger.exception("could not write the last metrics of run %s", self.run_id)

    def record_error(self, error: BaseException) -> None:
        """Tag the run with the exception that ended training on this rank (rank 0 only)."""
        if self.active:
            self.client.set_tag(self.run_id, mlflow_names.ERROR, format_error(error))
