"""Activation checkpointing of the encoder (``runtime.activation_checkpointing``): each ResNet stage and each ViT
block keeps only its input for the backward pass and runs again there to rebuild what its gradients need, so the
step holds one segment's activations at a time instead of the whole encoder's, for about one more encoder forward.

``torch.utils.checkpoint`` without re-entrance. What the second run must not change:

- random draws (dropout, stochastic depth): the RNG states of the first run are restored for it
  (``preserve_rng_state``), so it draws the same masks;
- BatchNorm's running statistics: the second run normalises with the same batch statistics; its update of the
  running statistics and ``num_batches_tracked`` is undone (the buffers put back as the first run left them), so
  each training forward moves them once, as without checkpointing.

Only where gradients are being recorded: evaluation and no-grad teacher passes run the segment once, as ever.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.utils.checkpoint import checkpoint


@contextlib.contextmanager
def frozen_running_statistics(module: nn.Module) -> Iterator[None]:
    """Within it, ``module``'s BatchNorm layers run as ever (batch statistics in training mode); on leaving, their
    running statistics and ``num_batches_tracked`` are put back as they were: a recomputation leaves them as the
    first forward set them. (Turning ``track_running_stats`` off instead would change what the layer saves for
    backward, which the checkpoint refuses.)"""
    buffers = [b for m in module.modules() if isinstance(m, _BatchNorm) for b in m.buffers()]
    kept = [b.clone() for b in buffers]
    try:
        yield
    finally:
        with torch.no_grad():
            for buffer, value in zip(buffers, kept):
                buffer.copy_(value)


def run_segment(segment: nn.Module, *inputs: Any, checkpointed: bool) -> Any:
    """``segment(*inputs)``, checkpointed when ``checkpointed`` and gradients are being recorded."""
    if not (checkpointed and torch.is_grad_enabled()):
        return segment(*inputs)
    return checkpoint(segment, *inputs, use_reentrant=False, preserve_rng_state=True,
                      context_fn=lambda: (contextlib.nullcontext(), frozen_running_statistics(segment)))


def set_activation_checkpointing(model: nn.Module, enabled: bool) -> int:
    """Checkpoint the stages / blocks of every encoder in ``model`` that supports it (an ``activation_checkpointing``
    attribute: :class:`~npsemiseg.models.backbones.ResNetBackbone`, :class:`~npsemiseg.models.vit.ViTBackbone`), or
    stop; returns how many encoders were set."""
    encoders = [m for m in model.modules() if hasattr(m, "activation_checkpointing")]
    for encoder in encoders:
        encoder.activation_checkpointing = bool(enabled)
    return len(encoders)
