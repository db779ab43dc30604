"""Values every layer of the library shares (a leaf module: imports nothing of npsemiseg)."""

from __future__ import annotations

import math
from typing import Literal

#: label value of pixels that no loss or metric counts (VOC's outlines, Cityscapes' void, dropped pseudo-labels)
IGNORE_INDEX = 255

#: cross-entropy over the S predictions of a head: ``elbo`` (mean of per-sample CEs, the paper) or
#: ``mean_logits`` (CE of the mean logits, the authors' code)
SampleCE = Literal["elbo", "mean_logits"]

#: how the labeled and unlabeled streams are ordered (``data.order``): ``passes`` (each stream shuffled on its own,
#: the labeled images in whole passes, per seed and epoch) or one permutation both streams share per epoch, as the
#: official scripts' ``DistributedSampler``s (default seed 0, ``set_epoch``) give their two lists of one length:
#: ``shared_repeated`` (the labeled list repeated and truncated to the unlabeled list's length, UniMatch's
#: ``SemiDataset``) or ``shared_sampled`` (the repeated labeled list and the unlabeled list each drawn once per run
#: with ``random.sample`` seeded by the run's seed, U2PL's and AugSeg's ``voc_dset``) or ``shared_repeated_frozen``
#: (``shared_repeated`` whose unlabeled stream keeps epoch 0's permutation: TorchSemiSeg's ``train.py`` never gives
#: the unlabeled sampler its epoch); or ``cycled_labeled`` (``passes``, but after the framework's warm-up the labeled
#: stream replays its epoch's first pass, the same batches with the same augmentations, through the epoch: PS-MT's
#: ``zip(cycle(supervised_loader), unsupervised_loader)``)
DataOrder = Literal["passes", "shared_repeated", "shared_sampled", "shared_repeated_frozen", "cycled_labeled"]

#: the blur sigma range (pixels) of AugSeg's and PS-MT's strong views, at the papers' crops of ~500 px
PAPER_BLUR_SIGMA = (0.1, 2.0)

#: a training checkpoint directory's files: the weights and state, and the run's configuration (written by
#: ``npsemiseg.training.checkpoint``, read by ``npsemiseg.inference_model``, downloaded by name by the platform)
STATE_FILE, CONFIG_FILE = "state.pt", "config.yaml"

#: the value (and MLflow param) of an option or switch that does not apply to a cell
NOT_APPLICABLE = "n/a"


def sliding_stride(window: int) -> int:
    """The sliding-window stride at ``window`` px when none is given: ceil(2/3 x window) (U2PL's; 513 at 769)."""
    return math.ceil(window * 2 / 3)

#: the corruptions an evaluation under shift can apply (``evaluation.corruptions``;
#: ``npsemiseg.evaluation.corruptions`` says which albumentations transform and parameters each severity uses):
#: ImageNet-C's / Cityscapes-C's names where the corruption is theirs
CORRUPTIONS = ("gaussian_noise", "shot_noise", "impulse_noise", "defocus_blur", "glass_blur", "motion_blur",
               "zoom_blur", "gaussian_blur", "snow", "fog", "brightness", "contrast", "jpeg_compression", "pixelate")
#: ImageNet-C's five severities
CORRUPTION_SEVERITIES = (1, 2, 3, 4, 5)
