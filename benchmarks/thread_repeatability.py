"""Does one mini-study cell give the same metrics with 1 and with 2 intra-op threads?

Runs one cell of ``jobs/specs/mini.yaml`` (default: supervised, baseline head, 1/16, seed 0) twice with
``torch.set_num_threads(1)`` and twice with ``torch.set_num_threads(2)``, from the same backbone weights, shortened
to ``--steps`` steps and ``--images`` validation images, and prints each run's metrics, whether runs at the same
count agree bit for bit, and how far 1 and 2 threads are apart (metrics and the trained weights).

    python benchmarks/thread_repeatability.py --weights pretrained:default --steps 60 --images 64

``--weights``: what ``model.weights`` takes (``pretrained:default``: the shipped backbone where the package ships
one; a path: any backbone file, e.g. one ``npsemiseg pretrain --steps 20`` built). ``tests/test_pretrain.py`` runs
the same comparison shortened (integration).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from npsemiseg.config import with_overrides
from npsemiseg.config.schema import RunConfig
from npsemiseg.training import train

MINI = Path(__file__).resolve().parents[1] / "jobs" / "specs" / "mini.yaml"
KEYS = ("miou", "pixel_acc", "ece", "nll")


def mini_cell(framework: str = "supervised", head: str = "baseline", *, weights: str, steps: int,
              images: int) -> RunConfig:
    """The mini spec's ``framework``/``study``/``1/16``/``head`` cell, seed 0, shortened, without its evaluation under
    shift (what is compared is the training)."""
    from semiseg_platform.sweeps.grid_spec import expand, load_spec

    config = next(c for c in expand(load_spec(MINI)) if c.framework == framework and c.head.label == head
                  and c.partition == "1/16" and c.seed == 0)
    return with_overrides(config, {"model.weights": weights, "schedule.max_steps": steps,
                                   "schedule.checkpoint_every_steps": 0, "evaluation.max_images": images,
                                   "evaluation.corruptions": []})


def run_with_threads(config: RunConfig, threads: int) -> tuple[dict[str, float], dict[str, torch.Tensor]]:
    """Train ``config`` with ``threads`` intra-op threads (restored after); its metrics and the model's weights."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        result = train(config)
    finally:
        torch.set_num_threads(previous)
    assert result.framework is not None
    state = {k: v.detach().clone() for k, v in result.framework.eval_model().state_dict().items()
             if v.is_floating_point()}
    return {k: float(result.metrics[k]) for k in KEYS if k in result.metrics}, state


def compare(config: RunConfig, counts: tuple[int, ...] = (1, 1, 2, 2)) -> dict:
    """Runs of ``config`` at each thread count of ``counts``; per count whether its runs agree exactly, and the
    largest metric and weight differences between the first run of each count."""
    runs = [(threads, *run_with_threads(config, threads)) for threads in counts]
    by_count: dict[int, list] = {}
    for threads, metrics, state in runs:
        by_count.setdefault(threads, []).append((metrics, state))
    same = {threads: all(m == rs[0][0] and all(torch.equal(s[k], rs[0][1][k]) for k in s) for m, s in rs[1:])
            for threads, rs in by_count.items()}
    (m1, s1), (m2, s2) = by_count[counts[0]][0], by_count[counts[-1]][0]
    return {
        "metrics": [{"threads": t, **m} for t, m, _ in runs],
        "repeatable_at_each_count": same,
        "metric_differences": {k: abs(m1[k] - m2[k]) for k in m1},
        "max_weight_difference": max(float((s1[k] - s2[k]).abs().max()) for k in s1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--weights", default="pretrained:default")
    parser.add_argument("--framework", default="supervised")
    parser.add_argument("--head", default="baseline")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--images", type=int, default=64)
    args = parser.parse_args()
    config = mini_cell(args.framework, args.head, weights=args.weights, steps=args.steps, images=args.images)
    print(json.dumps(compare(config), indent=2))


if __name__ == "__main__":
    main()
