"""Pixel-wise losses shared by every framework: sample-aware cross-entropy, OHEM, masked means.

Heads return ``S`` predictions per pixel (``S = 1`` for the baseline, ``T`` for MC dropout
and NP). The cross-entropy over samples has two forms:

- ``"elbo"`` (default, the paper's ELBO, Eq. 8): mean over samples of the per-sample CE,
  ``(1/S) sum_s CE(logits_s, y)``.
- ``"mean_logits"`` (the authors' code, ``docs/deviations.md`` D4): CE of the
  logits averaged over samples, ``CE((1/S) sum_s logits_s, y)``.

Both coincide for ``S = 1``. Ignored pixels (``ignore_index``) contribute 0.

The logits may come at feature resolution: they are upsampled to the labels one sample at a time, and
backward recomputes each sample's upsampled logits, so ``[S, B, K, H, W]`` never lives in memory (at the
paper's crop of 480 and T = 5 that is 0.6 GB per copy, several copies per step).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import get_args

import torch
import torch.nn.functional as F
from torch import Tensor

from npsemiseg.constants import IGNORE_INDEX, SampleCE

SAMPLE_CE_FORMS: tuple[str, ...] = get_args(SampleCE)


@dataclass(frozen=True)
class LossSettings:
    """The supervised-loss settings a framework needs: the CE form over the S samples, OHEM, aux weight.

    The run configuration's ``head.sample_ce`` and ``loss`` section, as the framework sees them.
    """

    sample_ce: SampleCE = "elbo"
    ohem: bool = False
    ohem_thresh: float = 0.7
    ohem_min_kept: int = 100_000
    aux_weight: float = 0.4


def _check_shapes(logits: Tensor, labels: Tensor) -> None:
    if logits.dim() != 5:
        raise ValueError(f"logits: expected [S, B, K, h, w], got shape {tuple(logits.shape)}")
    if labels.dim() != 3 or labels.shape[0] != logits.shape[1]:
        raise ValueError(
            f"labels: expected [B, H, W] with B = {logits.shape[1]} to match logits {tuple(logits.shape)}, "
            f"got shape {tuple(labels.shape)}"
        )
    if any(small > large for small, large in zip(logits.shape[-2:], labels.shape[-2:])):
        raise ValueError(f"logits {tuple(logits.shape)}: expected at most the labels' size {tuple(labels.shape[-2:])}")


def _sample_logits(logits: Tensor, size: tuple[int, int], align_corners: bool) -> Tensor:
    """One sample's logits ``[B, K, h, w]`` in float32, upsampled to ``size`` where smaller."""
    logits = logits.float()
    if tuple(logits.shape[-2:]) == size:
        return logits
    return F.interpolate(logits, size=size, mode="bilinear", align_corners=align_corners)


def _upsample_backward(grad: Tensor, input_size: torch.Size, align_corners: bool) -> Tensor:
    """The adjoint of :func:`_sample_logits`' upsampling: ``grad [B, K, H, W]`` -> ``[B, K, h, w]``."""
    if tuple(grad.shape[-2:]) == tuple(input_size[-2:]):
        return grad
    return torch.ops.aten.upsample_bilinear2d_backward(
        grad, list(grad.shape[-2:]), list(input_size), align_corners, None, None)


class _SampleCrossEntropy(torch.autograd.Function):
    """Mean over samples of the per-sample CE of ``logits [S, B, K, h, w]`` upsampled to ``labels [B, H, W]``.

    Forward upsamples and scores one sample at a time and keeps only the feature-resolution logits;
    backward recomputes each sample's upsampled softmax: ``d CE / d logit = softmax - onehot``, then the
    upsampling's adjoint. Equal to upsample + ``F.cross_entropy`` + mean at float32 round-off.
    """

    @staticmethod
    def forward(ctx, logits: Tensor, labels: Tensor, align_corners: bool, ignore_index: int) -> Tensor:
        size = tuple(labels.shape[-2:])
        total = torch.zeros(labels.shape, dtype=torch.float32, device=logits.device)
        for sample in logits:
            total += F.cross_entropy(_sample_logits(sample, size, align_corners), labels,
                                     ignore_index=ignore_index, reduction="none")
        ctx.save_for_backward(logits, labels)
        ctx.align_corners, ctx.ignore_index = align_corners, ignore_index
        return total / logits.shape[0]

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor):
        logits, labels = ctx.saved_tensors
        size = tuple(labels.shape[-2:])
        valid = labels != ctx.ignore_index
        index = labels.masked_fill(~valid, 0).unsqueeze(1)  # [B, 1, H, W]
        weight = (grad.float() * valid / logits.shape[0]).unsqueeze(1)  # [B, 1, H, W]
        grad_logits = torch.empty_like(logits)
        for sample, grad_sample in zip(logits, grad_logits):
            probs = _sample_logits(sample, size, ctx.align_corners).softmax(dim=1)
            probs.scatter_add_(1, index, torch.full_like(index, -1.0, dtype=probs.dtype))
            grad_sample.copy_(_upsample_backward(probs.mul_(weight), sample.shape, ctx.align_corners))
        return grad_logits, None, None, None


