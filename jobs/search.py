"""Entry point of the hyper-parameter search job: Ray Tune + Optuna (TPE) + ASHA over one cell.

    python -m jobs.search jobs/specs/search_smoke.yaml                  # local Ray, ./mlruns.db, ./optuna.db
    python -m jobs.search jobs/specs/search_np.yaml --dataset cityscapes --partition 1/8 \
        --set schedule.batch_size=8 --set schedule.unlabeled_batch_size=8
    ray job submit --working-dir . -- python -m jobs.search jobs/specs/search_np.yaml \
        --optuna-storage postgresql://USER@HOST/optuna              # a cluster

Running the same spec again continues its Optuna study (more trials, no configuration trained
twice). Exit status: 0 when the study has a best configuration, 1 when no trial ran to its end,
2 when the spec is invalid (nothing started).
"""

from __future__ import annotations

import sys

from jobs.entrypoint import job_parser, run_job
from semiseg_platform.cli import parse_assignments
from semiseg_platform.search import load_search_spec, run_search, search_id


def main(argv: list[str] | None = None) -> int:
    parser = job_parser("python -m jobs.search", __doc__, "search spec (YAML), e.g. jobs/specs/search_np.yaml")
    parser.add_argument("--dataset", help="search this dataset instead of the spec's")
    parser.add_argument("--partition", help="search this partition instead of the spec's (count or 1/16 ...)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a setting of the cell (dotted RunConfig key), repeatable")
    parser.add_argument("--num-samples", type=int, help="trials in this submission instead of the spec's")
    parser.add_argument("--optuna-storage", help="Optuna RDB URL (default: the spec's or sqlite:///./optuna.db)")
    parser.add_argument("--out-dir", help="where best_config.yaml, trials.csv and hparams.png go")
    parser.add_argument("--dry-run", action="store_true", help="validate the spec and print its search id, run nothing")
    args = parser.parse_args(argv)

    def body():
        spec = load_search_spec(args.spec, overrides=parse_assignments(args.set), dataset=args.dataset,
                                partition=args.partition, num_samples=args.num_samples)
        if args.dry_run:
            base = spec.base_config()
            print(f"search {spec.name}: {base.cell_name}, search_id {search_id(spec, base)}, "
                  f"space {sorted(spec.space)}, {spec.num_samples} trial(s)")
            return 0
        return run_search(spec, tracking_uri=args.tracking_uri, storage=args.storage,
                          optuna_storage=args.optuna_storage, out_dir=args.out_dir)

    return run_job(body)


if __name__ == "__main__":
    sys.exit(main())
