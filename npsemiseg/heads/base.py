"""The classifier-head contract shared by every head and every framework.

A head consumes the decoder feature map ``[B, C, h, w]`` and returns per-sample
logits ``[S, B, K, h, w]`` (S = 1 for the baseline, T for MC dropout and NP),
an auxiliary loss to add to the training loss (lambda_kl x KL for NP, zero
otherwise) and a dict of floats for logging. Prediction is the mean of the
per-sample softmaxes; uncertainty is the entropy of that mean.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from npsemiseg.constants import IGNORE_INDEX
from npsemiseg.heads.specs import HEADS, HeadSpec, check_choice  # noqa: F401  (the registry, here for the heads)


@dataclass
class HeadOutput:
    """What every head returns.

    logits: ``[S, B, K, h, w]`` per-sample logits at feature resolution.
    aux_loss: scalar tensor added to the training loss (lambda_kl x KL for NP, 0 otherwise).
    stats: values for logging (e.g. ``kl``, memory fill): floats or 0-dim tensors, which the training loop reads
    from the device together with the step's losses (no read of its own in the middle of a step).
    """

    logits: Tensor
    aux_loss: Tensor
    stats: dict[str, float | Tensor] = field(default_factory=dict)

    @property
    def num_samples(self) -> int:
        return self.logits.shape[0]


def predictive(logits: Tensor) -> tuple[Tensor, Tensor]:
    """Mean of the per-sample softmaxes and its entropy (natural log).

    logits: ``[S, B, K, h, w]``. Returns ``probs [B, K, h, w]`` and ``entropy [B, h, w]``.
    """
    if logits.dim() != 5:
        raise ValueError(f"logits: expected [S, B, K, h, w], got shape {tuple(logits.shape)}")
    probs = torch.softmax(logits.float(), dim=2).mean(dim=0)
    return probs, predictive_entropy(probs)


#: how :func:`predictive_entropy` takes the log of a probability: ``clamp`` = ``log(max(p, 1e-12))``, the entropy
#: of ``p`` at round-off (only terms with p < 1e-12, each below 3e-11, are changed); ``offset`` = ``log(p + 1e-10)``,
#: U2PL's (``u2pl/utils/loss_helper.py`` 35-36), AugSeg's (``train_semi.py`` 331) and the NP-SemiSeg authors'
#: (``U2PL/train_semi.py`` 499-500, ``AugSeg/train_semi.py`` 366), which moves every class's term by up to 1e-10
ENTROPY_LOGS = ("clamp", "offset")


def predictive_entropy(probs: Tensor, log: str = "clamp") -> Tensor:
    """Entropy (natural log) over the classes of ``probs [B, K, h, w]``: ``[B, h, w]``, the log taken as ``log``
    (:data:`ENTROPY_LOGS`) says."""
    if log not in ENTROPY_LOGS:
        raise ValueError(f"log: expected one of {list(ENTROPY_LOGS)}, got {log!r}")
    logs = torch.log(probs + 1e-10) if log == "offset" else torch.log(probs.clamp_min(1e-12))
    return -(probs * logs).sum(dim=1)


def gaussian_kl(mean_t: Tensor, sigma_t: Tensor, mean_c: Tensor, sigma_c: Tensor) -> Tensor:
    """KL(N(mean_t, sigma_t^2) || N(mean_c, sigma_c^2)) summed over the last (latent) dimension.

    All inputs ``[B, D]``, sigma a standard deviation (paper Eq. 6). Returns ``[B]``.
    """
    var_t, var_c = sigma_t.pow(2), sigma_c.pow(2)
    return 0.5 * (
        torch.log(var_c / var_t) + var_t / var_c - 1.0 + (mean_c - mean_t).pow(2) / var_c
    ).sum(dim=-1)


class ClassifierHead(HeadSpec, nn.Module):
    """Base class of the three heads: fixes the call signature of the contract; what a configuration reads of a
    head (label, options, paper settings) is its :class:`~npsemiseg.heads.specs.HeadSpec`.

    Subclasses implement ``forward(features, *, labels=None, context_features=None,
    context_labels=None, num_samples=None) -> HeadOutput``.
    """

    #: number of predictions a forward pass makes by default (S of the logits)
    default_num_samples: int = 1
    #: the training calls of one optimiser step (gradient accumulation, :func:`micro_batched_heads`): what a head
    #: takes in per step (the NP head's memory rows) it shares among them
    micro_batches: int = 1

    def __init__(self, in_channels: int, num_classes: int) -> None:
        super().__init__()
        if in_channels <= 0 or num_classes <= 1:
            raise ValueError(
                f"in_channels must be > 0 and num_classes > 1, got {in_channels}, {num_classes}"
            )
        self.in_channels = in_channels
        self.num_classes = num_classes

    def compiled_networks(self) -> list[nn.Module]:
        """The head's networks that ``runtime.compile`` compiles (``npsemiseg.models.compile``): its child modules
        (the classifier block; the NP head's query ConvNet, latent encoder and decoder). The head's own
        ``forward`` (input checks, the NP memories' updates) stays eager."""
        return list(self.children())

    def check_features(self, features: Tensor) -> None:
        if features.dim() != 4 or features.shape[1] != self.in_channels:
            raise ValueError(
                f"features: expected [B, {self.in_channels}, h, w], got shape {tuple(features.shape)}"
            )

    def zero_aux(self, features: Tensor) -> Tensor:
        return features.new_zeros((), dtype=torch.float32)

    def check_labels(self, labels: Tensor, features: Tensor, name: str = "labels") -> None:
        """Shape check of a label map against its features: ``[B, H, W]`` integers, same B.

        Cheap (no host sync); value checks are done by ``check_label_values`` where labels are used.
        """
        if labels.dim() != 3 or labels.is_floating_point() or labels.is_complex():
            raise ValueError(
                f"{name}: expected an integer label map [B, H, W], got {labels.dtype} of shape {tuple(labels.shape)}"
            )
        if labels.shape[0] != features.shape[0]:
            raise ValueError(
                f"{name}: batch size {labels.shape[0]} does not match the features' batch size {features.shape[0]}"
            )

    def check_inputs(self, features: Tensor, labels: Tensor | None = None, context_features: Tensor | None = None,
                     context_labels: Tensor | None = None) -> None:
        """Shape checks of a forward's tensors (:meth:`check_features`, :meth:`check_labels`): ``ValueError``
        naming the offending argument. A head's ``forward`` starts with it."""
        self.check_features(features)
        if labels is not None:
            self.check_labels(labels, features)
        if context_features is not None:
            self.check_features(context_features)
        if context_labels is not None:
            if context_features is None:
                raise ValueError("context_labels: given without context_features")
            self.check_labels(context_labels, context_features, "context_labels")

    def resolve_num_samples(self, num_samples: int | None) -> int:
        """``num_samples`` if given (must be >= 1), else the head's default for its current mode."""
        if num_samples is None:
            return self.default_num_samples
        if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
            raise ValueError(f"num_samples: expected a positive int, got {num_samples!r}")
        return num_samples


@dataclass(frozen=True)
class LabelCheck:
    """One deferred :func:`check_label_values`: ``summary`` = (count, min, max) of the values out of range, float32
    ``[3]`` on the labels' device (zeros when none), read later with the step's losses."""

    name: str
    num_classes: int
    summary: Tensor

    def raise_if_bad(self, count: float, low: float, high: float) -> None:
        """ValueError naming the labels, the range and the offending values' count and extent, if any."""
        if count > 0:
            raise ValueError(f"{self.name}: values must lie in [0, {self.num_classes}) or be {IGNORE_INDEX} (ignore), "
                             f"found {int(count)} that do not, from {int(low)} to {int(high)}")


_DEFERRED_CHECKS: contextvars.ContextVar[list[LabelCheck] | None] = contextvars.ContextVar("label_checks", default=None)


@contextlib.contextmanager
def deferred_label_checks() -> Iterator[list[LabelCheck]]:
    """Within it, :func:`check_label_values` reads nothing back: it appends a :class:`LabelCheck` to the list
    yielded, which the caller reads with its other device values (the training step: one transfer per step)."""
    checks: list[LabelCheck] = []
    token = _DEFERRED_CHECKS.set(checks)
    try:
        yield checks
    finally:
        _DEFERRED_CHECKS.reset(token)


@contextlib.contextmanager
def micro_batched_heads(models: Iterable[nn.Module], micro_batches: int) -> Iterator[None]:
    """Within it, every :class:`ClassifierHead` in ``models`` knows that an optimiser step is ``micro_batches``
    training calls (``micro_batches`` attribute; 1 again afterwards)."""
    heads = [m for model in models for m in model.modules() if isinstance(m, ClassifierHead)]
    for head in heads:
        head.micro_batches = micro_batches
    try:
        yield
    finally:
        for head in heads:
            head.micro_batches = 1


def check_label_values(labels: Tensor, num_classes: int, name: str = "labels") -> None:
    """ValueError unless every value is in ``[0, num_classes)`` or ``IGNORE_INDEX`` (one host sync); within
    :func:`deferred_label_checks`, no sync: the check is recorded there and raised when its caller reads it."""
    bad = (labels < 0) | ((labels >= num_classes) & (labels != IGNORE_INDEX))
    deferred = _DEFERRED_CHECKS.get()
    if deferred is not None:
        values = labels.detach().float()
        summary = torch.stack([bad.sum().float(), torch.where(bad, values, float("inf")).amin(),
                               torch.where(bad, values, float("-inf")).amax()])
        deferred.append(LabelCheck(name, num_classes, summary.nan_to_num(posinf=0.0, neginf=0.0)))  # none: inf -> 0
        return
    if bool(bad.any()):
        values = torch.unique(labels[bad])[:8].tolist()
        raise ValueError(
            f"{name}: values must lie in [0, {num_classes}) or be {IGNORE_INDEX} (ignore), found {values}"
        )


def downsample_labels(labels: Tensor, size: tuple[int, int]) -> Tensor:
    """Nearest-neighbour resize of integer label maps ``[B, H, W]`` to ``size`` = (h, w).

    Nearest (not area/bilinear) so every pixel keeps a real class or the ignore value.
    """
    if tuple(labels.shape[-2:]) == tuple(size):
        return labels
    resized = nn.functional.interpolate(labels[:, None].float(), size=size, mode="nearest")
    return resized[:, 0].to(labels.dtype)
