"""A two-worker DDP cell across two nodes (integration: a real local multi-node Ray cluster, gloo,
checkpoints on a real S3-compatible store, a real MLflow SQLite store).

The cluster is a head without CPUs and two worker raylets of 1 CPU each. Each raylet has one
``one_per_node`` (a custom resource); the first also has two ``both_here``. The cell asks for
``resources.custom_per_worker``: ``{one_per_node: 1}`` puts its two Ray Train workers on different
nodes, ``{both_here: 1}`` puts both on the first node. A loop callback records the node of each
rank, so the test sees where they ran rather than trusting the resources.

The same cell (same seed, same shards) on two nodes and on one node computes the same thing: DDP
averages the two ranks' gradients with one gloo all-reduce per bucket, and a sum of two numbers does
not depend on their order, so the losses and the final metrics agree to float rounding. The test
allows a relative 1e-5 (train/loss at every step, every final metric).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

import pytest
from mlflow import MlflowClient
from platform_fixtures import fresh_store, running_seaweedfs
from ray import cloudpickle

from npsemiseg.config import cell_config
from npsemiseg.callbacks import Callbacks
from semiseg_platform.launch import run_cell
from semiseg_platform.storage import CheckpointStore, parse_storage
from semiseg_platform.tracking.mlflow_names import FINAL_METRICS

pytestmark = pytest.mark.integration

#: relative tolerance of the two-node run against the one-node run (losses and final metrics)
RTOL = 1e-5


@dataclasses.dataclass
class NodeRecorder(Callbacks):
    """Writes ``<folder>/rank<r>.json`` with the Ray node id the rank trained on."""

    folder: str

    def on_start(self, config, *, total_steps, start_step, rank, world_size) -> None:
        import ray

        Path(self.folder, f"rank{rank}.json").write_text(json.dumps(
            {"node": ray.get_runtime_context().get_node_id(), "world_size": world_size}))


# Ray workers cannot import this test module: its classes travel by value
cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def cluster():
    """A head (no CPUs) and two worker raylets of 1 CPU; only the first can hold both workers."""
    import ray
    from ray.cluster_utils import Cluster

    with pytest.MonkeyPatch.context() as env:
        if not os.environ.get("AWS_ACCESS_KEY_ID"):  # signed S3 requests (any key: the store has no identities)
            env.setenv("AWS_ACCESS_KEY_ID", "test")
            env.setenv("AWS_SECRET_ACCESS_KEY", "test")
        cluster = Cluster(initialize_head=True, connect=True,
                          head_node_args={"num_cpus": 0, "include_dashboard": False})
        first = cluster.add_node(num_cpus=1, resources={"one_per_node": 1, "both_here": 2})
        second = cluster.add_node(num_cpus=1, resources={"one_per_node": 1})
        cluster.wait_for_nodes()
        yield cluster, first.node_id, second.node_id
        ray.shutdown()
        cluster.shutdown()


@pytest.fixture(scope="module")
def s3_storage(tmp_path_factory):
    with running_seaweedfs(tmp_path_factory.mktemp("seaweedfs")) as (_, endpoint):
        yield f"s3://npsemiseg-test/two-nodes?endpoint_override={endpoint}"


def _run(tmp_path: Path, name: str, custom: dict, storage: str, tracking: str):
    config = cell_config("smoke", framework="supervised", dataset="synthetic", partition="1/16", head="np",
                         **{"schedule.checkpoint_every_steps": 1, "runtime.device": "cpu"})
    nodes = tmp_path / name
    nodes.mkdir()
    result = run_cell(config, workers=2, cpus_per_worker=0.5, custom_per_worker=custom, storage=storage,
                      tracking=tracking, experiment="two-nodes", name=name, callbacks=[NodeRecorder(str(nodes))])
    placed = {int(p.stem[4:]): json.loads(p.read_text())["node"] for p in nodes.glob("rank*.json")}
    return result, placed


def test_a_two_worker_cell_across_two_nodes_matches_the_same_cell_on_one_node(cluster, s3_storage, tmp_path,
                                                                                 tmp_path_factory):
    _, first, second = cluster
    tracking = fresh_store(tmp_path_factory, "two_nodes")
    spread, spread_nodes = _run(tmp_path, "spread", {"one_per_node": 1}, s3_storage, tracking)
    packed, packed_nodes = _run(tmp_path, "packed", {"both_here": 1}, s3_storage, tracking)

    assert sorted(spread_nodes.values()) == sorted([first, second]), spread_nodes  # one worker per node
    assert set(packed_nodes) == {0, 1} and set(packed_nodes.values()) == {first}, packed_nodes
    for result in (spread, packed):
        assert result.status == "FINISHED" and result.steps == 3
        # checkpoints on S3, written by rank 0 wherever it ran
        assert result.checkpoint_uri == f"s3://npsemiseg-test/two-nodes/{result.name}/checkpoint_000000003"
        assert CheckpointStore(parse_storage(s3_storage), result.name).latest() == (3, result.checkpoint_uri)

    for metric in FINAL_METRICS:
        assert spread.metrics[metric] == pytest.approx(packed.metrics[metric], rel=RTOL, abs=1e-7), metric
    client = MlflowClient(tracking)
    losses = [[m.value for m in sorted(client.get_metric_history(r.run_id, "train/loss"), key=lambda m: m.step)]
              for r in (spread, packed)]
    assert len(losses[0]) >= 3 and losses[0] == pytest.approx(losses[1], rel=RTOL)
