"""``npsemiseg predict``: prediction, uncertainty and overlay PNGs of the user's own images from a
trained cell's checkpoint (or an exported model), batched, on CPU or GPU."""

from __future__ import annotations

import math
from pathlib import Path

import typer

from semiseg_platform.cli.app import TRACKING_HELP, app, fail, one_line
from semiseg_platform.cli.evaluate import CHECKPOINT_HELP, RUN_HELP, SAMPLES_HELP, check_options


@app.command()
def predict(
    inputs: list[Path] = typer.Argument(..., help="image files and/or directories of images"),
    out: Path = typer.Option(..., "--out", help="directory for the PNGs (created; one that holds files needs --overwrite)"),
    overwrite: bool = typer.Option(False, "--overwrite", help="write into a non-empty --out, replacing its PNGs of "
                                                              "the same names (other files are left alone)"),
    checkpoint: str | None = typer.Option(None, "--checkpoint", help=CHECKPOINT_HELP),
    run: str | None = typer.Option(None, "--run", help=RUN_HELP),
    samples: int | None = typer.Option(None, "--samples", help=SAMPLES_HELP),
    mode: str = typer.Option("whole", help="whole | sliding | sliding_global (one NP latent per image)"),
    device: str | None = typer.Option(None, help="cpu | cuda (default: cuda when available)"),
    batch_size: int = typer.Option(4, "--batch-size", help="images per forward pass (of one size)"),
    tracking: str | None = typer.Option(None, help=TRACKING_HELP),
) -> None:
    """Per image: the prediction (palette PNG of class indices), the uncertainty (entropy of the mean
    prediction, grey PNG: 0 = 0 nats, 255 = log K) and an overlay, written to --out."""
    # imported when the command runs: its --help answers without torch
    from npsemiseg import load_model
    from semiseg_platform.checkpoint_lookup import open_checkpoint
    from semiseg_platform.image_predictions import check_out, collect_images, write_predictions

    try:
        device = check_options(mode, samples, device)
        if mode == "center_crop":
            raise ValueError("--mode: center_crop predicts a crop, not the image; expected whole, sliding or sliding_global")
        if batch_size < 1:
            raise ValueError(f"--batch-size: expected >= 1, got {batch_size}")
        images = collect_images(inputs)
        check_out(out, images, overwrite=overwrite)
        with open_checkpoint(run_id=run, uri=checkpoint, tracking=tracking) as found:
            model = load_model(found.local, device=device, mode=mode)
        out.mkdir(parents=True, exist_ok=True)
        count = write_predictions(model, images, out, batch_size=batch_size, num_samples=samples,
                                  emit=typer.echo)
    except ValueError as error:
        fail(one_line(error))
    typer.echo(f"{count} image(s) -> {out}: cell {model.config.cell_name}, step {model.step}, mode {mode}, "
               f"T {model.samples(samples) or 1}")
    typer.echo(f"uncertainty scale: grey 0 = 0 nats (certain), 255 = log {model.num_classes} = "
               f"{math.log(model.num_classes):.4f} nats (also in each PNG's text chunk 'uncertainty_scale')")
