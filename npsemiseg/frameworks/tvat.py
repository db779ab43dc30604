"""PS-MT's T-VAT: a virtual-adversarial perturbation of the student's feature map, found with
the teachers (``ssl_frameworks.md`` section 4).

``r = eps * normalise(grad_d KL(p(f) || p(f + xi d)))`` after one power iteration from a
random unit ``d``, where ``p`` is the softmax of the teachers' ensemble logits (mean over
teachers, and over samples for stochastic heads) and the normalisation is per image over
``[C, h, w]``. The student then classifies ``f + r``.

Differences from the released code, by design: the KL is taken at feature resolution (the
released decoder upsamples first; upsampling is linear, so the direction changes only by
a pixel weighting); for stochastic heads (MC dropout, NP) both teacher passes draw the same
random numbers (forked RNG with one seed), so the KL measures the perturbation and not the
sampling noise.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def l2_normalize(d: Tensor) -> Tensor:
    """``d [B, ...]`` divided by its L2 norm per batch element (+1e-8, as PS-MT)."""
    norm = d.flatten(1).norm(dim=1).view(-1, *([1] * (d.dim() - 1)))
    return d / (norm + 1e-8)


def ensemble_logits(classifiers: Sequence[Callable[[Tensor], Tensor]], features: Tensor, seed: int) -> Tensor:
    """Mean logits ``[B, K, h, w]`` of ``classifiers`` (each maps features to ``[S, B, K, h, w]``),
    every call drawing its random numbers from a generator seeded with ``seed``."""
    devices = [features.device] if features.device.type == "cuda" else []
    total = None
    for classify in classifiers:
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            logits = classify(features).float().mean(dim=0)
        total = logits if total is None else total + logits
    return total / len(classifiers)


def tvat_perturbation(
    features: Tensor,
    classifiers: Sequence[Callable[[Tensor], Tensor]],
    *,
    xi: float = 1e-6,
    eps: float = 2.0,
    iterations: int = 1,
) -> Tensor:
    """The T-VAT perturbation ``r [B, C, h, w]`` (detached) of ``features [B, C, h, w]``.

    ``classifiers``: the teachers' classifier halves (features -> per-sample logits), used
    in eval mode by the caller and not trained here (no parameter gradients are kept).
    """
    if iterations < 1:
        raise ValueError(f"iterations: expected >= 1, got {iterations}")
    f = features.detach()
    seed = int(torch.randint(0, 2**62, (1,)).item())
    with torch.no_grad():
        clean = torch.softmax(ensemble_logits(classifiers, f, seed), dim=1)
    d = l2_normalize(torch.rand_like(f) - 0.5)
    for _ in range(iterations):
        d = d.detach().requires_grad_(True)
        with torch.enable_grad():
            perturbed = ensemble_logits(classifiers, f + xi * d, seed)
            distance = F.kl_div(F.log_softmax(perturbed, dim=1), clean, reduction="batchmean")
            (grad,) = torch.autograd.grad(distance, d)
        d = l2_normalize(grad)
    return (eps * d).detach()


def frozen_classifier(model: nn.Module, **head_kwargs) -> Callable[[Tensor], Tensor]:
    """``features -> logits [S, B, K, h, w]`` through ``model.classify`` (a Segmentor's second half),
    with the model in eval mode during the call (PS-MT stops the teachers' BN and dropout)."""
    from npsemiseg.frameworks.pseudo_labels import mode

    def classify(features: Tensor) -> Tensor:
        with mode(model, False):
            return model.classify(features, **head_kwargs).logits

    return classify
