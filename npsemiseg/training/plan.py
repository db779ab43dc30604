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
    """Epoch length from the configured convention, total steps from epochs or ``max_steps``: optimiser steps,
    each of ``schedule.accumulation_steps`` micro-batches (an epoch sees the same images whatever the split)."""
    schedule = config.schedule
    micro = world_size * schedule.accumulation_steps
    if schedule.epoch_length == "unlabeled":
        iters = num_unlabeled // (schedule.unlabeled_batch_size * micro)
    else:
        iters = num_labeled // (schedule.batch_size * micro)
    iters = max(1, iters)
    total = schedule.max_steps if schedule.max_steps is not None else schedule.epochs * iters
    return Plan(iters, total, math.ceil(total / iters))


def poly_lr(base_lr: float, step: int, total_steps: int, power: float) -> float:
    """Poly schedule ``base_lr * (1 - step / total_steps) ** power``, stepped per iteration (0-based)."""
    return base_lr * (1.0 - step / total_steps) ** power


def step_lr(base_lr: float, step: int, total_steps: int, power: float, timing: str = "before_step") -> float:
    """The LR iteration ``step`` (0-based) runs at: :func:`poly_lr` of ``step`` (``timing="before_step"``), or of
    ``step - 1`` (``after_step``: UniMatch's loop sets the LR after its optimiser step, unimatch.py 205-208, so its
    iteration k runs at lr(k - 1) and iteration 0 at the base LR)."""
    if timing not in ("before_step", "after_step"):
        raise ValueError(f"schedule.lr_timing: expected 'before_step' or 'after_step', got {timing!r}")
    return poly_lr(base_lr, max(step - 1, 0) if timing == "after_step" else step, total_steps, power)


@dataclass(frozen=True)
class BatchScaling:
    """The global labeled batch of a run and its base learning rate.

    global_batch = ``schedule.batch_size`` x world size x ``schedule.accumulation_steps`` (the labeled images of
    one optimiser step); accumulation_steps = micro-batches per optimiser step; reference_batch = ``optim.reference_batch``
    (the preset's global batch; None: unknown); lr = ``optim.lr``, times global / reference batch
    under ``optim.lr_scaling=linear``.
    """

    global_batch: int
    reference_batch: int | None
    lr: float
    lr_scaling: str
    accumulation_steps: int = 1

    @property
    def differs(self) -> bool:
        """Whether the global batch is not the one the preset's learning rate was tuned for."""
        return self.reference_batch is not None and self.global_batch != self.reference_batch

    def describe(self) -> str:
        """``global batch 2 (reference 12), lr 0.01 (lr_scaling none)``; under accumulation
        ``global batch 12 (4 micro-batches per step) ...``."""
        reference = f" (reference {self.reference_batch})" if self.reference_batch is not None else ""
        micro = f" ({self.accumulation_steps} micro-batches per step)" if self.accumulation_steps > 1 else ""
        return f"global batch {self.global_batch}{micro}{reference}, lr {self.lr:.6g} (lr_scaling {self.lr_scaling})"

    def warning(self) -> str | None:
        """The warning of a global batch other than the reference (None when they agree)."""
        if not self.differs:
            return None
        advice = ("lr scaled linearly" if self.lr_scaling == "linear"
                  else "lr left as it is; set optim.lr_scaling=linear to scale it")
        return (f"global batch {self.global_batch} differs from the preset's reference {self.reference_batch} "
                f"({advice})")


def batch_scaling(config: RunConfig, world_size: int) -> BatchScaling:
    """The global batch and base learning rate of ``config`` on ``world_size`` processes."""
    optim = config.optim
    accumulation = config.schedule.accumulation_steps
    global_batch = config.schedule.batch_size * world_size * accumulation
    lr = optim.lr
    if optim.lr_scaling == "linear":
        lr = optim.lr * global_batch / optim.reference_batch
    return BatchScaling(global_batch, optim.reference_batch, lr, optim.lr_scaling, accumulation)
