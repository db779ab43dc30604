"""Entry point of the hyper-parameter search job: Ray Tune + Optuna (TPE) + ASHA over one cell
(``npsemiseg search``).

    python -m jobs.search jobs/specs/search_smoke.yaml                  # local Ray, ./mlruns.db, ./optuna.db
    python -m jobs.search jobs/specs/search_np.yaml --dataset cityscapes --partition 1/8 \
        --set schedule.batch_size=8 --set schedule.unlabeled_batch_size=8
    ray job submit --working-dir . -- python -m jobs.search jobs/specs/search_np.yaml \
        --optuna-storage postgresql://USER@HOST/optuna              # a cluster

Options: those of ``npsemiseg search --help``. Running the same spec again continues its Optuna
study (more trials, no configuration trained twice). Exit status: 0 when the study has a best
configuration, 1 when no trial ran to its end, 2 when the spec is invalid (nothing started).
"""

from __future__ import annotations

import sys

from jobs.entrypoint import run_job


def main(argv: list[str] | None = None) -> int:
    return run_job("search", argv, "python -m jobs.search")


if __name__ == "__main__":
    sys.exit(main())
