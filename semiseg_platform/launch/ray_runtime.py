"""Connecting to Ray: the embedded local cluster by default, the existing one inside ``ray job submit``.

Inside ``ray job submit`` (or with ``RAY_ADDRESS`` set) ``ray.init()`` is called without
resource arguments: the cluster's resources are fixed by whoever started it. On the embedded
default the local cluster gets the environment its workers need on a single machine
(``GLOO_SOCKET_IFNAME`` on the loopback interface, which avoids gloo's "connection refused"
from a ``127.0.1.1`` hosts entry) and a longer worker-group start timeout (slow starts on a
loaded 2-core machine).
"""

from __future__ import annotations

import os
import socket
from typing import Any

import ray

#: Seconds Ray Train waits for its worker group to start on the embedded default (Ray's default: 60)
WORKER_GROUP_START_TIMEOUT_S = "300"


def in_existing_cluster() -> bool:
    """True inside ``ray job submit`` or whenever ``RAY_ADDRESS`` names a cluster to join."""
    return bool(os.environ.get("RAY_ADDRESS"))


def _loopback_interface() -> str | None:
    names = {name for _, name in socket.if_nameindex()}
    for candidate in ("lo", "lo0"):
        if candidate in names:
            return candidate
    return None


def embedded_env() -> dict[str, str]:
    """Environment variables for the embedded single-machine cluster (explicit settings win)."""
    env = {"RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S": os.environ.get("RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S",
                                                                     WORKER_GROUP_START_TIMEOUT_S)}
    interface = os.environ.get("GLOO_SOCKET_IFNAME") or _loopback_interface()
    if interface:
        env["GLOO_SOCKET_IFNAME"] = interface
    return env


def worker_env() -> dict[str, str]:
    """Environment of Ray Train workers: the embedded settings locally; on a cluster only what the
    driver was explicitly given (a loopback interface would break gloo across nodes)."""
    if in_existing_cluster():
        return {key: os.environ[key] for key in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME") if os.environ.get(key)}
    return embedded_env()


def ensure_ray(*, num_cpus: float | None = None, num_gpus: int | None = None, **init_kwargs: Any) -> None:
    """Start (embedded) or join (``RAY_ADDRESS``) Ray once per process; a no-op when already connected.

    ``num_cpus`` / ``num_gpus`` / ``init_kwargs`` apply to the embedded cluster only. Without
    ``RAY_ADDRESS`` a new local cluster is started even when another one (``ray start``) runs on
    this machine: plain ``ray.init()`` would join that one.
    """
    if ray.is_initialized():
        return
    if in_existing_cluster():
        ray.init()
        return
    # address="local": always a new embedded cluster, never a `ray start` cluster found on this machine
    init_kwargs.setdefault("address", "local")
    ray.init(num_cpus=num_cpus, num_gpus=num_gpus, runtime_env={"env_vars": embedded_env()}, **init_kwargs)
