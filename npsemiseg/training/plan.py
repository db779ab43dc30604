"""How long a run is (the epoch convention, total steps) and its per-iteration poly learning rate."""

from __future__ import annotations

import math
from dataclasses import dataclass

from npsemiseg.config import RunConfig


@dataclass(frozen=True)
class Plan:
    """Iterations of the run: ``iters_per_epoch`` (the epoch convention), ``total_steps``, ``total_epochs``."""

    iters_per_epoch: int
    total_steps: int
    total_epochs: int


def plan_run(config: RunConfig, *, num_labeled: int, num_unlabeled: int, world_size: int) -> Plan:
    """Epoch length from the configured convention, total steps from epochs or ``max_steps``."""
    schedule = config.schedule
    if schedule.epoch_length == "unlabeled":
        iters = num_unlabeled // (schedule.unlabeled_batch_size * world_size)
    else:
        iters = num_labeled // (schedule.batch_size * world_size)
    iters = max(1, iters)
    total = schedule.max_steps if schedule.max_steps is not None else schedule.epochs * iters
    return Plan(iters, total, math.ceil(total / iters))


def poly_lr(base_lr: float, step: int, total_steps: int, power: float) -> float:
    """Poly schedule ``base_lr * (1 - step / total_steps) ** power``, stepped per iteration (0-based)."""
    return base_lr * (1.0 - step / total_steps) ** power
