"""CPS's MeanTeacher, as TorchSemiSeg runs it (``docs/frameworks.md``, "MT"): the MT of the paper's rows.

TorchSemiSeg exp.voc/voc8.res50v3+.MeanTeacher config.py 73-107, train.py 180-213: student and teacher see the
same weak labeled + unlabeled batch, no CutMix and no strong view; loss = supervised CE + ``mse_weight`` (100) x
MSE(student softmax, teacher softmax) over every pixel of both; no supervised-only epochs. The teacher runs in
train mode (its BN uses and updates batch statistics) and follows the student by EMA of its parameters only
(decay 0.99; it keeps its own BN statistics); the student is evaluated. With the NP head the teacher copies the
student's memories (``semi.py``).

Released step (options ``passes``, ``ema_timing``, ``train_dropout``; switches ``mt_cps_split_passes``,
``mt_cps_ema_before_unlabeled``, ``mt_cps_no_dropout``): TorchSemiSeg's train.py 180-181 calls the network twice, the
labeled half then the unlabeled half, so every BatchNorm of student and teacher normalises each half with its own
statistics (``passes="split"``); its network.py 39-41 updates the teacher by EMA inside the labeled call, from the
student's parameters before this step's optimiser step, so the teacher that predicts the unlabeled half is already
updated (``ema_timing="before_unlabeled"``); its Network has no dropout (``train_dropout=False`` replaces every
train-only ``Dropout2d`` of the models by an identity; MC dropout stays). ``passes="joint"`` / ``ema_timing=
"after_step"`` / ``train_dropout=True`` is one pass over both halves with the EMA after the optimiser step. With
the NP head, split passes run the backbone and decoder per half and the head once on both (its context is the
labeled half).

Protocol switch ``mt_framework`` runs it for the cells asked as ``mt`` under ``released`` (the shared-trainer mean
teacher, ``mt.py``, under ``corrected``); asked for by name (``mt_cps``) it runs under either protocol.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from npsemiseg.frameworks.base import Batch, StepContext, StepResult
from npsemiseg.frameworks.ema import unwrap
from npsemiseg.frameworks.losses import mean_softmax
from npsemiseg.frameworks.specs.mt_cps import CPSMeanTeacherOptions, CPSMeanTeacherSpec  # noqa: F401
from npsemiseg.frameworks.semi import SemiSupervisedFramework, StudentPass, require_unlabeled
from npsemiseg.heads.base import HeadOutput
from npsemiseg.models import SegmentorOutput


class CPSMeanTeacher(CPSMeanTeacherSpec, SemiSupervisedFramework):
    """Student + one train-mode EMA teacher; MSE between their softmaxes on the same weak batch."""

    def __init__(self, options, build_model, **collaborators: Any) -> None:
        super().__init__(options, build_model, **collaborators)
        if self.unlabeled_truth != "hidden":
            raise ValueError(f"data.unlabeled_truth={self.unlabeled_truth!r}: the {self.name} framework has no "
                             "pseudo-labels (MSE between the softmaxes of student and teacher); expected 'hidden', "
                             "or framework 'mt'")
        if not options.train_dropout:
            for model in self.modules().values():
                remove_train_dropout(model)

    def eval_model(self) -> nn.Module:
        """The student (CPS evaluates its student)."""
        return self.student

    def train_step(self, batch: Batch, ctx: StepContext) -> StepResult:
        """``mse_weight`` x MSE between the student's and the train-mode teacher's softmaxes on the same weak
        labeled + unlabeled images ``[B, 3, H, W]`` each (one forward or two, ``passes``)."""
        opts: CPSMeanTeacherOptions = self.options  # type: ignore[assignment]
        images_l, labels_l = batch.labeled["image"], batch.labeled["label"]
        images_u = require_unlabeled(batch, self.name)["image"]
        self.seed_memories(images_l, labels_l)
        # the released EMA inside the step: once per optimiser step, in its first micro-batch (gradient accumulation)
        ema_here = opts.ema_timing == "before_unlabeled" and ctx.micro_batch == 0
        if opts.passes == "split":
            student, teacher_probs, confidence = self._split_passes(images_l, labels_l, images_u, ema_here)
        else:
            if ema_here:
                self._ema_step()
            teacher = self.predict(self.teacher, torch.cat([images_l, images_u]), train_mode=True)
            student = self.student_pass(images_l, labels_l, images_u, teacher.label[images_l.shape[0]:])
            teacher_probs, confidence = teacher.probs, teacher.confidence
        probs = mean_softmax(student.head.logits, images_l.shape[-2:], align_corners=self.align_corners)
        losses = self.supervised_terms(student, labels_l)
        losses["unsup"] = opts.mse_weight * F.mse_loss(probs, teacher_probs.float())
        return StepResult(losses, self.step_logs(student, teacher_confidence=confidence.mean()))

    def _split_passes(self, images_l: Tensor, labels_l: Tensor, images_u: Tensor,
                      ema_here: bool) -> tuple[StudentPass, Tensor, Tensor]:
        """The labeled pass (student and teacher), the EMA when ``ema_here``, the unlabeled pass; the
        student's outputs joined as one :class:`StudentPass`, the teacher's probabilities ``[B_l + B_u, K, H, W]``
        and confidences."""
        teacher_l = self.predict(self.teacher, images_l, train_mode=True)
        model = unwrap(self.student)
        if self._memory_names:  # NP: backbone + decoder per half, the head once with the labeled half as context
            encoded_l = model.encode(images_l)
            features_l = model.decoder(encoded_l.low_level, encoded_l.high_level)
        else:
            output_l = self.student(images_l, labels=labels_l, num_context=images_l.shape[0])
        if ema_here:
            self._ema_step()
        teacher_u = self.predict(self.teacher, images_u, train_mode=True)
        if self._memory_names:
            encoded_u = model.encode(images_u)
            features_u = model.decoder(encoded_u.low_level, encoded_u.high_level)
            features = torch.cat([features_l, features_u])
            head = model.classify(features, labels=torch.cat([labels_l, teacher_u.label]),
                                  num_context=images_l.shape[0])
            aux = model.aux_head(encoded_l.layer3) if model.aux_head is not None and model.training else None
            output = SegmentorOutput(features, head, aux, None)
        else:
            output_u = self.student(images_u)
            head = HeadOutput(torch.cat([output_l.head.logits, output_u.head.logits], dim=1), output_l.head.aux_loss,
                              output_l.head.stats)
            output = SegmentorOutput(torch.cat([output_l.features, output_u.features]), head, output_l.aux_logits,
                                     None)
        probs = torch.cat([teacher_l.probs, teacher_u.probs])
        return self._split(output, images_l.shape[0]), probs, torch.cat([teacher_l.confidence, teacher_u.confidence])

    @torch.no_grad()
    def _ema_step(self) -> None:
        """EMA of the parameters only: the train-mode teacher keeps its own BN statistics."""
        self.ema(self.teacher, self.options.ema_decay, buffers="none")  # type: ignore[attr-defined]

    @torch.no_grad()
    def after_optimizer_step(self, ctx: StepContext) -> None:
        """The EMA, unless it ran before the unlabeled prediction (``ema_timing``)."""
        if self.options.ema_timing == "after_step":  # type: ignore[attr-defined]
            self._ema_step()


def remove_train_dropout(model: nn.Module) -> None:
    """Replace every train-only ``nn.Dropout2d`` of ``model`` by an identity, in place (``MCDropout2d``, the MC-dropout
    head's and decoder's, stays)."""
    for module in list(unwrap(model).modules()):
        for name, child in list(module.named_children()):
            if type(child) is nn.Dropout2d:
                setattr(module, name, nn.Identity())
