"""``npsemiseg ui``: serve the MLflow UI of a local store."""

from __future__ import annotations

import typer

from semiseg_platform.cli.app import app


@app.command()
def ui(
    tracking: str | None = typer.Option(None, help="MLflow store (default: $MLFLOW_TRACKING_URI, else ./mlruns.db)"),
    host: str = typer.Option("127.0.0.1", help="interface to bind (default: loopback only)"),
    port: int = typer.Option(5000, help="port of the UI"),
    print_only: bool = typer.Option(False, "--print", help="print the command, start nothing"),
) -> None:
    """Serve the MLflow UI of a local store (mlflow server on loopback) and print the ready-made searches."""
    from semiseg_platform.ui import serve

    status = serve(tracking, host=host, port=port, print_only=print_only)
    if status:
        raise typer.Exit(status)
