"""What ``AtrousConv2d`` saves: one training step of the mini-study's model, with and without it, side by side.

The mini-study's model (``resnet_small``, ASPP 16 / low-level 8 channels, heads at 64 channels, 5 classes) on a
batch of 64 px images: forward, cross-entropy, backward, SGD step. Each variant (``u2pl`` at output stride 8,
``psmt`` / ``augseg`` at 16) is built once; its dilated convolutions are then timed both as ``AtrousConv2d``
(the centre tap alone where the other taps read only padding) and as plain ``nn.Conv2d`` (the same
parameters), in interleaved repeats so that other load on the machine hits both alike. Prints one JSON line per
variant: median milliseconds per step of each, their ratio, and the largest difference between the two
versions' losses (the same computation: floating-point rounding only).

    .venv/bin/python benchmarks/atrous_step.py --batch 16 --steps 10 --repeats 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

from npsemiseg.models import build_segmentor, upsample_logits
from npsemiseg.models.atrous import AtrousConv2d

K = 5


def set_atrous(model: nn.Module, enabled: bool) -> None:
    """Switch every dilated convolution of ``model`` between ``AtrousConv2d`` and plain ``nn.Conv2d`` (in place)."""
    for module in model.modules():
        if isinstance(module, nn.Conv2d) and module.dilation != (1, 1):
            module.__class__ = AtrousConv2d if enabled else nn.Conv2d


def step_ms(model: nn.Module, optimiser: torch.optim.Optimizer, images: torch.Tensor, labels: torch.Tensor,
            steps: int) -> tuple[float, float]:
    """Milliseconds per step over ``steps`` steps, and the last loss."""
    start = time.perf_counter()
    for _ in range(steps):
        logits = upsample_logits(model(images).head.logits, labels.shape[-2:])[0]
        loss = F.cross_entropy(logits, labels)
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        optimiser.step()
    return (time.perf_counter() - start) / steps * 1000, float(loss)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    for variant in ("u2pl", "psmt", "augseg"):
        torch.manual_seed(0)
        model = build_segmentor(num_classes=K, head="baseline", head_options={"hidden_channels": 64}, variant=variant,
                                backbone="resnet_small", aspp_channels=16, low_level_channels=8)
        images = torch.rand(args.batch, 3, args.size, args.size)
        labels = torch.randint(0, K, (args.batch, args.size, args.size))
        # the same loss from the same weights both ways (rounding only); then the timing on a copy of each state
        start = {k: v.clone() for k, v in model.state_dict().items()}
        losses = {}
        for enabled in (True, False):
            model.load_state_dict(start)
            set_atrous(model, enabled)
            torch.manual_seed(1)  # the same dropout masks both ways
            losses[enabled] = step_ms(model, torch.optim.SGD(model.parameters(), lr=0.01), images, labels, 3)[1]
        times: dict[bool, list[float]] = {True: [], False: []}
        optimiser = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        for _ in range(args.repeats + 1):  # the first round warms up and is dropped
            for enabled in (True, False):
                set_atrous(model, enabled)
                times[enabled].append(step_ms(model, optimiser, images, labels, args.steps)[0])
        atrous, plain = (statistics.median(times[e][1:]) for e in (True, False))
        print(json.dumps({"variant": variant, "batch": args.batch, "size": args.size, "threads": args.threads,
                          "plain_ms": round(plain, 1), "atrous_ms": round(atrous, 1), "ratio": round(atrous / plain, 3),
                          "loss_diff_after_3_steps": abs(losses[True] - losses[False])}), flush=True)


if __name__ == "__main__":
    main()
