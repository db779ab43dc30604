"""Node-local stores on a cluster of several hosts: ``run``, ``grid`` and ``search`` refuse a SQLite /
``file:`` tracking store and a local checkpoint directory before launch, unless the filesystem is
declared shared (``--shared-filesystem``, ``NPSEMISEG_SHARED_FILESYSTEM``).

The hosts come from node records as ``ray.nodes()`` gives them; the unit tests pass records of two
hosts (several raylets of one machine share an address and count once). The integration test reads
a real local Ray cluster of two raylets on this machine: one host.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from semiseg_platform import preflight as preflight_module
from semiseg_platform.cli.main import app
from semiseg_platform.preflight import (
    Needed,
    PreflightError,
    check_one_host_stores,
    node_hosts,
    preflight,
)


def _node(address: str, hostname: str, alive: bool = True) -> dict:
    return {"NodeID": f"{address}-{hostname}-{alive}", "Alive": alive, "NodeManagerAddress": address,
            "NodeManagerHostname": hostname}


#: a head and two raylets on one machine, a raylet on another; a dead node of a third
TWO_HOSTS = [_node("10.0.0.1", "head"), _node("10.0.0.1", "head"), _node("10.0.0.1", "head"),
             _node("10.0.0.2", "gpu-a"), _node("10.0.0.3", "gone", alive=False)]
ONE_HOST = [_node("10.0.0.1", "head"), _node("10.0.0.1", "head")]


@pytest.fixture(autouse=True)
def _no_declaration(monkeypatch):
    monkeypatch.delenv(preflight_module.SHARED_FILESYSTEM_ENV, raising=False)


def test_hosts_are_distinct_addresses_of_alive_nodes():
    assert node_hosts(TWO_HOSTS) == ["10.0.0.1", "10.0.0.2"]
    assert node_hosts(ONE_HOST) == ["10.0.0.1"]
    assert node_hosts([{"Alive": True, "NodeManagerHostname": "only-a-name"}]) == ["only-a-name"]
    assert node_hosts([]) == []


@pytest.mark.parametrize(("tracking", "storage", "culprit"), [
    ("sqlite:////shared/mlruns.db", "s3://bucket/ckpt", "tracking: sqlite:////shared/mlruns.db is a SQLite file"),
    ("file:///srv/mlruns", "s3://bucket/ckpt", "tracking: file:///srv/mlruns is a folder /srv/mlruns"),
    ("http://mlflow:5000", "/srv/ckpt", "storage: /srv/ckpt is a directory only this host reaches"),
    ("http://mlflow:5000", "file:///srv/ckpt", "storage: /srv/ckpt is a directory"),
])
def test_node_local_stores_are_refused_on_two_hosts(tracking, storage, culprit):
    with pytest.raises(PreflightError) as caught:
        check_one_host_stores(tracking, storage, hosts=node_hosts(TWO_HOSTS))
    message = str(caught.value)
    assert message.startswith(culprit) and "\n" not in message
    assert "2 hosts (10.0.0.1, 10.0.0.2)" in message and "--shared-filesystem" in message
    # one host (however many raylets), or a declared shared filesystem: accepted
    check_one_host_stores(tracking, storage, hosts=node_hosts(ONE_HOST))
    check_one_host_stores(tracking, storage, hosts=node_hosts(TWO_HOSTS), shared=True)


def test_remote_stores_pass_and_the_environment_declares_a_shared_filesystem(monkeypatch):
    check_one_host_stores("http://mlflow:5000", "s3://bucket/ckpt?endpoint_override=http://s3:8333",
                          hosts=node_hosts(TWO_HOSTS))
    check_one_host_stores("postgresql://u@db/mlflow", "s3://bucket/ckpt", hosts=node_hosts(TWO_HOSTS))
    monkeypatch.setenv(preflight_module.SHARED_FILESYSTEM_ENV, "1")
    check_one_host_stores("sqlite:////nfs/mlruns.db", "/nfs/ckpt", hosts=node_hosts(TWO_HOSTS))
    with pytest.raises(PreflightError, match="^storage: "):  # an explicit "not shared" wins over the variable
        check_one_host_stores("http://mlflow:5000", "/nfs/ckpt", hosts=node_hosts(TWO_HOSTS), shared=False)


def test_preflight_refuses_before_the_storage_is_created(tmp_path, smoke_config):
    storage = tmp_path / "ckpt"
    args = dict(tracking=f"sqlite:///{tmp_path}/mlruns.db", storage=str(storage), ray_init={"num_cpus": 1})
    with pytest.raises(PreflightError, match="^tracking: sqlite:///.* is a SQLite file"):
        preflight([smoke_config()], Needed(1, 0), nodes=lambda: TWO_HOSTS, **args)
    assert list(tmp_path.iterdir()) == []  # no store, no checkpoint folder
    uri, location = preflight([smoke_config()], Needed(1, 0), nodes=lambda: TWO_HOSTS, shared_filesystem=True, **args)
    assert uri == args["tracking"] and location.uri == str(storage) and storage.is_dir()


# ----------------------------------------------------------------------------- the commands
runner = CliRunner()
RUN = ["run", "--framework", "supervised", "--dataset", "synthetic", "--partition", "1/16", "--head", "baseline"]


@pytest.fixture
def two_host_cluster(tmp_path, monkeypatch):
    """An empty working directory, and preflight's view of the cluster: nodes on two hosts."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    for name in ("MLFLOW_TRACKING_URI", "RAY_ADDRESS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(preflight_module, "ray_nodes", lambda: TWO_HOSTS)
    grid = {"name": "hosts", "preset": "smoke", "frameworks": ["supervised"], "heads": ["baseline"],
            "datasets": {"synthetic_voc": ["1/16"]}}
    (tmp_path / "grid.yaml").write_text(yaml.safe_dump(grid))
    return work, tmp_path


