"""The embedded default (``make demo``): the smoke grid on a local Ray with the local MLflow store.

Runs ``jobs/specs/smoke.yaml`` (the paper's axes on the synthetic stand-ins of the three
datasets, at smoke scale, 1 CPU per cell), prints a note saying what the demo is (the pipeline
working, not a comparison of the methods), the paper's tables in Markdown, the
summary, one JSON line with the timing (as ``docs/performance.md`` records it) and the command that
opens the MLflow UI on this store. Running it again skips the cells that finished already;
delete ``mlruns.db``, ``mlartifacts/`` and ``ray_results/`` to start afresh.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

from semiseg_platform.logs import configure_logging
from semiseg_platform.sweeps.grid_runner import run_grid
from semiseg_platform.tracking import resolve_tracking_uri, ui_hint

SMOKE_SPEC = Path(__file__).resolve().parent / "specs" / "smoke.yaml"
#: printed before the tables, so that nobody reads them as results
PLUMBING_NOTE = ("What follows is the smoke grid (jobs/specs/smoke.yaml) on the built-in synthetic stand-ins of the "
                 "datasets, 3 steps a cell: its numbers say that every cell runs and is tracked, not how the methods "
                 "compare. For numbers that mean something run `make study` (jobs/specs/mini.yaml: the CPU "
                 "mini-study and its claims report).")


def mlflow_ui_command(tracking_uri: str) -> str:
    """The command that serves this store's UI, with the npsemiseg next to this Python if there is one."""
    hint = ui_hint(tracking_uri) or f"open {tracking_uri}"
    local = Path(sys.executable).parent / "npsemiseg"
    if hint.startswith("npsemiseg ") and local.exists():
        cwd = Path.cwd()
        executable = local.relative_to(cwd) if local.is_relative_to(cwd) else local
        hint = f"{executable} {hint[len('npsemiseg '):]}"
    return hint + "   # prints the links to open (the cells with their mIoU and PAvPU, http://127.0.0.1:5000)"


def main() -> int:
    configure_logging(logging.INFO)  # the grid's progress lines, as `npsemiseg grid` shows them
    tracking_uri = resolve_tracking_uri(None)
    summary = run_grid(SMOKE_SPEC, tracking_uri=tracking_uri, storage=os.environ.get("NPSEMISEG_STORAGE"))
    print()
    print(PLUMBING_NOTE)
    print()
    print(summary.tables_markdown)
    print(summary.format())
    overhead = summary.median_overhead_seconds
    print(json.dumps({
        "bench": "smoke_grid", "cells": len(summary.outcomes),
        "finished": len(summary.cells("finished")), "skipped": len(summary.cells("skipped")),
        "failed": len(summary.cells("failed")), "wall_s": round(summary.wall_seconds, 1),
        "concurrency": summary.concurrency, "cpus": os.cpu_count(),
        "median_overhead_s": None if overhead is None else round(overhead, 2),
    }))
    print()
    print("MLflow UI on this store:")
    print(f"  {mlflow_ui_command(tracking_uri)}")
    return 0 if summary.ok else 1


if __name__ == "__main__":
    sys.exit(main())
