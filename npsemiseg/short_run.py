"""The one rule that shortens the paper's time-dependent framework settings to a short run.

The mini-study (``jobs/specs/mini.yaml``, ``docs/learning.md``) keeps every framework and head setting of
the paper preset except those measured in time, which would otherwise mean something else in
a run of a few hundred steps. The rule: **a time-dependent setting keeps the share of the run
it has in the paper**, with two floors where the share would leave nothing:

* phases counted in epochs (``sup_only_epochs`` of MT / U2PL, ``warmup_epochs`` and
  ``rampup_epochs`` of PS-MT) are multiplied by ``run.epochs / paper.epochs``; whole-epoch
  phases are rounded, and a phase the paper has (>= 1 epoch) keeps at least one epoch;
* EMA decays (``ema_decay``; PS-MT's ``ema_keep_rate``): the teacher's horizon ``1 / (1 - d)``
  steps, which is also where the warm-up ``min(1 - 1/(k+1), d)`` ends, is multiplied by
  ``run.steps / paper.steps``, floored at ``MIN_EMA_HORIZON`` steps (a teacher averages at
  least that many steps) and never longer than the paper's: ``d = 1 - 1 / horizon``. Without
  it a short run's teacher stays near its initialisation (0.99^120 = 30 %, see
  ``docs/history/learning.md``) where the paper's has forgotten it;
* queue lengths (U2PL's ``queue_size``, ``background_queue_size``) keep their age in steps:
  multiplied by the ratio of pixels per step ``run.pixels_per_step / paper.pixels_per_step``
  (keys are sampled from the step's feature pixels), floored at ``MIN_QUEUE``.

The same idea for what is measured in pixels (:func:`scale_pixel_settings`): **a pixel-sized setting keeps
its size relative to the crop**. The strong views' blur (AugSeg's and PS-MT's sigma in [0.1, 2] pixels at
crops of ~500 px) is the one such setting of the frameworks' training; on 64 px images the paper's blur is 7.5
times wider relative to the image and erases what the study's classes are made of (``benchmarks/RESULTS.md``).
CutMix boxes, crops and the other intensity operations are relative or pixel-wise already.

The same idea for what is measured in channels (:func:`scale_np_widths`): **the NP head's latent and
deterministic paths keep their share of the NP decoder's input** where a run narrows the decoder. The NP decoder
reads the decoder's ``C`` feature channels concatenated with the two ``D``-channel paths (``latent_dim``); the paper
has ``C = 512`` (U2PL's DeepLabv3+: 256 ASPP + 256 low-level) and ``D = 32``, so the paths are
``2D / (C + 2D) = 64 / 576`` (11 %) of that input. A narrowed decoder keeps it with ``D = C x 32 / 512``, rounded
half up to a whole channel and at least 1 (the integer whose share is nearest the paper's). The paper preset
keeps its 32 (its cells are the paper's); only a spec that narrows the decoder applies the rule.

Nothing else changes (loss weights, thresholds, T-VAT, CutMix, heads). ``PAPER_VOC`` is the
paper's VOC classic 1/16 run (80 epochs of 874 iterations, 12 + 12 crops of 480 px).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from npsemiseg.constants import PAPER_BLUR_SIGMA

MIN_EMA_HORIZON = 10
MIN_QUEUE = 256
EPOCH_PHASES = ("sup_only_epochs", "warmup_epochs", "rampup_epochs")
EMA_DECAYS = ("ema_decay", "ema_keep_rate")
QUEUES = ("queue_size", "background_queue_size")
#: the paper's NP head: decoder features (U2PL's 256 ASPP + 256 low-level channels) and path width (``latent_dim``)
PAPER_NP_FEATURES = 512
PAPER_NP_LATENT_DIM = 32


@dataclass(frozen=True)
class RunLength:
    """How long a run is: total optimiser ``steps``, ``epochs`` (steps / iterations per epoch),
    ``pixels_per_step`` (labeled + unlabeled crops x crop area, all processes) and the ``crop_size``."""

    steps: int
    epochs: float
    pixels_per_step: int
    crop_size: int = 0

    @classmethod
    def of(cls, *, steps: int, iters_per_epoch: int, images_per_step: int, crop_size: int) -> RunLength:
        if min(steps, iters_per_epoch, images_per_step, crop_size) < 1:
            raise ValueError(f"RunLength.of: expected positive steps, iters_per_epoch, images_per_step and crop_size, "
                             f"got {steps}, {iters_per_epoch}, {images_per_step}, {crop_size}")
        return cls(steps, steps / iters_per_epoch, images_per_step * crop_size * crop_size, crop_size)


#: VOC classic 1/16: (10582 - 92) unlabeled / 12 per step = 874 iterations per epoch, 80 epochs
PAPER_VOC = RunLength.of(steps=80 * 874, iters_per_epoch=874, images_per_step=24, crop_size=480)


def scale_time_settings(options: Mapping[str, Any], run: RunLength, paper: RunLength = PAPER_VOC) -> dict[str, Any]:
    """``options`` (a framework's paper options) with the time-dependent ones scaled to ``run``.

    Returns only the changed keys (what a grid spec's ``cell_overrides`` sets).
    """
    epoch_share, step_share = run.epochs / paper.epochs, run.steps / paper.steps
    changed: dict[str, Any] = {}
    for key, value in options.items():
        if key in EPOCH_PHASES and value:
            scaled = value * epoch_share
            changed[key] = max(1, round(scaled)) if isinstance(value, int) else round(scaled, 4)
        elif key in EMA_DECAYS and 0 < value < 1:
            horizon = min(1 / (1 - value), max(MIN_EMA_HORIZON, step_share / (1 - value)))
            changed[key] = round(1 - 1 / horizon, 6)
        elif key in QUEUES:
            changed[key] = max(MIN_QUEUE, math.ceil(value * run.pixels_per_step / paper.pixels_per_step))
    return {k: v for k, v in changed.items() if v != options[k]}


def scale_pixel_settings(run: RunLength, paper: RunLength = PAPER_VOC) -> dict[str, Any]:
    """The ``data.augmentation`` settings measured in pixels, scaled by ``run``'s crop over ``paper``'s:
    ``{"blur_sigma": [min, max]}`` (rounded to 4 decimals; what a grid spec's ``overrides`` sets)."""
    ratio = run.crop_size / paper.crop_size
    return {"blur_sigma": [round(sigma * ratio, 4) for sigma in PAPER_BLUR_SIGMA]}


def scale_np_widths(feature_channels: int, *, paper_features: int = PAPER_NP_FEATURES,
                    paper_latent_dim: int = PAPER_NP_LATENT_DIM) -> dict[str, Any]:
    """The NP head's path width for a decoder of ``feature_channels`` output channels (the NP head's
    ``in_channels``, ``npsemiseg.models.feature_channels``): ``{"latent_dim": D}`` with
    ``D = feature_channels x paper_latent_dim / paper_features`` rounded half up, at least 1, so that the latent
    and deterministic paths keep the paper's share ``2D / (C + 2D)`` of the NP decoder's input (what a grid
    spec's ``cell_overrides`` sets as ``head.options.latent_dim`` for its NP cells)."""
    if feature_channels < 1:
        raise ValueError(f"scale_np_widths: expected a positive feature width, got {feature_channels}")
    return {"latent_dim": max(1, math.floor(feature_channels * paper_latent_dim / paper_features + 0.5))}
