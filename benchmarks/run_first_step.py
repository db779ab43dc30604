"""Time-to-first-step of ``npsemiseg run``: the in-process launcher against Ray Train
(results: ``docs/performance.md``).

Runs the same smoke cell (``schedule.max_steps=1``) as a fresh ``npsemiseg run`` process in an empty
working directory, once per launcher and repetition (alternating), and times from the process start to
the progress line of step 1 (``step 1/1``), and to the process's end. The machine's load average is
printed before and after (the figures move with it on a shared machine).

    python benchmarks/run_first_step.py --repeats 2
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

CELL = ["run", "--framework", "u2pl", "--dataset", "synthetic", "--partition", "1/16", "--head", "np",
        "--set", "schedule.max_steps=1"]
SCRIPT = "from semiseg_platform.cli.main import main; main()"


def one_run(launcher: str) -> tuple[float, float]:
    """(seconds to the step-1 line, seconds to exit) of one ``npsemiseg run --launcher <launcher>``."""
    with tempfile.TemporaryDirectory(prefix="first-step-") as work:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        env.pop("RAY_ADDRESS", None)
        started = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-c", SCRIPT, *CELL, "--launcher", launcher], cwd=work, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        first_step = float("nan")
        for line in proc.stdout:
            if "step 1/1" in line and first_step != first_step:
                first_step = time.perf_counter() - started
        if proc.wait() != 0:
            raise RuntimeError(f"npsemiseg run --launcher {launcher} exited {proc.returncode}")
        return first_step, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()}, {os.cpu_count()} CPUs")
    times: dict[str, list[tuple[float, float]]] = {"trainer": [], "in_process": []}
    for _ in range(args.repeats):
        for launcher in times:
            times[launcher].append(one_run(launcher))
            print(f"{launcher:>10}: first step {times[launcher][-1][0]:6.1f} s, exit {times[launcher][-1][1]:6.1f} s")
    print(f"load average after: {os.getloadavg()}")
    for launcher, runs in times.items():
        print(f"{launcher:>10}: median first step {statistics.median(r[0] for r in runs):.1f} s, "
              f"median exit {statistics.median(r[1] for r in runs):.1f} s ({len(runs)} runs)")


if __name__ == "__main__":
    main()
