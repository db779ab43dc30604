"""The framework contract: an SSL method is a training step over student and teacher models.

The single training loop (``npsemiseg.training``) owns data loading, the optimiser,
the schedule, AMP, gradient clipping, NaN checks, evaluation and checkpoints. A
framework owns only what differs between MT, PS-MT, U2PL, AugSeg and the
supervised reference: which models exist, how a batch becomes weighted loss terms,
and what happens after each optimiser step (EMA).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

import torch
from pydantic import BaseModel, ConfigDict
from torch import Tensor, nn


class FrameworkOptions(BaseModel):
    """Base of each framework's own options (validated, unknown keys rejected)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


@dataclass
class Batch:
    """One training iteration's data.

    labeled: ``image [B, 3, H, W]`` float in [0, 1], ``label [B, H, W]`` int64 (255 = ignore).
    unlabeled: ``image [B_u, 3, H, W]`` (weak view) and, when the data pipeline makes one,
    ``image_strong [B_u, 3, H, W]``; None for frameworks that use no unlabeled data.
    """

    labeled: dict[str, Tensor]
    unlabeled: dict[str, Tensor] | None = None


@dataclass
class StepContext:
    """Where the run is, for schedules (ramp-ups, percentile and EMA schedules)."""

    step: int  # 0-based global iteration
    total_steps: int
    epoch: int  # 0-based, = step // iters_per_epoch
    total_epochs: int
    iters_per_epoch: int


@dataclass
class StepResult:
    """Weighted loss terms (their sum is optimised) and extra floats to log."""

    losses: dict[str, Tensor]
    logs: dict[str, float] = field(default_factory=dict)

    @property
    def total(self) -> Tensor:
        return sum(self.losses.values())  # type: ignore[return-value]


def head_logs(stats: dict[str, float]) -> dict[str, float]:
    """The head's diagnostics (``HeadOutput.stats``) as step logs ``head/<name>``: apart from the
    loss terms (the NP head's raw ``kl`` is ``train/head/kl``; ``train/kl`` is the lambda_kl x KL term)."""
    return {f"head/{k}": float(v) for k, v in stats.items()}


class Framework:
    """Base class: subclasses set ``name`` and ``Options`` and implement ``train_step``.

    ``build_model`` builds one fresh segmentor (student or teacher) from the run config;
    the framework calls it as many times as it needs models.
    """

    name: ClassVar[str] = ""
    Options: ClassVar[type[FrameworkOptions]] = FrameworkOptions
    #: False for the supervised reference: the loop then loads no unlabeled data
    uses_unlabeled: ClassVar[bool] = True

    def __init__(self, options: FrameworkOptions, build_model: Callable[[], nn.Module], *, num_classes: int, config: Any = None) -> None:
        self.options = options
        self.num_classes = num_classes
        self.config = config
        self.student = build_model()

    @classmethod
    def paper_options(cls, dataset: str, partition: str) -> dict[str, Any]:
        """The paper's settings of this framework's options for one dataset x partition."""
        return {}

    def modules(self) -> dict[str, nn.Module]:
        """Every model the checkpoint must hold, by name (the student under ``student``)."""
        return {"student": self.student}

    def eval_model(self) -> nn.Module:
        """The model evaluated and used for inference (the teacher where there is one)."""
        return self.student

    def train_step(self, batch: Batch, ctx: StepContext) -> StepResult:
        raise NotImplementedError

    @torch.no_grad()
    def after_optimizer_step(self, ctx: StepContext) -> None:
        """Called after every optimiser step (EMA updates)."""

    def state_dict(self) -> dict[str, Any]:
        """Extra state beyond ``modules()`` (queues, counters) for checkpoints."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state:
            raise ValueError(f"{type(self).__name__} holds no extra state, got keys {sorted(state)}")
