"""Start-up and shut-down time of the local stack, per service (semiseg_platform.devstack).

Starts the stack in a fresh home on free loopback ports (first start: initdb, secrets, bucket),
stops it, starts it again (warm: data directories exist) and stops it; prints one JSON line per
phase with the seconds per service from spawn to healthy (``up``) or from the first signal to the
process group's end (``down``), and the 1-minute load average.

    .venv/bin/python benchmarks/stack_lifecycle.py
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from stack_fixtures import reachable_home, stack_settings  # noqa: E402

from semiseg_platform.devstack import Stack  # noqa: E402


def main() -> None:
    home = reachable_home()
    stack = Stack(stack_settings(home))
    try:
        for phase in ("first", "warm"):
            began = time.monotonic()
            stack.startup_seconds.clear()
            stack.up()
            up_s = time.monotonic() - began
            print(json.dumps({"bench": "stack_up", "phase": phase, "total_s": round(up_s, 1),
                              "per_service_s": {k: round(v, 1) for k, v in stack.startup_seconds.items()},
                              "load1": os.getloadavg()[0]}), flush=True)
            began = time.monotonic()
            stack.stop_seconds.clear()
            stack.down()
            print(json.dumps({"bench": "stack_down", "phase": phase, "total_s": round(time.monotonic() - began, 1),
                              "per_service_s": {k: round(v, 1) for k, v in stack.stop_seconds.items()},
                              "load1": os.getloadavg()[0]}), flush=True)
    finally:
        stack.down()
        shutil.rmtree(stack.settings.ray_temp_dir, ignore_errors=True)
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
