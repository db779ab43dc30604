"""``npsemiseg predict``: prediction, uncertainty and overlay PNGs of the user's own images from a
trained cell's checkpoint (or an exported model), batched, on CPU or GPU."""

from __future__ import annotations

import math
from collections import defaultdict
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from semiseg_platform.cli.app import TRACKING_HELP, app, fail, one_line
from semiseg_platform.cli.evaluate import CHECKPOINT_HELP, RUN_HELP, SAMPLES_HELP, check_options

if TYPE_CHECKING:  # the command imports it when it runs: its --help answers without torch
    from npsemiseg import SegmentationModel

#: The image files taken from an input directory
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff", ".webp")
#: The files written per image ``<stem>``
OUTPUTS = ("{stem}_prediction.png", "{stem}_uncertainty.png", "{stem}_overlay.png")


def collect_images(inputs: list[Path]) -> list[Path]:
    """The image files named or found (one level, sorted) in ``inputs``; ``ValueError`` naming a
    missing path, an empty directory, a file that is not an image or two images with one name."""
    from PIL import UnidentifiedImageError

    from npsemiseg.untrusted import PREDICT_FORMATS, open_image

    found: list[Path] = []
    for path in inputs:
        if path.is_dir():
            images = sorted(p for p in path.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
            if not images:
                raise ValueError(f"{path}: directory holds no image ({', '.join(IMAGE_SUFFIXES)})")
            found += images
        elif path.is_file():
            found.append(path)
        else:
            raise ValueError(f"{path}: no such file or directory")
    stems: dict[str, Path] = {}
    for image in found:
        try:
            with open_image(image, formats=PREDICT_FORMATS) as opened:  # too many pixels or another format: refused
                opened.verify()
        except (UnidentifiedImageError, OSError, SyntaxError) as error:
            raise ValueError(f"{image}: not an image ({' '.join(str(error).split())})") from None
        if image.stem in stems:
            raise ValueError(f"{image}: same name as {stems[image.stem]} (the outputs are named by the file's stem)")
        stems[image.stem] = image
    return found


def batches(images: list[Path], batch_size: int) -> list[list[Path]]:
    """Batches of at most ``batch_size`` images of one size (sizes differ between user images)."""
    from npsemiseg.untrusted import PREDICT_FORMATS, open_image

    by_size: dict[tuple[int, int], list[Path]] = defaultdict(list)
    for image in images:
        with open_image(image, formats=PREDICT_FORMATS) as opened:
            by_size[opened.size].append(image)
    return [group[i:i + batch_size] for group in by_size.values() for i in range(0, len(group), batch_size)]


def output_paths(out: Path, image: Path) -> list[Path]:
    """The three PNGs ``predict`` writes for ``image`` under ``out``."""
    return [out / name.format(stem=image.stem) for name in OUTPUTS]


def check_out(out: Path, images: list[Path], *, overwrite: bool) -> None:
    """``ValueError`` naming ``--out`` unless predict may write there: not a link nor a file; when it exists
    and holds anything, only with ``--overwrite``, and even then none of the PNGs to write may be a link or a
    folder (the files are replaced by renaming, so a link planted later is replaced, never followed)."""
    if out.is_symlink():
        raise ValueError(f"--out: {out} is a symbolic link; predict does not write through links (give its target)")
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out: {out} is a file, expected a directory")
    held = sorted(out.iterdir()) if out.is_dir() else []
    if held and not overwrite:
        raise ValueError(f"--out: {out} is not empty ({len(held)} entries, e.g. {held[0].name}); pass --overwrite to "
                         "replace the PNGs predict writes there (other files are left alone)")
    for path in (path for image in images for path in output_paths(out, image)):
        if path.is_symlink() or (path.exists() and not path.is_file()):
            kind = "a symbolic link" if path.is_symlink() else "not a file"
            raise ValueError(f"--out: {path} is {kind}; predict does not write through it (remove it first)")


def write_predictions(model: SegmentationModel, images: list[Path], out: Path, *, batch_size: int,
                      num_samples: int | None) -> int:
    """Predict every image in batches and write its three PNGs under ``out``, each one renamed into place
    (:func:`~semiseg_platform.storage.atomic_write`: a link at its name is replaced, not followed); returns the count."""
    import torch

    from npsemiseg.data.datasets import load_image
    from npsemiseg.evaluation.visualize import overlay, save_label_png, save_png, save_uncertainty_png
    from npsemiseg.untrusted import PREDICT_FORMATS
    from semiseg_platform.storage import atomic_write

    count = 0
    for group in batches(images, batch_size):
        pixels = torch.stack([load_image(path, formats=PREDICT_FORMATS) for path in group])
        labels, uncertainty = model.predict(pixels, num_samples=num_samples)
        for path, image, label, entropy in zip(group, pixels, labels.cpu(), uncertainty.cpu()):
            prediction, grey, blended = output_paths(out, path)
            atomic_write(prediction, partial(save_label_png, label=label, num_classes=model.num_classes))
            atomic_write(grey, partial(save_uncertainty_png, entropy=entropy, num_classes=model.num_classes))
            atomic_write(blended, partial(save_png, pixels=overlay(image, label, model.num_classes)))
            count += 1
            typer.echo(f"{path} -> {prediction.name}, {grey.name}, {blended.name} "
                       f"(mean uncertainty {entropy.mean().item():.3f} nats)")
    return count


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
    from npsemiseg import load_model
    from semiseg_platform.checkpoint_lookup import open_checkpoint

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
        count = write_predictions(model, images, out, batch_size=batch_size, num_samples=samples)
    except ValueError as error:
        fail(one_line(error))
    typer.echo(f"{count} image(s) -> {out}: cell {model.config.cell_name}, step {model.step}, mode {mode}, "
               f"T {model.samples(samples) or 1}")
    typer.echo(f"uncertainty scale: grey 0 = 0 nats (certain), 255 = log {model.num_classes} = "
               f"{math.log(model.num_classes):.4f} nats (also in each PNG's text chunk 'uncertainty_scale')")
