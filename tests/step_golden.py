"""What the whole-step golden tests share: comparing one step of ``train_step`` with a recorded official step.

A recorder stores, per model (``student``, ``teacher``, ...), the sum, the sum of |values| and sampled entries (at
``index/<name>``) of every parameter and buffer after the step (``<model>/sum|abs|at/<name>``), and of every
student gradient (``student/grad_sum|grad_abs|grad_at/<name>``): ``record_mt_cps_golden.digest`` and
``gradient_digest``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np
import torch
from torch import nn

#: float32 round-off of a value, relative to max(1, its largest recorded |value|)
RTOL_SCALE = 1e-5
#: gradients: relative to the tensor's scale (round-off through the backward pass), with a floor (a bias before a BN
#: has a zero gradient: round-off alone)
GRAD_RTOL, GRAD_FLOOR = 5e-5, 1e-3


def close(ours, theirs, what: str, rtol: float = RTOL_SCALE) -> float:
    """``|ours - theirs| <= rtol * max(1, max |theirs|)``; returns the difference relative to that scale."""
    ours, theirs = np.asarray(ours, dtype=np.float64), np.asarray(theirs, dtype=np.float64)
    diff = float(np.max(np.abs(ours - theirs))) if theirs.size else 0.0
    scale = max(1.0, float(np.max(np.abs(theirs))) if theirs.size else 1.0)
    assert diff <= rtol * scale, f"{what}: max |difference| {diff:.3g} > {rtol * scale:.3g}"
    return diff / scale


def close_grad(ours, theirs, scale: float, what: str, rtol: float = GRAD_RTOL, floor: float = GRAD_FLOOR) -> float:
    """A gradient quantity within ``rtol`` of ``scale`` (the tensor's largest recorded |entry|, or for a sum
    its recorded sum of |entries|), at least ``floor``; returns the difference relative to that scale."""
    diff = float(np.max(np.abs(np.asarray(ours, dtype=np.float64) - np.asarray(theirs, dtype=np.float64))))
    scale = max(scale, floor)
    assert diff <= rtol * scale, f"{what}: max |difference| {diff:.3g} > {rtol * scale:.3g}"
    return diff / scale


def compare_gradients(model: nn.Module, data: Mapping[str, np.ndarray], prefix: str = "student",
                      rtol: float = GRAD_RTOL, floor: float = GRAD_FLOOR) -> dict[str, float]:
    """Every parameter's gradient of ``model`` against the record (within ``rtol`` of its scale, at least
    ``floor``: :func:`close_grad`): ``{"grad/<name>": relative difference}``."""
    diffs = {}
    for name, p in model.named_parameters():
        assert p.grad is not None, f"{prefix} {name}: no gradient"
        grad, total = p.grad.detach().double().flatten(), float(data[f"{prefix}/grad_abs/{name}"])
        entries = data[f"{prefix}/grad_at/{name}"]
        diffs[f"grad/{name}"] = max(
            close_grad(float(grad.sum()), data[f"{prefix}/grad_sum/{name}"], total, f"grad {name} sum", rtol, floor),
            close_grad(float(grad.abs().sum()), total, total, f"grad {name} sum |x|", rtol, floor),
            close_grad(grad[torch.from_numpy(data[f"index/{name}"]).long()].numpy(), entries,
                       float(np.abs(entries).max()), f"grad {name} entries", rtol, floor))
    return diffs


def compare_states(models: Mapping[str, nn.Module], data: Mapping[str, np.ndarray],
                   skip: Iterable[str] = (), rtol: float = RTOL_SCALE) -> dict[str, float]:
    """Every parameter and buffer of each model against the record (``skip``: ``<model>/<name>`` keys left out;
    within ``rtol``: :func:`close`): ``{"<model>/<name>": relative difference}``."""
    skipped, diffs = set(skip), {}
    for prefix, model in models.items():
        for name, t in (*model.named_parameters(), *model.named_buffers()):
            if f"{prefix}/{name}" in skipped:
                continue
            flat = t.detach().double().flatten()
            diffs[f"{prefix}/{name}"] = max(
                close(float(flat.sum()), data[f"{prefix}/sum/{name}"], f"{prefix} {name} sum", rtol),
                close(float(flat.abs().sum()), data[f"{prefix}/abs/{name}"], f"{prefix} {name} sum |x|", rtol),
                close(flat[torch.from_numpy(data[f"index/{name}"]).long()].numpy(), data[f"{prefix}/at/{name}"],
                      f"{prefix} {name} entries", rtol))
    return diffs


def summary(diffs: Mapping[str, float]) -> dict[str, str]:
    """The largest relative difference overall (and where), of the gradients and of the weights and buffers."""
    worst = max(diffs, key=diffs.get)
    grads = [v for k, v in diffs.items() if k.startswith("grad/")]
    states = [v for k, v in diffs.items() if "/" in k and not k.startswith("grad/")]
    return {"max": f"{diffs[worst]:.2e}", "where": worst, "gradients": f"{max(grads, default=0.0):.2e}",
            "weights_buffers": f"{max(states, default=0.0):.2e}"}
