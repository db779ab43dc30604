"""Batch CutMix variants of U2PL, PS-MT and AugSeg (pure functions on batch tensors).

Every function takes ``image [B, 3, H, W]``, ``label [B, H, W]`` (ground truth or
pseudo-labels) and ``confidence [B, H, W]`` (or None), pastes boxes from partner images
into each image, and moves label and confidence with the pixels. All random draws use
the optional ``generator`` (torch's global RNG when None). Inputs are not modified.

``MixResult.mask [B, H, W]`` marks the pasted pixels and ``MixResult.source [B, H, W]``
says which image of the batch each output pixel comes from, so a framework can mix
further per-pixel tensors (teacher logits ``[B, K, H, W]``) the same way with ``mix_like``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class MixResult:
    """Mixed batch. mask ``[B, H, W]`` bool: pixel inside a pasted box; source ``[B, H, W]`` long:
    the batch index each output pixel was taken from (None for AugSeg's two-stage mix, whose
    pixels come from two different batches)."""

    image: Tensor
    label: Tensor
    confidence: Tensor | None
    mask: Tensor
    source: Tensor | None


def _check(image: Tensor, label: Tensor, confidence: Tensor | None) -> tuple[int, int, int]:
    if image.dim() != 4:
        raise ValueError(f"image: expected [B, C, H, W], got shape {tuple(image.shape)}")
    b, _, h, w = image.shape
    if label.shape != (b, h, w):
        raise ValueError(f"label: expected [B, H, W] = {(b, h, w)}, got {tuple(label.shape)}")
    if confidence is not None and confidence.shape != (b, h, w):
        raise ValueError(f"confidence: expected [B, H, W] = {(b, h, w)}, got {tuple(confidence.shape)}")
    return b, h, w


def _rand(generator: torch.Generator | None, *shape: int) -> Tensor:
    return torch.rand(shape, generator=generator)


def _randint(low: int, high: int, generator: torch.Generator | None, *shape: int) -> Tensor:
    """Integers uniform in [low, high) (high > low)."""
    return torch.randint(low, high, shape, generator=generator)


def sample_gamma(shape: float, generator: torch.Generator | None = None) -> float:
    """One Gamma(shape, 1) draw using ``generator`` (Marsaglia-Tsang)."""
    if shape <= 0:
        raise ValueError(f"shape must be > 0, got {shape}")
    if shape < 1:
        return sample_gamma(shape + 1, generator) * float(_rand(generator)) ** (1 / shape)
    d = shape - 1 / 3
    c = 1 / math.sqrt(9 * d)
    while True:
        x = float(torch.randn((), generator=generator))
        v = (1 + c * x) ** 3
        if v > 0 and math.log(max(float(_rand(generator)), 1e-300)) < 0.5 * x * x + d - d * v + d * math.log(v):
            return d * v


def sample_beta(a: float, b: float, generator: torch.Generator | None = None) -> float:
    """One Beta(a, b) draw using ``generator``."""
    x, y = sample_gamma(a, generator), sample_gamma(b, generator)
    return x / (x + y)


def box_mask(boxes: Tensor, height: int, width: int) -> Tensor:
    """boxes ``[B, 4]`` (y0, y1, x0, x1; half-open) -> bool ``[B, H, W]`` True inside."""
    ys = torch.arange(height, device=boxes.device)
    xs = torch.arange(width, device=boxes.device)
    rows = (ys >= boxes[:, 0:1]) & (ys < boxes[:, 1:2])
    cols = (xs >= boxes[:, 2:3]) & (xs < boxes[:, 3:4])
    return rows[:, :, None] & cols[:, None, :]


def cutmix_boxes(batch: int, height: int, width: int, lam: float,
                 generator: torch.Generator | None = None) -> Tensor:
    """PS-MT / AugSeg boxes: sides ``int(dim * sqrt(1 - lam))``, centre uniform in
    ``[int(dim / 8), dim)`` per image, box ``[c - side // 2, c + side // 2)`` clipped to the image.
    Returns ``[B, 4]`` (y0, y1, x0, x1).
    """
    ratio = math.sqrt(1.0 - lam)
    cut_h, cut_w = int(height * ratio), int(width * ratio)
    cy = _randint(height // 8, height, generator, batch)
    cx = _randint(width // 8, width, generator, batch)
    y0, y1 = (cy - cut_h // 2).clamp(0, height), (cy + cut_h // 2).clamp(0, height)
    x0, x1 = (cx - cut_w // 2).clamp(0, width), (cx + cut_w // 2).clamp(0, width)
    return torch.stack([y0, y1, x0, x1], dim=1)


def u2pl_boxes(batch: int, height: int, width: int, generator: torch.Generator | None = None) -> Tensor:
    """U2PL's ``generate_cutout_mask``: width w ~ U{W/2+1, ..., W-1}, height ``round(H*W/2 / w)``,
    position uniform inside the image; area ``w * round(HW / 2w)``, i.e. half the image up to
    rounding. Returns ``[B, 4]`` (y0, y1, x0, x1)."""
    low = width // 2 + 1
    w = _randint(low, width, generator, batch) if width > low else torch.full((batch,), width)
    h = torch.round(height * width / 2 / w.double()).long().clamp(1, height)
    x0 = (_rand(generator, batch) * (width - w + 1)).long()
    y0 = (_rand(generator, batch) * (height - h + 1)).long()
    return torch.stack([y0, y0 + h, x0, x0 + w], dim=1)


def mix_like(tensor: Tensor, source: Tensor) -> Tensor:
    """Mix another per-pixel tensor ``[B, ..., H, W]`` as a ``MixResult`` mixed its batch:
    output pixel (i, y, x) is ``tensor[source[i, y, x], ..., y, x]``. source ``[B, H, W]`` long."""
    index = source.to(tensor.device)
    index = index.view(index.shape[0], *([1] * (tensor.dim() - 3)), *index.shape[1:]).expand_as(tensor)
    return tensor.gather(0, index)


def _paste(image: Tensor, label: Tensor, confidence: Tensor | None, mask: Tensor, partner: Tensor) -> MixResult:
    """Pixels in ``mask [B, H, W]`` of image i come from image ``partner[i]`` (partner ``[B]``)."""
    own = torch.arange(mask.shape[0], device=mask.device).view(-1, 1, 1)
    source = torch.where(mask, partner.to(mask.device).view(-1, 1, 1), own)
    return _gather(image, label, confidence, mask, source)


def _gather(image: Tensor, label: Tensor, confidence: Tensor | None, mask: Tensor, source: Tensor) -> MixResult:
    return MixResult(
        image=mix_like(image, source), label=mix_like(label, source),
        confidence=None if confidence is None else mix_like(confidence, source),
        mask=mask, source=source,
    )


def u2pl_cutmix(image: Tensor, label: Tensor, confidence: Tensor | None = None, *, p: float = 0.5,
                generator: torch.Generator | None = None) -> MixResult:
    """U2PL: with probability ``p`` (once per batch) each image i gets a rectangle of half its
    area (``u2pl_boxes``) from image ``(i + 1) mod B``."""
    b, h, w = _check(image, label, confidence)
    if float(_rand(generator)) >= p:
        mask = torch.zeros(b, h, w, dtype=torch.bool, device=image.device)
    else:
        mask = box_mask(u2pl_boxes(b, h, w, generator).to(image.device), h, w)
    return _paste(image, label, confidence, mask, (torch.arange(b) + 1) % b)


#: PS-MT's box schemes: one box whose size follows lambda ~ Beta (its VOC code), several boxes of random proportions
#: (its Cityscapes code)
PSMT_BOX_SCHEMES = ("beta_box", "random_boxes")


def psmt_cutmix(image: Tensor, label: Tensor, confidence: Tensor | None = None, *, scheme: str = "beta_box",
                beta: float = 4.0, num_boxes: int = 3, prop_range: tuple[float, float] = (0.25, 0.5),
                generator: torch.Generator | None = None) -> MixResult:
    """PS-MT's CutMix among unlabeled images, in one of its two box schemes (:data:`PSMT_BOX_SCHEMES`).

    ``"beta_box"`` (PS-MT's VOC code, ``rand_bbox_1``): one box per image from partner ``perm(i)`` (a random
    permutation), lambda ~ Beta(beta, beta) once per batch (``cutmix_boxes``).
    ``"random_boxes"`` (its Cityscapes code, ``rand_bbox_2``): ``num_boxes`` boxes per image, each from its own
    partner drawn uniformly from the batch (with replacement) and pasted in order; box n covers
    ``prop / num_boxes`` of the image with prop ~ U(prop_range), a random aspect ratio (height
    fraction ``sqrt(1/n) prop^u``, width fraction ``sqrt(1/n) prop^(1-u)``, u ~ U[0, 1]) and a
    position uniform inside the image.
    """
    b, h, w = _check(image, label, confidence)
    if scheme not in PSMT_BOX_SCHEMES:
        raise ValueError(f"scheme: expected one of {list(PSMT_BOX_SCHEMES)}, got {scheme!r}")
    if scheme == "beta_box":
        partner = torch.randperm(b, generator=generator)
        boxes = cutmix_boxes(b, h, w, sample_beta(beta, beta, generator), generator)
        return _paste(image, label, confidence, box_mask(boxes, h, w).to(image.device), partner)
    source = torch.arange(b).view(b, 1, 1).expand(b, h, w).clone()
    mask = torch.zeros(b, h, w, dtype=torch.bool)
    partners = _randint(0, b, generator, num_boxes, b)
    fac = math.sqrt(1.0 / num_boxes)
    for n in range(num_boxes):
        prop = prop_range[0] + (prop_range[1] - prop_range[0]) * _rand(generator, b)
        split = _rand(generator, b)
        bh = torch.round(fac * prop.pow(split) * h).long().clamp(0, h)
        bw = torch.round(fac * prop.pow(1 - split) * w).long().clamp(0, w)
        y0 = torch.round((h - bh) * _rand(generator, b)).long()
        x0 = torch.round((w - bw) * _rand(generator, b)).long()
        box = box_mask(torch.stack([y0, y0 + bh, x0, x0 + bw], dim=1), h, w)
        source = torch.where(box, partners[n].view(b, 1, 1), source)
        mask |= box
    return _gather(image, label, confidence, mask.to(image.device), source.to(image.device))


def adaptive_confidence(probs: Tensor, entropy: Tensor) -> Tensor:
    """AugSeg's per-image confidence rho_i = mean over pixels of (1 - H(p) / log K) * max_k p_k.

    probs: teacher softmax ``[B, K, H, W]``; entropy: its entropy ``[B, H, W]`` (natural log; the caller's form of
    the log, ``npsemiseg.heads.base.predictive_entropy``). Returns ``[B]`` in [0, 1].
    """
    if probs.dim() != 4:
        raise ValueError(f"probs: expected [B, K, H, W], got shape {tuple(probs.shape)}")
    if entropy.shape != probs.shape[:1] + probs.shape[2:]:
        raise ValueError(f"entropy: expected [B, H, W] = {list(probs.shape[:1] + probs.shape[2:])}, got "
                         f"{list(entropy.shape)}")
    normalised = entropy / math.log(probs.shape[1])
    return ((1.0 - normalised) * probs.amax(dim=1)).mean(dim=(1, 2))


def augseg_cutmix(image: Tensor, label: Tensor, confidence: Tensor, labeled_image: Tensor,
                  labeled_label: Tensor, rho: Tensor, *, labeled_beta: tuple[float, float] = (8.0, 2.0),
                  beta: float = 4.0, generator: torch.Generator | None = None) -> MixResult:
    """AugSeg's adaptive two-stage CutMix of the unlabeled batch (its ``cut_mix_label_adaptive``).

    rho ``[B]``: ``adaptive_confidence`` of the teacher's probabilities. One permutation pi.
    Stage 1 builds a pool: with probability ``1 - rho_i`` unlabeled image i receives a box
    (lambda ~ Beta(8, 2) per batch) from labeled image ``pi(i) mod B_l`` with its ground truth
    and confidence 1. Stage 2 is ordinary CutMix (lambda ~ Beta(4, 4)): output image i is the
    original image i with a box taken from pool image ``pi(i)``. So low-confidence images
    lend their partners labeled content. labeled_image ``[B_l, 3, H, W]``, labeled_label
    ``[B_l, H, W]``. ``mask`` marks the stage-2 box; ``source`` is None.
    """
    b, h, w = _check(image, label, confidence)
    bl, _, _ = _check(labeled_image, labeled_label, None)
    if labeled_image.shape[1:] != image.shape[1:]:
        raise ValueError(f"labeled_image: expected [B_l, {image.shape[1]}, {h}, {w}], got {tuple(labeled_image.shape)}")
    if rho.shape != (b,):
        raise ValueError(f"rho: expected [B] = [{b}], got {tuple(rho.shape)}")
    perm = torch.randperm(b, generator=generator)
    boxes_l = cutmix_boxes(b, h, w, sample_beta(*labeled_beta, generator), generator)
    boxes_u = cutmix_boxes(b, h, w, sample_beta(beta, beta, generator), generator)
    use_labeled = _rand(generator, b) > rho.detach().float().cpu()

    device = image.device
    perm = perm.to(device)
    mask_l = (box_mask(boxes_l, h, w) & use_labeled.view(b, 1, 1)).to(device)
    partner_l = perm % bl
    pool_image = torch.where(mask_l[:, None], labeled_image[partner_l], image)
    pool_label = torch.where(mask_l, labeled_label[partner_l].to(label.dtype), label)
    pool_confidence = torch.where(mask_l, torch.ones_like(confidence), confidence)

    mask_u = box_mask(boxes_u, h, w).to(device)
    return MixResult(
        image=torch.where(mask_u[:, None], pool_image[perm], image),
        label=torch.where(mask_u, pool_label[perm], label),
        confidence=torch.where(mask_u, pool_confidence[perm], confidence),
        mask=mask_u, source=None,
    )
