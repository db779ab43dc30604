"""Learning check of the SSL frameworks on synthetic data: not a test (results: ``docs/history/learning.md``).

On the generic ``synthetic`` dataset (8 classes) with 1/16 of the training images labeled,
trains ``supervised`` and each SSL framework (``mt``, ``psmt``, ``u2pl``, ``augseg``) with each
head (``baseline``, ``mc_dropout``, ``np``) for the same number of steps on the ``smoke``
model (small ResNet, narrow DeepLabv3+), then evaluates the framework's evaluation model
(the teacher) on the validation images. One JSON line per cell: mIoU, PAvPU, ECE, seconds.

Targets: every SSL framework beats ``supervised`` in mIoU (per head); NP's PAvPU >=
MC dropout's for U2PL.

Protocol, scaled down from the paper's (each change keeps the paper's proportions where it can):
- 512 training images of 32 x 32 (32 labeled), 64 validation images, whole-image evaluation
  with T = 5 predictions, PAvPU on 8 x 8 patches (64 x 64 on 500-px images in the paper).
- 4 labeled + 4 unlabeled images per step, ``--steps`` steps (default 240); epochs are counted
  over the labeled list (8 steps) so epoch-based schedules (U2PL's supervised-only epoch and
  percentiles, AugSeg's epoch-0 decay, PS-MT's alternating teachers) have room to act.
- EMA decays shortened with the run (horizon 1/(1 - d) ~ 5-15% of training as in the paper's
  thousands of iterations): AugSeg 0.999 -> 0.99, PS-MT 0.996 -> 0.99; MT and U2PL keep 0.99.
  PS-MT's ramp-up spans 12/80 of the run as in the paper. U2PL's queues and query counts are
  shrunk (2000 / 3000 keys, 64 anchors x 16 negatives) for the small batch.
- Everything else is the paper preset's framework options and the smoke preset's head options
  (NP: Q = 64, lambda_kl = 0.005).

Usage::

    .venv/bin/python benchmarks/ssl_synthetic.py                      # all 15 cells
    .venv/bin/python benchmarks/ssl_synthetic.py --frameworks supervised,u2pl --heads mc_dropout,np
"""

from __future__ import annotations

import argparse
import json
import math
import time
from typing import Any

import torch

FRAMEWORKS = ("supervised", "mt", "psmt", "u2pl", "augseg")
HEADS = ("baseline", "mc_dropout", "np")


def cell_overrides(framework: str, *, steps: int, image_size: int, labeled_epoch_steps: int) -> dict[str, Any]:
    """Configuration overrides of one benchmark cell on top of the smoke preset."""
    total_epochs = math.ceil(steps / labeled_epoch_steps)
    overrides: dict[str, Any] = {
        "data.options": {"train_size": 512, "val_size": 64, "image_size": image_size},
        "schedule.max_steps": steps,
        "schedule.batch_size": 4,
        "schedule.unlabeled_batch_size": 4,
        "schedule.crop_size": image_size,
        "schedule.epoch_length": "labeled",
        "evaluation.max_images": 64,
        "evaluation.num_samples": 5,
        "runtime.device": "cpu",
        "runtime.progress": "off",
    }
    options: dict[str, Any] = {}
    if framework == "augseg":
        options = {"ema_decay": 0.99}
    elif framework == "psmt":
        options = {"ema_keep_rate": 0.99, "rampup_epochs": 12 / 80 * total_epochs}
    elif framework == "u2pl":
        options = {"num_queries": 64, "num_negatives": 16, "queue_size": 2000, "background_queue_size": 3000}
    if options:
        overrides["framework_options"] = options
    return overrides


def run_cell(framework: str, head: str, *, steps: int, image_size: int, seed: int) -> dict[str, Any]:
    from npsemiseg.config import cell_config
    from npsemiseg.training import train

    labeled_epoch_steps = 512 // 16 // 4  # 32 labeled images, 4 per step
    overrides = cell_overrides(framework, steps=steps, image_size=image_size, labeled_epoch_steps=labeled_epoch_steps)
    config = cell_config("smoke", framework=framework, head=head, dataset="synthetic", partition="1/16",
                                   seed=seed, **overrides)
    started = time.perf_counter()
    result = train(config)
    metrics = result.metrics
    return {
        "bench": "ssl_synthetic", "framework": framework, "head": head, "partition": "1/16", "steps": result.steps,
        "image_size": image_size, "seed": seed, "miou": round(metrics["miou"], 4), "pavpu": round(metrics["pavpu"], 4),
        "ece": round(metrics["ece"], 4), "pixel_acc": round(metrics["pixel_acc"], 4),
        "train_seconds": round(result.train_seconds, 1), "seconds": round(time.perf_counter() - started, 1),
        "cell_id": config.cell_id,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--frameworks", default=",".join(FRAMEWORKS))
    parser.add_argument("--heads", default=",".join(HEADS))
    parser.add_argument("--steps", type=int, default=240)
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    for framework in args.frameworks.split(","):
        if framework not in FRAMEWORKS:
            raise ValueError(f"--frameworks: expected names from {FRAMEWORKS}, got {framework!r}")
        for head in args.heads.split(","):
            if head not in HEADS:
                raise ValueError(f"--heads: expected names from {HEADS}, got {head!r}")
            print(json.dumps(run_cell(framework, head, steps=args.steps, image_size=args.image_size, seed=args.seed)),
                  flush=True)


if __name__ == "__main__":
    main()
