"""An elastic cell loses a node and finishes on the other at the same global batch (integration: a real local
multi-node Ray cluster, gloo, a real MLflow SQLite store).

The cluster is a head without CPUs and two worker raylets of 1 CPU, each with one ``one_per_node`` (a custom
resource the cell's workers ask for: one worker per node). The cell asks for 1 to 2 workers
(``ScalingConfig(num_workers=(1, 2))``) with batches planned for 2, and checkpoints every step. Rank 1 hangs
after step 2; once a checkpoint is in the storage the test removes rank 1's node. Ray Train restarts the worker
group (``max_failures``) with the one worker the surviving node holds. Its first try may still count the lost
node, which Ray Train notices as a placement group not ready within ``RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S``
(10 s here instead of 60: placing workers on live nodes takes well under a second), and then it tries again.
The worker re-plans the per-process batch and accumulation steps for its world size (same global batch, same
cell id), resumes from the checkpoint and finishes. The run's record says so: planned 2 processes (params), world
sizes 2 then 1 (a metric per attempt), the re-plan (tags).
"""

from __future__ import annotations

import dataclasses
import json
import sys
import threading
import time
from pathlib import Path

import pytest
from mlflow import MlflowClient
from platform_fixtures import FaultInjection, fresh_store
from ray import cloudpickle

from npsemiseg.callbacks import Callbacks
from npsemiseg.config import cell_config
from semiseg_platform.launch import run_cell
from semiseg_platform.storage import CheckpointStore, parse_storage
from semiseg_platform.tracking import mlflow_names

pytestmark = pytest.mark.integration

#: seconds the test waits for the cell to reach the fault, then for it to finish (generous: a loaded machine)
TIMEOUT_S = 300
#: seconds Ray Train waits for a worker group's placement group before trying again with a fresh view of the nodes
PLACEMENT_TIMEOUT_S = "10"


@dataclasses.dataclass
class NodeRecorder(Callbacks):
    """Writes ``<folder>/rank<r>.json`` with the Ray node id the rank trained on (the first attempt's)."""

    folder: str

    def on_start(self, config, *, total_steps, start_step, rank, world_size) -> None:
        import ray

        path = Path(self.folder, f"rank{rank}.json")
        if not path.exists():
            path.write_text(json.dumps({"node": ray.get_runtime_context().get_node_id()}))


# Ray workers cannot import this test module: its classes travel by value
cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def cluster():
    """A head (no CPUs: the driver and Ray Train's controller only) and two worker raylets of 1 CPU."""
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, connect=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    for _ in range(2):
        cluster.add_node(num_cpus=1, resources={"one_per_node": 1})
    cluster.wait_for_nodes()
    yield cluster
    ray.shutdown()
    cluster.shutdown()


def test_an_elastic_cell_that_loses_a_node_finishes_on_one_worker_at_the_same_global_batch(
        cluster, tmp_path, tmp_path_factory, monkeypatch):
    monkeypatch.setenv("RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S", PLACEMENT_TIMEOUT_S)  # read by Ray Train's controller
    config = cell_config("smoke", framework="supervised", dataset="synthetic", partition="1/16", head="baseline",
                         **{"schedule.checkpoint_every_steps": 1, "runtime.device": "cpu"})
    storage, tracking, nodes = str(tmp_path / "ray_results"), fresh_store(tmp_path_factory, "elastic"), tmp_path / "nodes"
    nodes.mkdir()
    marker = tmp_path / "hung"
    callbacks = [NodeRecorder(str(nodes)), FaultInjection(rank=1, step=2, marker=str(marker), action="hang")]
    ended: dict = {}

    def launch() -> None:  # the cell in a thread: Ray removes nodes from the main thread only
        try:
            ended["result"] = run_cell(config, workers=2, min_workers=1, cpus_per_worker=1,
                                       custom_per_worker={"one_per_node": 1}, max_failures=1, storage=storage,
                                       tracking=tracking, experiment="elastic", name="elastic", callbacks=callbacks)
        except BaseException as error:  # noqa: BLE001 - re-raised below, in the test's thread
            ended["error"] = error

    cell = threading.Thread(target=launch, daemon=True)
    cell.start()
    checkpoints = CheckpointStore(parse_storage(storage), "elastic")
    deadline = time.monotonic() + TIMEOUT_S
    while not (marker.exists() and checkpoints.latest()) and cell.is_alive() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert marker.exists() and checkpoints.latest(), f"the cell never reached the fault after a checkpoint: {ended}"
    lost = json.loads((nodes / "rank1.json").read_text())["node"]
    [node] = [n for n in cluster.worker_nodes if n.node_id == lost]
    cluster.remove_node(node)  # the raylet, and rank 1's process with it
    cell.join(timeout=TIMEOUT_S)
    assert not cell.is_alive(), "the cell did not finish after losing a node"
    if "error" in ended:
        raise ended["error"]
    result = ended["result"]
    assert result.status == "FINISHED" and result.steps == 3 and result.cell_id == config.cell_id

    run = MlflowClient(tracking).get_run(result.run_id)
    params, tags = run.data.params, run.data.tags
    planned = {key: params[f"{mlflow_names.PLAN_PREFIX}{key}"] for key in ("processes", "batch", "global_batch")}
    assert planned == {"processes": "2", "batch": "2", "global_batch": "4"}
    assert params[mlflow_names.PLAN_MIN_PROCESSES] == "1"
    obtained = {key[len(mlflow_names.PLAN_OBTAINED_PREFIX):]: value for key, value in tags.items()
                if key.startswith(mlflow_names.PLAN_OBTAINED_PREFIX)}
    assert obtained == {"world_size": "1", "batch": "2", "unlabeled_batch": "2", "accumulation_steps": "2",
                        "global_batch": "4", "global_batch_kept": "True"}
    assert tags[mlflow_names.ATTEMPTS] == "2" and tags[mlflow_names.WORLD_SIZE] == "1"
    assert tags[mlflow_names.CELL_ID] == config.cell_id
    history = MlflowClient(tracking).get_metric_history(result.run_id, mlflow_names.PLAN_WORLD_SIZE)
    attempts = sorted(history, key=lambda m: m.timestamp)
    assert [m.value for m in attempts] == [2.0, 1.0]
    assert attempts[0].step == 0 and attempts[1].step >= 1  # the second attempt resumed from a checkpoint
    # the same optimisation: the same number of optimiser steps on each world size
    totals = {m.value for m in MlflowClient(tracking).get_metric_history(result.run_id, mlflow_names.TOTAL_STEPS)}
    assert totals == {3.0}
