"""Pixel-wise losses shared by every framework: sample-aware cross-entropy, OHEM, masked means.

Heads return ``S`` predictions per pixel (``S = 1`` for the baseline, ``T`` for MC dropout
and NP). The cross-entropy over samples has two forms:

- ``"elbo"`` (default, the paper's ELBO, Eq. 8): mean over samples of the per-sample CE,
  ``(1/S) sum_s CE(logits_s, y)``.
- ``"mean_logits"`` (the authors' code, ``docs/deviations.md`` D4): CE of the
  logits averaged over samples, ``CE((1/S) sum_s logits_s, y)``.

Both coincide for ``S = 1``. Ignored pixels (``ignore_index``) contribute 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import get_args

import torch
import torch.nn.functional as F
from torch import Tensor

from npsemiseg.constants import IGNORE_INDEX, SampleCE
from npsemiseg.models import upsample_logits

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
        raise ValueError(f"logits: expected [S, B, K, H, W], got shape {tuple(logits.shape)}")
    if labels.dim() != 3 or labels.shape != (logits.shape[1], *logits.shape[3:]):
        raise ValueError(
            f"labels: expected [B, H, W] = {(logits.shape[1], *logits.shape[3:])} to match logits "
            f"{tuple(logits.shape)}, got shape {tuple(labels.shape)}"
        )


def pixel_cross_entropy(
    logits: Tensor, labels: Tensor, *, form: SampleCE = "elbo", ignore_index: int = IGNORE_INDEX
) -> Tensor:
    """Per-pixel cross-entropy over ``S`` predictions.

    logits: ``[S, B, K, H, W]`` already at label resolution; labels: ``[B, H, W]`` int64.
    Returns ``[B, H, W]`` float32, 0 where ``labels == ignore_index``.
    """
    _check_shapes(logits, labels)
    if form == "elbo":
        num_samples = logits.shape[0]
        flat = logits.flatten(0, 1).float()  # [S*B, K, H, W]
        target = labels.unsqueeze(0).expand(num_samples, *labels.shape).flatten(0, 1)
        per_sample = F.cross_entropy(flat, target, ignore_index=ignore_index, reduction="none")
        return per_sample.view(num_samples, *labels.shape).mean(dim=0)
    if form == "mean_logits":
        return F.cross_entropy(logits.float().mean(dim=0), labels, ignore_index=ignore_index, reduction="none")
    raise ValueError(f"form: expected one of {SAMPLE_CE_FORMS}, got {form!r}")


def masked_mean(values: Tensor, mask: Tensor) -> Tensor:
    """Mean of ``values [B, H, W]`` over pixels where ``mask [B, H, W]`` (bool) holds; 0 when none."""
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp_min(1.0)


def cross_entropy_loss(
    logits: Tensor, labels: Tensor, *, form: SampleCE = "elbo", ignore_index: int = IGNORE_INDEX
) -> Tensor:
    """Scalar CE averaged over the non-ignored pixels (0 when every pixel is ignored).

    logits ``[S, B, K, H, W]`` at label resolution, labels ``[B, H, W]``.
    """
    per_pixel = pixel_cross_entropy(logits, labels, form=form, ignore_index=ignore_index)
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
) -> Tensor:
    """CE averaged over the hard pixels that :func:`ohem_mask` keeps (Cityscapes' supervised loss).

    logits ``[S, B, K, H, W]`` at label resolution, labels ``[B, H, W]``. Hardness is judged by
    the predictive probability of the label (mean of the per-sample softmaxes; no gradient).
    """
    per_pixel = pixel_cross_entropy(logits, labels, form=form, ignore_index=ignore_index)
    valid = labels != ignore_index
    with torch.no_grad():
        probs = torch.softmax(logits.float(), dim=2).mean(dim=0)  # [B, K, H, W]
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
    size = tuple(labels.shape[-2:])

    def criterion(sample_logits: Tensor) -> Tensor:
        upsampled = upsample_logits(sample_logits, size, align_corners=align_corners)
        if ohem:
            return ohem_cross_entropy(upsampled, labels, thresh=ohem_thresh, min_kept=ohem_min_kept, form=sample_ce)
        return cross_entropy_loss(upsampled, labels, form=sample_ce)

    terms = {"sup": criterion(logits)}
    if aux_logits is not None and aux_weight > 0:
        terms["aux"] = aux_weight * criterion(aux_logits.unsqueeze(0))
    return terms
