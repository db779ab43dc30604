"""Integer class maps: their validation and their confusion counts.

Here, below both, because evaluation (mIoU) and the frameworks' pseudo-label diagnostics count the same thing:
(true class, predicted class) pairs over the pixels whose truth is known.
"""

from __future__ import annotations

import torch
from torch import Tensor

from npsemiseg.constants import IGNORE_INDEX


def check_label_maps(pred: Tensor, target: Tensor, num_classes: int, ignore_index: int) -> None:
    """Raise ``ValueError`` unless ``pred`` and ``target`` are matching integer maps with valid values.

    ``pred`` holds classes in ``[0, num_classes)``; ``target`` the same or ``ignore_index``.
    """
    if num_classes < 2:
        raise ValueError(f"num_classes: expected >= 2, got {num_classes}")
    if pred.shape != target.shape:
        raise ValueError(
            f"pred and target: expected the same shape, got {tuple(pred.shape)} and {tuple(target.shape)}"
        )
    for name, tensor in (("pred", pred), ("target", target)):
        if tensor.is_floating_point() or tensor.is_complex() or tensor.dtype == torch.bool:
            raise ValueError(f"{name}: expected an integer class map, got dtype {tensor.dtype}")
    if pred.numel() and (pred.min() < 0 or pred.max() >= num_classes):
        raise ValueError(
            f"pred: expected classes in [0, {num_classes}), got range [{int(pred.min())}, {int(pred.max())}]"
        )
    bad = (target != ignore_index) & ((target < 0) | (target >= num_classes))
    if bad.any():
        raise ValueError(
            f"target: expected classes in [0, {num_classes}) or {ignore_index} (ignore), "
            f"got {int(target[bad][0])}"
        )


def confusion_matrix(pred: Tensor, target: Tensor, num_classes: int, ignore_index: int = IGNORE_INDEX) -> Tensor:
    """Counts of (target class, predicted class) over the valid pixels.

    pred, target: int ``[...]`` of the same shape. Returns int64 ``[K, K]`` on their
    device, rows = target class, columns = predicted class.
    """
    check_label_maps(pred, target, num_classes, ignore_index)
    valid = target != ignore_index
    index = target[valid].long() * num_classes + pred[valid].long()
    return torch.bincount(index, minlength=num_classes * num_classes).reshape(num_classes, num_classes)
