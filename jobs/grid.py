"""Entry point of the grid job: run every cell of a grid spec under Ray Tune (``npsemiseg grid``).

    python -m jobs.grid jobs/specs/smoke.yaml                      # local Ray, local MLflow store
    python -m jobs.grid jobs/specs/paper.yaml --dry-run            # validate, list the cells
    ray job submit --working-dir . -- python -m jobs.grid jobs/specs/paper.yaml   # a cluster

Options: those of ``npsemiseg grid --help``. Exit status: 0 when every cell finished (or had
finished earlier), 1 when any cell failed, 2 when the spec is invalid (nothing started).
"""

from __future__ import annotations

import sys

from jobs.entrypoint import run_job


def main(argv: list[str] | None = None) -> int:
    return run_job("grid", argv, "python -m jobs.grid")


if __name__ == "__main__":
    sys.exit(main())
