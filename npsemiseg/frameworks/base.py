"""The framework contract: an SSL method is a training step over student and teacher models.

The single training loop (``npsemiseg.training``) owns data loading, the optimiser,
the schedule, AMP, gradient accumulation, gradient clipping, NaN checks, evaluation and checkpoints. A
framework owns only what differs between MT, PS-MT, U2PL, AugSeg and the
supervised reference: which models exist, how a batch becomes weighted loss terms,
and what happens after each optimiser step (EMA).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import Tensor, nn

from npsemiseg.frameworks.ema import unwrap
from npsemiseg.frameworks.losses import LossSettings
from npsemiseg.frameworks.specs.base import FRAMEWORKS, FrameworkOptions, FrameworkSpec  # noqa: F401  (here too)
from npsemiseg.models import logit_align_corners


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
    #: gradient accumulation (``schedule.accumulation_steps``): this call's micro-batch (0-based) of the
    #: ``micro_batches`` the optimiser step at ``step`` sums; ``step`` (and every schedule) is the optimiser step's
    micro_batch: int = 0
    micro_batches: int = 1


@dataclass
class StepResult:
    """Weighted loss terms (their sum is optimised) and extra values to log: floats, or 0-dim tensors that the
    loop reads from the device in one transfer with the loss terms (a read of its own would wait for the device)."""

    losses: dict[str, Tensor]
    logs: dict[str, float | Tensor] = field(default_factory=dict)

    @property
    def total(self) -> Tensor:
        return sum(self.losses.values())  # type: ignore[return-value]


def head_logs(stats: dict[str, float | Tensor]) -> dict[str, float | Tensor]:
    """The head's diagnostics (``HeadOutput.stats``) as step logs ``head/<name>``: apart from the
    loss terms (the NP head's raw ``kl`` is ``train/head/kl``; ``train/kl`` is the lambda_kl x KL term)."""
    return {f"head/{k}": v for k, v in stats.items()}


class Framework(FrameworkSpec):
    """Base class: a framework's training step. Built-in subclasses inherit their spec (``class U2PL(U2PLSpec,
    SemiSupervisedFramework)``: name, ``Options``, what a run of the framework needs, see
    :class:`~npsemiseg.frameworks.specs.base.FrameworkSpec`); a plug-in registers itself
    (``@FRAMEWORKS.register(name)``), sets ``name`` and ``Options`` and implements ``train_step``.

    Collaborators: ``build_model`` builds one fresh segmentor (student or teacher) per call, as many
    times as the framework needs models; ``num_classes`` K; ``loss`` the supervised-loss settings;
    ``unlabeled_truth`` what the unlabeled images' ground truth is used for (``data.unlabeled_truth``: ``hidden``,
    ``measured``, ``oracle``; see :meth:`~npsemiseg.frameworks.semi.SemiSupervisedFramework.predict_unlabeled`).
    """

    def __init__(self, options: FrameworkOptions, build_model: Callable[[], nn.Module], *, num_classes: int,
                 loss: LossSettings | None = None,
                 build_optimizer: Callable[[nn.Module], torch.optim.Optimizer] | None = None,
                 unlabeled_truth: Literal["hidden", "measured", "oracle"] = "hidden") -> None:
        if unlabeled_truth != "hidden" and not self.uses_unlabeled:
            raise ValueError(f"data.unlabeled_truth={unlabeled_truth!r}: the {self.name} framework uses no unlabeled "
                             "images; expected 'hidden' (the diagnostic is for the SSL frameworks' pseudo-labels)")
        self.options = options
        self.num_classes = num_classes
        self.unlabeled_truth = unlabeled_truth
        self.loss = loss if loss is not None else LossSettings()
        #: the run's optimizer over another model's parameters (PS-MT's released teacher warm-up trains its teachers)
        self.build_optimizer = build_optimizer
        self.student = build_model()
        #: the student's logit upsampling to label size (losses and teacher predictions use the same)
        self.align_corners = logit_align_corners(self.student)

    @classmethod
    def unlabeled_views(cls, options: Mapping[str, Any]) -> dict[str, Any]:
        """What the unlabeled stream's items carry beyond the weak view and one strong view, for the framework's
        ``options`` (keywords of ``npsemiseg.data.transforms.train_transform``: ``strong_views``, ``padding_mask``,
        ``draws``); none by default, so other frameworks' data stay as they are."""
        return {}

    @property
    def warmup_epochs(self) -> int:
        """The first epochs, whose steps read the labeled batch only (PS-MT's teacher warm-up); 0 by default. The data
        order ``cycled_labeled`` starts cycling after them, as PS-MT's loop does."""
        return 0

    @property
    def head_aux_term(self) -> str | None:
        """The loss term the head's ``aux_loss`` is optimised as (NP: ``kl``), None for heads without one."""
        return getattr(getattr(unwrap(self.student), "head", None), "aux_loss_term", None)

    def head_aux_losses(self, head_output: Any) -> dict[str, Tensor]:
        """``{aux_loss_term: head_output.aux_loss}`` for a head with an auxiliary loss, else ``{}``."""
        term = self.head_aux_term
        return {term: head_output.aux_loss} if term else {}

    def modules(self) -> dict[str, nn.Module]:
        """Every model the checkpoint must hold, by name (the student under ``student``)."""
        return {"student": self.student}

    def eval_model(self) -> nn.Module:
        """The model evaluated and used for inference (the teacher where there is one)."""
        return self.student

    def train_step(self, batch: Batch, ctx: StepContext) -> StepResult:
        """The weighted loss terms of ``batch``, each a mean over its images. Under gradient accumulation the loop
        calls it once per micro-batch of an optimiser step (``ctx.micro_batch`` of ``ctx.micro_batches``, the same
        ``ctx.step``) and sums the gradients of ``total / micro_batches``."""
        raise NotImplementedError

    @torch.no_grad()
    def after_optimizer_step(self, ctx: StepContext) -> None:
        """Called after every optimiser step (EMA updates), once per step whatever the micro-batches: what must move
        per optimiser step, not per ``train_step`` call, belongs here."""

    def state_dict(self) -> dict[str, Any]:
        """Extra state beyond ``modules()`` (queues, counters) for checkpoints."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state:
            raise ValueError(f"{type(self).__name__} holds no extra state, got keys {sorted(state)}")
