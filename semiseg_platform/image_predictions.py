"""Prediction PNGs of a user's own images (``npsemiseg predict``): the images found and checked, batched by
size, predicted by a :class:`~npsemiseg.SegmentationModel`, and the prediction, uncertainty and overlay of each
written into place."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch
from PIL import UnidentifiedImageError

from npsemiseg import SegmentationModel
from npsemiseg.data.datasets import load_image
from npsemiseg.evaluation.visualize import overlay, save_label_png, save_png, save_uncertainty_png
from npsemiseg.untrusted import PREDICT_FORMATS, open_image
from semiseg_platform.storage import atomic_write

#: The image files taken from an input directory
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff", ".webp")
#: The files written per image ``<stem>``
OUTPUTS = ("{stem}_prediction.png", "{stem}_uncertainty.png", "{stem}_overlay.png")


def collect_images(inputs: list[Path]) -> list[Path]:
    """The image files named or found (one level, sorted) in ``inputs``; ``ValueError`` naming a
    missing path, an empty directory, a file that is not an image or two images with one name."""
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
                      num_samples: int | None, emit: Callable[[str], None] = print) -> int:
    """Predict every image in batches and write its three PNGs under ``out``, each one renamed into place
    (:func:`~semiseg_platform.storage.atomic_write`: a link at its name is replaced, not followed); returns the count."""
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
            emit(f"{path} -> {prediction.name}, {grey.name}, {blended.name} "
                       f"(mean uncertainty {entropy.mean().item():.3f} nats)")
    return count
