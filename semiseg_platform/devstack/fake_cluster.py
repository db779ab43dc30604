"""The cluster launcher's node types on Ray's fake multi-node provider: autoscaling on one machine.

``infra/aws/cluster.yaml`` is the one source of the node types (names, ``min_workers`` /
``max_workers``, resources). :func:`fake_autoscaling_config` turns it into an autoscaling config
for Ray's non-docker fake provider (``FakeMultiNodeProvider``): the autoscaler runs as it would on
AWS, but a "node" it launches is one more raylet on this machine. The mapping:

- the head type becomes ``ray.head.default`` (the name the fake provider gives the head it runs
  on); its resources are those of ``ray start --head`` (:func:`head_resources`);
- every worker type keeps its name, ``min_workers`` and ``max_workers`` (capped by
  ``max_workers`` when given) and its custom resources; its GPUs become :data:`GPU_STANDIN`, a
  custom resource of the same count (a fake node has no GPU, and a cell asking Ray for ``GPU``
  would try NCCL and CUDA). A CPU cell asks for the stand-in with ``resources.custom_per_worker``;
- its CPUs stay as they are unless ``cpus`` is given (a machine of 2 cores hosting 48-CPU
  nodes would make Ray start that many worker processes); ``object_store_memory`` is small;
- ``node_config`` (instance types, disks, IAM) means nothing to the fake provider and is dropped.

The provider is loaded as an ``external`` provider by module path: the fake provider's own
``type: fake_multinode`` needs the ``example.yaml`` defaults file, which Ray's wheel does not ship.
The head must be started with ``RAY_FAKE_CLUSTER=1`` (the provider checks it) and
``--autoscaling-config`` pointing at the written file (:func:`write_fake_autoscaling_config`).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from npsemiseg.untrusted import load_yaml

#: The custom resource a fake node has in place of each GPU of its node type
GPU_STANDIN = "gpu_standin"
#: The head's node type name under the fake provider
FAKE_HEAD_TYPE = "ray.head.default"
#: The fake provider's class, loaded by module path (``provider.type: external``)
FAKE_PROVIDER = "ray.autoscaler._private.fake_multi_node.node_provider.FakeMultiNodeProvider"
#: Object store of a fake node (bytes): above Ray's minimum, small enough for a laptop
FAKE_OBJECT_STORE_BYTES = 100 * 1024 * 1024


def load_cluster_config(path: str | Path) -> dict[str, Any]:
    return load_yaml(Path(path).read_text(), where=f"cluster config {path}", path=path)


def fake_resources(resources: Mapping[str, float], *, cpus: float | None = None) -> dict[str, float]:
    """A node type's resources on a fake node: ``GPU`` -> :data:`GPU_STANDIN`, ``CPU`` -> ``cpus`` if given."""
    fake = {name: amount for name, amount in resources.items() if name not in ("CPU", "GPU")}
    fake["CPU"] = resources.get("CPU", 0) if cpus is None else cpus
    if resources.get("GPU"):
        fake[GPU_STANDIN] = resources["GPU"]
    fake["object_store_memory"] = FAKE_OBJECT_STORE_BYTES
    return fake


def head_resources(cluster: Mapping[str, Any]) -> dict[str, float]:
    """The head type's resources (its ``ray start --head --num-cpus`` / ``--resources``), GPUs as stand-ins."""
    head = cluster["available_node_types"][cluster["head_node_type"]]
    resources = fake_resources(head.get("resources", {}))
    resources.pop("object_store_memory")
    return resources


def fake_autoscaling_config(cluster: Mapping[str, Any], *, gcs_address: str, idle_timeout_minutes: float | None = None,
                            max_workers: int | None = None, cpus: float | None = None) -> dict[str, Any]:
    """An autoscaling config for Ray's fake provider from a cluster launcher config (see the module).

    ``gcs_address``: the head's ``ip:port`` (the fake nodes join it). ``idle_timeout_minutes`` (default:
    the cluster's), ``max_workers`` (a cap on the cluster's and each type's) and ``cpus`` (each worker
    node's CPUs) shrink the cluster for a test."""
    head_type = cluster["head_node_type"]
    types: dict[str, Any] = {FAKE_HEAD_TYPE: {"resources": {}, "node_config": {}, "min_workers": 0, "max_workers": 0}}
    for name, spec in cluster["available_node_types"].items():
        if name == head_type:
            continue
        most = spec.get("max_workers", cluster.get("max_workers", 0))
        types[name] = {
            "resources": fake_resources(spec.get("resources", {}), cpus=cpus),
            "node_config": {},
            "min_workers": spec.get("min_workers", 0),
            "max_workers": most if max_workers is None else min(most, max_workers),
        }
    total = cluster.get("max_workers", 0)
    return {
        "cluster_name": f"{cluster['cluster_name']}-fake",
        "max_workers": total if max_workers is None else min(total, max_workers),
        "upscaling_speed": cluster.get("upscaling_speed", 1.0),
        "idle_timeout_minutes": (cluster.get("idle_timeout_minutes", 5) if idle_timeout_minutes is None
                                 else idle_timeout_minutes),
        "provider": {"type": "external", "module": FAKE_PROVIDER, "gcs_address": gcs_address,
                     "launch_multiple": True,
                     # a fake node is up when its raylet is: no SSH setup (node updaters), no launch-hash checks
                     "disable_node_updaters": True, "disable_launch_config_check": True,
                     # every fake node shares this machine's IP: the autoscaler tells them apart by node id
                     "use_node_id_as_ip": True},
        "auth": {"ssh_user": copy.deepcopy(cluster.get("auth", {})).get("ssh_user", "ubuntu")},
        "available_node_types": types,
        "head_node_type": FAKE_HEAD_TYPE,
        "file_mounts": {}, "cluster_synced_files": [], "file_mounts_sync_continuously": False,
        "rsync_exclude": [], "rsync_filter": [],
        "initialization_commands": [], "setup_commands": [], "head_setup_commands": [],
        "worker_setup_commands": [], "head_start_ray_commands": [], "worker_start_ray_commands": [],
    }


def write_fake_autoscaling_config(cluster_yaml: str | Path, destination: str | Path, **options: Any) -> Path:
    """:func:`fake_autoscaling_config` of ``cluster_yaml`` written to ``destination``; returns its path."""
    destination = Path(destination)
    config = fake_autoscaling_config(load_cluster_config(cluster_yaml), **options)
    destination.write_text(yaml.safe_dump(config, sort_keys=False))
    return destination
