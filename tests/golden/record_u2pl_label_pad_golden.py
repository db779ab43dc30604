"""Record what U2PL's released training crop does to images smaller than the crop:
``tests/golden/u2pl_label_pad_released.npz``.

Usage (from the repository root; CHECKOUT is a checkout of U2PL, https://github.com/Haochen-Wang409/U2PL)::

    PYTHONPATH=$PWD python tests/golden/record_u2pl_label_pad_golden.py CHECKOUT [--commit SHA] [--out tests/golden]

``ToTensor``, ``Normalize`` and ``Crop`` are imported from ``u2pl/dataset/augmentation.py`` of CHECKOUT at run time
(nothing of them is kept here) and run in the order of ``u2pl/dataset/pascal_voc.py`` ``build_transfrom`` (resize,
flip and rotation off) on the fixed images and labels below, with the VOC configs' mean, std, ``ignore_label: 255``
and ``crop_type: rand``. The module imports cv2 at its top, which none of the three calls: an empty stand-in module
that fails on any use is put in its place (cv2 is not installed here). Each image is at most the crop size on both
sides, so the random offset can only be 0 and what is recorded is the padding alone: ``Crop`` pads evenly, the
normalised image with 0 and the label with 0 although it is given 255 (augmentation.py 243).
"""

from __future__ import annotations

import hashlib
import importlib.util
import random
import sys
import types
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script: its shared helpers
from recording import official_commit, recorder_arguments, save_golden  # noqa: E402


OFFICIAL_FILE = "u2pl/dataset/augmentation.py"
#: the crop size and the (H, W) of each image: both sides short, the height short, the width short, neither
CROP = 12
SIZES = ((7, 10), (5, 12), (12, 9), (12, 12))
SEED = 20269
#: the U2PL VOC configs' normalisation (experiments/pascal/*/ours/config.yaml)
MEAN, STD = [123.675, 116.28, 103.53], [58.395, 57.12, 57.375]


def inputs(i: int) -> tuple[np.ndarray, np.ndarray]:
    """Image ``i`` (uint8 H x W x 3) and its label (uint8 H x W, classes 1..4 and some 255)."""
    h, w = SIZES[i]
    index = np.arange(h * w * 3).reshape(h, w, 3)
    image = ((index * 37 + 11 * i) % 256).astype(np.uint8)
    label = (1 + (np.arange(h * w).reshape(h, w) * 7 + i) % 4).astype(np.uint8)
    label[0, :2] = 255
    return image, label


class _NoCv2(types.ModuleType):
    def __getattr__(self, name: str):
        raise RuntimeError(f"cv2.{name} used: the recorded functions must not need cv2")


def official_module(checkout: Path):
    saved = sys.modules.get("cv2")
    sys.modules["cv2"] = _NoCv2("cv2")
    try:
        spec = importlib.util.spec_from_file_location("u2pl_augmentation", checkout / OFFICIAL_FILE)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        if saved is None:
            del sys.modules["cv2"]
        else:
            sys.modules["cv2"] = saved
    return module


def record(checkout: Path) -> dict[str, np.ndarray]:
    aug = official_module(checkout)
    transform = aug.Compose([aug.ToTensor(), aug.Normalize(mean=MEAN, std=STD),
                             aug.Crop(CROP, crop_type="rand", ignore_label=255)])
    random.seed(SEED)
    out: dict[str, np.ndarray] = {}
    for i in range(len(SIZES)):
        image, label = inputs(i)
        with torch.no_grad():
            img, lbl = transform(image, label)
        out[f"image{i}"], out[f"label{i}"] = image, label
        out[f"cropped_image{i}"] = img[0].numpy()
        out[f"cropped_label{i}"] = lbl[0, 0].numpy().astype(np.uint8)
    return out



def main(argv: list[str] | None = None) -> None:
    args = recorder_arguments(__doc__, "a checkout of U2PL", argv)
    arrays = record(args.checkout)
    sidecar = {
        "about": "U2PL's released training crop of images smaller than the crop (tests/test_u2pl_label_pad_golden.py).",
        "repository": "https://github.com/Haochen-Wang409/U2PL",
        "commit": args.commit or official_commit(args.checkout),
        "official_file_sha256": hashlib.sha256((args.checkout / OFFICIAL_FILE).read_bytes()).hexdigest(),
        "sources": {
            "crop": f"{OFFICIAL_FILE} 214-266 (Crop: ignore_label set to 0 at 243, even padding 249-256)",
            "to_tensor_normalize": f"{OFFICIAL_FILE} 50-111 (ToTensor, Normalize)",
            "order": "u2pl/dataset/pascal_voc.py 48-71 (build_transfrom: ToTensor, Normalize, ..., Crop)",
        },
        "command": "PYTHONPATH=$PWD python tests/golden/record_u2pl_label_pad_golden.py CHECKOUT"
                   + (f" --commit {args.commit}" if args.commit else ""),
        "checkout": f"CHECKOUT holds {OFFICIAL_FILE} at the commit, e.g. git archive COMMIT {OFFICIAL_FILE} | "
                    "tar -x -C CHECKOUT",
        "sizes": dict(crop=CROP, images=[list(s) for s in SIZES], seed=SEED, mean=MEAN, std=STD),
        "torch": torch.__version__,
        "keys": sorted(arrays),
    }
    save_golden(args.out, "u2pl_label_pad_released", arrays, sidecar)


if __name__ == "__main__":
    main()
