"""``npsemiseg hparams-figure``: the paper's hyper-parameter figure from finished search trials."""

from __future__ import annotations

from pathlib import Path

import typer

from semiseg_platform.cli.app import CELL_FAILED, TRACKING_HELP, app, fail


@app.command("hparams-figure")
def hparams_figure(
    experiment: str = typer.Option(..., help="MLflow experiment holding the search trials"),
    out: Path = typer.Option(..., help="directory for hparams.png"),
    tracking: str | None = typer.Option(None, help=TRACKING_HELP),
    search_id: str | None = typer.Option(None, help="only the trials of this search (default: every search)"),
    aggregate: str = typer.Option("max", help="max | mean of the finished trials at each value"),
) -> None:
    """The paper's hyper-parameter figure (mIoU against Q, lambda_kl, T) from finished search trials."""
    from semiseg_platform.reports import write_hparams_figure
    from semiseg_platform.tracking import resolve_tracking_uri

    if aggregate not in ("max", "mean"):
        fail(f"--aggregate: expected max or mean, got {aggregate!r}")
    path = write_hparams_figure(resolve_tracking_uri(tracking), experiment, out, search=search_id, aggregate=aggregate)
    if path is None:
        fail(f"--experiment: no finished search trial in experiment {experiment!r}", status=CELL_FAILED)
    typer.echo(f"figure written to {path}")
