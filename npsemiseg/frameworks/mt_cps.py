"""CPS's MeanTeacher, as TorchSemiSeg runs it (``docs/frameworks.md``, "MT"): the MT of the paper's rows.

TorchSemiSeg exp.voc/voc8.res50v3+.MeanTeacher config.py 73-107, train.py 180-213: student and teacher see the
same weak labeled + unlabeled batch, no CutMix and no strong view; loss = supervised CE + ``mse_weight`` (100) x
MSE(student softmax, teacher softmax) over every pixel of both; no supervised-only epochs. The teacher runs in
train mode (its BN uses and updates batch statistics) and follows the student by EMA of its parameters only
(decay 0.99; it keeps its own BN statistics); the student is evaluated. With the NP head the teacher copies the
student's memories (``semi.py``).

Protocol switch ``mt_variant`` runs it for the cells asked as ``mt`` under ``released`` (the shared-trainer mean
teacher, ``mt.py``, under ``corrected``); asked for by name (``mt_cps``) it runs under either protocol.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from npsemiseg.frameworks.base import FRAMEWORKS, Batch, StepContext, StepResult
from npsemiseg.frameworks.mt import MeanTeacherOptions
from npsemiseg.frameworks.semi import SemiSupervisedFramework, require_unlabeled
from npsemiseg.models import upsample_logits


class CPSMeanTeacherOptions(MeanTeacherOptions):
    """CPS's MeanTeacher options (TorchSemiSeg MeanTeacher config.py: ``ema_decay`` 0.99, ``unsup_weight`` 100)."""

    mse_weight: float = Field(100.0, ge=0.0)


@FRAMEWORKS.register("mt_cps")
class CPSMeanTeacher(SemiSupervisedFramework):
    """Student + one train-mode EMA teacher; MSE between their softmaxes on the same weak batch."""

    name = "mt_cps"
    Options = CPSMeanTeacherOptions
    # model variant and augmentation pipeline: the Framework defaults (U2PL's), as ``mt``
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

    def __init__(self, options, build_model, **collaborators: Any) -> None:
        super().__init__(options, build_model, **collaborators)
        if self.unlabeled_truth != "hidden":
            raise ValueError(f"data.unlabeled_truth={self.unlabeled_truth!r}: the {self.name} framework has no "
                             "pseudo-labels (MSE between the softmaxes of student and teacher); expected 'hidden', "
                             "or framework 'mt'")

    def eval_model(self) -> nn.Module:
        """The student (CPS evaluates its student)."""
        return self.student

    def train_step(self, batch: Batch, ctx: StepContext) -> StepResult:
        """``mse_weight`` x MSE between the student's and the train-mode teacher's softmaxes on the same weak
        labeled + unlabeled images ``[B, 3, H, W]`` each."""
        opts: CPSMeanTeacherOptions = self.options  # type: ignore[assignment]
        images_l, labels_l = batch.labeled["image"], batch.labeled["label"]
        images_u = require_unlabeled(batch, self.name)["image"]
        self.seed_memories(images_l, labels_l)
        teacher = self.predict(self.teacher, torch.cat([images_l, images_u]), train_mode=True)
        student = self.student_pass(images_l, labels_l, images_u, teacher.label[images_l.shape[0]:])
        logits = upsample_logits(student.head.logits, images_l.shape[-2:], align_corners=self.align_corners)
        probs = logits.float().softmax(dim=2).mean(dim=0)
        losses = self.supervised_terms(student, labels_l)
        losses["unsup"] = opts.mse_weight * F.mse_loss(probs, teacher.probs.float())
        return StepResult(losses, self.step_logs(student, teacher_confidence=float(teacher.confidence.mean())))

    @torch.no_grad()
    def after_optimizer_step(self, ctx: StepContext) -> None:
        """EMA of the parameters only: the train-mode teacher keeps its own BN statistics."""
        self.ema(self.teacher, self.options.ema_decay, buffers="none")  # type: ignore[attr-defined]
