"""``npsemiseg tables``: the paper's Tables 1-6 (and the uncertainty-time figure) from MLflow runs."""

from __future__ import annotations

from pathlib import Path

import typer

from semiseg_platform.cli.app import TRACKING_HELP, app, fail


def existing_store(tracking: str | None, experiment: str) -> str:
    """The tracking URI of a store that answers and holds ``experiment`` (``PreflightError`` otherwise;
    a local store is never created by reading it)."""
    from mlflow.tracking import MlflowClient

    from semiseg_platform.preflight import PreflightError, check_tracking
    from semiseg_platform.tracking.store import sqlite_path

    uri = check_tracking(tracking)
    db = sqlite_path(uri)
    if db is not None and not db.is_file():
        raise PreflightError(f"tracking: no MLflow store at {db} (expected the store a run or grid wrote; "
                             "--tracking or MLFLOW_TRACKING_URI)")
    client = MlflowClient(uri)
    if client.get_experiment_by_name(experiment) is None:
        names = sorted(e.name for e in client.search_experiments(max_results=50))
        raise PreflightError(f"--experiment: no experiment {experiment!r} in {uri}, expected one of {names}")
    return uri


@app.command()
def tables(
    experiment: str = typer.Option(..., help="MLflow experiment to read the cell runs from"),
    out: Path = typer.Option(..., help="directory for the tables (Markdown, LaTeX, CSV, Parquet) and figures"),
    tracking: str | None = typer.Option(None, help=TRACKING_HELP),
    grid_id: str | None = typer.Option(None, help="only the cells of this grid (default: every cell run)"),
) -> None:
    """Build the paper's Tables 1-6 (and the uncertainty-time figure) from MLflow runs; print them."""
    from semiseg_platform.preflight import PreflightError
    from semiseg_platform.reports import markdown_report, write_report

    try:
        tracking_uri = existing_store(tracking, experiment)
        if out.exists() and not out.is_dir():
            raise PreflightError(f"--out: {out} is a file (expected a directory for the tables)")
    except PreflightError as error:
        fail(str(error))
    built, written = write_report(tracking_uri, experiment, out, grid_id=grid_id)
    typer.echo(markdown_report(built))
    typer.echo(f"{len(written)} files written to {out}")
