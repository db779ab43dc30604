"""Corrupted copies of a validation set (the ImageNet-C / Cityscapes-C protocol), seeded and cached on disk.

Which corruptions: ImageNet-C's (Hendrycks & Dietterich, ICLR 2019) that a well-kept library implements, drawn
by albumentations (2.x). The imagecorruptions package (Michaelis et al., 2019), which Cityscapes-C (Kamann &
Rother, CVPR 2020) used, does not run on today's stack: its 1.1.2 (the last release, 2020) calls
``skimage.filters.gaussian(..., multichannel=True)``, an argument scikit-image removed (0.19 deprecated it),
and imports ``pkg_resources`` and ``scipy.ndimage.interpolation``; so no frost (no library ships it). Where
ImageNet-C's corruption and albumentations' transform have the same parameter, the severity table below
holds ImageNet-C's five values (noise std, photons, salt-and-pepper amount, defocus radius, glass blur,
zoom factors, Gaussian sigma, JPEG quality, pixelation scale, brightness shift, contrast factor); motion
blur (a kernel size: 2 x ImageNet-C's sigma + 1), fog and snow (albumentations' own models) have
monotone values of the project's choosing, spanning the transforms' documented ranges.

Where: on the image as it is evaluated, before normalisation, as Cityscapes-C corrupts the validation images
themselves (the full-resolution PNGs) and evaluates them as usual: the items of a validation split are
``[3, H, W]`` floats in [0, 1] with no resize (``npsemiseg.data.build_dataset``), so the copy corrupts
``round(255 x image)`` (the decoded file itself) as uint8 and the model's own normalisation follows.
Labels are unchanged (taken from the source item).

Seeding: image ``i``'s corruption draws from ``albumentations.Compose(seed=s)`` with ``s`` numpy's
``SeedSequence((data_seed, crc32(corruption), severity, i))``, so an image's copy is the same on every machine,
process and build order. Cache: ``<cache>/<source key>/albumentations-<version>/<corruption>/severity<k>/
seed<data_seed>/`` holds one lossless PNG per image and ``copy.json``; it is built in a temporary sibling folder
and renamed into place whole (``os.replace``), so a folder that exists is complete and an interrupted build
leaves nothing a later one reads.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import zlib
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch import Tensor
from torch.utils.data import Dataset

from npsemiseg.constants import CORRUPTION_SEVERITIES, CORRUPTIONS

CACHE_ENV = "NPSEMISEG_CACHE"
COPY_RECORD = "copy.json"
#: ImageNet-C's motion-blur sigmas (3, 5, 8, 12, 15) as albumentations kernel sizes, 2 x sigma + 1
_MOTION_KERNELS = (7, 11, 17, 25, 31)


def _table() -> dict[str, tuple[str, list[dict[str, Any]]]]:
    """Per corruption, the albumentations transform and its keyword arguments at severities 1-5."""
    import cv2

    def fixed(name: str, values: list[float]) -> list[dict[str, Any]]:
        return [{name: (v, v)} for v in values]

    imagenet_c_zoom = [(1.11, 0.01), (1.16, 0.01), (1.21, 0.02), (1.26, 0.02), (1.31, 0.03)]
    return {
        "gaussian_noise": ("GaussNoise", [{"std_range": (c, c), "mean_range": (0.0, 0.0), "per_channel": True}
                                          for c in (0.08, 0.12, 0.18, 0.26, 0.38)]),
        "shot_noise": ("ShotNoise", fixed("scale_range", [1 / 60, 1 / 25, 1 / 12, 1 / 5, 1 / 3])),
        "impulse_noise": ("SaltAndPepper", [{"amount": (c, c), "salt_vs_pepper": (0.5, 0.5)}
                                            for c in (0.03, 0.06, 0.09, 0.17, 0.27)]),
        "defocus_blur": ("Defocus", [{"radius": (r, r), "alias_blur": (a, a)}
                                     for r, a in ((3, 0.1), (4, 0.5), (6, 0.5), (8, 0.5), (10, 0.5))]),
        "glass_blur": ("GlassBlur", [{"sigma": s, "max_delta": d, "iterations": n}
                                     for s, d, n in ((0.7, 1, 2), (0.9, 2, 1), (1, 2, 3), (1.1, 3, 2), (1.5, 4, 2))]),
        "motion_blur": ("MotionBlur", [{"blur_limit": (k, k)} for k in _MOTION_KERNELS]),
        "zoom_blur": ("ZoomBlur", [{"max_factor": (m, m), "step_factor": (s, s)} for m, s in imagenet_c_zoom]),
        "gaussian_blur": ("GaussianBlur", [{"sigma_limit": (c, c), "blur_limit": 0} for c in (1, 2, 3, 4, 6)]),
        "snow": ("RandomSnow", [{"snow_point_range": (c, c), "brightness_coeff": 2.5, "method": "texture"}
                                for c in (0.2, 0.3, 0.4, 0.5, 0.6)]),
        "fog": ("RandomFog", [{"fog_coef_range": (c, c), "alpha_coef": 0.08} for c in (0.2, 0.35, 0.5, 0.65, 0.8)]),
        "brightness": ("RandomBrightnessContrast", [{"brightness_limit": (c, c), "contrast_limit": (0.0, 0.0)}
                                                    for c in (0.2, 0.3, 0.4, 0.5, 0.6)]),
        "contrast": ("RandomBrightnessContrast", [{"brightness_limit": (0.0, 0.0), "contrast_limit": (c - 1, c - 1)}
                                                  for c in (0.4, 0.3, 0.2, 0.1, 0.05)]),
        "jpeg_compression": ("ImageCompression", [{"compression_type": "jpeg", "quality_range": (q, q)}
                                                  for q in (25, 18, 15, 10, 7)]),
        "pixelate": ("Downscale", [{"scale_range": (c, c), "interpolation_pair": {
            "downscale": cv2.INTER_AREA, "upscale": cv2.INTER_NEAREST}} for c in (0.6, 0.5, 0.4, 0.3, 0.25)]),
    }


@cache
def corruption_table() -> dict[str, tuple[str, list[dict[str, Any]]]]:
    """:func:`_table`, built once (it imports OpenCV)."""
    return _table()


def check_corruption(corruption: str, severity: int) -> None:
    """``ValueError`` naming ``corruption`` / ``severity`` and the allowed values when either is unknown."""
    if corruption not in CORRUPTIONS:
        raise ValueError(f"corruption: unknown {corruption!r}, expected one of {', '.join(CORRUPTIONS)}")
    if severity not in CORRUPTION_SEVERITIES:
        raise ValueError(f"corruption severity: expected one of {CORRUPTION_SEVERITIES}, got {severity!r}")


def image_seed(data_seed: int, corruption: str, severity: int, index: int) -> int:
    """The seed of image ``index``'s corruption (32 bits: what albumentations takes)."""
    keys = (data_seed, zlib.crc32(corruption.encode()), severity, index)
    return int(np.random.SeedSequence(keys).generate_state(1)[0])


