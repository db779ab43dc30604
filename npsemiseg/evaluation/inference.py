"""Prediction with uncertainty under the evaluation protocols of the three frameworks.

Every mode makes T predictions (``num_samples``; the head's default when None),
upsamples each sample's logits to the evaluated size (``upsample_logits``, as
the frameworks do before their argmax) and returns the mean of the per-sample
softmaxes and its entropy in nats (``heads.predictive``).

Modes (``predict(..., mode=...)``):

- ``whole``: the whole image in one pass. With ``resize_multiple`` m (PS-MT's released VOC evaluation,
  VocCode/train.py 324-337), the image is first resized (bilinear, ``align_corners=True``) to the next
  multiples of m, ``ceil(H / m) m x ceil(W / m) m`` (``resize_rounding="nearest"``: the nearest multiples, UniMatch
  V2's), and each sample's logits at that size are resized back to ``H x W`` (bilinear, ``align_corners=True``)
  before the predictive.
- ``center_crop`` (the VOC convention, U2PL's ``Crop(type="center")``): a side
  shorter than the crop is padded to it, ``pad // 2`` before and the rest after,
  with the ImageNet mean colour (the value 0 after the normalisation U2PL pads
  in; images here are in [0, 1] and the Segmentor normalises, so padding with
  the mean is the same input); a side longer than the crop is center-cropped
  (offset ``(size - crop) // 2``) and the part outside the crop is not evaluated,
  as U2PL crops the label with it. The outputs cover the evaluated region:
  ``min(H, crop) x min(W, crop)``; ``center_crop(labels, crop_size)`` gives the
  matching labels.
- ``sliding``: overlapping windows, combined by a named scheme
  (``SLIDING_SCHEMES``): ``u2pl`` = 769 window, stride ceil(769 x 2/3) = 513,
  the last window shifted back inside the image, per-sample logits averaged by
  the number of windows covering a pixel; ``augseg`` = 800 window, stride 533,
  windows starting at every multiple of the stride below the image side and cut
  at the image border (also UniMatch's and FixMatch's evaluation), predictive
  probabilities summed (divided here by the count: same argmax, and still
  probabilities for the calibration metrics). With ``u2pl``'s placement a side
  shorter than the window is taken whole (no padding), so a window covering the
  image gives exactly the ``whole`` prediction; ``augseg``'s still starts a cut
  window at the stride where the side is longer than it, as the official loops.
- ``sliding_global``: ``sliding`` for the NP head with one latent per image:
  the latent samples and the deterministic (context) vector are inferred once
  from the whole image (downscaled to the area of one window, see
  ``global_latent``) and every window is decoded with them, so all windows share
  the image's global latent variable, which the paper's Limitations section
  names as what plain sliding evaluation loses.

``predict`` does not change the model's train/eval mode (``evaluate`` sets
eval); it runs under ``torch.inference_mode``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from npsemiseg.constants import sliding_stride
from npsemiseg.heads.base import predictive
from npsemiseg.models import IMAGENET_MEAN, logit_align_corners, upsample_logits

MODES = ("whole", "center_crop", "sliding", "sliding_global")


@dataclass(frozen=True)
class SlidingScheme:
    """How windows are placed and their predictions combined.

    placement: ``"shift"`` (the last window moved back to end at the border, all windows
    full-size) or ``"clip"`` (windows at multiples of the stride, cut at the border).
    combine: ``"logits"`` (per-sample logits averaged over windows, then the predictive) or
    ``"probs"`` (the predictive probabilities of each window averaged over windows).
    """

    window: int
    stride: int
    placement: Literal["shift", "clip"] = "shift"
    combine: Literal["logits", "probs"] = "logits"

    def __post_init__(self) -> None:
        if self.window < 1 or self.stride < 1:
            raise ValueError(f"window, stride: expected >= 1, got {self.window}, {self.stride}")
        if self.stride > self.window:
            raise ValueError(f"stride: expected <= window ({self.window}) so windows cover the image, got {self.stride}")
        if self.placement not in ("shift", "clip"):
            raise ValueError(f"placement: expected 'shift' or 'clip', got {self.placement!r}")
        if self.combine not in ("logits", "probs"):
            raise ValueError(f"combine: expected 'logits' or 'probs', got {self.combine!r}")


SLIDING_SCHEMES: dict[str, SlidingScheme] = {
    "u2pl": SlidingScheme(769, sliding_stride(769), "shift", "logits"),
    "augseg": SlidingScheme(800, int(800 * 2 / 3), "clip", "probs"),
    #: UniMatch V2's (supervised.py 47-63): 798 window, stride 532, the last window shifted back, softmaxes summed
    "unimatch_v2": SlidingScheme(798, int(798 * 2 / 3), "shift", "probs"),
}

#: VOC's evaluation crop (U2PL, AugSeg, PS-MT)
DEFAULT_CROP_SIZE = 513


def _pair(value: int | tuple[int, int], name: str) -> tuple[int, int]:
    pair = (value, value) if isinstance(value, int) else tuple(value)
    if len(pair) != 2 or any(not isinstance(v, int) or v < 1 for v in pair):
        raise ValueError(f"{name}: expected a positive int or (height, width), got {value!r}")
    return pair  # type: ignore[return-value]


# ---------------------------------------------------------------- geometry


def center_crop_box(height: int, width: int, crop_size: int | tuple[int, int]) -> tuple[int, int, int, int]:
    """``(top, left, h, w)`` of the region U2PL's center crop keeps of a ``height x width`` image.

    A side longer than the crop keeps ``crop`` pixels from offset ``(size - crop) // 2``;
    a shorter side is kept whole (it gets padded instead).
    """
    crop_h, crop_w = _pair(crop_size, "crop_size")
    h, w = min(height, crop_h), min(width, crop_w)
    return (height - h) // 2, (width - w) // 2, h, w


def center_crop(tensor: Tensor, crop_size: int | tuple[int, int]) -> Tensor:
    """The evaluated region of ``tensor [..., H, W]`` under ``center_crop`` (labels, images)."""
    top, left, h, w = center_crop_box(tensor.shape[-2], tensor.shape[-1], crop_size)
    return tensor[..., top : top + h, left : left + w]


def pad_to(images: Tensor, size: tuple[int, int], fill: tuple[float, ...] = IMAGENET_MEAN) -> tuple[Tensor, tuple[int, int]]:
    """Pad ``images [B, 3, H, W]`` to at least ``size`` with the colour ``fill``, split as U2PL does
    (``pad // 2`` before). Returns the padded images and the ``(top, left)`` offset of the original."""
    height, width = images.shape[-2:]
    out_h, out_w = max(size[0], height), max(size[1], width)
    if (out_h, out_w) == (height, width):
        return images, (0, 0)
    top, left = (out_h - height) // 2, (out_w - width) // 2
    colour = torch.tensor(fill, dtype=images.dtype, device=images.device).view(1, -1, 1, 1)
    padded = colour.expand(images.shape[0], images.shape[1], out_h, out_w).clone()
    padded[..., top : top + height, left : left + width] = images
    return padded, (top, left)


def window_starts(size: int, window: int, stride: int, placement: str) -> list[int]:
    """Start offsets of the windows along one side of length ``size``.

    ``shift``: ``ceil((size - window) / stride) + 1`` windows at ``i x stride``, the last moved
    back to end at ``size`` (U2PL); a side no longer than the window gets one window. ``clip``: every
    multiple of ``stride`` below ``size``, the windows cut at the border, whatever the window
    (AugSeg's ``validate_citys`` and UniMatch's ``evaluate``: ``while row < h: ...; row += stride``).
    """
    if placement == "clip":
        return list(range(0, size, stride))
    if size <= window:
        return [0]
    count = math.ceil((size - window) / stride) + 1
    return [min(i * stride, size - window) for i in range(count)]


def sliding_windows(height: int, width: int, scheme: SlidingScheme) -> list[tuple[slice, slice]]:
    """``(rows, cols)`` slices of every window of ``scheme`` over a ``height x width`` image, row-major."""
    rows = window_starts(height, scheme.window, scheme.stride, scheme.placement)
    cols = window_starts(width, scheme.window, scheme.stride, scheme.placement)
    return [
        (slice(top, min(top + scheme.window, height)), slice(left, min(left + scheme.window, width)))
        for top in rows
        for left in cols
    ]


# ---------------------------------------------------------------- prediction


def sample_logits(model: nn.Module, images: Tensor, num_samples: int | None, **forward_kwargs: Any) -> Tensor:
    """Per-sample logits of ``images [B, 3, H, W]`` upsampled to ``[S, B, K, H, W]`` (as the model says:
    :func:`~npsemiseg.models.logit_align_corners`)."""
    if num_samples is not None:
        forward_kwargs["num_samples"] = num_samples
    logits = model(images, **forward_kwargs).head.logits
    return upsample_logits(logits, images.shape[-2:], align_corners=logit_align_corners(model))


def probs_entropy(probs: Tensor) -> tuple[Tensor, Tensor]:
    """``(probs, entropy)`` of an already-averaged probability map ``[B, K, H, W]``, via ``predictive``
    on its log (softmax(log p) = p), so that one function defines the entropy."""
    return predictive(torch.log(probs.clamp_min(1e-12)).unsqueeze(0))


def global_scale_for(height: int, width: int, window: tuple[int, int]) -> float:
    """Default downscaling of the whole image for ``sliding_global``: to the area of one window
    (never up), so the latent costs about one more window pass."""
    return min(1.0, math.sqrt(window[0] * window[1] / (height * width)))


def global_latent(model: nn.Module, images: Tensor, num_samples: int | None, scale: float) -> Any:
    """The NP latent of the whole image: ``model.extract`` on ``images`` resized by ``scale``
    (bilinear, antialiased), then ``model.head.infer_latent`` (latent samples ``z [T, B, D]`` and
    deterministic vector ``r [B, D]`` from the stored centers)."""
    head = getattr(model, "head", None)
    if not hasattr(head, "infer_latent"):
        raise ValueError(
            f"mode: 'sliding_global' needs a head with infer_latent (the NP head), got {type(head).__name__}"
        )
    if not 0.0 < scale <= 1.0:
        raise ValueError(f"global_scale: expected a factor in (0, 1], got {scale}")
    if scale < 1.0:
        size = (max(1, round(images.shape[-2] * scale)), max(1, round(images.shape[-1] * scale)))
        images = F.interpolate(images, size=size, mode="bilinear", align_corners=False, antialias=True)
    features = model.extract(images)
    if num_samples is None:
        num_samples = head.default_num_samples
    return head.infer_latent(features, num_samples)


def resolve_scheme(
    scheme: str | SlidingScheme,
    crop_size: int | None,
    stride: int | None,
    placement: str | None,
    combine: str | None,
) -> SlidingScheme:
    """A named scheme (``SLIDING_SCHEMES``) with any of its fields overridden."""
    if isinstance(scheme, str):
        if scheme not in SLIDING_SCHEMES:
            raise ValueError(f"scheme: expected one of {sorted(SLIDING_SCHEMES)} or a SlidingScheme, got {scheme!r}")
        scheme = SLIDING_SCHEMES[scheme]
    window = scheme.window if crop_size is None else crop_size
    if not isinstance(window, int):
        raise ValueError(f"crop_size: sliding windows are square, expected an int, got {crop_size!r}")
    if stride is None:
        stride = scheme.stride if crop_size is None else sliding_stride(window)
    return SlidingScheme(window, stride, placement or scheme.placement, combine or scheme.combine)  # type: ignore[arg-type]


def _predict_sliding(
    model: nn.Module, images: Tensor, num_samples: int | None, scheme: SlidingScheme, latent: Any
) -> tuple[Tensor, Tensor]:
    height, width = images.shape[-2:]
    forward_kwargs = {} if latent is None else {"latent": latent}
    total: Tensor | None = None
    count = images.new_zeros(height, width)
    for rows, cols in sliding_windows(height, width, scheme):
        logits = sample_logits(model, images[..., rows, cols], num_samples, **forward_kwargs)
        window_value = logits if scheme.combine == "logits" else predictive(logits)[0]
        if total is None:
            total = window_value.new_zeros(*window_value.shape[:-2], height, width)
        total[..., rows, cols] += window_value
        count[rows, cols] += 1
    assert total is not None
    total /= count
    return predictive(total) if scheme.combine == "logits" else probs_entropy(total)


def _check_arguments(images: Tensor, mode: str, num_samples: int | None, resize_multiple: int | None) -> None:
    if images.dim() != 4 or images.shape[1] != 3:
        raise ValueError(f"images: expected [B, 3, H, W], got shape {tuple(images.shape)}")
    if mode not in MODES:
        raise ValueError(f"mode: expected one of {MODES}, got {mode!r}")
    if num_samples is not None and (isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1):
        raise ValueError(f"num_samples: expected a positive int or None, got {num_samples!r}")
    if resize_multiple is not None and (mode != "whole" or isinstance(resize_multiple, bool)
                                        or not isinstance(resize_multiple, int) or resize_multiple < 1):
        raise ValueError(f"resize_multiple: expected a positive int with mode 'whole', got {resize_multiple!r} "
                         f"with mode {mode!r}")


def resized_side(side: int, multiple: int, rounding: str = "up") -> int:
    """``side`` rounded to a multiple of ``multiple``: ``up`` (PS-MT's ``ceil``) or ``nearest`` (UniMatch V2's
    ``int(side / multiple + 0.5) x multiple``, supervised.py 75; at least one ``multiple``)."""
    if rounding == "up":
        return math.ceil(side / multiple) * multiple
    if rounding == "nearest":
        return max(multiple, int(side / multiple + 0.5) * multiple)
    raise ValueError(f"resize_rounding: expected 'up' or 'nearest', got {rounding!r}")


def _predict_whole(model: nn.Module, images: Tensor, num_samples: int | None,
                   resize_multiple: int | None, rounding: str = "up") -> tuple[Tensor, Tensor]:
    """The whole image, or resized to multiples of ``resize_multiple`` (:func:`resized_side`) and the logits
    resized back (PS-MT, UniMatch V2)."""
    if resize_multiple is None:
        return predictive(sample_logits(model, images, num_samples))
    height, width = images.shape[-2:]
    size = (resized_side(height, resize_multiple, rounding), resized_side(width, resize_multiple, rounding))
    resized = F.interpolate(images, size=size, mode="bilinear", align_corners=True)
    logits = sample_logits(model, resized, num_samples)
    return predictive(upsample_logits(logits, (height, width), align_corners=True))


@torch.inference_mode()
def predict(
    model: nn.Module,
    images: Tensor,
    *,
    mode: str = "whole",
    num_samples: int | None = None,
    crop_size: int | tuple[int, int] | None = None,
    stride: int | None = None,
    scheme: str | SlidingScheme = "u2pl",
    placement: str | None = None,
    combine: str | None = None,
    pad_fill: tuple[float, ...] = IMAGENET_MEAN,
    global_scale: float | None = None,
    resize_multiple: int | None = None,
    resize_rounding: str = "up",
) -> tuple[Tensor, Tensor]:
    """Predictive probabilities and entropy of ``images [B, 3, H, W]`` (in [0, 1]) under ``mode``.

    model: a ``Segmentor`` (``model(images, num_samples=..., latent=...)`` returns an output whose
    ``head.logits`` are ``[S, B, K, h, w]``). ``num_samples``: T (None = the head's default).
    center_crop: ``crop_size`` (default 513), ``pad_fill`` (default the ImageNet mean).
    sliding / sliding_global: ``scheme`` (``"u2pl"``, ``"augseg"`` or a ``SlidingScheme``) whose
    window (``crop_size``), ``stride``, ``placement`` and ``combine`` can be overridden (a window
    given without a stride gets stride ceil(2/3 window)); ``global_scale`` (sliding_global) resizes
    the whole image for the latent (default: to one window's area, ``global_scale_for``).
    whole: ``resize_multiple`` (None: none) resizes the image to multiples of it (``resize_rounding``: the next
    one ``up`` or the ``nearest``) and the logits back.

    Returns ``probs [B, K, H', W']`` and ``entropy [B, H', W']`` (nats), with ``H' x W'`` the
    image size, or for center_crop the evaluated region ``min(H, crop) x min(W, crop)``.
    """
    _check_arguments(images, mode, num_samples, resize_multiple)
    if mode == "whole":
        return _predict_whole(model, images, num_samples, resize_multiple, resize_rounding)

    if mode == "center_crop":
        crop = _pair(DEFAULT_CROP_SIZE if crop_size is None else crop_size, "crop_size")
        region = center_crop(images, crop)
        padded, (top, left) = pad_to(region, crop, pad_fill)
        logits = sample_logits(model, padded, num_samples)
        return predictive(logits[..., top : top + region.shape[-2], left : left + region.shape[-1]])

    sliding_scheme = resolve_scheme(scheme, crop_size, stride, placement, combine)  # type: ignore[arg-type]
    latent = None
    if mode == "sliding_global":
        window = (sliding_scheme.window, sliding_scheme.window)
        scale = global_scale_for(*images.shape[-2:], window) if global_scale is None else global_scale
        latent = global_latent(model, images, num_samples, scale)
    return _predict_sliding(model, images, num_samples, sliding_scheme, latent)
