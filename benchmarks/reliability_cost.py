"""What the in-distribution reliability metrics cost a cell's evaluation (target: at most +10 %).

Times, side by side in one run (``time_interleaved``: warm-up, then ``--repeats`` rounds in a rotated order,
medians), for each head:

- ``full``: ``evaluate`` over ``--images`` random images exactly as a cell evaluates;
- ``no_calibration``: the same evaluation with the calibration accumulator switched off (its update and
  compute replaced by no-ops);
- ``predict``: the predictions alone (``predict`` of every image);
- ``calibration``: the calibration accumulator alone (a fresh ``Calibration``, ``update`` with every image's
  predictions, computed beforehand, then ``compute``).

``full / no_calibration`` and ``calibration / predict`` bound what the reliability metrics add: every metric
of ``Calibration`` (ECE with equal-width and equal-mass bins, NLL, Brier, AUROC, AUPR, AURC, the curves) is
counted, including ECE / NLL / Brier / AUROC that the evaluation computed before the equal-mass ECE, AUPR and
AURC were added; the class-balanced PAvPU comes from the PAvPU counts and costs nothing measurable. The
component ratio is the steadier one on a loaded machine (its cases are short and repeat the same work).
Prints one JSON line per case and one per head with the ratios (wall and process-CPU medians)::

    .venv/bin/python benchmarks/reliability_cost.py                       # CPU: mini-study-like model, 128 px
    .venv/bin/python benchmarks/reliability_cost.py --backbone resnet50 --size 321 --images 4   # paper-like
    .venv/bin/python benchmarks/reliability_cost.py --device cuda --backbone resnet101 --size 513
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
from contextlib import nullcontext
from unittest import mock

import torch
from uncertainty_time import fill_np_memories

from npsemiseg.evaluation import Calibration, evaluate, predict, time_interleaved
from npsemiseg.models import build_segmentor

HEADS = ("baseline", "mc_dropout", "np")
TARGET = 1.10


class Images(torch.utils.data.Dataset):
    """``count`` random ``size`` x ``size`` images with random labels of ``num_classes`` classes (seeded)."""

    def __init__(self, count: int, size: int, num_classes: int) -> None:
        gen = torch.Generator().manual_seed(0)
        self.images = torch.rand(count, 3, size, size, generator=gen)
        self.labels = torch.randint(0, num_classes, (count, size, size), generator=gen)

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"image": self.images[index], "label": self.labels[index]}


def without_calibration():
    """A context in which ``Calibration`` accumulates and reports nothing."""
    return mock.patch.multiple(Calibration, update=lambda self, *args: None, compute=lambda self: {})


def build_cases(args: argparse.Namespace, data: Images, device: torch.device) -> dict:
    """The four timed cases of every head (see the module docstring)."""
    images = [image[None].to(device) for image in data.images]
    labels = [label[None].to(device) for label in data.labels]
    cases = {}
    for head in args.heads:
        model = build_segmentor(num_classes=args.num_classes, head=head, backbone=args.backbone).to(device)
        if head == "np":
            fill_np_memories(model, args.num_classes, device)
        model.eval()
        samples = None if head == "baseline" else args.samples
        for case, context in (("full", nullcontext), ("no_calibration", without_calibration)):
            def run(model=model, samples=samples, context=context):
                with context(), torch.no_grad():
                    return evaluate(model, data, num_classes=args.num_classes, num_samples=samples)
            cases[f"{head}/{case}"] = run
        outputs = [predict(model, image, num_samples=samples) for image in images]

        def predict_all(model=model, samples=samples):
            return [predict(model, image, num_samples=samples) for image in images]

        def calibrate_all(outputs=outputs):
            calibration = Calibration(args.num_classes)
            for (probs, entropy), label in zip(outputs, labels):
                calibration.update(probs, label, entropy)
            return calibration.compute()
        cases[f"{head}/predict"], cases[f"{head}/calibration"] = predict_all, calibrate_all
    return cases


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--heads", nargs="+", default=list(HEADS), choices=HEADS)
    parser.add_argument("--backbone", default="resnet_small")
    parser.add_argument("--size", type=int, default=128, help="image side (whole-image evaluation)")
    parser.add_argument("--images", type=int, default=8)
    parser.add_argument("--num-classes", type=int, default=21)
    parser.add_argument("--samples", type=int, default=5, help="T of the stochastic heads")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    device = torch.device(args.device)
    data = Images(args.images, args.size, args.num_classes)
    cases = build_cases(args, data, device)
    timings = time_interleaved(cases, repeats=args.repeats, warmup=1, device=device)
    context = {"date": datetime.date.today().isoformat(), "machine": platform.node(), "cpus": os.cpu_count(),
               "load_1min": os.getloadavg()[0], "threads": args.threads, "device": args.device,
               "backbone": args.backbone, "size": args.size, "images": args.images, "T": args.samples,
               "num_classes": args.num_classes, "repeats": args.repeats, "command": " ".join(sys.argv)}
    print(json.dumps({"context": context}))
    for name, timing in timings.items():
        print(json.dumps({"case": name, "wall_median_s": timing.median, "cpu_median_s": timing.cpu_median}))
    ok = True
    for head in args.heads:
        full, bare = timings[f"{head}/full"], timings[f"{head}/no_calibration"]
        share = 1 + timings[f"{head}/calibration"].cpu_median / timings[f"{head}/predict"].cpu_median
        ok &= share <= TARGET
        print(json.dumps({"head": head, "full_over_no_calibration_wall": round(full.median / bare.median, 4),
                          "full_over_no_calibration_cpu": round(full.cpu_median / bare.cpu_median, 4),
                          "predict_plus_calibration_over_predict_cpu": round(share, 4), "target": TARGET,
                          "met": share <= TARGET}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
