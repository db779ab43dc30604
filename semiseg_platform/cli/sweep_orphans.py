"""``npsemiseg sweep-orphans``: end RUNNING MLflow runs whose owning process is gone."""

from __future__ import annotations

import typer

from semiseg_platform.cli.app import TRACKING_HELP, app


@app.command("sweep-orphans")
def sweep_orphans(
    experiment: str = typer.Option("npsemiseg", help="MLflow experiment"),
    tracking: str | None = typer.Option(None, help=TRACKING_HELP),
    stale_after: float | None = typer.Option(None, help="also end runs owned on other hosts after this many seconds"),
) -> None:
    """End RUNNING MLflow runs whose owning process is gone (status KILLED, reason in the 'error' tag)."""
    from semiseg_platform.tracking import sweep_orphaned_runs

    swept = sweep_orphaned_runs(experiment, tracking=tracking, stale_after_s=stale_after)
    typer.echo(f"{len(swept)} orphaned run(s) ended" + (": " + ", ".join(swept) if swept else ""))
