"""``npsemiseg claims``: the paper's claims checked from MLflow runs, with verdicts."""

from __future__ import annotations

from pathlib import Path

import typer

from semiseg_platform.cli.app import TRACKING_HELP, app, fail


@app.command()
def claims(
    experiment: list[str] = typer.Option(..., help="MLflow experiment of the study's cell runs; repeat it to pool "
                                         "replicates of one study (pairs are formed within each experiment)"),
    out: Path = typer.Option(Path("claims"), help="directory for claims.md, claims.json and the forest plot claims_forest.png"),
    tracking: str | None = typer.Option(None, help=TRACKING_HELP),
    grid_id: str | None = typer.Option(None, help="only the cells of this grid (default: every cell run)"),
    search_experiment: str | None = typer.Option(None, help="experiment of the search runs (C6; default: none)"),
) -> None:
    """Check every claim of the paper (S0, S1, C1-C6) from MLflow runs: paired differences, mean, 95 %
    bootstrap interval, verdict. Writes claims.md, claims.json and claims_forest.png (the differences and
    intervals as a forest plot, when any claim has a pair); prints the Markdown."""
    from semiseg_platform.reports.claims import claims_command
    from semiseg_platform.tracking import existing_experiment, resolve_tracking_uri

    if out.exists() and not out.is_dir():
        fail(f"--out: {out} is a file, expected a directory")
    tracking = resolve_tracking_uri(tracking)
    try:
        for name in experiment:
            existing_experiment(tracking, name)
        claims_command(experiment, tracking=tracking, out=out, grid_id=grid_id, search_experiment=search_experiment,
                       emit=typer.echo)
    except ValueError as error:
        fail(str(error))
