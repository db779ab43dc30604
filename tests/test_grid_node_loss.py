"""A grid survives the loss of a node under a running cell, in the same submission (integration:
a real local multi-node Ray cluster, a real MLflow SQLite store).

The cluster is a head without CPUs and one worker raylet of one CPU, so every cell trains on the
worker. The first cell hangs after step 2 (checkpoints every step); the test then removes the worker
node and adds a fresh one. Tune retries the cell's trial (``max_failures``) on the new node: it
continues its MLflow run from its last checkpoint, and the submission ends with every cell FINISHED,
one run per cell, none RUNNING. A cell that fails on its own (an exception in its loop) is not retried.
"""

from __future__ import annotations

import threading
import time

import pytest
from mlflow import MlflowClient
from platform_fixtures import FaultInjection, fresh_store

from semiseg_platform.sweeps.grid_runner import run_grid
from semiseg_platform.sweeps.grid_spec import load_spec
from semiseg_platform.tracking import mlflow_names

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster():
    """A head (no CPUs: it runs no cell) and one worker raylet of 1 CPU, this process connected."""
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, connect=True,
                      head_node_args={"num_cpus": 0, "include_dashboard": False})
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    yield cluster
    ray.shutdown()
    cluster.shutdown()


def _spec(tmp_path, store: str, name: str, partitions: list[str]):
    return load_spec({
        "name": name,
        "experiment": name,
        "preset": "smoke",
        "frameworks": ["supervised"],
        "datasets": {"synthetic_cityscapes": partitions},
        "heads": ["baseline"],
        "overrides": {"runtime.device": "cpu", "schedule.checkpoint_every_steps": 1},
        "resources": {"workers": 1, "cpus_per_worker": 1},
        "max_concurrent": 1,
        "tracking_uri": store,
        "storage": str(tmp_path / "ray_results"),
    })


def _cell_runs(client: MlflowClient, experiment: str) -> list:
    experiment_id = client.get_experiment_by_name(experiment).experiment_id
    return client.search_runs([experiment_id], f"tags.`{mlflow_names.KIND}` = '{mlflow_names.KIND_CELL}'")


def test_a_cell_whose_node_dies_is_retried_and_resumes_in_the_same_submission(tmp_path, tmp_path_factory, cluster):
    spec = _spec(tmp_path, fresh_store(tmp_path_factory, "node_loss"), "node_loss", ["186", "372"])
    assert spec.max_failures == 2  # the default
    marker = tmp_path / "hung"
    fault = FaultInjection(rank=0, step=2, marker=str(marker), action="hang")
    [worker] = list(cluster.worker_nodes)
    lines: list[str] = []
    ended: dict = {}

    def submit() -> None:  # the grid in a thread: Ray adds nodes from the main thread only
        try:
            ended["summary"] = run_grid(spec, tables_dir=tmp_path / "tables", emit=lines.append,
                                        cell_callbacks=(fault,))
        except BaseException as error:  # noqa: BLE001 - re-raised below, in the test's thread
            ended["error"] = error

    grid = threading.Thread(target=submit, daemon=True)
    grid.start()
    deadline = time.monotonic() + 180
    while not marker.exists() and grid.is_alive() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert marker.exists(), f"the cell never reached the fault: {ended or lines}"
    cluster.remove_node(worker)  # the raylet, and the cell's process with it
    cluster.add_node(num_cpus=1)
    grid.join(timeout=240)
    assert not grid.is_alive(), lines
    if "error" in ended:
        raise ended["error"]
    summary = ended["summary"]
    assert summary.ok, summary.format()
    assert len(summary.cells("finished")) == 2
    assert any("retrying supervised/synthetic_cityscapes/186/baseline" in line for line in lines), lines

    client = MlflowClient(spec.tracking_uri)
    runs = _cell_runs(client, spec.experiment)
    assert sorted(r.data.tags[mlflow_names.CELL_ID] for r in runs) == sorted(o.cell_id for o in summary.outcomes)
    assert all(r.info.status == "FINISHED" for r in runs)
    experiment_id = client.get_experiment_by_name(spec.experiment).experiment_id
    assert client.search_runs([experiment_id], "attributes.status = 'RUNNING'") == []
    attempts = {r.data.tags[mlflow_names.CELL_ID]: r.data.tags[mlflow_names.ATTEMPTS] for r in runs}
    retried = summary.outcomes[0]
    assert attempts == {retried.cell_id: "2", summary.outcomes[1].cell_id: "1"}
    # the retry continued the same run from a checkpoint (each attempt logs train/total_steps at its start step)
    starts = sorted(m.step for m in client.get_metric_history(retried.run_id, "train/total_steps"))
    assert starts[0] == 0 and len(starts) == 2 and starts[1] >= 1


def test_a_cell_failing_on_its_own_is_not_retried(tmp_path, tmp_path_factory, cluster):
    spec = _spec(tmp_path, fresh_store(tmp_path_factory, "own_failure"), "own_failure", ["186"])
    # raises once (its marker): a retry would run through and finish, so FAILED means no retry happened
    fault = FaultInjection(rank=0, step=1, marker=str(tmp_path / "raised"), action="raise")
    lines: list[str] = []
    summary = run_grid(spec, tables_dir=tmp_path / "tables", emit=lines.append, cell_callbacks=(fault,))
    [failed] = summary.cells("failed")
    assert "InjectedFault" in failed.reason
    assert not any("retrying" in line for line in lines) and any("FAILED supervised" in line for line in lines)
    [run] = _cell_runs(MlflowClient(spec.tracking_uri), spec.experiment)
    assert run.info.status == "FAILED" and run.data.tags[mlflow_names.ATTEMPTS] == "1"
