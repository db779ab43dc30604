"""PS-MT's T-VAT: a virtual-adversarial perturbation of the student's feature map, found with
the teachers (``docs/frameworks.md``, PS-MT).

``r = eps * normalise(grad_d KL(p(f) || p(f + xi d)))`` after one power iteration from a
random unit ``d``, where ``p`` is the softmax of the teachers' ensemble logits (mean over
teachers, and over samples for stochastic heads) and the normalisation is per image over
``[C, h, w]``. The student then classifies ``f + r``.

Differences from the released code, by design: the KL is taken at feature resolution (the
released decoder upsamples first; upsampling is linear, so the direction changes only by a pixel
weighting; :func:`at_size` gives the released variant, switch ``psmt_tvat_crop_kl``); for
stochastic heads (MC dropout, NP) both teacher passes draw the same random numbers (forked RNG
with one seed), so the KL measures the perturbation and not the sampling noise. The search runs
with autocast off (bf16 cannot resolve ``xi * d``).

Batches: the released student decoder runs the search once on the labeled and once on the unlabeled
feature map (two calls, EntireModel.py 60 and 64), ``parts`` gives that (switch ``psmt_tvat_per_batch``);
by default the whole batch is searched at once. The direction is normalised per image either way and the
KL's ``batchmean`` scales every image's gradient by 1 / (images searched together), which the exact
normalisation removes: the two forms differ only in their random draws. With the released ``norm + 1e-8``
the gradient (order ``xi^2``) is far below 1e-8, so ``|r|`` is proportional to that 1 / B and the two forms
differ in size (the labeled images' perturbation grows by (B_l + B_u) / B_l when searched on their own).

Precision note (measured on the smoke model, 6144-element feature maps): the KL is quadratic
around ``d = 0``, so its gradient is of order ``xi^2``. At the paper's ``xi = 1e-6`` in float32
the gradient (norm ~3e-14) is rounding noise: its cosine with the float64 direction is ~0
(0.77 at ``xi = 1e-4``, 0.99996 at ``1e-2``). The released code, which also divides by
``norm + 1e-8``, therefore adds a perturbation of norm ~3e-6 instead of ``eps``. By default
the direction is normalised exactly (``|r| = eps``, the paper's description), which at
``xi = 1e-6`` amounts to a random direction; ``xi`` is an option (>= 1e-2 gives the
adversarial direction in float32).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from npsemiseg.frameworks.pseudo_labels import mode
from npsemiseg.models.segmentor import upsample_logits


def l2_normalize(d: Tensor, epsilon: float | None = None) -> Tensor:
    """``d [B, ...]`` divided by its L2 norm per batch element.

    ``epsilon``: the released code divides by ``norm + 1e-8``; None divides by the norm itself
    (0 stays 0), so the result has unit norm however small ``d`` is."""
    norm = d.flatten(1).norm(dim=1).view(-1, *([1] * (d.dim() - 1)))
    if epsilon is None:
        return d / norm.clamp_min(torch.finfo(d.dtype).tiny)
    return d / (norm + epsilon)


def ensemble_logits(classifiers: Sequence[Callable[[Tensor], Tensor]], features: Tensor, seed: int) -> Tensor:
    """Mean logits ``[B, K, h, w]`` of ``classifiers`` (each maps features to ``[S, B, K, h, w]``),
    every call drawing its random numbers from a generator seeded with ``seed``."""
    devices = [features.device] if features.device.type == "cuda" else []
    total = None
    for classify in classifiers:
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            logits = classify(features).mean(dim=0)
        total = logits if total is None else total + logits
    return total / len(classifiers)


def tvat_perturbation(
    features: Tensor,
    classifiers: Sequence[Callable[[Tensor], Tensor]],
    *,
    xi: float = 1e-6,
    eps: float = 2.0,
    iterations: int = 1,
    released_normalization: bool = False,
    parts: Sequence[int] | None = None,
) -> Tensor:
    """The T-VAT perturbation ``r [B, C, h, w]`` (detached) of ``features [B, C, h, w]``.

    ``parts``: batch sizes that sum to B, each searched on its own in order (its own random start and KL
    ``batchmean``), as the released code's one call per batch (labeled, then unlabeled); None: one search.

    ``classifiers``: the teachers' classifier halves (features -> per-sample logits), used
    in eval mode by the caller and not trained here (no parameter gradients are kept).
    ``released_normalization``: normalise the gradient by ``norm + 1e-8`` as the released code
    does. Its gradient is of order ``xi^2`` (the KL is quadratic around ``d = 0``), so at
    ``xi = 1e-6`` that makes ``|r|`` ~ 1e-4 eps, i.e. no perturbation; by default the direction
    is normalised exactly, so ``|r| = eps`` per image as the paper describes.
    """
    if iterations < 1:
        raise ValueError(f"iterations: expected >= 1, got {iterations}")
    if parts is not None:
        if sum(parts) != features.shape[0] or any(int(n) < 0 for n in parts):
            raise ValueError(f"parts: expected batch sizes summing to {features.shape[0]}, got {list(parts)}")
        return torch.cat([tvat_perturbation(chunk, classifiers, xi=xi, eps=eps, iterations=iterations,
                                            released_normalization=released_normalization)
                          for chunk in features.split([int(n) for n in parts]) if chunk.shape[0]], dim=0)
    f = features.detach()
    if f.dtype in (torch.float16, torch.bfloat16):
        f = f.float()
    seed = int(torch.randint(0, 2**62, (1,)).item())
    with torch.autocast(f.device.type, enabled=False):
        r = _power_iteration(f, classifiers, seed, xi=xi, iterations=iterations,
                              epsilon=1e-8 if released_normalization else None)
    return (eps * r).to(features.dtype).detach()


def _power_iteration(f: Tensor, classifiers: Sequence[Callable[[Tensor], Tensor]], seed: int, *, xi: float,
                     iterations: int, epsilon: float | None) -> Tensor:
    """The unit (per image) direction ``d`` after ``iterations`` power iterations from a random start."""
    with torch.no_grad():
        clean = torch.softmax(ensemble_logits(classifiers, f, seed), dim=1)
    d = l2_normalize(torch.rand_like(f) - 0.5, 1e-8)
    for _ in range(iterations):
        d = d.detach().requires_grad_(True)
        with torch.enable_grad():
            perturbed = ensemble_logits(classifiers, f + xi * d, seed)
            distance = F.kl_div(F.log_softmax(perturbed, dim=1), clean, reduction="batchmean")
            (grad,) = torch.autograd.grad(distance, d)
        d = l2_normalize(grad, epsilon)
    return d.detach()


def at_size(classify: Callable[[Tensor], Tensor], size: Sequence[int], *, align_corners: bool) -> Callable[[Tensor], Tensor]:
    """``classify`` with its logits ``[S, B, K, h, w]`` upsampled to ``size`` (the crop): the released
    decoder's T-VAT takes the KL between crop-size predictions."""
    def classify_at_size(features: Tensor) -> Tensor:
        return upsample_logits(classify(features), size, align_corners=align_corners)

    return classify_at_size


def frozen_classifier(model: nn.Module, **head_kwargs) -> Callable[[Tensor], Tensor]:
    """``features -> logits [S, B, K, h, w]`` through ``model.classify`` (a Segmentor's second half),
    with the model in eval mode during the call (PS-MT stops the teachers' BN and dropout)."""
    def classify(features: Tensor) -> Tensor:
        with mode(model, False):
            return model.classify(features, **head_kwargs).logits

    return classify
