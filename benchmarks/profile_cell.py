"""Where do a mini-study cell's seconds go? ``torch.profiler`` over a shortened cell of ``jobs/specs/mini.yaml``.

Trains the mini spec's ``--framework`` / ``--head`` cell (study, 1/16, seed 0, the shipped backbone) for ``--steps``
steps with one intra-op thread (as the grid runs its cells), evaluates ``--images`` validation images, and prints the
operators by their own CPU time (``--rows`` of them) and the total::

    python benchmarks/profile_cell.py --framework unimatch --head np --steps 60

Results: docs/performance.md, "The mini-study".
"""

from __future__ import annotations

import argparse
import time

import torch
from thread_repeatability import mini_cell
from torch.profiler import ProfilerActivity, profile

from npsemiseg.training import train


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--framework", default="unimatch")
    parser.add_argument("--head", default="np")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--images", type=int, default=8)
    parser.add_argument("--rows", type=int, default=30)
    parser.add_argument("--weights", default="pretrained:default")
    args = parser.parse_args()
    torch.set_num_threads(1)
    config = mini_cell(args.framework, args.head, weights=args.weights, steps=args.steps, images=args.images)
    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        train(config)
    wall = time.perf_counter() - start
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows))
    print(f"{args.framework}/{args.head}: {args.steps} steps + {args.images} validation images, wall {wall:.1f} s "
          f"(profiled), torch {torch.__version__}, 1 thread")


if __name__ == "__main__":
    main()
