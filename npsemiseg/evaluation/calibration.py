"""Pixel-level calibration metrics accumulated over a dataset: ECE, NLL, Brier, AUROC.

Everything is kept as sums and histograms (float64 / int64 tensors), so batches,
images and DDP ranks combine by addition and the dataset value is exact for
ECE, NLL and Brier.

AUROC of "the pixel is wrong" against its uncertainty is computed from two
histograms of the uncertainty (for wrong and for right pixels) with
``uncertainty_bins`` equal-width bins over ``[0, uncertainty_max]`` (default
4096 bins over ``[0, log K]``, the range of the entropy in nats; values outside
are clamped into the end bins). Pairs whose uncertainties fall in the same bin
count as ties (1/2), so the value equals the exact pairwise AUROC whenever no
bin mixes distinct values and differs from it by at most the fraction of
wrong/right pairs that share a bin otherwise.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from npsemiseg.constants import IGNORE_INDEX
from npsemiseg.evaluation.metrics import all_reduce_sum

#: sum slots of ``Calibration.sums``
_PIXELS, _NLL, _BRIER = 0, 1, 2


class Calibration:
    """Accumulates ECE (``num_bins`` equal-width bins of the max probability), NLL, Brier score
    (multi-class: sum over classes of the squared error, averaged over pixels) and the AUROC of
    wrong pixels against uncertainty, over the valid pixels of every update.

    ECE bins follow Guo et al. (2017): bin b holds confidences in ``(b/n, (b+1)/n]``.
    """

    def __init__(
        self,
        num_classes: int,
        *,
        num_bins: int = 15,
        uncertainty_bins: int = 4096,
        uncertainty_max: float | None = None,
        ignore_index: int = IGNORE_INDEX,
    ) -> None:
        if num_classes < 2:
            raise ValueError(f"num_classes: expected >= 2, got {num_classes}")
        if num_bins < 1 or uncertainty_bins < 1:
            raise ValueError(f"num_bins, uncertainty_bins: expected >= 1, got {num_bins}, {uncertainty_bins}")
        self.num_classes = num_classes
        self.num_bins = num_bins
        self.uncertainty_bins = uncertainty_bins
        self.uncertainty_max = math.log(num_classes) if uncertainty_max is None else float(uncertainty_max)
        if self.uncertainty_max <= 0:
            raise ValueError(f"uncertainty_max: expected > 0, got {uncertainty_max}")
        self.ignore_index = ignore_index
        self.reset()

    def reset(self) -> None:
        #: [3]: valid pixels, summed NLL, summed Brier score
        self.sums = torch.zeros(3, dtype=torch.float64)
        #: [3, num_bins]: pixels, summed confidence, correct pixels per confidence bin
        self.confidence_bins = torch.zeros(3, self.num_bins, dtype=torch.float64)
        #: [2, uncertainty_bins]: uncertainty histograms of right (row 0) and wrong (row 1) pixels
        self.uncertainty_histograms = torch.zeros(2, self.uncertainty_bins, dtype=torch.int64)

    def update(self, probs: Tensor, target: Tensor, uncertainty: Tensor) -> None:
        """probs: ``[B, K, H, W]`` predictive probabilities; target: int ``[B, H, W]``;
        uncertainty: ``[B, H, W]`` (the entropy of ``probs``, normally)."""
        if probs.dim() != 4 or probs.shape[1] != self.num_classes:
            raise ValueError(f"probs: expected [B, {self.num_classes}, H, W], got shape {tuple(probs.shape)}")
        expected = (probs.shape[0], *probs.shape[2:])
        if tuple(target.shape) != expected or tuple(uncertainty.shape) != expected:
            raise ValueError(
                f"target, uncertainty: expected shape {expected}, got {tuple(target.shape)}, {tuple(uncertainty.shape)}"
            )
        device = probs.device
        self._to(device)
        valid = target != self.ignore_index
        # per-pixel values in float32 (an [N, K] float64 copy of a Cityscapes image is 300 MB), sums in float64
        probs = probs.movedim(1, -1)[valid].float()  # [N, K]
        labels = target[valid].long()
        if labels.numel() and (labels.min() < 0 or labels.max() >= self.num_classes):
            raise ValueError(f"target: expected classes in [0, {self.num_classes}) or {self.ignore_index}")
        uncertainty = uncertainty[valid].float()

        confidence, prediction = probs.max(dim=1)
        correct = prediction == labels
        true_prob = probs.gather(1, labels[:, None]).squeeze(1)
        nll = -torch.log(true_prob.clamp_min(1e-12)).double().sum()
        brier = (probs.pow(2).sum(1) - 2 * true_prob + 1).double().sum()
        self.sums += torch.stack([torch.tensor(float(labels.numel()), dtype=torch.float64, device=device), nll, brier])

        bin_index = (torch.ceil(confidence * self.num_bins).long() - 1).clamp(0, self.num_bins - 1)
        for row, values in enumerate((torch.ones_like(confidence), confidence, correct.float())):
            self.confidence_bins[row].index_add_(0, bin_index, values.double())

        unc_index = (uncertainty / self.uncertainty_max * self.uncertainty_bins).long()
        unc_index = unc_index.clamp(0, self.uncertainty_bins - 1)
        flat = correct.logical_not().long() * self.uncertainty_bins + unc_index
        self.uncertainty_histograms += torch.bincount(flat, minlength=2 * self.uncertainty_bins).view(2, -1)

    def _to(self, device: torch.device) -> None:
        self.sums = self.sums.to(device)
        self.confidence_bins = self.confidence_bins.to(device)
        self.uncertainty_histograms = self.uncertainty_histograms.to(device)

    def all_reduce(self) -> None:
        """Sum the accumulators over DDP ranks (every rank must call it once)."""
        self.sums = all_reduce_sum(self.sums)
        self.confidence_bins = all_reduce_sum(self.confidence_bins)
        self.uncertainty_histograms = all_reduce_sum(self.uncertainty_histograms)

    def reliability(self) -> dict[str, Tensor]:
        """Reliability-diagram data per confidence bin (CPU tensors ``[num_bins]``):
        ``lower``/``upper`` bin edges, ``count``, mean ``confidence`` and ``accuracy`` (NaN when empty)."""
        count, confidence_sum, correct_sum = self.confidence_bins.cpu()
        edges = torch.linspace(0, 1, self.num_bins + 1, dtype=torch.float64)
        nonempty = count > 0
        nan = torch.full_like(count, math.nan)
        return {
            "lower": edges[:-1],
            "upper": edges[1:],
            "count": count,
            "confidence": torch.where(nonempty, confidence_sum / count.clamp_min(1), nan),
            "accuracy": torch.where(nonempty, correct_sum / count.clamp_min(1), nan),
        }

    def compute(self) -> dict[str, float]:
        """``ece``, ``nll`` (mean over valid pixels, nats), ``brier`` (mean over valid pixels) and ``auroc``
        (NaN when every pixel is right or every pixel is wrong)."""
        pixels, nll, brier = self.sums.tolist()
        if pixels == 0:
            raise ValueError("Calibration.compute: no valid pixel was added (call update first)")
        count, confidence_sum, correct_sum = self.confidence_bins
        ece = (confidence_sum - correct_sum).abs().sum().item() / pixels
        return {"ece": ece, "nll": nll / pixels, "brier": brier / pixels, "auroc": self.auroc()}

    def auroc(self) -> float:
        """P(u_wrong > u_right) + P(u_wrong = u_right) / 2 from the binned histograms."""
        right, wrong = self.uncertainty_histograms.double()
        num_right, num_wrong = right.sum().item(), wrong.sum().item()
        if num_right == 0 or num_wrong == 0:
            return math.nan
        right_below = torch.cumsum(right, 0) - right
        return ((wrong * (right_below + 0.5 * right)).sum().item()) / (num_right * num_wrong)
