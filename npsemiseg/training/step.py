"""One optimisation step: LR -> ``framework.train_step`` -> finite check -> backward -> gradient all-reduce
(under torch.distributed) -> gradient norm (logged every step as ``train/grad_norm``, clipped when
``optim.grad_clip``) -> SGD step -> buffer sync -> ``after_optimizer_step`` (EMA)."""

from __future__ import annotations

import contextlib
import math
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from npsemiseg.config import RunConfig
from npsemiseg.frameworks import Batch, Framework, StepContext, StepResult
from npsemiseg.training.distributed import average_gradients, broadcast_buffers, synced_batchnorm
from npsemiseg.training.factories import Optimizer
from npsemiseg.training.plan import step_lr


def autocast(config: RunConfig, device: torch.device) -> Any:
    """bf16 autocast on GPU when ``runtime.amp``, else a no-op context."""
    if device.type == "cuda" and config.runtime.amp:
        return torch.autocast(device_type="cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _to_device(batch: dict[str, Tensor], device: torch.device) -> dict[str, Tensor]:
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


def check_finite(step: int, names: list[str], values: list[float]) -> None:
    """FloatingPointError naming the first non-finite loss term of step ``step`` (1-based, as ``on_step``)."""
    bad = [(n, v) for n, v in zip(names, values) if not math.isfinite(v)]
    if bad:
        terms = ", ".join(f"{n}={v:.4g}" for n, v in zip(names, values))
        name, value = bad[0]
        raise FloatingPointError(
            f"non-finite loss at step {step}: term {name!r} is {value} (all terms: {terms}); "
            "lower optim.lr, set optim.grad_clip, or check the data"
        )


def train_step(framework: Framework, batch: Batch, ctx: StepContext, optimizer: Optimizer, config: RunConfig,
               device: torch.device, world_size: int) -> dict[str, float]:
    """One optimisation step; returns the ``train/...`` logs (losses averaged over ranks)."""
    lr = step_lr(optimizer.base_lr, ctx.step, ctx.total_steps, config.schedule.poly_power, config.schedule.lr_timing)
    for group, multiplier in zip(optimizer.torch_optimizer.param_groups, optimizer.multipliers):
        group["lr"] = lr * multiplier
    batch = Batch(labeled=_to_device(batch.labeled, device),
                  unlabeled=_to_device(batch.unlabeled, device) if batch.unlabeled is not None else None)
    with autocast(config, device):
        result = framework.train_step(batch, ctx)
    names, floats, step_logs = _read_values(framework, result, ctx, world_size)
    optimizer.torch_optimizer.zero_grad(set_to_none=True)
    result.total.backward()
    if world_size > 1:
        average_gradients(optimizer.parameters, world_size)
    logs = {"train/loss": float(sum(floats)), "train/lr": lr}
    logs.update({f"train/{n}": v for n, v in zip(names, floats)})
    logs["train/grad_norm"] = gradient_norm(optimizer, config.optim.grad_clip, ctx, names, floats)
    optimizer.torch_optimizer.step()
    if world_size > 1 and not synced_batchnorm(config.runtime.sync_bn, device):
        broadcast_buffers(framework.student)
    framework.after_optimizer_step(ctx)
    clash = set(result.logs) & set(names)
    if clash:
        raise ValueError(f"{type(framework).__name__}: step logs {sorted(clash)} reuse loss term names; "
                         "log them under another name (e.g. head/<name>)")
    logs.update({f"train/{k}": v for k, v in step_logs.items()})
    return logs


def _read_values(framework: Framework, result: StepResult, ctx: StepContext,
                 world_size: int) -> tuple[list[str], list[float], dict[str, float]]:
    """The loss terms' names and values averaged over ranks, checked finite on every rank together, and the
    step's logs as floats (this rank's): the tensors among them come back in the same transfer as the losses,
    the step's one read of device values before the gradient norm."""
    if not result.losses:
        raise ValueError(f"{type(framework).__name__}.train_step returned no loss terms at step {ctx.step}")
    names = list(result.losses)
    values = torch.stack([result.losses[n].detach().float().reshape(()) for n in names])
    if world_size > 1:
        dist.all_reduce(values)  # a non-finite term on any rank reaches every rank: all stop together
        values /= world_size
    logged = [k for k, v in result.logs.items() if isinstance(v, Tensor)]
    if logged:
        values = torch.cat([values, torch.stack([result.logs[k].detach().float().reshape(()).to(values.device)
                                                 for k in logged])])
    floats = values.tolist()
    check_finite(ctx.step + 1, names, floats[: len(names)])
    read = dict(zip(logged, floats[len(names):]))
    return names, floats[: len(names)], {k: read[k] if k in read else float(v) for k, v in result.logs.items()}


def gradient_norm(optimizer: Optimizer, max_norm: float | None, ctx: StepContext, names: list[str],
                  floats: list[float]) -> float:
    """The total L2 norm of the gradients before clipping, clipped to ``max_norm`` when given.

    Logged every step: one exploding step (U2PL's contrastive loss on a class with a single small-norm
    anchor, ``docs/learning.md``) is otherwise invisible in the losses until the run has collapsed.
    A non-finite norm stops the run before the optimiser writes it into the weights."""
    if max_norm is not None:
        norm = float(torch.nn.utils.clip_grad_norm_(optimizer.parameters, max_norm))
    else:
        norm = float(torch.nn.utils.get_total_norm([p.grad for p in optimizer.parameters if p.grad is not None]))
    if not math.isfinite(norm):
        raise FloatingPointError(f"non-finite gradient norm at step {ctx.step + 1} (loss terms finite: "
                                 + ", ".join(f"{n}={v:.4g}" for n, v in zip(names, floats)) + ")")
    return norm
