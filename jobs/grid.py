"""Entry point of the grid job: run every cell of a grid spec under Ray Tune.

    python -m jobs.grid jobs/specs/smoke.yaml                      # local Ray, local MLflow store
    ray job submit --working-dir . -- python -m jobs.grid jobs/specs/paper.yaml   # a cluster

Exit status: 0 when every cell finished (or had finished earlier), 1 when any cell failed,
2 when the spec is invalid (nothing started).
"""

from __future__ import annotations

import sys

from jobs.entrypoint import job_parser, run_job
from semiseg_platform.grid import expand, load_spec, run_grid


def main(argv: list[str] | None = None) -> int:
    parser = job_parser("python -m jobs.grid", __doc__, "grid spec (YAML), e.g. jobs/specs/paper.yaml")
    parser.add_argument("--tables-dir", help="where to write the tables (default: under the storage)")
    parser.add_argument("--dry-run", action="store_true", help="validate the spec and list its cells, run nothing")
    args = parser.parse_args(argv)

    def body():
        spec = load_spec(args.spec)
        if args.dry_run:
            configs = expand(spec)
            for config in configs:
                print(f"{config.cell_id}  {config.cell_name}  seed {config.seed}")
            print(f"{len(configs)} cells")
            return 0
        return run_grid(spec, tracking_uri=args.tracking_uri, storage=args.storage, tables_dir=args.tables_dir)

    return run_job(body)


if __name__ == "__main__":
    sys.exit(main())
