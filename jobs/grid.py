"""Entry point of the grid job: run every cell of a grid spec under Ray Tune.

    python -m jobs.grid jobs/specs/smoke.yaml                      # local Ray, local MLflow store
    ray job submit --working-dir . -- python -m jobs.grid jobs/specs/paper.yaml   # a cluster

Exit status: 0 when every cell finished (or had finished earlier), 1 when any cell failed,
2 when the spec is invalid (nothing started).
"""

from __future__ import annotations

import argparse
import sys

from semiseg_platform.grid import expand, load_spec, run_grid


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jobs.grid", description=__doc__.split("\n\n")[0])
    parser.add_argument("spec", help="grid spec (YAML), e.g. jobs/specs/paper.yaml")
    parser.add_argument("--tracking-uri", help="MLflow tracking URI (default: the spec's, MLFLOW_TRACKING_URI, or ./mlruns.db)")
    parser.add_argument("--storage", help="checkpoint storage: directory or s3://bucket/prefix (default: the spec's or ./ray_results)")
    parser.add_argument("--tables-dir", help="where to write the tables (default: under the storage)")
    parser.add_argument("--dry-run", action="store_true", help="validate the spec and list its cells, run nothing")
    args = parser.parse_args(argv)
    try:
        spec = load_spec(args.spec)
        if args.dry_run:
            configs = expand(spec)
            for config in configs:
                print(f"{config.cell_id}  {config.cell_name}  seed {config.seed}")
            print(f"{len(configs)} cells")
            return 0
        summary = run_grid(spec, tracking_uri=args.tracking_uri, storage=args.storage, tables_dir=args.tables_dir)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(summary.format())
    return 0 if summary.ok else 1


if __name__ == "__main__":
    sys.exit(main())
