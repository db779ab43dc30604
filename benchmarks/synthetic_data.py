"""Synthetic dataset: generation and augmentation speed, and how hard the task is.

speed: milliseconds per item to generate a synthetic image + label (median of repeated
passes over the same indices), and per item for the weak / weak+strong training transforms.

difficulty: is the synthetic task learnable but not trivial, with something for SSL to gain?
On ``synthetic_blender`` (21 classes) it reports val mIoU of
  (a) a per-pixel colour classifier (nearest class-mean RGB, fitted on every train label):
      what colour alone achieves;
  (b) a small fully convolutional net trained supervised on the 1/16 partition, and
  (c) the same net, same steps, on the 1/2 partition (8x the labels).
A clear (c) - (b) gap means labels are the bottleneck, which is what unlabeled data can fill.

Prints one JSON line per measurement. Usage::

    .venv/bin/python benchmarks/synthetic_data.py                  # both, 1 thread
    .venv/bin/python benchmarks/synthetic_data.py --what speed
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader

from npsemiseg.data import build_dataset, dataset_info
from npsemiseg.data.synthetic import SyntheticConfig, build_world, generate
from npsemiseg.data.transforms import train_transform
from npsemiseg.evaluation.metrics import miou


def emit(**record) -> None:
    print(json.dumps(record), flush=True)


def time_per_item(fn, n: int, repeats: int = 5) -> dict[str, float]:
    """Median over ``repeats`` passes of the mean milliseconds of ``fn(i)`` for i < n: wall time and
    this process's CPU time (the CPU time is what a busy shared machine does not inflate)."""
    wall, cpu = [], []
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        for i in range(n):
            fn(i)
        wall.append((time.perf_counter() - start) / n * 1e3)
        cpu.append((time.process_time() - start_cpu) / n * 1e3)
    return {"ms_per_item": round(statistics.median(wall), 3), "cpu_ms_per_item": round(statistics.median(cpu), 3)}


def speed() -> None:
    for name in ("synthetic", "synthetic_voc", "synthetic_cityscapes"):
        for size in (32, 64, 128):
            config = SyntheticConfig.for_dataset(name, image_size=size)
            build_world(config)
            emit(bench="synthetic_generate", dataset=name, image_size=size,
                 **time_per_item(lambda i, config=config: generate(config, "train", i), 100))
    config = SyntheticConfig.for_dataset("synthetic_voc", image_size=64)
    items = [dict(zip(("image", "label"), generate(config, "train", i)[:2]), id=str(i)) for i in range(50)]
    for strong in (None, "augseg", "psmt"):
        transform = train_transform(48, strong=strong)
        emit(bench="train_transform", image_size=64, crop=48, strong=strong,
             **time_per_item(lambda i, transform=transform: transform(items[i]), len(items)))


class TinyFCN(nn.Module):
    """Four 3x3 conv blocks (one strided, two dilated) and a 1x1 classifier; logits at input size."""

    def __init__(self, num_classes: int, width: int = 48) -> None:
        super().__init__()

        def block(cin: int, cout: int, stride: int = 1, dilation: int = 1) -> nn.Sequential:
            return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, dilation, dilation, bias=False),
                                 nn.BatchNorm2d(cout), nn.ReLU(inplace=True))

        self.body = nn.Sequential(block(3, width), block(width, width, stride=2), block(width, width, dilation=2),
                                  block(width, width, dilation=4))
        self.classifier = nn.Conv2d(width, num_classes, 1)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return F.interpolate(self.classifier(self.body(images)), size=images.shape[-2:], mode="bilinear",
                             align_corners=False)


def evaluate_predictions(predict, val, num_classes: int) -> float:
    preds, targets = [], []
    for batch in DataLoader(val, batch_size=32):
        preds.append(predict(batch["image"]))
        targets.append(batch["label"])
    return miou(torch.cat(preds), torch.cat(targets), num_classes)[0]


def colour_baseline(name: str, options: dict, num_classes: int) -> float:
    train = build_dataset(name, "labeled", partition="5291", **options)
    unl = build_dataset(name, "unlabeled", partition="5291", **options)
    # every train image with its label: the labeled half, and the unlabeled half regenerated labeled
    items = [train[i] for i in range(len(train))] + [
        dict(zip(("image", "label"), generate(train.config, "train", j)[:2])) for j in unl.indices]
    pixels = torch.cat([it["image"].flatten(1) for it in items], 1).T  # [N, 3]
    labels = torch.cat([it["label"].flatten() for it in items])
    keep = labels != 255
    means = torch.stack([pixels[keep & (labels == k)].mean(0) for k in range(num_classes)])

    def predict(images):
        distance = ((images.unsqueeze(1) - means.view(1, num_classes, 3, 1, 1)) ** 2).sum(2)
        return distance.argmin(1)

    return evaluate_predictions(predict, build_dataset(name, "val", **options), num_classes)


def train_supervised(name: str, partition: str, options: dict, num_classes: int, steps: int, seed: int) -> float:
    torch.manual_seed(seed)
    size = options["image_size"]
    labeled = build_dataset(name, "labeled", partition=partition, transform=train_transform(size * 3 // 4), **options)
    loader = DataLoader(labeled, batch_size=8, shuffle=True, drop_last=len(labeled) >= 8,
                        generator=torch.Generator().manual_seed(seed))
    model = TinyFCN(num_classes)
    optimiser = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimiser, lambda s: (1 - s / steps) ** 0.9)
    step = 0
    while step < steps:
        for batch in loader:
            loss = F.cross_entropy(model(batch["image"]), batch["label"], ignore_index=255)
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
            schedule.step()
            step += 1
            if step == steps:
                break
    model.eval()
    with torch.no_grad():
        return evaluate_predictions(lambda images: model(images).argmax(1), build_dataset(name, "val", **options),
                                    num_classes)


def difficulty(steps: int, seed: int, instance_jitter: float) -> None:
    name = "synthetic_blender"
    options = {"image_size": 48, "train_size": 512, "val_size": 128, "instance_jitter": instance_jitter}
    info = dataset_info(name, **options)
    start = time.perf_counter()
    emit(bench="synthetic_difficulty", dataset=name, options=options, model="colour_nearest_mean", labeled="all 512",
         val_miou=round(colour_baseline(name, options, info.num_classes), 4), seconds=round(time.perf_counter() - start, 1))
    for partition in ("662", "5291"):
        start = time.perf_counter()
        score = train_supervised(name, partition, options, info.num_classes, steps, seed)
        emit(bench="synthetic_difficulty", dataset=name, model="tiny_fcn_supervised", partition=partition,
             alias=next(a for a, p in info.partition_aliases.items() if p == partition),
             labeled=info.partitions[partition], steps=steps, val_miou=round(score, 4),
             seconds=round(time.perf_counter() - start, 1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--what", choices=("speed", "difficulty", "all"), default="all")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--instance-jitter", type=float, default=1.0)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    emit(bench="setup", torch=torch.__version__, threads=args.threads, load_average=os.getloadavg()[0],
         cpus=os.cpu_count())
    if args.what in ("speed", "all"):
        speed()
    if args.what in ("difficulty", "all"):
        difficulty(args.steps, args.seed, args.instance_jitter)


if __name__ == "__main__":
    main()
