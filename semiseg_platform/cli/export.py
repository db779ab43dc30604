"""``npsemiseg export``: one self-contained model file (configuration, the evaluated model's weights,
NP memories and centers) that ``npsemiseg.load_model`` reads without MLflow or the storage."""

from __future__ import annotations

from pathlib import Path

import typer

from semiseg_platform.cli.app import TRACKING_HELP, app, fail, one_line
from semiseg_platform.cli.evaluate import CHECKPOINT_HELP, RUN_HELP


@app.command()
def export(
    out: Path = typer.Option(..., "--out", help="the file to write, e.g. model.pt"),
    run: str | None = typer.Option(None, "--run", help=RUN_HELP),
    checkpoint: str | None = typer.Option(None, "--checkpoint", help=CHECKPOINT_HELP),
    select: str = typer.Option("last", help="last | best checkpoint of the cell"),
    tracking: str | None = typer.Option(None, help=TRACKING_HELP),
) -> None:
    """Write a trained cell's model as one file for ``npsemiseg.load_model(path)``."""
    from npsemiseg import load_model
    from semiseg_platform.checkpoint_lookup import open_checkpoint

    try:
        if out.is_dir():
            raise ValueError(f"--out: {out} is a directory, expected a file path such as model.pt")
        with open_checkpoint(run_id=run, uri=checkpoint, select=select, tracking=tracking) as found:
            model = load_model(found.local)
        written = model.export(out)
    except ValueError as error:
        fail(one_line(error))
    typer.echo(f"cell {model.config.cell_name} ({model.config.cell_id}) step {model.step} from {found.uri} -> "
               f"{written} ({written.stat().st_size / 2**20:.1f} MiB)")
    typer.echo(f"load it with: npsemiseg.load_model({str(written)!r})")
