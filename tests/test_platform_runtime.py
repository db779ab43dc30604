"""Ray connection settings and the cell runner's argument checks (no Ray cluster started)."""

from __future__ import annotations

import socket

import pytest
from platform_fixtures import FAULT_ENV, FaultInjection

from npsemiseg.config import cell_config, with_overrides
from semiseg_platform.launch import cell_run_name, run_cell, validate_min_workers, validate_resources
from semiseg_platform.launch.ray_runtime import embedded_env, in_existing_cluster, worker_env

HAS_LO = "lo" in {name for _, name in socket.if_nameindex()}


@pytest.fixture
def clean_env(monkeypatch):
    for key in ("RAY_ADDRESS", "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S"):
        monkeypatch.delenv(key, raising=False)
    return monkeypatch


@pytest.mark.skipif(not HAS_LO, reason="no loopback interface named lo")
def test_embedded_cluster_uses_loopback_gloo(clean_env):
    assert not in_existing_cluster()
    env = worker_env()
    assert env["GLOO_SOCKET_IFNAME"] == "lo"
    assert float(env["RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S"]) > 60
    clean_env.setenv("GLOO_SOCKET_IFNAME", "eth7")
    assert embedded_env()["GLOO_SOCKET_IFNAME"] == "eth7"


def test_existing_cluster_gets_only_explicit_settings(clean_env):
    clean_env.setenv("RAY_ADDRESS", "http://127.0.0.1:8265")
    assert in_existing_cluster()
    assert worker_env() == {}  # never the loopback interface across nodes
    clean_env.setenv("NCCL_SOCKET_IFNAME", "ib0")
    assert worker_env() == {"NCCL_SOCKET_IFNAME": "ib0"}


@pytest.mark.parametrize("kwargs, message", [
    ({"workers": -1}, "workers"),
    ({"workers": 1.5}, "workers"),
    ({"gpus_per_worker": -1}, "gpus_per_worker"),
    ({"cpus_per_worker": 0}, "cpus_per_worker"),
    ({"max_failures": -2}, "max_failures"),
    ({"workers": 0, "gpus_per_worker": 1}, "gpus_per_worker: local mode"),
    ({"workers": 0, "max_failures": 1}, "max_failures: local mode"),
])
def test_bad_resources_are_named(kwargs, message):
    args = {"workers": 2, "gpus_per_worker": 0, "cpus_per_worker": 1.0, "max_failures": 0, **kwargs}
    with pytest.raises(ValueError, match=message):
        validate_resources(**args)


@pytest.mark.parametrize(("min_workers", "workers", "message"), [
    (0, 2, "min_workers: expected an integer from 1 to workers"),
    (3, 2, "min_workers: expected an integer from 1 to workers"),
    (1, 0, "local mode has no elastic workers"),
    (3, 5, r"min_workers: the global batch 10 .* cannot be kept on 3 worker\(s\); world sizes that keep it: \[1, 2, 5\]"),
])
def test_bad_min_workers_are_named(min_workers, workers, message):
    config = cell_config("smoke", framework="supervised", dataset="synthetic", partition="1/16", head="baseline")
    assert config.schedule.batch_size == 2 and config.schedule.accumulation_steps == 1
    with pytest.raises(ValueError, match=message):
        validate_min_workers(config, min_workers, workers)
    with pytest.raises(ValueError, match=message):  # before anything starts: no storage, no MLflow run
        run_cell(config, workers=workers, min_workers=min_workers, storage="/nonexistent/never-created",
                 tracking="sqlite:////nonexistent/never.db")
    validate_min_workers(config, None, workers)
    validate_min_workers(config, 1, 2)  # 4 images on 1 or 2 workers


def test_fault_injection_spec(monkeypatch):
    monkeypatch.delenv(FAULT_ENV, raising=False)
    assert FaultInjection.from_env() is None
    monkeypatch.setenv(FAULT_ENV, "rank=1,step=2,marker=/tmp/m")
    assert FaultInjection.from_env() == FaultInjection(rank=1, step=2, marker="/tmp/m", action="exit")
    for bad in ("rank=1,step=2", "rank=x,step=2,marker=m", "rank=1,step=2,marker=m,action=explode"):
        monkeypatch.setenv(FAULT_ENV, bad)
        with pytest.raises(ValueError, match=FAULT_ENV):
            FaultInjection.from_env()


def test_fault_injection_raises_once(tmp_path):
    config = cell_config("smoke", framework="supervised", dataset="synthetic", partition="1/16", head="baseline")
    fault = FaultInjection(rank=0, step=2, marker=str(tmp_path / "marker"), action="raise")
    fault.on_start(config, total_steps=3, start_step=0, rank=0, world_size=1)
    fault.on_step(1, 3, {})
    with pytest.raises(RuntimeError, match="injected failure on rank 0 after step 2"):
        fault.on_step(2, 3, {})
    fault.on_step(2, 3, {})  # the marker says it happened: the retried attempt runs through
    other_rank = FaultInjection(rank=1, step=1, marker=str(tmp_path / "other"), action="raise")
    other_rank.on_start(config, total_steps=3, start_step=0, rank=0, world_size=2)
    other_rank.on_step(1, 3, {})


def test_cell_run_names_are_path_safe_and_unique():
    config = cell_config("smoke", framework="supervised", dataset="synthetic", partition="1/16", head="np")
    name = cell_run_name(config)
    assert name == f"supervised_synthetic_1_16_np-{config.cell_id}"
    assert cell_run_name(config, "grid7") == f"grid7-{name}"
    assert cell_run_name(with_overrides(config, {"seed": 9})) != name
    # two experiments sharing a storage never share a checkpoint lineage
    assert cell_run_name(config, "grid7", "study a/b") == f"study_a_b-grid7-{name}"
    assert cell_run_name(config, "grid7", "other") != cell_run_name(config, "grid7", "study a/b")
