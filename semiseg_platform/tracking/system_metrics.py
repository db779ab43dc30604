"""MLflow's system metrics (CPU, memory, disk, network, and GPU with ``nvidia-ml-py``) of every node a cell runs on.

``runtime.system_metrics``: ``auto`` (the default) samples when the tracking URI is an MLflow server (``http`` or
``https``: a cluster's, or the local stack's) and not for a local file or SQLite store (``make demo``, the tests,
a laptop, where they say nothing about the run and only grow the store); ``on`` / ``off`` whatever the store.

The first worker of each node (``LOCAL_RANK`` 0, as Ray Train sets it; a cell trained in-process is its own node's)
runs MLflow's :class:`~mlflow.system_metrics.system_metrics_monitor.SystemMetricsMonitor` into the cell's run, every
``MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL`` seconds (MLflow's variable, default 10): ``system/<metric>`` when every
worker is on one node, ``system/<host>/<metric>`` when they span nodes. Stopping takes one last sample, so a run
shorter than the interval has its node's figures too.
"""

from __future__ import annotations

import logging
import os
import socket
from typing import Any
from urllib.parse import urlparse

logger = logging.getLogger(__name__)

#: tracking URI schemes of an MLflow server, where ``runtime.system_metrics: auto`` samples
SERVER_SCHEMES = ("http", "https")


def system_metrics_wanted(mode: str, tracking_uri: str) -> bool:
    """Whether ``runtime.system_metrics`` = ``mode`` samples for a run tracked at ``tracking_uri``."""
    if mode == "auto":
        return urlparse(tracking_uri).scheme in SERVER_SCHEMES
    return mode == "on"


def node_tag(world_size: int) -> str | None:
    """The node part of the metric names: None when the ``world_size`` workers share one node, else this host."""
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    return socket.gethostname() if local_world < world_size else None


class NodeMonitor:
    """MLflow's system-metrics sampler of this node, into one run; :meth:`stop` is idempotent."""

    def __init__(self, tracking_uri: str, run_id: str, *, node: str | None) -> None:
        from mlflow.system_metrics.metrics.gpu_monitor import GPUMonitor
        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

        self.monitor: Any = SystemMetricsMonitor(run_id, resume_logging=True, node_id=node, tracking_uri=tracking_uri)
        if os.environ.get("CUDA_VISIBLE_DEVICES") and not any(isinstance(m, GPUMonitor) for m in self.monitor.monitors):
            logger.warning("system metrics: no GPU figures on this node; install nvidia-ml-py (pip install 'npsemiseg[gpu]')")
        self.monitor.start()

    def stop(self) -> None:
        """End the sampling thread and write one last sample (MLflow's thread drops the samples of an unfinished
        interval)."""
        monitor, self.monitor = self.monitor, None
        if monitor is None:
            return
        monitor.finish()
        monitor.collect_metrics()
        monitor.publish_metrics(monitor.aggregate_metrics())
        monitor.mlflow_logger.flush()


def start_node_monitor(mode: str, tracking_uri: str, run_id: str, *, world_size: int) -> NodeMonitor | None:
    """A started :class:`NodeMonitor` when ``mode`` asks for one here and this is its node's first worker, else None.
    Sampling never fails the run: a monitor that cannot start is a warning."""
    if not system_metrics_wanted(mode, tracking_uri) or int(os.environ.get("LOCAL_RANK", "0")) != 0:
        return None
    try:
        return NodeMonitor(tracking_uri, run_id, node=node_tag(world_size))
    except Exception as error:  # noqa: BLE001 - monitoring must not stop training
        logger.warning("system metrics: could not start MLflow's monitor (%s: %s)", type(error).__name__, error)
        return None
