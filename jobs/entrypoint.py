"""What the grid and search jobs share: the spec and storage arguments, and the exit-status rule."""

from __future__ import annotations

import argparse
import sys
from typing import Any, Callable


def job_parser(prog: str, doc: str, spec_help: str) -> argparse.ArgumentParser:
    """A parser with the spec and the tracking / checkpoint storage options of every job."""
    parser = argparse.ArgumentParser(prog=prog, description=doc.split("\n\n")[0])
    parser.add_argument("spec", help=spec_help)
    parser.add_argument("--tracking-uri", help="MLflow tracking URI (default: the spec's, MLFLOW_TRACKING_URI, or ./mlruns.db)")
    parser.add_argument("--storage", help="checkpoint storage: directory or s3://bucket/prefix (default: the spec's or ./ray_results)")
    return parser


def run_job(body: Callable[[], Any]) -> int:
    """Run a job's body and return its exit status: the body's int as is (a dry run), else its
    summary printed and 0 when ``summary.ok``, 1 otherwise; an invalid spec or input
    (``ValueError``, raised before anything started) is one line on stderr and 2."""
    try:
        outcome = body()
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if isinstance(outcome, int):
        return outcome
    print(outcome.format())
    return 0 if outcome.ok else 1
