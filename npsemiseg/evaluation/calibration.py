"""Pixel-level calibration and error-detection metrics accumulated over a dataset.

Metrics (``Calibration.compute``): ECE with equal-width bins (``ece``) and with equal-mass bins
(``ece_adaptive``), NLL, Brier score, and how well the head's own uncertainty (the entropy of its
predictive: of the softmax for the baseline head, of the mean over T samples for MC dropout and
NP-SemiSeg) finds its wrong pixels: the AUROC and the AUPR of "the pixel is wrong" against the
uncertainty, and the AURC, the area under the risk-coverage curve (Geifman et al., 2019).

Everything is kept as sums and fixed-size histograms (float64 / int64 tensors), so batches, images
and DDP ranks combine by addition and the memory does not grow with the number of pixels:

- ``sums``: pixels, summed NLL, summed Brier score: NLL and Brier are exact;
- ``confidence_bins``: pixels, summed confidence and correct pixels per equal-width confidence bin
  (Guo et al., 2017: bin b holds ``(b/n, (b+1)/n]``): ``ece`` is exact;
- ``confidence_histogram``: the same three sums over ``fine_bins`` log-spaced bins of ``1 - confidence``
  (:func:`log_bin_index`): ``ece_adaptive`` groups whole fine bins into ``num_bins`` groups of (about)
  equal pixel count, so a group boundary can sit off the exact equal-mass boundary by at most one fine
  bin's pixels;
- ``uncertainty_histograms``: right and wrong pixels per log-spaced uncertainty bin over
  ``[0, uncertainty_max]`` (default ``log K``, the range of the entropy in nats). AUROC, AUPR and AURC
  treat the pixels of one bin as tied: each equals the exact value on the binned scores, and the
  exact value on the raw scores whenever no bin mixes distinct values (AUROC then differs by at most
  the fraction of wrong/right pairs that share a bin).

The log spacing (bin edges ``r * ((1 + max / r) ** (b / bins) - 1)``, ``r`` = ``resolution``) gives every
bin the same *relative* width (0.34 % with the defaults, 4096 bins, r = 1e-6) instead of the same
absolute width: a trained model puts most pixels at entropies and ``1 - confidence`` values near 0,
where equal-width bins would lump them together.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from npsemiseg.constants import IGNORE_INDEX
from npsemiseg.evaluation.metrics import all_reduce_sum

#: sum slots of ``Calibration.sums``
_PIXELS, _NLL, _BRIER = 0, 1, 2
#: the finest value the log-spaced histograms tell apart from 0
DEFAULT_RESOLUTION = 1e-6


def log_bin_index(values: Tensor, maximum: float, bins: int, resolution: float = DEFAULT_RESOLUTION) -> Tensor:
    """The log-spaced bin (int64, in ``[0, bins)``) of each value of ``values`` in ``[0, maximum]``; values
    outside are clamped into the end bins. Bin b covers ``[edge(b), edge(b + 1))``, :func:`log_bin_edges`."""
    scale = bins / math.log1p(maximum / resolution)
    index = torch.log1p(values.double().clamp_min(0) / resolution) * scale
    return index.long().clamp(0, bins - 1)


def log_bin_edges(maximum: float, bins: int, resolution: float = DEFAULT_RESOLUTION) -> Tensor:
    """The ``bins + 1`` edges (float64) of :func:`log_bin_index`'s bins: 0, ..., ``maximum``."""
    steps = torch.arange(bins + 1, dtype=torch.float64) / bins
    return resolution * torch.expm1(steps * math.log1p(maximum / resolution))


