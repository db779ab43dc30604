"""Helpers of the stack tests: settings on free ports and a home the ``postgres`` user can reach."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from semiseg_platform.devstack import StackSettings, port_in_use


def free_port_block(count: int, start: int | None = None) -> int:
    """A base port such that ``base .. base + count`` are free on 127.0.0.1 (inside 20000-32767,
    outside Ray's worker ports and the kernel's ephemeral range). Each pytest-xdist worker scans its own
    part of the range, so two workers starting stacks at once never pick the same block."""
    if start is None:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
        start = 21000 + 2750 * (int(worker) % 4 if worker.isdigit() else 0)
    for base in range(start, 32000 - count, 37):
        if not any(port_in_use("127.0.0.1", port) for port in range(base, base + count)):
            return base
    raise RuntimeError("no free block of ports between 21000 and 32000")


def stack_settings(home: Path, **overrides) -> StackSettings:
    """Settings on a free block of ports (never the defaults: a developer's stack may be running)."""
    base = free_port_block(16)
    ports = dict(postgres_port=base, s3_port=base + 1, seaweed_master_port=base + 3, seaweed_volume_port=base + 5,
                 seaweed_filer_port=base + 7, mlflow_port=base + 9, ray_port=base + 10, ray_dashboard_port=base + 11,
                 ray_dashboard_agent_port=base + 12, ray_client_port=base + 13)
    return StackSettings(home=home, **{**ports, **overrides})


def reachable_home() -> Path:
    """A stack home the ``postgres`` user can traverse (pytest's tmp_path is 0700 under /tmp/pytest-of-root)."""
    home = Path(tempfile.mkdtemp(prefix="npsemiseg-stack-test-"))
    os.chmod(home, 0o711)
    return home