def pixel_cross_entropy(
    logits: Tensor, labels: Tensor, *, form: SampleCE = "elbo", ignore_index: int = IGNORE_INDEX,
    align_corners: bool = False,
) -> Tensor:
    """Per-pixel cross-entropy over ``S`` predictions.

    logits: ``[S, B, K, h, w]`` at label resolution or smaller (then upsampled bilinearly, ``align_corners``
    as the model's, one sample at a time); labels: ``[B, H, W]`` int64.
    Returns ``[B, H, W]`` float32, 0 where ``labels == ignore_index``.
    """
    _check_shapes(logits, labels)
    if form == "elbo":
        return _SampleCrossEntropy.apply(logits, labels, align_corners, ignore_index)
    if form == "mean_logits":  # the mean commutes with the (linear) upsampling: upsample it once
        mean = logits.float().mean(dim=0)
        return F.cross_entropy(_sample_logits(mean, tuple(labels.shape[-2:]), align_corners), labels,
                               ignore_index=ignore_index, reduction="none")
    raise ValueError(f"form: expected one of {SAMPLE_CE_FORMS}, got {form!r}")


class _MeanSoftmax(torch.autograd.Function):
    """Mean over samples of the softmax of ``logits [S, B, K, h, w]`` upsampled to ``size``: ``[B, K, H, W]`` float32.

    Forward upsamples one sample at a time and keeps only the feature-resolution logits; backward recomputes each
    sample's upsampled softmax ``p``: ``d loss / d logit = p * (g - sum_k g p) / S``, then the upsampling's adjoint.
    """

    @staticmethod
    def forward(ctx, logits: Tensor, size: tuple[int, int], align_corners: bool) -> Tensor:
        total = None
        for sample in logits:
            probs = _sample_logits(sample, size, align_corners).softmax(dim=1)
            total = probs if total is None else total.add_(probs)
        ctx.save_for_backward(logits)
        ctx.size, ctx.align_corners = size, align_corners
        return total.div_(logits.shape[0])

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor):
        (logits,) = ctx.saved_tensors
        grad = grad.float() / logits.shape[0]
        grad_logits = torch.empty_like(logits)
        for sample, grad_sample in zip(logits, grad_logits):
            probs = _sample_logits(sample, ctx.size, ctx.align_corners).softmax(dim=1)
            inner = (grad * probs).sum(dim=1, keepdim=True)
            grad_sample.copy_(_upsample_backward(probs.mul_(grad - inner), sample.shape, ctx.align_corners))
        return grad_logits, None, None


def mean_softmax(logits: Tensor, size: tuple[int, int], *, align_corners: bool = False) -> Tensor:
    """Mean over samples of the softmax of ``logits [S, B, K, h, w]`` upsampled to ``size``: ``[B, K, H, W]``
    float32, differentiable, one sample at a time forward and backward (no ``[S, B, K, H, W]`` tensor exists)."""
    return _MeanSoftmax.apply(logits, tuple(size), align_corners)


def mean_probabilities(logits: Tensor, size: tuple[int, int], *, align_corners: bool = False) -> Tensor:
    """:func:`mean_softmax` without gradient (a teacher's predictive)."""
    with torch.no_grad():
        return mean_softmax(logits, size, align_corners=align_corners)


def masked_mean(values: Tensor, mask: Tensor) -> Tensor:
    """Mean of ``values [B, H, W]`` over pixels where ``mask [B, H, W]`` (bool) holds; 0 when none."""
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp_min(1.0)


