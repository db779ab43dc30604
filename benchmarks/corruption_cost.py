"""What the evaluation under shift costs, per corruption: building a cached corrupted copy (seconds per image) and
evaluating one copy (seconds per copy), against the clean evaluation (results: ``docs/performance.md``, "The
evaluation under shift").

Builds the copies of a cell's evaluated images at one severity into a fresh temporary cache and evaluates the
cell's model (trained two steps, which fill the NP head's memories: the cost does not depend on the weights) on
each copy with ``evaluate_model``, as a
run's evaluation under shift does. The cell is the mini-study's (``jobs/specs/mini.yaml``'s data and model) with
the head given. Prints a Markdown table and one JSON line per corruption. ``--build-only H W``: only the time
to corrupt one H x W image per corruption (a Cityscapes image: 1024 2048), no model. Usage::

    python3 benchmarks/corruption_cost.py [--head np] [--images 50] [--severity 3] [--corruptions fog ...]
    python3 benchmarks/corruption_cost.py --build-only 1024 2048
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from npsemiseg.config import cell_config
from npsemiseg.constants import CORRUPTIONS
from npsemiseg.evaluation.corruptions import CorruptedCopy, build_copy, copy_dir, corrupt_image, source_key
from npsemiseg.training.artifacts import evaluate_model
from npsemiseg.training import train
from npsemiseg.training.factories import build_datasets

MINI_STUDY_CELL = {
    "model.backbone": "resnet_small", "model.weights": None, "head.options.hidden_channels": 64,
    "model.options": {"aspp_channels": 16, "low_level_channels": 8, "representation_dim": 16},
    "schedule.max_steps": 2, "schedule.batch_size": 8, "schedule.crop_size": 64, "data.num_workers": 0,
    "data.augmentation.resize": "none", "evaluation.corruptions": [], "evaluation.mode": "whole",
    "evaluation.pavpu_window": 8, "evaluation.figures": False,
    "data.options": {"seed": 0, "family": "study_textures"}, "runtime.device": "cpu", "runtime.amp": False,
}


def measure(corruption: str, val: torch.utils.data.Dataset, model: torch.nn.Module, config, *, severity: int,
            images: int, cache: Path) -> dict[str, float]:
    """Seconds to build ``corruption``'s copy of the first ``images`` images, per image, and to evaluate it."""
    directory = copy_dir(cache, source_key(config.dataset, "val", dict(config.data.options), images), corruption,
                         severity, 0)
    start = time.perf_counter()
    build_copy(val, directory, corruption, severity, data_seed=0, num_images=images)
    built = time.perf_counter() - start
    start = time.perf_counter()
    metrics = evaluate_model(model, CorruptedCopy(val, directory, images), config, step=0, device=torch.device("cpu"))
    evaluated = time.perf_counter() - start
    return {"build_s_per_image": built / images, "evaluate_s_per_copy": evaluated, "miou": metrics["miou"]}


def build_seconds(corruption: str, height: int, width: int, *, severity: int) -> float:
    """Seconds to corrupt one ``height`` x ``width`` image of gradients and edges (the same image every call)."""
    rows, columns = np.mgrid[0:height, 0:width]
    image = np.stack([columns % 256, rows % 256, ((rows // 13 + columns // 13) % 2) * 200 + 28], -1).astype(np.uint8)
    start = time.perf_counter()
    corrupt_image(image, corruption, severity, seed=0)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--head", default="np")
    parser.add_argument("--images", type=int, default=50)
    parser.add_argument("--severity", type=int, default=3)
    parser.add_argument("--corruptions", nargs="*", default=list(CORRUPTIONS))
    parser.add_argument("--build-only", nargs=2, type=int, metavar=("HEIGHT", "WIDTH"))
    args = parser.parse_args()
    if args.build_only:
        height, width = args.build_only
        print(f"| corruption | build (s / {height} x {width} image) |\n| --- | --- |")
        for corruption in args.corruptions:
            seconds = build_seconds(corruption, height, width, severity=args.severity)
            print(f"| {corruption} | {seconds:.2f} |", flush=True)
        return
    torch.manual_seed(0)
    config = cell_config("paper", framework="supervised", dataset="study", partition="1/16", head=args.head,
                         **MINI_STUDY_CELL, **{"evaluation.max_images": args.images})
    val = build_datasets(config)["val"]
    model = train(config).framework.eval_model()
    evaluate_model(model, val, config, step=0, device=torch.device("cpu"))  # warm-up: the first pass pays for it
    start = time.perf_counter()
    evaluate_model(model, val, config, step=0, device=torch.device("cpu"))
    clean = time.perf_counter() - start
    print(f"clean evaluation of {args.images} images ({args.head} head, T = {config.evaluation.num_samples}): "
          f"{clean:.2f} s")
    print("| corruption | build (ms / image) | evaluate (s / copy) | x clean |\n| --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory(prefix="corruption-cost-") as cache:
        for corruption in args.corruptions:
            row = measure(corruption, val, model, config, severity=args.severity, images=args.images,
                          cache=Path(cache))
            print(f"| {corruption} | {1000 * row['build_s_per_image']:.1f} | {row['evaluate_s_per_copy']:.2f} | "
                  f"{row['evaluate_s_per_copy'] / clean:.2f} |")
            print(json.dumps({"corruption": corruption, "severity": args.severity, "images": args.images,
                              "clean_s": clean, **row}), flush=True)


if __name__ == "__main__":
    main()
