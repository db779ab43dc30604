"""Record what UniMatch's released training crop does to images smaller than the crop:
``tests/golden/crop_padding_released.npz``.

Usage (from the repository root; CHECKOUT is a checkout of UniMatch, https://github.com/LiheYoung/UniMatch)::

    PYTHONPATH=$PWD python tests/golden/record_crop_padding_golden.py CHECKOUT [--commit SHA] [--out tests/golden]

``crop`` is imported from ``dataset/transform.py`` of CHECKOUT at run time (nothing of it is kept here) and run on
the fixed PIL images and masks below. Each image is at most the crop size on both sides, so the official crop's
random offset can only be 0 and what is recorded is the padding alone: where the image lands in the crop, the
image's fill (0) and the mask's (255). The same bottom-and-right padding is PS-MT's ``_crop`` (its module imports
cv2) and AugSeg's; ``tests/test_crop_padding_golden.py`` runs our crop on the same inputs.
"""

from __future__ import annotations

import hashlib
import importlib.util
import random
import sys
from pathlib import Path

import numpy as np
import PIL
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script: its shared helpers
from recording import official_commit, recorder_arguments, save_golden  # noqa: E402


OFFICIAL_FILE = "dataset/transform.py"
#: the crop size and the (H, W) of each image: both sides short, the height short, the width short, neither
CROP = 12
SIZES = ((7, 10), (5, 12), (12, 9), (12, 12))
SEED = 20268


def inputs(i: int) -> tuple[np.ndarray, np.ndarray]:
    """Image ``i`` (uint8 H x W x 3, never 0) and its mask (uint8 H x W, classes 1..4, never 255)."""
    h, w = SIZES[i]
    index = np.arange(h * w * 3).reshape(h, w, 3)
    image = (1 + (index * 37 + 11 * i) % 254).astype(np.uint8)
    mask = (1 + (np.arange(h * w).reshape(h, w) * 7 + i) % 4).astype(np.uint8)
    return image, mask


def official_crop(checkout: Path):
    spec = importlib.util.spec_from_file_location("unimatch_transform", checkout / OFFICIAL_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.crop


def record(checkout: Path) -> dict[str, np.ndarray]:
    crop = official_crop(checkout)
    random.seed(SEED)
    out: dict[str, np.ndarray] = {}
    for i in range(len(SIZES)):
        image, mask = inputs(i)
        img, msk = crop(Image.fromarray(image), Image.fromarray(mask), CROP)
        out[f"image{i}"], out[f"mask{i}"] = image, mask
        out[f"cropped_image{i}"], out[f"cropped_mask{i}"] = np.array(img), np.array(msk)
    return out



def main(argv: list[str] | None = None) -> None:
    args = recorder_arguments(__doc__, "a checkout of UniMatch", argv)
    arrays = record(args.checkout)
    sidecar = {
        "about": "UniMatch's released training crop of images smaller than the crop (tests/test_crop_padding_golden.py).",
        "repository": "https://github.com/LiheYoung/UniMatch",
        "commit": args.commit or official_commit(args.checkout),
        "official_file_sha256": hashlib.sha256((args.checkout / OFFICIAL_FILE).read_bytes()).hexdigest(),
        "sources": {
            "crop": f"{OFFICIAL_FILE} 9-23 (crop: ImageOps.expand with border (0, 0, padw, padh), image fill 0, "
                    "mask fill 255, then a random crop)",
        },
        "command": "PYTHONPATH=$PWD python tests/golden/record_crop_padding_golden.py CHECKOUT"
                   + (f" --commit {args.commit}" if args.commit else ""),
        "checkout": f"CHECKOUT holds {OFFICIAL_FILE} at the commit, e.g. git archive COMMIT {OFFICIAL_FILE} | "
                    "tar -x -C CHECKOUT",
        "sizes": dict(crop=CROP, images=[list(s) for s in SIZES], seed=SEED),
        "pillow": PIL.__version__,
        "keys": sorted(arrays),
    }
    save_golden(args.out, "crop_padding_released", arrays, sidecar)


if __name__ == "__main__":
    main()
