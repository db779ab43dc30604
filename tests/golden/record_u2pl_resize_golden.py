"""Record what U2PL's released random rescale does to an image and its label: ``tests/golden/u2pl_resize_released.npz``.

Usage (from the repository root; CHECKOUT is a checkout of U2PL, https://github.com/Haochen-Wang409/U2PL)::

    PYTHONPATH=$PWD python tests/golden/record_u2pl_resize_golden.py CHECKOUT [--commit SHA] [--out tests/golden]

``ToTensor``, ``Normalize`` and ``RandResize`` are imported from ``u2pl/dataset/augmentation.py`` of CHECKOUT at run time
(nothing of them is kept here; the module is loaded as :mod:`record_u2pl_label_pad_golden` loads it) and run in the
order of ``u2pl/dataset/pascal_voc.py`` ``build_transfrom`` (flip, rotation and crop off) with the VOC configs' mean,
std and ``rand_resize: [0.5, 2.0]``, on square noise images (noise: where antialiasing changes most) and block labels.
Each case's scale is chosen by the two ``random.random()`` draws ``RandResize`` makes (the branch, then the position
in it), answered from a list; the scale it then computes is stored with the result. The module's
``collections.Iterable`` (gone since Python 3.10) is given ``collections.abc.Iterable`` in that module only. The
NP-SemiSeg authors' ``U2PL/u2pl/dataset/augmentation.py`` is the same file.
"""

from __future__ import annotations

import collections.abc
import sys
import types
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script: its shared helpers
from record_u2pl_label_pad_golden import MEAN, OFFICIAL_FILE, STD, official_module  # noqa: E402
from recording import official_commit, official_sidecar, recorder_arguments, save_golden  # noqa: E402

#: (side, the two random.random() draws of RandResize): shrinking and growing, sizes floored where rounding differs
CASES = ((13, (0.2, 0.2)), (13, (0.2, 0.9)), (15, (0.3, 0.1)), (16, (0.7, 0.37)), (20, (0.9, 0.9)), (11, (0.6, 0.45)))
SEED = 20271


def inputs(i: int, side: int) -> tuple[np.ndarray, np.ndarray]:
    """Image ``i`` (uint8 noise, side x side x 3) and its label (uint8 blocks of classes 0..4, one corner 255)."""
    gen = np.random.default_rng(SEED + i)
    image = gen.integers(0, 256, (side, side, 3), dtype=np.uint8)
    rows, cols = np.meshgrid(np.arange(side), np.arange(side), indexing="ij")
    label = ((rows // 3 + 2 * (cols // 4) + i) % 5).astype(np.uint8)
    label[:2, :2] = 255
    return image, label


def record(checkout: Path) -> dict[str, np.ndarray]:
    aug = official_module(checkout)
    aug.collections = types.SimpleNamespace(Iterable=collections.abc.Iterable)  # gone from collections in Python 3.10
    transform = aug.Compose([aug.ToTensor(), aug.Normalize(mean=MEAN, std=STD), aug.RandResize([0.5, 2.0])])
    out: dict[str, np.ndarray] = {}
    for i, (side, draws) in enumerate(CASES):
        aug.random = types.SimpleNamespace(random=iter(draws).__next__)  # RandResize's two draws
        image, label = inputs(i, side)
        with torch.no_grad():
            img, lbl = transform(image, label)
        branch, position = draws
        scale = 0.5 + (1.0 - 0.5) * position if branch < 0.5 else 1.0 + (2.0 - 1.0) * position  # augmentation.py 191-194
        out.update({f"image{i}": image, f"label{i}": label, f"scale{i}": np.array(scale),
                    f"resized_image{i}": img[0].numpy(), f"resized_label{i}": lbl[0, 0].numpy().astype(np.uint8)})
    return out


def main(argv: list[str] | None = None) -> None:
    args = recorder_arguments(__doc__, "a checkout of U2PL", argv)
    arrays = record(args.checkout)
    sidecar = {
        **official_sidecar("U2PL's released random rescale (tests/test_u2pl_resize_golden.py).",
                           "https://github.com/Haochen-Wang409/U2PL", args.checkout,
                           args.commit or official_commit(args.checkout), [OFFICIAL_FILE]),
        "sources": {
            "rand_resize": f"{OFFICIAL_FILE} 159-211 (RandResize: the scale 191-194, the size int(s * side) 204-206, "
                           "F.interpolate bilinear align_corners=False 207-209, the label mode='nearest' 210)",
            "order": "u2pl/dataset/pascal_voc.py 48-71 (build_transfrom: ToTensor, Normalize, ..., RandResize, ...)",
        },
        "command": "PYTHONPATH=$PWD python tests/golden/record_u2pl_resize_golden.py CHECKOUT"
                   + (f" --commit {args.commit}" if args.commit else ""),
        "checkout": f"CHECKOUT holds {OFFICIAL_FILE} at the commit, e.g. git archive COMMIT {OFFICIAL_FILE} | "
                    "tar -x -C CHECKOUT",
        "sizes": dict(cases=[[side, list(draws)] for side, draws in CASES], seed=SEED, mean=MEAN, std=STD),
        "torch": torch.__version__,
        "keys": sorted(arrays),
    }
    save_golden(args.out, "u2pl_resize_released", arrays, sidecar)


if __name__ == "__main__":
    main()
