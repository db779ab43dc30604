"""Record what TorchSemiSeg's MeanTeacher training pipeline does to an image and its label at each of its scales:
``tests/golden/mt_cps_rescale_released.npz``.

Usage (from the repository root; CHECKOUT is a checkout of TorchSemiSeg, https://github.com/charlesCXK/TorchSemiSeg)::

    PYTHONPATH=$PWD python tests/golden/record_mt_cps_rescale_golden.py CHECKOUT [--commit SHA] [--out tests/golden]

``TrainPre`` of ``exp.voc/voc8.res50v3+.MeanTeacher/dataloader.py`` and the crop of ``furnace/utils/img_utils.py``
are loaded from CHECKOUT at run time (nothing of them is kept here), with stubs for what they import and do not use
here (``config``: its ``train_scale_array``, read from config.py, and the crop's size; ``datasets.BaseDataset``), on
square uint8 noise images (noise: where resampling differs most) and block labels (the U2PL rescale golden's
``inputs``). Each case answers the pipeline's
``random`` draws: the mirror's (off), ``random.choice`` of the scale (the case's, stored with the result); the crop is
the resized image's size, so it neither moves nor pads. ``img_utils``' ``collections.Iterable`` (gone since Python
3.10) is given ``collections.abc.Iterable`` in that module only.
"""

from __future__ import annotations

import collections.abc
import importlib.util
import re
import sys
import types
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script: its shared helpers
from record_u2pl_resize_golden import inputs  # noqa: E402  (uint8 noise images and block labels)
from recording import official_commit, official_sidecar, recorder_arguments, save_golden  # noqa: E402

BENCHMARKS = str(Path(__file__).resolve().parents[2] / "benchmarks")
if BENCHMARKS not in sys.path:  # the benchmarks' package: the official runs' stand-in modules
    sys.path.append(BENCHMARKS)
from official.mt_cps import in_sys_modules  # noqa: E402

OFFICIAL_DIR = "exp.voc/voc8.res50v3+.MeanTeacher"
OFFICIAL_FILES = [f"{OFFICIAL_DIR}/dataloader.py", f"{OFFICIAL_DIR}/config.py", "furnace/utils/img_utils.py"]
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
#: image sides (the images and labels: ``record_u2pl_resize_golden.inputs``, uint8 noise and blocks of classes 0..4);
#: each case takes the official scale of its index (config.py's six, in turn)
SIDES = (16, 13, 15, 16, 12, 11)


def train_scale_array(checkout: Path) -> list[float]:
    """``C.train_scale_array`` of the official config.py."""
    text = (checkout / OFFICIAL_DIR / "config.py").read_text()
    return [float(v) for v in re.search(r"^C\.train_scale_array\s*=\s*\[([^\]]*)\]", text, re.M).group(1).split(",")]


def load(path: Path, name: str) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def official_train_pre(checkout: Path, scales: list[float]) -> types.ModuleType:
    """The official ``dataloader.py`` module, its imports answered: ``config`` (the scales; the crop set per case),
    ``utils.img_utils`` (the official file), ``datasets.BaseDataset`` (unused here)."""
    stubs = {name: types.ModuleType(name) for name in ("config", "utils", "datasets", "datasets.BaseDataset")}
    stubs["config"].config = types.SimpleNamespace(train_scale_array=scales, image_height=0, image_width=0)
    stubs["datasets.BaseDataset"].BaseDataset = object
    img_utils = load(checkout / "furnace/utils/img_utils.py", "utils.img_utils")
    img_utils.collections = types.SimpleNamespace(Iterable=collections.abc.Iterable)  # gone since Python 3.10
    stubs["utils"].img_utils = img_utils
    with in_sys_modules({**stubs, "utils.img_utils": img_utils}):
        return load(checkout / OFFICIAL_DIR / "dataloader.py", "torchsemiseg_dataloader")


def record(checkout: Path) -> tuple[dict[str, np.ndarray], list[float]]:
    scales = train_scale_array(checkout)
    module = official_train_pre(checkout, scales)
    out: dict[str, np.ndarray] = {}
    for i, side in enumerate(SIDES):
        scale = scales[i % len(scales)]
        module.random = types.SimpleNamespace(random=lambda: 0.0, choice=lambda options, s=scale: s)  # no flip
        resized = int(side * scale)
        module.config.image_height = module.config.image_width = resized  # the crop: the whole resized image
        image, label = inputs(i, side)
        img, lbl, _ = module.TrainPre(np.array(MEAN), np.array(STD))(image, label)
        out.update({f"image{i}": image, f"label{i}": label, f"scale{i}": np.array(scale),
                    f"resized_image{i}": img.astype(np.float32), f"resized_label{i}": lbl.astype(np.uint8)})
    return out, scales


def main(argv: list[str] | None = None) -> None:
    args = recorder_arguments(__doc__, "a checkout of TorchSemiSeg", argv)
    arrays, scales = record(args.checkout)
    sidecar = {
        **official_sidecar("TorchSemiSeg MeanTeacher's training pipeline at each scale "
                           "(tests/test_mt_cps_rescale_golden.py).",
                           "https://github.com/charlesCXK/TorchSemiSeg", args.checkout,
                           args.commit or official_commit(args.checkout), OFFICIAL_FILES),
        "sources": {
            "train_pre": f"{OFFICIAL_DIR}/dataloader.py 11-61 (random_mirror; random_scale: random.choice of "
                         "train_scale_array, cv2.resize INTER_LINEAR image and INTER_NEAREST label at int(s * side); "
                         "normalize; the crop padded with 0 and 255)",
            "scales": f"{OFFICIAL_DIR}/config.py 107 (C.train_scale_array)",
        },
        "command": "PYTHONPATH=$PWD python tests/golden/record_mt_cps_rescale_golden.py CHECKOUT"
                   + (f" --commit {args.commit}" if args.commit else ""),
        "checkout": "CHECKOUT holds the files above at the commit, e.g. git archive COMMIT " + " ".join(OFFICIAL_FILES)
                    + " | tar -x -C CHECKOUT",
        "sizes": dict(sides=list(SIDES), scales=scales, inputs="record_u2pl_resize_golden.inputs", mean=MEAN, std=STD),
        "cv2": __import__("cv2").__version__,
        "keys": sorted(arrays),
    }
    save_golden(args.out, "mt_cps_rescale_released", arrays, sidecar)


if __name__ == "__main__":
    main()