def corrupt_image(image: np.ndarray, corruption: str, severity: int, *, seed: int) -> np.ndarray:
    """``image`` (uint8 ``[H, W, 3]``) under ``corruption`` at ``severity`` (1-5), drawn from ``seed``."""
    import albumentations

    check_corruption(corruption, severity)
    if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
        raise ValueError(f"image: expected uint8 [H, W, 3], got {image.dtype} {tuple(image.shape)}")
    name, severities = corruption_table()[corruption]
    transform = getattr(albumentations, name)(p=1.0, **severities[severity - 1])
    out = albumentations.Compose([transform], seed=seed, strict=True)(image=image)["image"]
    return np.ascontiguousarray(out, dtype=np.uint8)


def as_uint8(image: Tensor) -> np.ndarray:
    """A ``[3, H, W]`` float image in [0, 1] as uint8 ``[H, W, 3]`` (the decoded file's values)."""
    return (image.detach().cpu().float().clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).numpy()


def default_cache_dir() -> Path:
    """``$NPSEMISEG_CACHE/corruptions`` (else ``~/.cache/npsemiseg/corruptions``)."""
    base = os.environ.get(CACHE_ENV)
    return (Path(base) if base else Path.home() / ".cache" / "npsemiseg") / "corruptions"


def copy_dir(cache_dir: Path, source_key: str, corruption: str, severity: int, data_seed: int) -> Path:
    """Where the copy of ``source_key`` (a name of the source images: :func:`source_key`) lives."""
    import albumentations

    return (Path(cache_dir) / source_key / f"albumentations-{albumentations.__version__}" / corruption
            / f"severity{severity}" / f"seed{data_seed}")


def source_key(dataset: str, split: str, options: dict[str, Any], num_images: int) -> str:
    """A folder name for a split's first ``num_images`` images: the dataset, split and a hash of its options."""
    digest = zlib.crc32(json.dumps(options, sort_keys=True, default=str).encode())
    return f"{dataset}-{split}-{num_images}-{digest:08x}"


def build_copy(source: Dataset, directory: Path, corruption: str, severity: int, *, data_seed: int,
               num_images: int) -> Path:
    """The corrupted copy of ``source``'s first ``num_images`` images in ``directory`` (built when absent;
    a complete folder is reused as it is). Returns ``directory``."""
    check_corruption(corruption, severity)
    if (directory / COPY_RECORD).is_file():
        return directory
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}.building-", dir=directory.parent))
    try:
        for index in range(num_images):
            write_corrupted(source, staging, index, corruption, severity, data_seed=data_seed)
        record = {"corruption": corruption, "severity": severity, "data_seed": data_seed, "num_images": num_images}
        (staging / COPY_RECORD).write_text(json.dumps(record, indent=1))
        try:
            os.replace(staging, directory)
        except OSError:  # another process renamed its complete copy into place first: keep that one
            if not (directory / COPY_RECORD).is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return directory


