"""What ``data check`` (and the run preflight) costs: headers only, every file decoded, and decoded again with the
record of an earlier check (results: ``docs/reliability.md``, "Dataset folders").

Writes a folder dataset of random JPEG images and index PNG masks into a temporary folder (its check record
too), writes its lists (``1/8``, val 10 %) and times ``check_dataset`` three ways, one JSON line each.
Usage::

    python3 benchmarks/data_check.py [--images 500] [--masks 400] [--height 375] [--width 500]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml
from PIL import Image

from npsemiseg.data.check import check_dataset
from npsemiseg.data.sets.folder import register_folder, write_partitions


def write_folder(folder: Path, images: int, masks: int, height: int, width: int) -> None:
    """``images`` random RGB JPEGs, the first ``masks`` with a blocky 3-class mask."""
    (folder / "images").mkdir(parents=True)
    (folder / "masks").mkdir()
    (folder / "classes.yaml").write_text(yaml.safe_dump({"names": ["background", "a", "b"]}))
    rng = np.random.default_rng(0)
    for i in range(images):
        pixels = rng.integers(0, 256, size=(height, width, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(folder / "images" / f"i{i:05d}.jpg", quality=90)
        if i < masks:
            coarse = rng.integers(0, 3, size=(-(-height // 16), -(-width // 16)), dtype=np.uint8)
            mask = np.kron(coarse, np.ones((16, 16), dtype=np.uint8))[:height, :width]
            Image.fromarray(mask).save(folder / "masks" / f"i{i:05d}.png")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=500)
    parser.add_argument("--masks", type=int, default=400)
    parser.add_argument("--height", type=int, default=375)
    parser.add_argument("--width", type=int, default=500)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="data-check-") as base:
        os.environ["NPSEMISEG_CACHE"] = str(Path(base) / "cache")
        folder = Path(base) / "bench"
        write_folder(folder, args.images, args.masks, args.height, args.width)
        write_partitions(folder, ["1/8"], seed=0, val="0.1")
        name = register_folder(folder).name
        for what, options in (("headers only (sample=0)", {"sample": 0}), ("every file decoded", {}),
                              ("again with reuse=True (the preflight)", {"reuse": True})):
            start = time.perf_counter()
            report = check_dataset(name, folder, **options)
            print(json.dumps({"check": what, "seconds": round(time.perf_counter() - start, 2), "usable": report.usable,
                              "images_decoded": report.images_decoded, "labels_decoded": report.labels_checked}))


if __name__ == "__main__":
    main()
