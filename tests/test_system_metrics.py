"""MLflow's system metrics of a cell's nodes (``runtime.system_metrics``), against a real SQLite store."""

from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient
from platform_fixtures import fresh_store

from npsemiseg.config import cell_config
from semiseg_platform.launch.cell import run_cell_in_process
from semiseg_platform.tracking.system_metrics import node_tag, start_node_monitor, system_metrics_wanted

pytestmark = pytest.mark.integration

#: names MLflow 3 gives the CPU monitor's figures (psutil), under ``system/``
CPU_METRICS = ("system/cpu_utilization_percentage", "system/system_memory_usage_megabytes")


def test_auto_samples_for_a_tracking_server_only():
    assert system_metrics_wanted("auto", "https://mlflow.example:5000") and system_metrics_wanted("auto", "http://h:5000")
    assert not system_metrics_wanted("auto", "sqlite:////tmp/mlruns.db") and not system_metrics_wanted("auto", "file:/m")
    assert system_metrics_wanted("on", "sqlite:////tmp/mlruns.db") and not system_metrics_wanted("off", "http://h:5000")


def test_the_node_is_named_only_when_the_workers_span_nodes(monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert node_tag(1) is None
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert node_tag(4) is None and node_tag(8)  # 8 workers, 4 on this node: this host's name
    monkeypatch.setenv("LOCAL_RANK", "1")  # not the node's first worker: no monitor (nor a store opened)
    assert start_node_monitor("on", "sqlite:////nonexistent/mlruns.db", "run", world_size=8) is None


@pytest.mark.parametrize("mode", ["on", "auto"])
def test_a_cell_logs_its_nodes_system_metrics_when_asked(tmp_path, tmp_path_factory, monkeypatch, mode):
    """``on``: the short run has MLflow's CPU and memory figures (at least the last sample); ``auto`` (as ``off``) on
    a local SQLite store: none."""
    monkeypatch.setenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", "0.2")
    tracking = fresh_store(tmp_path_factory, f"system-{mode}")
    config = cell_config("smoke", framework="supervised", dataset="synthetic", partition="1/16", head="baseline",
                         **{"runtime.system_metrics": mode, "schedule.max_steps": 2})
    result = run_cell_in_process(config, storage=tmp_path, tracking=tracking, experiment="system")
    assert result.status == "FINISHED"
    logged = MlflowClient(tracking).get_run(result.run_id).data.metrics
    system = sorted(key for key in logged if key.startswith("system/"))
    if mode == "on":
        assert set(CPU_METRICS) <= set(system)
        assert 0 < logged["system/system_memory_usage_megabytes"]
    else:
        assert system == [] and "miou" in logged
