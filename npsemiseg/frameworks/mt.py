"""Mean teacher in the shared U2PL/AugSeg trainer (``docs/frameworks.md``, "MT").

NP-SemiSeg never released its MT integration; of the two mean teachers it could mean this is the
shared-trainer one, chosen for a like-for-like comparison with U2PL and AugSeg (same crops, batches,
schedule and evaluation): the EMA teacher (decay 0.99) predicts on the weak unlabeled view;
its argmax is a hard pseudo-label; the unlabeled images, pseudo-labels and confidences are
CutMixed together (U2PL's half-area CutMix, probability 0.5) and the student is trained
with CE on the mixed view, weight 1 (averaged over the pseudo-labeled pixels).
``confidence_threshold`` > 0 ignores pixels whose (mixed) teacher confidence is below it
(0 = every pixel, the reference). As in the U2PL trainer, the first ``sup_only_epochs``
(``paper_options``: 1 on VOC, 0 on Cityscapes, U2PL's values) train on labeled images only,
with the teacher following the student.

``variant="cps"`` is the other, the MeanTeacher of CPS (TorchSemiSeg MeanTeacher config.py 73-107,
train.py 180-213) that the paper's MT rows come from: student and teacher (train mode: its BN uses
and updates batch statistics; EMA over parameters only) see the same weak labeled + unlabeled batch,
no CutMix; loss = supervised CE + ``mse_weight`` (100) x MSE(student softmax, teacher softmax) over
every pixel of both; no supervised-only epochs; the student is evaluated.

Teacher: EMA of the student's parameters, decay 0.99; the BN buffers are averaged too (the
teacher never runs in train mode, so it has no statistics of its own). With the NP head the
teacher copies the student's memories (``semi.py``); with MC dropout its pseudo-labels are
the mean of T passes.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import Tensor, nn

from npsemiseg.data.mixing import u2pl_cutmix
from npsemiseg.frameworks.base import FRAMEWORKS, Batch, FrameworkOptions, StepContext, StepResult
from npsemiseg.frameworks.losses import cross_entropy_loss
from npsemiseg.frameworks.semi import SemiSupervisedFramework, ignore_where, require_unlabeled, sup_only


class MTOptions(FrameworkOptions):
    """Mean teacher options (defaults = the shared-trainer MT, ``docs/frameworks.md``)."""

    ema_decay: float = Field(0.99, ge=0.0, le=1.0)
    unsup_weight: float = Field(1.0, ge=0.0)
    cutmix_prob: float = Field(0.5, ge=0.0, le=1.0)
    confidence_threshold: float = Field(0.0, ge=0.0, le=1.0)
    sup_only_epochs: int = Field(0, ge=0)
    variant: Literal["shared", "cps"] = "shared"
    mse_weight: float = Field(100.0, ge=0.0)


@FRAMEWORKS.register("mt")
class MeanTeacher(SemiSupervisedFramework):
    """Student + one EMA teacher; hard pseudo-labels on CutMixed unlabeled images."""

    name = "mt"
    Options = MTOptions
    #: CPS's MeanTeacher as run (TorchSemiSeg exp.voc/voc8.res50v3+.MeanTeacher): crop 512 (config.py 81-82), global
    #: batch 8 (script.sh ``batch_size=8``; dataloader.py 86-91 splits it over NGPUS=4: 2 labeled + 2 unlabeled per
    #: GPU; config.py's default 16 is overridden); it has no Cityscapes MeanTeacher config: U2PL's there
    publication_settings = {"voc": (512, 8), "cityscapes": (769, 16)}
    #: script.sh ``learning_rate=0.0025`` x world size 4 (train.py 91-93) = 0.01, one LR for backbone and head
    #: (train.py 95-100: ``group_weight(..., base_lr)`` for both; switch ``mt_single_lr``)
    publication_lr = {"voc": 1e-2}

    @classmethod
    def publication_epochs(cls, dataset: str, partition: str) -> int | None:
        """CPS's MeanTeacher: 34 epochs on VOC (TorchSemiSeg exp.voc/voc8.res50v3+.MeanTeacher config.py 102,
        ``C.nepochs = 34``); no Cityscapes MeanTeacher config (the shared 200 there)."""
        return None if dataset == "cityscapes" else 34

    @classmethod
    def paper_options(cls, dataset: str, partition: str) -> dict[str, Any]:
        """The shared U2PL trainer's schedule: one supervised-only epoch except on Cityscapes."""
        return MTOptions(sup_only_epochs=0 if dataset == "cityscapes" else 1).model_dump()

    def __init__(self, options, build_model, **collaborators: Any) -> None:
        super().__init__(options, build_model, **collaborators)
        if options.variant == "cps" and self.unlabeled_truth != "hidden":
            raise ValueError(f"data.unlabeled_truth={self.unlabeled_truth!r}: MT's cps variant has no pseudo-labels "
                             "(MSE between the softmaxes of student and teacher); expected 'hidden', or variant 'shared'")

    def eval_model(self) -> nn.Module:
        """The teacher; the student for the CPS variant (CPS evaluates its student)."""
        return self.student if self.options.variant == "cps" else self.teacher  # type: ignore[attr-defined]

    def train_step(self, batch: Batch, ctx: StepContext) -> StepResult:
        opts: MTOptions = self.options  # type: ignore[assignment]
        images_l, labels_l = batch.labeled["image"], batch.labeled["label"]
        if opts.variant == "cps":
            return self._cps_step(images_l, labels_l, require_unlabeled(batch, self.name)["image"], opts)
        if sup_only(ctx, opts.sup_only_epochs):
            student = self.labeled_pass(images_l, labels_l)
            return StepResult(self.supervised_terms(student, labels_l), self.step_logs(student))
        unlabeled = require_unlabeled(batch, self.name)
        images_u = unlabeled["image"]
        self.seed_memories(images_l, labels_l)

        teacher = self.predict_unlabeled(self.teacher, unlabeled)
        mixed = u2pl_cutmix(images_u, teacher.label, teacher.confidence, p=opts.cutmix_prob)
        pseudo = ignore_where(mixed.label, mixed.confidence < opts.confidence_threshold)

        student = self.student_pass(images_l, labels_l, mixed.image, pseudo)
        losses = self.supervised_terms(student, labels_l)
        losses["unsup"] = opts.unsup_weight * cross_entropy_loss(student.logits_u, pseudo, form=self.sample_ce)
        return StepResult(losses, self.step_logs(student, teacher_confidence=float(teacher.confidence.mean())))

    def _cps_step(self, images_l: Tensor, labels_l: Tensor, images_u: Tensor, opts: MTOptions) -> StepResult:
        """CPS's MeanTeacher: ``mse_weight`` x MSE between the student's and the train-mode teacher's softmaxes
        on the same weak labeled + unlabeled images ``[B, 3, H, W]`` each."""
        self.seed_memories(images_l, labels_l)
        teacher = self.predict(self.teacher, torch.cat([images_l, images_u]), train_mode=True)
        student = self.student_pass(images_l, labels_l, images_u, teacher.label[images_l.shape[0]:])
        probs = torch.cat([student.logits_l, student.logits_u], dim=1).float().softmax(dim=2).mean(dim=0)
        losses = self.supervised_terms(student, labels_l)
        losses["unsup"] = opts.mse_weight * F.mse_loss(probs, teacher.probs.float())
        return StepResult(losses, self.step_logs(student, teacher_confidence=float(teacher.confidence.mean())))

    def after_optimizer_step(self, ctx: StepContext) -> None:
        opts: MTOptions = self.options  # type: ignore[assignment]
        if opts.variant == "cps":  # parameters only: the train-mode teacher keeps its own BN statistics
            self.ema(self.teacher, opts.ema_decay, buffers="none")
            return
        if sup_only(ctx, opts.sup_only_epochs):
            self.reset_teacher(self.teacher)
        else:
            self.ema(self.teacher, opts.ema_decay, buffers="ema")
