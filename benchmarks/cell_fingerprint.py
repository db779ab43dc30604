"""Which commit changed a cell's results? One mini-study cell, shortened, trained by the checkout on ``PYTHONPATH``:
its cell id, the SHA-256 of its trained parameters and of its buffers, and its metrics, as one JSON line, so that
two commits are compared bit for bit (and bisected: ``git bisect run`` on the parameters' digest).

    git worktree add /tmp/wt_old OLD
    PYTHONPATH=/tmp/wt_old python benchmarks/cell_fingerprint.py supervised np --steps 48
    PYTHONPATH=$PWD python benchmarks/cell_fingerprint.py supervised np --steps 48

The cell is the checkout's own ``jobs/specs/mini.yaml`` cell (``framework``/``study``/``1/16``/``head``, ``--seed``),
with ``--steps`` training steps, ``--images`` validation images and no evaluation under shift; ``--steps 960 --images
0`` trains and evaluates the whole cell (the shift aside, which comes after the metrics compared). It runs on one
intra-op thread: the thread count changes a cell's rounding (``benchmarks/thread_repeatability.py``), so two commits
are compared at the same count. A commit that regroups floating-point sums (same values up to rounding) changes the
digests and, through training, the metrics: docs/learning.md, "Code versions within a cell".
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path
from typing import Any

import torch

import npsemiseg
from npsemiseg.config import with_overrides
from npsemiseg.config.schema import RunConfig
from npsemiseg.training import train

KEYS = ("miou", "pixel_acc", "ece", "nll")


def shortened_cell(framework: str, head: str, *, seed: int = 0, steps: int, images: int | None) -> RunConfig:
    """The mini spec's cell of the checkout that ``npsemiseg`` is imported from, shortened to ``steps`` steps and
    ``images`` validation images (None: all), without checkpoints or the evaluation under shift."""
    from semiseg_platform.sweeps.grid_spec import CellKey, cell_config, load_spec

    spec = load_spec(Path(npsemiseg.__file__).resolve().parents[1] / "jobs" / "specs" / "mini.yaml")
    config = cell_config(spec, CellKey(framework, "study", "1/16", head, seed))
    overrides: dict[str, Any] = {"schedule.max_steps": steps, "schedule.checkpoint_every_steps": 0,
                                 "evaluation.max_images": images}
    if hasattr(config.evaluation, "corruptions"):  # checkouts from 2026-11-27 on
        overrides["evaluation.corruptions"] = []
    return with_overrides(config, overrides)


def digest(tensors: list[torch.Tensor]) -> str:
    """SHA-256 of the tensors' bytes in order (first 16 hex digits)."""
    sha = hashlib.sha256()
    for tensor in tensors:
        sha.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return sha.hexdigest()[:16]


def fingerprint(config: RunConfig) -> dict[str, Any]:
    """Train ``config`` on one intra-op thread (restored after): the cell id, the digests of the trained model's
    parameters and buffers (sorted by name), and its metrics."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        result = train(config)
    finally:
        torch.set_num_threads(previous)
    assert result.framework is not None
    model = result.framework.eval_model()
    return {"cell_id": config.cell_id, "steps": result.steps,
            "parameters": digest([p for _, p in sorted(model.named_parameters())]),
            "buffers": digest([b for _, b in sorted(model.named_buffers())]),
            **{k: float(result.metrics[k]) for k in KEYS if k in result.metrics}}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("framework", help="a framework of the mini spec (supervised, mt, psmt, u2pl, augseg, ...)")
    parser.add_argument("head", help="a head of the mini spec (baseline, mc_dropout, np, np_mean)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=48)
    parser.add_argument("--images", type=int, default=40, help="validation images (0: all)")
    args = parser.parse_args(argv)
    config = shortened_cell(args.framework, args.head, seed=args.seed, steps=args.steps, images=args.images or None)
    print(json.dumps(fingerprint(config)))


if __name__ == "__main__":
    main()