def image_file(directory: Path, index: int) -> Path:
    """The PNG of image ``index`` in a copy."""
    return directory / f"{index:06d}.png"


def write_corrupted(source: Dataset, directory: Path, index: int, corruption: str, severity: int, *,
                    data_seed: int) -> Path:
    """Corrupt image ``index`` of ``source`` into ``directory`` (independent of every other image)."""
    image = as_uint8(source[index]["image"])
    seed = image_seed(data_seed, corruption, severity, index)
    path = image_file(directory, index)
    Image.fromarray(corrupt_image(image, corruption, severity, seed=seed)).save(path, compress_level=1)
    return path


class CorruptedCopy(Dataset):
    """The items of ``source`` (first ``num_images``) with the image read from a built copy (:func:`build_copy`)
    and everything else (the label, the id) from ``source``."""

    def __init__(self, source: Dataset, directory: Path, num_images: int) -> None:
        self.source, self.directory, self.num_images = source, Path(directory), num_images

    def __len__(self) -> int:
        return self.num_images

    def __getitem__(self, index: int) -> dict[str, Any]:
        if not 0 <= index < self.num_images:
            raise IndexError(f"CorruptedCopy: index {index} out of range [0, {self.num_images})")
        item = dict(self.source[index])
        pixels = np.asarray(Image.open(image_file(self.directory, index)).convert("RGB"))
        item["image"] = torch.from_numpy(pixels.copy()).permute(2, 0, 1).float().div_(255)
        return item


def corrupted_copy(source: Dataset, corruption: str, severity: int, *, data_seed: int, key: str,
                   cache_dir: Path | None = None, max_images: int | None = None) -> CorruptedCopy:
    """The cached corrupted copy of ``source`` (built on first use) as a dataset. ``key`` names the source images
    (:func:`source_key`); ``max_images``: only the first images."""
    num_images = len(source) if max_images is None else min(len(source), max_images)  # type: ignore[arg-type]
    directory = copy_dir(cache_dir or default_cache_dir(), key, corruption, severity, data_seed)
    build_copy(source, directory, corruption, severity, data_seed=data_seed, num_images=num_images)
    return CorruptedCopy(source, directory, num_images)


#: the prefix of the evaluation under shift's metrics: ``shift/<corruption>/<severity>/<metric>``, per corruption
#: ``shift/<corruption>/mean/<metric>`` and over every corruption and severity ``shift/mean/<metric>``
SHIFT_PREFIX = "shift"


def shift_metric(corruption: str, severity: int | str, metric: str) -> str:
    """A metric's name under shift (names sort by corruption, then severity, ``mean`` after the severities)."""
    return f"{SHIFT_PREFIX}/{corruption}/{severity}/{metric}"


def summarize_shift(per_copy: dict[tuple[str, int], dict[str, float]]) -> dict[str, float]:
    """Every copy's metrics (``{(corruption, severity): metrics}``, per-class IoUs left out) under
    :func:`shift_metric` names, their mean over the severities per corruption and the ImageNet-C / Cityscapes-C
    summary, the mean over every corruption and severity (``shift/mean/<metric>``); ``shift/mean/error`` is
    1 - that mean mIoU (what an mCE normalises: ``semiseg_platform.reports.shift``)."""
    out: dict[str, float] = {}
    by_corruption: dict[str, list[dict[str, float]]] = {}
    for (corruption, severity), metrics in per_copy.items():
        kept = {k: v for k, v in metrics.items() if not k.startswith("iou/") and k != "num_images"}
        out.update({shift_metric(corruption, severity, k): v for k, v in kept.items()})
        by_corruption.setdefault(corruption, []).append(kept)
    every = [m for copies in by_corruption.values() for m in copies]
    for corruption, copies in by_corruption.items():
        out.update({shift_metric(corruption, "mean", k): v for k, v in _means(copies).items()})
    if every:
        means = _means(every)
        out.update({f"{SHIFT_PREFIX}/mean/{k}": v for k, v in means.items()})
        out[f"{SHIFT_PREFIX}/mean/error"] = 1.0 - means["miou"]
    return out


def _means(rows: list[dict[str, float]]) -> dict[str, float]:
    """The mean of each metric every row has (NaN where any row's is NaN)."""
    keys = set(rows[0]).intersection(*rows[1:])
    return {k: float(np.mean([row[k] for row in rows])) for k in sorted(keys)}
