"""The unlabeled views a test batch gives FixMatch and UniMatch besides ``image`` and ``image_strong`` (what
``Framework.unlabeled_views`` asks the data pipeline for): a second strong view, the crop's padding mask and a second
augmentation draw (``*_mix``); other frameworks read none of them."""

from __future__ import annotations

import torch


def with_unimatch_views(unlabeled: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``unlabeled`` plus ``image_strong2`` (the strong view flipped vertically), ``padding`` (the last column) and
    every key again with suffix ``_mix`` (the batch rolled by one image: another view in the step's eyes)."""
    out = dict(unlabeled)
    out["image_strong2"] = out["image_strong"].flip(-2)
    padding = torch.zeros(out["image"].shape[0], *out["image"].shape[-2:], dtype=torch.bool)
    padding[..., -1] = True
    out["padding"] = padding
    out.update({f"{k}_mix": v.roll(1, dims=0) for k, v in list(out.items())})
    return out
