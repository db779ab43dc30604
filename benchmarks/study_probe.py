"""Why shape is not learnt on the study dataset: a probe, not a test (results: ``docs/history/learning.md``).

Trains the mini-study's model (``resnet_small`` + the narrow DeepLabv3+ ``u2pl`` decoder,
baseline head) with plain cross-entropy on the study data and prints one JSON line: mIoU,
pixel accuracy and per-class IoU on the **tune** split (settings are chosen there, never on
val). Each flag changes one suspect: output stride, image size, object size, objects per
image, learning rate, batch and crop, the U2PL scale augmentation, labeled images, and the
family (``shapeonly``: 4 shapes x 1 texture; ``textonly``: disc x 2 textures).

Usage (one line per run; ~30-110 s each at 300 steps, 1 thread)::

    nice -n 10 .venv/bin/python benchmarks/study_probe.py --steps 300               # whole 64 px images, batch 8
    nice -n 10 .venv/bin/python benchmarks/study_probe.py --bs 4 --crop 48 --aug rescale_balanced   # mini.yaml-like
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F

from npsemiseg.constants import IGNORE_INDEX
from npsemiseg.data.study import FAMILIES, Family, StudyConfig, generate, labeled_indices
from npsemiseg.data.transforms import train_transform
from npsemiseg.evaluation.metrics import ConfusionMatrix
from npsemiseg.models import build_segmentor, upsample_logits
from npsemiseg.training.plan import poly_lr

PROBE_FAMILIES = {"shapeonly": Family(("disc", "ring", "triangle", "cross"), ("stripes",)),
                  "textonly": Family(("disc",), ("stripes", "dots"))}


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=int, default=64, help="image size (px)")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--bs", type=int, default=8, help="labeled batch")
    p.add_argument("--os", type=int, default=8, help="output stride (8 or 16)")
    p.add_argument("--labeled", type=int, default=1024, help="labeled images (64 = the 1/16 partition)")
    p.add_argument("--weights", default=None, help="backbone weights file (a pretraining)")
    p.add_argument("--crop", type=int, default=0, help="random crop (0: whole images)")
    p.add_argument("--aug", default="", help="train_transform resize mode (rescale_balanced = U2PL's), needs --crop")
    p.add_argument("--family", default="study", help="study, shapeonly or textonly")
    p.add_argument("--radius", default="0.14,0.28", help="object_radius range")
    p.add_argument("--objs", default="1,4", help="objects_per_image range")
    p.add_argument("--tune", type=int, default=100, help="tune images evaluated")
    p.add_argument("--seed", type=int, default=0, help="data seed")
    return p.parse_args()


def main() -> None:
    a = parse()
    torch.set_num_threads(1)
    FAMILIES.update(PROBE_FAMILIES)
    cfg = StudyConfig(seed=a.seed, image_size=a.size, family=a.family,
                      object_radius=tuple(float(v) for v in a.radius.split(",")),
                      objects_per_image=tuple(int(v) for v in a.objs.split(",")))
    num_classes = len(cfg.family_spec.class_names)
    labeled, _ = labeled_indices(cfg, a.labeled)
    cache: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    transform = train_transform(a.crop, resize=a.aug) if a.aug else None
    torch.manual_seed(0)
    model = build_segmentor(num_classes=num_classes, head="baseline", variant="u2pl", backbone="resnet_small",
                            weights=a.weights, output_stride=a.os, aspp_channels=16, low_level_channels=8,
                            representation_head=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9, weight_decay=1e-4)
    g, start = torch.Generator().manual_seed(0), time.time()
    model.train()
    for step in range(a.steps):
        for group in optimizer.param_groups:
            group["lr"] = poly_lr(a.lr, step, a.steps, 0.9)
        items = []
        for i in torch.randint(len(labeled), (a.bs,), generator=g).tolist():
            if labeled[i] not in cache:
                cache[labeled[i]] = generate(cfg, "train", labeled[i])
            items.append({"image": cache[labeled[i]][0], "label": cache[labeled[i]][1], "id": str(i)})
        if transform is not None:
            items = [transform(item) for item in items]
        images, labels = torch.stack([t["image"] for t in items]), torch.stack([t["label"] for t in items])
        if a.crop and transform is None:
            y, x = torch.randint(a.size - a.crop + 1, (2,), generator=g).tolist()
            images, labels = images[..., y:y + a.crop, x:x + a.crop], labels[..., y:y + a.crop, x:x + a.crop]
        logits = upsample_logits(model(images).head.logits, labels.shape[-2:])[0]
        loss = F.cross_entropy(logits, labels, ignore_index=IGNORE_INDEX)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    confusion = ConfusionMatrix(num_classes)
    with torch.no_grad():
        for first in range(0, a.tune, 25):
            pairs = [generate(cfg, "tune", i) for i in range(first, min(a.tune, first + 25))]
            images, labels = torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])
            confusion.update(upsample_logits(model(images).head.logits, labels.shape[-2:])[0].argmax(1), labels)
    result = confusion.compute()
    print(json.dumps({**vars(a), "loss": round(loss.item(), 3), "miou": round(float(result["miou"]), 4),
                      "pixel_acc": round(result["pixel_acc"], 4),
                      "per_class": [round(float(v), 3) for v in result["per_class_iou"]],
                      "seconds": round(time.time() - start)}), flush=True)


if __name__ == "__main__":
    main()