@pytest.mark.parametrize(("args", "culprit"), [
    (RUN, "tracking: sqlite:///"),
    ([*RUN, "--tracking", "http://127.0.0.1:1"], None),  # the tracking probe comes first: not this check
    (["grid", "{spec}"], "tracking: sqlite:///"),
    (["grid", "{spec}", "--tracking", "file:///srv/mlruns"], "tracking: file:///srv/mlruns is a folder"),
    (["search", "{search}"], "tracking: sqlite:///"),
])
def test_the_commands_refuse_node_local_stores_on_two_hosts(two_host_cluster, args, culprit):
    work, inputs = two_host_cluster
    search = Path(__file__).parents[1] / "jobs" / "specs" / "search_smoke.yaml"
    args = [a.replace("{spec}", str(inputs / "grid.yaml")).replace("{search}", str(search)) for a in args]
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    [line] = result.stderr.strip().splitlines()
    if culprit is None:
        assert "tracking: MLflow server" in line
    else:
        assert line.startswith(f"error: {culprit}") and "on 2 hosts" in line and "--shared-filesystem" in line
    assert os.listdir(work) == []  # nothing written: no store, no ray_results/, no optuna.db


def test_a_declared_shared_filesystem_passes_the_check(two_host_cluster):
    work, _ = two_host_cluster
    # past the hosts check, the storage check runs (and refuses a file where a directory must be)
    (work / "not_a_dir").write_text("")
    result = runner.invoke(app, [*RUN, "--shared-filesystem", "--storage", "not_a_dir/ckpt"])
    assert result.exit_code == 2, result.output
    assert "storage" in result.stderr and "on 2 hosts" not in result.stderr


@pytest.mark.integration
def test_raylets_of_one_machine_are_one_host():
    """A real local Ray cluster of a head and a worker raylet: two alive nodes, one host, no refusal."""
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, connect=True,
                      head_node_args={"num_cpus": 0, "include_dashboard": False})
    try:
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        nodes = preflight_module.ray_nodes()
        assert sum(1 for node in nodes if node["Alive"]) == 2
        assert len(node_hosts(nodes)) == 1
        check_one_host_stores("sqlite:////tmp/mlruns.db", "/tmp/ckpt", hosts=node_hosts(nodes))
    finally:
        ray.shutdown()
        cluster.shutdown()
