"""Schedules of the SSL frameworks: PS-MT's cosine ramp-up, U2PL's entropy percentiles.

All are pure functions of where the run is (iteration / epoch), so a resumed run
recomputes them exactly.
"""

from __future__ import annotations

import math

from torch import Tensor


def cosine_rampup(current: float, length: float) -> float:
    """PS-MT's cosine ramp-up: ``0.5 * (1 - cos(pi * c / L))`` with ``c`` clipped to [0, L].

    0 at the start, 1 from ``length`` on; 1 everywhere when ``length == 0``.
    """
    if length < 0:
        raise ValueError(f"length: expected >= 0, got {length}")
    if length == 0:
        return 1.0
    current = min(max(float(current), 0.0), float(length))
    return 0.5 * (1.0 - math.cos(math.pi * current / length))


def rampup_weight(step: int, iters_per_epoch: int, final_weight: float, rampup_epochs: float, start_epoch: float = 0.0) -> float:
    """PS-MT's unsupervised weight at global iteration ``step``.

    0 before ``start_epoch``, then ``final_weight * cosine_rampup`` over ``rampup_epochs``
    epochs counted in iterations (PS-MT's ``ConsistencyWeight``).
    """
    start = start_epoch * iters_per_epoch
    if step < start:
        return 0.0
    return final_weight * cosine_rampup(step - start, rampup_epochs * iters_per_epoch)


def u2pl_drop_percent(epoch: int, total_epochs: int, drop_percent: float = 80.0) -> float:
    """The entropy percentile above which U2PL ignores pseudo-labels at ``epoch``.

    ``100 - (100 - drop_percent) * (1 - t / T)``: 80 at the start, rising linearly to 100
    (80 + 20 t/T for the default), so fewer pixels are dropped as the teacher improves.
    """
    if total_epochs <= 0:
        raise ValueError(f"total_epochs: expected > 0, got {total_epochs}")
    return 100.0 - (100.0 - drop_percent) * (1.0 - epoch / total_epochs)


def contrastive_alpha(epoch: int, total_epochs: int, alpha_0: float = 20.0) -> float:
    """U2PL's ``alpha_t = alpha_0 (1 - t / T)``: the percentile of teacher entropy below which
    unlabeled pixels are reliable (anchor candidates) and above ``100 - alpha_t`` of which
    they are unreliable (negative candidates)."""
    if total_epochs <= 0:
        raise ValueError(f"total_epochs: expected > 0, got {total_epochs}")
    return alpha_0 * (1.0 - epoch / total_epochs)


def percentile(values: Tensor, q: float) -> Tensor:
    """The ``q``-th percentile (0..100) of a 1-d tensor, linear interpolation between
    order statistics (numpy's default, as U2PL uses). Scalar tensor, no host sync."""
    if values.dim() != 1 or values.numel() == 0:
        raise ValueError(f"values: expected a non-empty 1-d tensor, got shape {tuple(values.shape)}")
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"q: expected a percentile in [0, 100], got {q}")
    ordered = values.float().sort().values
    position = q / 100.0 * (ordered.numel() - 1)
    low = math.floor(position)
    high = min(low + 1, ordered.numel() - 1)
    fraction = position - low
    return ordered[low] + (ordered[high] - ordered[low]) * fraction


def entropy_filter(entropy: Tensor, labels: Tensor, q: float, ignore_index: int = 255) -> Tensor:
    """Pseudo-labels with pixels at or above the ``q``-th entropy percentile set to ignore.

    entropy ``[B, H, W]``, labels ``[B, H, W]``; the percentile is taken over the
    non-ignored pixels (U2PL's ``compute_unsupervised_loss``). Returns a new label map.
    """
    valid = labels != ignore_index
    if not bool(valid.any()):
        return labels.clone()
    threshold = percentile(entropy[valid], q)
    return labels.masked_fill(valid & (entropy >= threshold), ignore_index)
