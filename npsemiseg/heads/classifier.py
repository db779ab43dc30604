"""The plain classifier head (U2PL's classifier block) and its MC-dropout version.

Both heads use one block definition, ``ClassifierBlock``; they differ only in whether the
dropout layers stay active in ``eval()`` and in how many stochastic passes a call makes.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from .base import ClassifierHead, HeadOutput
from .specs import BaselineHeadSpec, MCDropoutHeadSpec


class MCDropout2d(nn.Dropout2d):
    """``Dropout2d`` that stays active in ``eval()`` (Monte-Carlo dropout)."""

    def forward(self, input: Tensor) -> Tensor:
        return F.dropout2d(input, self.p, training=True, inplace=self.inplace)


class ClassifierBlock(nn.Sequential):
    """U2PL's classifier: 3x3 conv -> 256, BN, ReLU, Dropout; 3x3 256 -> 256, BN, ReLU, Dropout; 1x1 -> K
    (256 = ``hidden_channels``, the head option that sizes it with a narrowed decoder).

    ``[N, C, h, w] -> [N, K, h, w]``. ``mc_dropout=True`` swaps in dropout that is active in
    ``eval()`` too (the paper's MC dropout: dropout after every activation).
    """

    def __init__(
        self,
        in_channels: int,
        num_classes: int,
        dropout: float = 0.1,
        *,
        hidden_channels: int = 256,
        mc_dropout: bool = False,
    ) -> None:
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout: expected a probability in [0, 1), got {dropout}")
        drop = MCDropout2d if mc_dropout else nn.Dropout2d
        super().__init__(
            nn.Conv2d(in_channels, hidden_channels, 3, padding=1),
            nn.BatchNorm2d(hidden_channels),
            nn.ReLU(inplace=True),
            drop(dropout),
            nn.Conv2d(hidden_channels, hidden_channels, 3, padding=1),
            nn.BatchNorm2d(hidden_channels),
            nn.ReLU(inplace=True),
            drop(dropout),
            nn.Conv2d(hidden_channels, num_classes, 1),
        )


class BaselineHead(BaselineHeadSpec, ClassifierHead):
    """The plain (deterministic in eval) classifier head: one prediction, ``logits [1, B, K, h, w]``.

    ``block``: :data:`BASELINE_BLOCKS` (``projection`` has no hidden layer: ``dropout`` and ``hidden_channels`` do
    not apply). Labels and context are accepted for the common contract and not used (shape-checked only).
    """

    #: whether the block's dropout stays active in eval()
    mc_dropout: bool = False

    def __init__(self, in_channels: int, num_classes: int, dropout: float = 0.1, hidden_channels: int = 256,
                 block: str = "u2pl") -> None:
        super().__init__(in_channels, num_classes)
        BaselineHead.check_values(dropout=dropout, hidden_channels=hidden_channels, block=block)
        self.dropout = dropout
        self.classifier: nn.Module = (nn.Conv2d(in_channels, num_classes, 1) if block == "projection" else
                                      ClassifierBlock(in_channels, num_classes, dropout, hidden_channels=hidden_channels,
                                                      mc_dropout=self.mc_dropout))

    def forward(
        self,
        features: Tensor,
        *,
        labels: Tensor | None = None,
        context_features: Tensor | None = None,
        context_labels: Tensor | None = None,
        num_samples: int | None = None,
    ) -> HeadOutput:
        """``features [B, C, h, w]`` -> ``HeadOutput(logits [1, B, K, h, w])``."""
        self.check_inputs(features, labels, context_features, context_labels)
        if num_samples not in (None, 1):
            raise ValueError(f"num_samples: the baseline head makes exactly 1 prediction, got {num_samples}")
        return HeadOutput(self.classifier(features)[None], self.zero_aux(features))


class MCDropoutHead(MCDropoutHeadSpec, BaselineHead):
    """The classifier block with dropout active in ``eval()``: T stochastic passes, ``logits [T, B, K, h, w]``.

    The T passes run one after the other on the B images (every layer, the first conv included,
    runs T times, as the paper's MC-dropout timing counts it; no T-fold copy of the features).
    A call in ``train()`` makes ``train_mode_passes`` passes (default 1: ordinary dropout training), in ``eval()``
    ``training_samples`` (T of its predictions while the run trains: a teacher's pseudo-labels); the T of every
    reported metric is the caller's (``evaluation.num_samples``).
    """

    mc_dropout = True

    def __init__(self, in_channels: int, num_classes: int, dropout: float = 0.1, training_samples: int = 5,
                 train_mode_passes: int = 1, hidden_channels: int = 256) -> None:
        self.check_values(dropout=dropout, training_samples=training_samples, train_mode_passes=train_mode_passes,
                          hidden_channels=hidden_channels)
        super().__init__(in_channels, num_classes, dropout, hidden_channels)
        self.training_samples = training_samples
        self.train_mode_passes = train_mode_passes

    @property
    def default_num_samples(self) -> int:  # type: ignore[override]
        return self.train_mode_passes if self.training else self.training_samples

    def forward(
        self,
        features: Tensor,
        *,
        labels: Tensor | None = None,
        context_features: Tensor | None = None,
        context_labels: Tensor | None = None,
        num_samples: int | None = None,
    ) -> HeadOutput:
        """``features [B, C, h, w]`` -> ``HeadOutput(logits [T, B, K, h, w])``."""
        self.check_inputs(features, labels, context_features, context_labels)
        t = self.resolve_num_samples(num_samples)
        logits = torch.stack([self.classifier(features) for _ in range(t)])
        return HeadOutput(logits, self.zero_aux(features))
