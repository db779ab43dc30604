"""``npsemiseg tables``: the paper's Tables 1-6 (and the uncertainty-time figure) from MLflow runs."""

from __future__ import annotations

from pathlib import Path

import typer

from semiseg_platform.cli.app import TRACKING_HELP, app
from semiseg_platform.reports import markdown_report, write_report
from semiseg_platform.tracking import resolve_tracking_uri


@app.command()
def tables(
    experiment: str = typer.Option(..., help="MLflow experiment to read the cell runs from"),
    out: Path = typer.Option(..., help="directory for the tables (Markdown, LaTeX, CSV, Parquet) and figures"),
    tracking: str | None = typer.Option(None, help=TRACKING_HELP),
    grid_id: str | None = typer.Option(None, help="only the cells of this grid (default: every cell run)"),
) -> None:
    """Build the paper's Tables 1-6 (and the uncertainty-time figure) from MLflow runs; print them."""
    tracking_uri = resolve_tracking_uri(tracking)
    built, written = write_report(tracking_uri, experiment, out, grid_id=grid_id)
    typer.echo(markdown_report(built))
    typer.echo(f"{len(written)} files written to {out}")