class Calibration:
    """Accumulates the module's metrics over the valid pixels of every update (see the module docstring).

    ``num_bins``: bins of both ECEs (15, Guo et al.); ``fine_bins``: log-spaced bins of ``1 - confidence``
    the equal-mass ECE is grouped from; ``uncertainty_bins``: log-spaced bins of the uncertainty.
    """

    def __init__(
        self,
        num_classes: int,
        *,
        num_bins: int = 15,
        fine_bins: int = 4096,
        uncertainty_bins: int = 4096,
        uncertainty_max: float | None = None,
        ignore_index: int = IGNORE_INDEX,
    ) -> None:
        if num_classes < 2:
            raise ValueError(f"num_classes: expected >= 2, got {num_classes}")
        if min(num_bins, fine_bins, uncertainty_bins) < 1:
            raise ValueError(f"num_bins, fine_bins, uncertainty_bins: expected >= 1, got {num_bins}, {fine_bins}, "
                             f"{uncertainty_bins}")
        self.num_classes = num_classes
        self.num_bins = num_bins
        self.fine_bins = fine_bins
        self.uncertainty_bins = uncertainty_bins
        self.uncertainty_max = math.log(num_classes) if uncertainty_max is None else float(uncertainty_max)
        if self.uncertainty_max <= 0:
            raise ValueError(f"uncertainty_max: expected > 0, got {uncertainty_max}")
        self.ignore_index = ignore_index
        self.reset()

    def reset(self) -> None:
        #: [3]: valid pixels, summed NLL, summed Brier score
        self.sums = torch.zeros(3, dtype=torch.float64)
        #: [3, num_bins]: pixels, summed confidence, correct pixels per equal-width confidence bin
        self.confidence_bins = torch.zeros(3, self.num_bins, dtype=torch.float64)
        #: [3, fine_bins]: the same sums per log-spaced bin of 1 - confidence (bin 0: confidence nearest 1)
        self.confidence_histogram = torch.zeros(3, self.fine_bins, dtype=torch.float64)
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

        per_pixel = torch.stack([torch.ones_like(confidence), confidence, correct.float()]).double()  # [3, N]
        bin_index = (torch.ceil(confidence * self.num_bins).long() - 1).clamp(0, self.num_bins - 1)
        self.confidence_bins.index_add_(1, bin_index, per_pixel)
        fine_index = log_bin_index(1 - confidence, 1.0, self.fine_bins)
        self.confidence_histogram.index_add_(1, fine_index, per_pixel)

        unc_index = log_bin_index(uncertainty, self.uncertainty_max, self.uncertainty_bins)
        flat = correct.logical_not().long() * self.uncertainty_bins + unc_index
        self.uncertainty_histograms += torch.bincount(flat, minlength=2 * self.uncertainty_bins).view(2, -1)

    def _accumulators(self) -> tuple[str, ...]:
        return "sums", "confidence_bins", "confidence_histogram", "uncertainty_histograms"

    def _to(self, device: torch.device) -> None:
        for name in self._accumulators():
            setattr(self, name, getattr(self, name).to(device))

    def all_reduce(self) -> None:
        """Sum the accumulators over DDP ranks (every rank must call it once)."""
        for name in self._accumulators():
            setattr(self, name, all_reduce_sum(getattr(self, name)))

    def reliability(self) -> dict[str, Tensor]:
        """Reliability-diagram data per equal-width confidence bin (CPU tensors ``[num_bins]``):
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
        """``ece``, ``ece_adaptive``, ``nll`` (mean over valid pixels, nats), ``brier`` (mean over valid pixels),
        ``auroc`` and ``aupr`` (NaN when every pixel is right or every pixel is wrong) and ``aurc``."""
        pixels, nll, brier = self.sums.tolist()
        if pixels == 0:
            raise ValueError("Calibration.compute: no valid pixel was added (call update first)")
        _, confidence_sum, correct_sum = self.confidence_bins
        ece = (confidence_sum - correct_sum).abs().sum().item() / pixels
        return {"ece": ece, "ece_adaptive": self.adaptive_ece(), "nll": nll / pixels, "brier": brier / pixels,
                "auroc": self.auroc(), "aupr": self.aupr(), "aurc": self.aurc()}

    def adaptive_ece(self) -> float:
        """ECE over ``num_bins`` equal-mass bins: the fine bins, in order of confidence, go whole to group
        ``floor(num_bins x pixels before them / pixels)``; sum over groups of |confidence - correct| / pixels."""
        count, confidence_sum, correct_sum = self.confidence_histogram.cpu().flip(1)  # ascending confidence
        pixels = count.sum()
        before = torch.cumsum(count, 0) - count
        group = (before * self.num_bins / pixels).floor().long().clamp(max=self.num_bins - 1)
        gap = torch.zeros(self.num_bins, dtype=torch.float64).index_add_(0, group, confidence_sum - correct_sum)
        return (gap.abs().sum() / pixels).item()

    def _error_histograms(self) -> tuple[Tensor, Tensor] | None:
        """(right, wrong) float64 CPU histograms by ascending uncertainty; None unless both are non-empty."""
        right, wrong = self.uncertainty_histograms.cpu().double()
        return (right, wrong) if right.sum() > 0 and wrong.sum() > 0 else None

    def auroc(self) -> float:
        """P(u_wrong > u_right) + P(u_wrong = u_right) / 2 from the binned histograms."""
        histograms = self._error_histograms()
        if histograms is None:
            return math.nan
        right, wrong = histograms
        right_below = torch.cumsum(right, 0) - right
        return ((wrong * (right_below + 0.5 * right)).sum() / (right.sum() * wrong.sum())).item()

    def aupr(self) -> float:
        """Average precision of "wrong" against the uncertainty (wrong pixels are the positives): the sum over
        thresholds (bins, most uncertain first) of the recall gained times the precision there, as
        ``sklearn.metrics.average_precision_score`` and torchmetrics' ``BinaryAveragePrecision`` compute it."""
        histograms = self._error_histograms()
        if histograms is None:
            return math.nan
        right, wrong = (h.flip(0) for h in histograms)  # most uncertain first
        true_positives, flagged = torch.cumsum(wrong, 0), torch.cumsum(right + wrong, 0)
        precision = true_positives / flagged.clamp_min(1)
        return ((wrong / wrong.sum()) * precision).sum().item()

    def risk_coverage(self) -> dict[str, Tensor]:
        """The risk-coverage curve (CPU float64 tensors, one point per non-empty uncertainty bin): keeping the
        pixels up to each bin, most certain first, the ``coverage`` (share of pixels kept) and the ``risk``
        (error rate among them)."""
        right, wrong = self.uncertainty_histograms.cpu().double()
        count = right + wrong
        kept = count > 0
        covered = torch.cumsum(count, 0)[kept]
        return {"coverage": covered / count.sum().clamp_min(1),
                "risk": torch.cumsum(wrong, 0)[kept] / covered.clamp_min(1)}

    def aurc(self) -> float:
        """Area under the risk-coverage curve: the sum over bins of the coverage gained times the risk after it
        (with one pixel per bin: the mean over k of the error rate of the k most certain pixels)."""
        curve = self.risk_coverage()
        gained = torch.diff(curve["coverage"], prepend=curve["coverage"].new_zeros(1))
        return (gained * curve["risk"]).sum().item()
