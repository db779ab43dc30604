"""A grid on an autoscaling cluster, on one machine (integration: Ray's fake multi-node provider, the
real autoscaler, a real MLflow SQLite store).

The autoscaling config is generated from ``infra/aws/cluster.yaml`` (the one source of the node
types; ``semiseg_platform.devstack.fake_cluster``): the ``gpu_worker`` type with its GPUs as the
``gpu_standin`` custom resource, its CPUs shrunk to 2, at most 2 nodes, a 0.1 minute idle timeout.
The head is started by ``ray start --head --autoscaling-config=...`` with ``RAY_FAKE_CLUSTER=1`` in
its own session, temp dir and ports, and no worker node. A smoke grid of two cells, each asking for
a whole ``gpu_worker`` (``resources.custom_per_worker: {gpu_standin: 4}``), is submitted in-process
(``RAY_ADDRESS``): the preflight prints ``waiting for resources`` while the autoscaler, asked for one
cell's bundle, launches the first node; both cells finish; the idle nodes are removed afterwards.
Teardown kills the head's process group and any process under its temp dir (never ``ray stop``).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from platform_fixtures import fresh_store
from stack_fixtures import free_port_block

from semiseg_platform.devstack.fake_cluster import (
    GPU_STANDIN,
    head_resources,
    load_cluster_config,
    write_fake_autoscaling_config,
)
from semiseg_platform.logs import PROGRESS
from semiseg_platform.sweeps.grid_runner import run_grid
from semiseg_platform.sweeps.grid_spec import load_spec

# isolated: joining the fake cluster (auth disabled) fixes Ray's auth mode for the rest of the process
pytestmark = [pytest.mark.integration, pytest.mark.isolated]

ROOT = Path(__file__).resolve().parents[1]
CLUSTER_YAML = ROOT / "infra" / "aws" / "cluster.yaml"
WORKER_TYPE = "gpu_worker"
#: the whole node type per cell: each cell needs a node of its own
STANDINS_PER_CELL = 4


def _processes_under(folder: str) -> list[int]:
    """Ids of the processes whose command line names ``folder`` (this cluster's, and only them)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if folder in (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def _stop(head: subprocess.Popen, temp_dir: str) -> None:
    """That cluster's ``ray stop``: its head's process group, then whatever still runs under its temp dir."""
    for sig, wait_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(head.pid, sig)
        except ProcessLookupError:
            pass
        for pid in _processes_under(temp_dir):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and (head.poll() is None or _processes_under(temp_dir)):
            time.sleep(0.5)
        if head.poll() is not None and not _processes_under(temp_dir):
            return


@pytest.fixture(scope="module")
def fake_cluster():
    """The head of a fake autoscaling cluster (no worker node yet); yields ``(address, temp_dir)``."""
    import ray._private.services as services

    ip = services.get_node_ip_address()
    base = free_port_block(8)
    temp_dir = tempfile.mkdtemp(prefix="npss-fake-")  # short: Ray's socket paths live under it
    config = write_fake_autoscaling_config(CLUSTER_YAML, Path(temp_dir) / "autoscaling.yaml",
                                           gcs_address=f"{ip}:{base}", idle_timeout_minutes=0.1, max_workers=2,
                                           cpus=2)
    head = head_resources(load_cluster_config(CLUSTER_YAML))
    env = {**os.environ, "RAY_FAKE_CLUSTER": "1", "RAY_AUTH_MODE": "disabled", "AUTOSCALER_UPDATE_INTERVAL_S": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    env.pop("RAY_ADDRESS", None)
    ray_cli = str(Path(sys.executable).parent / "ray")
    command = [ray_cli, "start", "--head", "--block", "--disable-usage-stats", "--include-dashboard=false",
               f"--temp-dir={temp_dir}", f"--autoscaling-config={config}", f"--port={base}",
               f"--num-cpus={head.pop('CPU'):g}", f"--num-gpus={head.pop(GPU_STANDIN, 0):g}",
               f"--object-store-memory={100 * 1024 * 1024}",
               f"--ray-client-server-port={base + 1}", f"--dashboard-agent-listen-port={base + 2}",
               f"--dashboard-agent-grpc-port={base + 3}", f"--metrics-export-port={base + 4}",
               f"--runtime-env-agent-port={base + 5}", f"--node-manager-port={base + 6}",
               f"--object-manager-port={base + 7}"]
    log = open(Path(temp_dir) / "head.log", "w")
    process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield f"{ip}:{base}", temp_dir, process
    finally:
        import ray

        ray.shutdown()
        _stop(process, temp_dir)
        log.close()
        shutil.rmtree(temp_dir, ignore_errors=True)


def _connect(address: str, timeout_s: float = 60.0) -> None:
    import ray

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            ray.init(address=address, log_to_driver=False)
            return
        except (ConnectionError, RuntimeError):
            if time.monotonic() > deadline:
                raise
            time.sleep(1.0)


def _worker_nodes() -> list[dict]:
    import ray

    return [node for node in ray.nodes() if node["Resources"].get(GPU_STANDIN)]


def test_a_grid_scales_gpu_workers_up_from_zero_and_idle_ones_are_removed(fake_cluster, tmp_path, tmp_path_factory,
                                                                          monkeypatch):
    import ray

    address, temp_dir, head = fake_cluster
    monkeypatch.setenv("RAY_ADDRESS", address)
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    _connect(address)
    assert _worker_nodes() == [] and ray.cluster_resources().get(GPU_STANDIN, 0) == 0  # scaled to zero

    spec = load_spec({
        "name": "autoscale", "experiment": "autoscale", "preset": "smoke", "frameworks": ["supervised"],
        "datasets": {"synthetic_cityscapes": ["186", "372"]}, "heads": ["baseline"],
        "overrides": {"runtime.device": "cpu"},
        "resources": {"workers": 1, "cpus_per_worker": 1, "custom_per_worker": {GPU_STANDIN: STANDINS_PER_CELL}},
        "max_concurrent": 2, "tracking_uri": fresh_store(tmp_path_factory, "autoscale"),
        "storage": str(tmp_path / "ray_results"),
    })
    waiting: list[str] = []

    class Lines(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            waiting.append(record.getMessage())

    progress, handler = logging.getLogger(PROGRESS), Lines(logging.INFO)
    level = progress.level
    progress.addHandler(handler)
    progress.setLevel(logging.INFO)
    lines: list[str] = []
    try:
        summary = run_grid(spec, tables_dir=tmp_path / "tables", emit=lines.append, resource_timeout=120)
    finally:
        progress.removeHandler(handler)
        progress.setLevel(level)
    assert summary.ok, summary.format()
    assert len(summary.cells("finished")) == 2
    waits = [line for line in waiting if line.startswith("waiting for resources")]
    assert waits and f"{STANDINS_PER_CELL:g} {GPU_STANDIN} (has 0)" in waits[0], waiting

    launched = _worker_nodes()
    assert 1 <= len(launched) <= 2, launched  # the autoscaler launched gpu_worker nodes (at most its max_workers)
    assert all(node["Resources"][GPU_STANDIN] == STANDINS_PER_CELL for node in launched)
    # the submission is over: a fresh driver, holding no object of the grid's on the worker nodes
    ray.shutdown()
    _connect(address)
    def autoscaler_events() -> list[str]:
        monitor_log = next(Path(temp_dir).glob("session_*/logs/monitor.log")).read_text()
        return [line.split(":event_summary:", 1)[1] for line in monitor_log.splitlines() if ":event_summary:" in line]

    def removed_idle(events: list[str]) -> bool:
        return any(event.startswith("Removing") and "(idle)" in event for event in events)

    # the nodes go first, the monitor logs its summary of the removal on a later update: wait for both
    deadline = time.monotonic() + 90
    while ((any(node["Alive"] for node in _worker_nodes()) or not removed_idle(autoscaler_events()))
           and time.monotonic() < deadline):
        time.sleep(1.0)
    events = autoscaler_events()
    print("autoscaler events:", events)
    assert not any(node["Alive"] for node in _worker_nodes()), f"idle {WORKER_TYPE} nodes were not removed: {events}"
    assert f"Adding 1 node(s) of type {WORKER_TYPE}." in events, events
    assert removed_idle(events), events
