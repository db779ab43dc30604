"""One optimisation step: LR -> per micro-batch ``framework.train_step`` -> backward (gradients summed over the
``schedule.accumulation_steps`` micro-batches, each loss divided by their number) -> gradient all-reduce (under
torch.distributed) -> gradient norm (logged every step as ``train/grad_norm``, clipped when ``optim.grad_clip``)
-> SGD step -> buffer sync -> ``after_optimizer_step`` (EMA).

The step's logged device values (loss terms averaged over ranks, the framework's tensor logs, the NP head's label
checks, the gradient norm) stay on the device as one vector (:class:`PendingLogs`) until :func:`read_logs` reads
them, several steps' in one transfer: each read waits for the device to finish what was queued. :func:`train_step`
reads its own at once, before the optimiser step (a non-finite loss or norm never reaches the weights);
:func:`deferred_train_step` leaves the read to its caller (the loop, every ``runtime.read_every_steps`` steps)."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from npsemiseg.config import RunConfig
from npsemiseg.frameworks import Batch, Framework, StepContext, StepResult
from npsemiseg.heads import LabelCheck, deferred_label_checks, micro_batched_heads
from npsemiseg.models import uses_cuda_graphs
from npsemiseg.training.distributed import average_gradients, broadcast_buffers, synced_batchnorm
from npsemiseg.training.factories import Optimizer
from npsemiseg.training.plan import step_lr


def autocast(config: RunConfig, device: torch.device) -> Any:
    """bf16 autocast on GPU when ``runtime.amp``, else a no-op context."""
    if device.type == "cuda" and config.runtime.amp:
        return torch.autocast(device_type="cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _to_device(batch: dict[str, Tensor], device: torch.device, channels_last: bool = False) -> dict[str, Tensor]:
    """The batch on ``device``; with ``channels_last`` its images (float ``[B, 3, H, W]``) in that memory format."""
    moved = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
    if channels_last:
        moved = {k: v.contiguous(memory_format=torch.channels_last) if v.dim() == 4 and v.is_floating_point() else v
                 for k, v in moved.items()}
    return moved


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


@dataclass
class PendingLogs:
    """One step's ``train/...`` logs with their device values not yet read: ``values`` = float32 ``[N + L + 3C + 1]``
    on the step's device: the N loss terms ``names`` (averaged over ranks), the L tensor logs ``logged`` (this
    rank's), C label checks' (count, min, max) and the gradient norm before clipping. ``host``: the logs that were
    floats already (``train/lr`` and the framework's float logs), ``order``: the framework's log keys in order."""

    step: int
    names: list[str]
    logged: list[str]
    checks: list[LabelCheck]
    values: Tensor
    host: dict[str, float]
    order: list[str]


def train_step(framework: Framework, batch: Batch | Sequence[Batch], ctx: StepContext, optimizer: Optimizer, config: RunConfig,
               device: torch.device, world_size: int) -> dict[str, float]:
    """One optimisation step over ``batch``, or over its micro-batches when given a sequence of them (gradient
    accumulation); returns the ``train/...`` logs (losses averaged over ranks and micro-batches), read before the
    optimiser step: one read of device values."""
    pending = _forward_backward(framework, batch, ctx, optimizer, config, device, world_size)
    logs = read_logs([pending])[0]
    _optimizer_step(framework, optimizer, config, device, world_size, ctx)
    return logs


def deferred_train_step(framework: Framework, batch: Batch | Sequence[Batch], ctx: StepContext, optimizer: Optimizer,
                        config: RunConfig, device: torch.device, world_size: int) -> PendingLogs:
    """:func:`train_step` without the read: no wait for the device; :func:`read_logs` gives the logs (and raises
    for a non-finite value, after the optimiser has taken it)."""
    pending = _forward_backward(framework, batch, ctx, optimizer, config, device, world_size)
    _optimizer_step(framework, optimizer, config, device, world_size, ctx)
    return pending


def _forward_backward(framework: Framework, batches: Batch | Sequence[Batch], ctx: StepContext, optimizer: Optimizer,
                      config: RunConfig, device: torch.device, world_size: int) -> PendingLogs:
    """LR, then per micro-batch forward and backward (gradients summed, each micro-batch's loss divided by their
    number k), one gradient all-reduce and norm (clipped): the step up to the optimiser. The logged loss terms and
    tensor logs are the micro-batches' means; the label checks are every micro-batch's."""
    micro_batches = [batches] if isinstance(batches, Batch) else list(batches)
    lr = step_lr(optimizer.base_lr, ctx.step, ctx.total_steps, config.schedule.poly_power, config.schedule.lr_timing)
    for group, multiplier in zip(optimizer.torch_optimizer.param_groups, optimizer.multipliers):
        group["lr"] = lr * multiplier
    optimizer.torch_optimizer.zero_grad(set_to_none=True)
    k = len(micro_batches)
    parts: list[_MicroBatchLogs] = []
    with micro_batched_heads(framework.modules().values(), k) if k > 1 else contextlib.nullcontext():
        for index, batch in enumerate(micro_batches):
            micro_ctx = replace(ctx, micro_batch=index, micro_batches=k)
            parts.append(_micro_batch(framework, batch, micro_ctx, config, device, world_size))
    if world_size > 1:
        average_gradients(optimizer.parameters, world_size)
    norm = gradient_norm(optimizer, config.optim.grad_clip)
    first = parts[0]
    differing = [p.names + p.order for p in parts if (p.names, p.order) != (first.names, first.order)]
    if differing:
        raise ValueError(f"{type(framework).__name__}: the micro-batches of step {ctx.step} returned different loss "
                         f"terms or logs ({first.names + first.order} and {differing[0]}); a step's calls must "
                         "return the same keys")
    values = first.values if k == 1 else torch.stack([p.values for p in parts]).mean(0)
    logged = {name: (first.logged[name] if k == 1 else torch.stack([p.logged[name] for p in parts]).mean())
              for name in first.logged}
    floats = {name: sum(p.floats[name] for p in parts) / k for name in first.floats}
    checks = [c for p in parts for c in p.checks]
    vector = [values, *(v.reshape(1).to(values.device) for v in logged.values()),
              *(c.summary.to(values.device) for c in checks), norm.detach().float().reshape(1).to(values.device)]
    host = {"train/lr": lr, **{f"train/{k}": v for k, v in floats.items()}}
    return PendingLogs(ctx.step + 1, first.names, list(logged), checks, torch.cat(vector), host, first.order)


@dataclass
class _MicroBatchLogs:
    """One micro-batch's loss terms ``names``/``values`` (averaged over ranks), tensor logs (float32, 0-dim), float
    logs, label checks and the framework's log keys in order."""

    names: list[str]
    values: Tensor
    logged: dict[str, Tensor]
    floats: dict[str, float]
    checks: list[LabelCheck]
    order: list[str]


def _micro_batch(framework: Framework, batch: Batch, ctx: StepContext, config: RunConfig, device: torch.device,
                 world_size: int) -> _MicroBatchLogs:
    """Forward and backward of one micro-batch: its total loss divided by ``ctx.micro_batches`` (k micro-batches
    of b images add up to the gradient of one batch of k b when every loss is a mean over its batch)."""
    if uses_cuda_graphs(config.runtime.compile, device):
        torch.compiler.cudagraph_mark_step_begin()  # the previous step's graph outputs may be overwritten
    last = config.runtime.channels_last
    batch = Batch(labeled=_to_device(batch.labeled, device, last),
                  unlabeled=_to_device(batch.unlabeled, device, last) if batch.unlabeled is not None else None)
    with autocast(config, device), deferred_label_checks() as checks:
        result = framework.train_step(batch, ctx)
    names, values = _loss_values(framework, result, ctx, world_size)
    clash = set(result.logs) & set(names)
    if clash:
        raise ValueError(f"{type(framework).__name__}: step logs {sorted(clash)} reuse loss term names; "
                         "log them under another name (e.g. head/<name>)")
    total = result.total
    (total if ctx.micro_batches == 1 else total / ctx.micro_batches).backward()
    logged = {k: v.detach().float().reshape(()) for k, v in result.logs.items() if isinstance(v, Tensor)}
    floats = {k: float(v) for k, v in result.logs.items() if not isinstance(v, Tensor)}
    return _MicroBatchLogs(names, values, logged, floats, list(checks), list(result.logs))


def _optimizer_step(framework: Framework, optimizer: Optimizer, config: RunConfig, device: torch.device,
                    world_size: int, ctx: StepContext) -> None:
    optimizer.torch_optimizer.step()
    if world_size > 1 and not synced_batchnorm(config.runtime.sync_bn, device):
        broadcast_buffers(framework.student)
    framework.after_optimizer_step(ctx)


def _loss_values(framework: Framework, result: StepResult, ctx: StepContext, world_size: int) -> tuple[list[str], Tensor]:
    """The loss terms' names and values ``[N]`` averaged over ranks (a non-finite term on any rank reaches every
    rank: all stop together at the read)."""
    if not result.losses:
        raise ValueError(f"{type(framework).__name__}.train_step returned no loss terms at step {ctx.step}")
    names = list(result.losses)
    values = torch.stack([result.losses[n].detach().float().reshape(()) for n in names])
    if world_size > 1:
        dist.all_reduce(values)
        values /= world_size
    return names, values


def read_logs(pending: Sequence[PendingLogs]) -> list[dict[str, float]]:
    """The logs of every pending step, in order, from one transfer of their values. Raises at the first step
    with a label out of range (ValueError), a non-finite loss term or a non-finite gradient norm
    (FloatingPointError), naming the step."""
    if not pending:
        return []
    floats = torch.cat([p.values.to(pending[0].values.device) for p in pending]).tolist()
    out, offset = [], 0
    for p in pending:
        row = floats[offset: offset + p.values.numel()]
        offset += p.values.numel()
        n, m = len(p.names), len(p.logged)
        for i, check in enumerate(p.checks):
            check.raise_if_bad(*row[n + m + 3 * i: n + m + 3 * i + 3])
        losses, norm = row[:n], row[-1]
        check_finite(p.step, p.names, losses)
        if not math.isfinite(norm):
            raise FloatingPointError(f"non-finite gradient norm at step {p.step} (loss terms finite: "
                                     + ", ".join(f"{k}={v:.4g}" for k, v in zip(p.names, losses)) + ")")
        logs = {"train/loss": float(sum(losses)), "train/lr": p.host["train/lr"]}
        logs.update({f"train/{k}": v for k, v in zip(p.names, losses)})
        logs["train/grad_norm"] = norm
        read = dict(zip(p.logged, row[n: n + m]))
        logs.update({f"train/{k}": read[k] if k in read else p.host[f"train/{k}"] for k in p.order})
        out.append(logs)
    return out


def gradient_norm(optimizer: Optimizer, max_norm: float | None) -> Tensor:
    """The total L2 norm of the gradients before clipping (0-dim, on the device, not read), the gradients clipped
    to ``max_norm`` when given.

    Logged every step: one exploding step (U2PL's contrastive loss on a class with a single small-norm
    anchor, ``docs/learning.md``) is otherwise invisible in the losses until the run has collapsed.
    A non-finite norm stops the run at its read (:func:`read_logs`)."""
    if max_norm is not None:
        return torch.nn.utils.clip_grad_norm_(optimizer.parameters, max_norm)
    grads = [p.grad for p in optimizer.parameters if p.grad is not None]
    return torch.nn.utils.get_total_norm(grads) if grads else torch.zeros(())