def cross_entropy_loss(
    logits: Tensor, labels: Tensor, *, form: SampleCE = "elbo", ignore_index: int = IGNORE_INDEX,
    align_corners: bool = False,
) -> Tensor:
    """Scalar CE averaged over the non-ignored pixels (0 when every pixel is ignored).

    logits ``[S, B, K, h, w]`` at label resolution or smaller (:func:`pixel_cross_entropy`), labels ``[B, H, W]``.
    """
    per_pixel = pixel_cross_entropy(logits, labels, form=form, ignore_index=ignore_index, align_corners=align_corners)
    return masked_mean(per_pixel, labels != ignore_index)


def ohem_mask(
    label_probability: Tensor, valid: Tensor, *, thresh: float = 0.7, min_kept: int = 100_000
) -> Tensor:
    """Which pixels online hard example mining keeps (U2PL's ``ProbOhemCrossEntropy2d``).

    label_probability: ``[B, H, W]`` predicted probability of each pixel's label; valid:
    ``[B, H, W]`` bool. Keeps valid pixels whose probability is <= the threshold, where the
    threshold is ``thresh`` raised to the ``min_kept``-th smallest probability when fewer
    than ``min_kept`` pixels fall below ``thresh``. When ``min_kept`` exceeds the number of
    valid pixels every valid pixel is kept (as U2PL does). Returns ``[B, H, W]`` bool.
    """
    num_valid = int(valid.sum())
    if min_kept > num_valid or num_valid == 0:
        return valid
    probs = label_probability.masked_fill(~valid, 1.0).flatten()
    threshold = torch.tensor(thresh, dtype=probs.dtype, device=probs.device)
    if min_kept > 0:
        kth = torch.kthvalue(probs, min_kept).values
        threshold = torch.maximum(threshold, kth)
    return valid & (label_probability <= threshold)


def ohem_cross_entropy(
    logits: Tensor,
    labels: Tensor,
    *,
    thresh: float = 0.7,
    min_kept: int = 100_000,
    form: SampleCE = "elbo",
    ignore_index: int = IGNORE_INDEX,
    align_corners: bool = False,
) -> Tensor:
    """CE averaged over the hard pixels that :func:`ohem_mask` keeps (Cityscapes' supervised loss).

    logits ``[S, B, K, h, w]`` at label resolution or smaller (:func:`pixel_cross_entropy`), labels
    ``[B, H, W]``. Hardness is judged by the predictive probability of the label (mean of the per-sample
    softmaxes; no gradient).
    """
    per_pixel = pixel_cross_entropy(logits, labels, form=form, ignore_index=ignore_index, align_corners=align_corners)
    valid = labels != ignore_index
    with torch.no_grad():
        probs = mean_probabilities(logits, tuple(labels.shape[-2:]), align_corners=align_corners)  # [B, K, H, W]
        safe_labels = labels.masked_fill(~valid, 0)
        label_probability = probs.gather(1, safe_labels.unsqueeze(1)).squeeze(1)
        kept = ohem_mask(label_probability, valid, thresh=thresh, min_kept=min_kept)
    return masked_mean(per_pixel, kept)


def supervised_loss(
    logits: Tensor,
    aux_logits: Tensor | None,
    labels: Tensor,
    *,
    sample_ce: SampleCE = "elbo",
    ohem: bool = False,
    ohem_thresh: float = 0.7,
    ohem_min_kept: int = 100_000,
    aux_weight: float = 0.4,
    align_corners: bool = False,
) -> dict[str, Tensor]:
    """The supervised terms every framework uses on its labeled images.

    logits: ``[S, B, K, h, w]`` head logits at feature resolution (upsampled here to the labels);
    aux_logits: ``[B, K, h', w']`` of the layer-3 auxiliary head or None; labels ``[B, H, W]``.
    Returns ``{"sup": CE or OHEM CE}`` plus ``{"aux": aux_weight x the same loss on aux_logits}``
    when ``aux_logits`` is given (U2PL's Cityscapes criterion). ``align_corners``: the model's logit upsampling.
    """
    def criterion(sample_logits: Tensor) -> Tensor:
        if ohem:
            return ohem_cross_entropy(sample_logits, labels, thresh=ohem_thresh, min_kept=ohem_min_kept,
                                      form=sample_ce, align_corners=align_corners)
        return cross_entropy_loss(sample_logits, labels, form=sample_ce, align_corners=align_corners)

    terms = {"sup": criterion(logits)}
    if aux_logits is not None and aux_weight > 0:
        terms["aux"] = aux_weight * criterion(aux_logits.unsqueeze(0))
    return terms
