"""Segmentation and uncertainty metrics: confusion-matrix mIoU and PAvPU (and its class-balanced variant).

Both are accumulated as integer counts over batches (and DDP ranks), so a
dataset-level value is computed from summed counts, never as a mean of
per-image values.

Conventions: predictions and targets are int64 ``[B, H, W]`` at full
resolution; ``ignore_index`` (255) pixels of the target are left out of every
count.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import Tensor
from torch.nn import functional as F

from npsemiseg.constants import IGNORE_INDEX
from npsemiseg.label_maps import confusion_matrix


def all_reduce_sum(tensor: Tensor) -> Tensor:
    """The sum of ``tensor`` over all DDP ranks when torch.distributed is initialised.

    Returns ``tensor`` itself in a single process; otherwise a reduced copy on the
    device the backend needs (CUDA for NCCL, CPU for gloo).
    """
    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return tensor
    if dist.get_backend() == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
    reduced = tensor.to(device, copy=True)
    dist.all_reduce(reduced, op=dist.ReduceOp.SUM)
    return reduced


def iou_from_confusion(confusion: Tensor) -> tuple[float, Tensor]:
    """Per-class IoU and mIoU from a ``[K, K]`` confusion matrix.

    A class absent from both prediction and target (union 0) has IoU NaN and is
    left out of the mean. Returns ``(miou, per_class_iou [K] float64)``; mIoU is
    NaN when no class occurs at all.
    """
    confusion = confusion.double()
    intersection = confusion.diagonal()
    union = confusion.sum(0) + confusion.sum(1) - intersection
    per_class = torch.where(union > 0, intersection / union.clamp_min(1), torch.full_like(union, math.nan))
    present = union > 0
    miou = per_class[present].mean().item() if bool(present.any()) else math.nan
    return miou, per_class


def miou(pred: Tensor, target: Tensor, num_classes: int, ignore_index: int = IGNORE_INDEX) -> tuple[float, Tensor]:
    """mIoU of one set of maps (``[B, H, W]`` predicted classes vs targets).

    Returns ``(miou, per_class_iou [K])``; classes absent from both prediction and
    target are NaN in ``per_class_iou`` and left out of the mean.
    """
    return iou_from_confusion(confusion_matrix(pred, target, num_classes, ignore_index))


class ConfusionMatrix:
    """Accumulates a ``[K, K]`` confusion matrix over batches; reduces over DDP ranks.

    ``compute()`` gives ``miou``, ``pixel_acc`` and ``per_class_iou`` (a ``[K]`` tensor).
    """

    def __init__(self, num_classes: int, ignore_index: int = IGNORE_INDEX) -> None:
        if num_classes < 2:
            raise ValueError(f"num_classes: expected >= 2, got {num_classes}")
        self.num_classes = num_classes
        self.ignore_index = ignore_index
        self.confusion: Tensor | None = None

    def update(self, pred: Tensor, target: Tensor) -> None:
        """Add the counts of ``pred`` vs ``target`` (int ``[B, H, W]``)."""
        counts = confusion_matrix(pred, target, self.num_classes, self.ignore_index)
        self.confusion = counts if self.confusion is None else self.confusion + counts.to(self.confusion.device)

    def all_reduce(self) -> None:
        """Sum the counts over DDP ranks (every rank must call it, even one that saw no data)."""
        if self.confusion is None:
            self.confusion = torch.zeros(self.num_classes, self.num_classes, dtype=torch.int64)
        self.confusion = all_reduce_sum(self.confusion)

    def compute(self) -> dict:
        if self.confusion is None:
            raise ValueError("ConfusionMatrix.compute: no data was added (call update first)")
        miou_value, per_class = iou_from_confusion(self.confusion)
        total = self.confusion.sum().item()
        pixel_acc = self.confusion.diagonal().sum().item() / total if total else math.nan
        return {"miou": miou_value, "pixel_acc": pixel_acc, "per_class_iou": per_class}


# ---------------------------------------------------------------- PAvPU


def normalized_entropy(entropy: Tensor, num_classes: int) -> Tensor:
    """Entropy in nats divided by its maximum ``log K``, so it lies in ``[0, 1]``."""
    return entropy / math.log(num_classes)


def pavpu_counts(
    pred: Tensor,
    target: Tensor,
    uncertainty: Tensor,
    window: int = 64,
    accuracy_threshold: float = 0.5,
    uncertainty_threshold: float = 0.4,
    ignore_index: int = IGNORE_INDEX,
) -> Tensor:
    """Patch counts ``[n_ac, n_au, n_ic, n_iu]`` (int64) for PAvPU (Mukhoti & Gal, 2018).

    pred, target: int ``[B, H, W]``; uncertainty: float ``[B, H, W]``. The maps are
    tiled into non-overlapping ``window x window`` patches from the top-left corner;
    partial patches at the right/bottom edges are kept. Each patch is judged over its
    valid (target != ``ignore_index``) pixels only: accurate iff the fraction of
    correct valid pixels is >= ``accuracy_threshold``; uncertain iff the mean
    uncertainty of its valid pixels is >= ``uncertainty_threshold``. Patches with no
    valid pixel are excluded. a = accurate, i = inaccurate, c = certain, u = uncertain.
    """
    if pred.dim() != 3:
        raise ValueError(f"pred: expected [B, H, W], got shape {tuple(pred.shape)}")
    if uncertainty.shape != pred.shape or target.shape != pred.shape:
        raise ValueError(
            "pred, target, uncertainty: expected the same [B, H, W] shape, got "
            f"{tuple(pred.shape)}, {tuple(target.shape)}, {tuple(uncertainty.shape)}"
        )
    if not uncertainty.is_floating_point():
        raise ValueError(f"uncertainty: expected a float map, got dtype {uncertainty.dtype}")
    if window < 1:
        raise ValueError(f"window: expected >= 1, got {window}")
    valid = target != ignore_index
    # float64 so that thresholds met with equality are judged exactly for representable values
    per_pixel = torch.stack(
        [valid.double(), ((pred == target) & valid).double(), torch.where(valid, uncertainty.double(), 0.0)], dim=1
    )  # [B, 3, H, W]: valid, correct, uncertainty on valid pixels
    height, width = pred.shape[-2:]
    per_pixel = F.pad(per_pixel, (0, -width % window, 0, -height % window))
    patch_sums = F.avg_pool2d(per_pixel, window, stride=window, divisor_override=1)  # [B, 3, H', W']
    num_valid, num_correct, uncertainty_sum = patch_sums.unbind(dim=1)
    kept = num_valid > 0
    num_valid = num_valid.clamp_min(1)
    accurate = (num_correct / num_valid >= accuracy_threshold)[kept]
    uncertain = (uncertainty_sum / num_valid >= uncertainty_threshold)[kept]
    return torch.stack(
        [
            (accurate & ~uncertain).sum(),
            (accurate & uncertain).sum(),
            (~accurate & ~uncertain).sum(),
            (~accurate & uncertain).sum(),
        ]
    )


def pavpu_from_counts(counts: Tensor) -> float:
    """PAvPU = (n_ac + n_iu) / (n_ac + n_au + n_ic + n_iu); NaN with no patch."""
    n_ac, _, _, n_iu = counts.tolist()
    total = int(counts.sum())
    return (n_ac + n_iu) / total if total else math.nan


def pavpu_balanced_from_counts(counts: Tensor) -> float:
    """The class-balanced PAvPU: the mean of p(certain | accurate) = n_ac / (n_ac + n_au) and
    p(uncertain | inaccurate) = n_iu / (n_ic + n_iu), the two conditional rates Mukhoti & Gal report beside
    PAvPU. PAvPU itself is the accuracy of "certain = accurate" over patches, so when almost every patch is
    accurate (a good model, 64 x 64 patches) a head that is certain everywhere scores near 1 without finding
    any inaccurate patch; here each kind of patch weighs one half. NaN when no accurate or no inaccurate patch
    exists (a rate is undefined)."""
    n_ac, n_au, n_ic, n_iu = (float(c) for c in counts.tolist())
    if n_ac + n_au == 0 or n_ic + n_iu == 0:
        return math.nan
    return 0.5 * (n_ac / (n_ac + n_au) + n_iu / (n_ic + n_iu))


def pavpu(
    pred: Tensor,
    target: Tensor,
    uncertainty: Tensor,
    window: int = 64,
    accuracy_threshold: float = 0.5,
    uncertainty_threshold: float = 0.4,
    ignore_index: int = IGNORE_INDEX,
) -> float:
    """Patch Accuracy vs Patch Uncertainty of ``[B, H, W]`` maps, counts pooled over the batch.

    See ``pavpu_counts`` for how patches are formed and judged. ``uncertainty`` is used
    as given (the evaluation passes the entropy of the mean prediction, in nats, or
    that entropy / log K; see ``PAvPU``).
    """
    return pavpu_from_counts(
        pavpu_counts(pred, target, uncertainty, window, accuracy_threshold, uncertainty_threshold, ignore_index)
    )


class PAvPU:
    """Accumulates PAvPU patch counts over images (and DDP ranks).

    ``update(pred, target, entropy)`` takes the entropy of the mean prediction in nats;
    with ``normalize=True`` it is divided by ``log num_classes`` first. The choice is
    recorded in ``name`` (``"pavpu"`` or ``"pavpu_normalized"``), the key ``compute()``
    returns it under, beside the class-balanced variant ``<name>_balanced``
    (:func:`pavpu_balanced_from_counts`). The dataset values are ratios of summed counts.
    """

    def __init__(
        self,
        num_classes: int,
        *,
        normalize: bool = False,
        window: int = 64,
        accuracy_threshold: float = 0.5,
        uncertainty_threshold: float = 0.4,
        ignore_index: int = IGNORE_INDEX,
    ) -> None:
        self.num_classes = num_classes
        self.normalize = normalize
        self.window = window
        self.accuracy_threshold = accuracy_threshold
        self.uncertainty_threshold = uncertainty_threshold
        self.ignore_index = ignore_index
        self.counts: Tensor | None = None

    @property
    def name(self) -> str:
        return "pavpu_normalized" if self.normalize else "pavpu"

    def update(self, pred: Tensor, target: Tensor, entropy: Tensor) -> None:
        uncertainty = normalized_entropy(entropy, self.num_classes) if self.normalize else entropy
        counts = pavpu_counts(
            pred, target, uncertainty, self.window, self.accuracy_threshold, self.uncertainty_threshold,
            self.ignore_index,
        )
        self.counts = counts if self.counts is None else self.counts + counts.to(self.counts.device)

    def all_reduce(self) -> None:
        """Sum the counts over DDP ranks (every rank must call it)."""
        if self.counts is None:
            self.counts = torch.zeros(4, dtype=torch.int64)
        self.counts = all_reduce_sum(self.counts)

    def compute(self) -> dict[str, float]:
        if self.counts is None:
            raise ValueError("PAvPU.compute: no data was added (call update first)")
        return {self.name: pavpu_from_counts(self.counts),
                f"{self.name}_balanced": pavpu_balanced_from_counts(self.counts)}
