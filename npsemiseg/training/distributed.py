"""The loop as one DDP rank, without DistributedDataParallel: equal start, averaged gradients, synced buffers.

Each rank takes its share of every global batch, parameters and buffers start equal (broadcast from
rank 0), gradients are averaged with coalesced all-reduces after backward (the same update as
DistributedDataParallel's) and the student's buffers are broadcast from rank 0 after every step (as
DDP does before each forward). The student is *not* wrapped in DistributedDataParallel: frameworks
call it several times per step and call its ``extract``/``classify`` halves (PS-MT's T-VAT), which
DDP's reducer does not support.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from npsemiseg.frameworks.ema import unwrap


def rank_world() -> tuple[int, int]:
    """``(rank, world size)``: ``(0, 1)`` outside torch.distributed."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def synced_batchnorm(sync_bn: bool, device: torch.device) -> bool:
    """True when SyncBatchNorm keeps BN statistics equal across ranks (GPU with ``runtime.sync_bn``);
    NP memories are synchronised by the head itself, so no buffer broadcast is needed then."""
    return device.type == "cuda" and sync_bn


def _coalesced(tensors: list[Tensor], op: Any) -> None:
    """Apply a collective to tensors grouped by dtype and device, one flat buffer per group."""
    groups: dict[tuple[torch.dtype, torch.device], list[Tensor]] = {}
    for tensor in tensors:
        groups.setdefault((tensor.dtype, tensor.device), []).append(tensor)
    for group in groups.values():
        flat = torch.cat([t.reshape(-1) for t in group])
        op(flat)
        offset = 0
        for t in group:
            t.copy_(flat[offset : offset + t.numel()].view_as(t))
            offset += t.numel()


def broadcast_state(modules: list[nn.Module]) -> None:
    """Make every rank's parameters and buffers equal to rank 0's."""
    tensors = [t.data for m in modules for t in (*unwrap(m).parameters(), *unwrap(m).buffers())]
    _coalesced(tensors, lambda flat: dist.broadcast(flat, src=0))


def broadcast_buffers(module: nn.Module) -> None:
    """Make every rank's buffers of ``module`` equal to rank 0's."""
    tensors = [b.data for b in unwrap(module).buffers()]
    if tensors:
        _coalesced(tensors, lambda flat: dist.broadcast(flat, src=0))


def average_gradients(parameters: list[nn.Parameter], world_size: int) -> None:
    """Mean of the gradients over ranks; a parameter that got no gradient on any rank keeps ``None``."""
    has_grad = torch.tensor([p.grad is not None for p in parameters], dtype=torch.float32,
                            device=parameters[0].device)
    dist.all_reduce(has_grad)
    grads = []
    for p, used in zip(parameters, has_grad.tolist()):
        if used and p.grad is None:
            p.grad = torch.zeros_like(p)
        if used:
            grads.append(p.grad)
    _coalesced(grads, lambda flat: (dist.all_reduce(flat), flat.div_(world_size)))
