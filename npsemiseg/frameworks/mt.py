"""Mean teacher in the shared U2PL/AugSeg trainer (``docs/frameworks.md``, "MT").

NP-SemiSeg never released its MT integration; of the two mean teachers it could mean this is the
shared-trainer one, chosen for a like-for-like comparison with U2PL and AugSeg (same crops, batches,
schedule and evaluation): the EMA teacher (decay 0.99) predicts on the weak unlabeled view;
its argmax is a hard pseudo-label; the unlabeled images, pseudo-labels and confidences are
CutMixed together (U2PL's half-area CutMix, probability 0.5) and the student is trained
with CE on the mixed view, weight 1 (averaged over the pseudo-labeled pixels).
``confidence_threshold`` > 0 ignores pixels whose (mixed) teacher confidence is below it
(0 = every pixel, the reference). As in the U2PL trainer, the first ``sup_only_epochs``
(U2PL's trainer: 1 by default, 0 where a dataset's settings say so, Cityscapes) train on labeled images only,
with the teacher following the student.

CPS's MeanTeacher, the other (the MT of the paper's rows), is the framework ``mt_cps`` (``mt_cps.py``);
protocol switch ``mt_framework`` runs it for ``mt`` cells under ``released``.

Teacher: EMA of the student's parameters, decay 0.99; the BN buffers are averaged too (the
teacher never runs in train mode, so it has no statistics of its own). With the NP head the
teacher copies the student's memories (``semi.py``); with MC dropout its pseudo-labels are
the mean of T passes.
"""

from __future__ import annotations



from npsemiseg.data.mixing import u2pl_cutmix
from npsemiseg.frameworks.base import Batch, StepContext, StepResult
from npsemiseg.frameworks.specs.mt import MeanTeacherOptions, MeanTeacherSpec, MTOptions  # noqa: F401
from npsemiseg.frameworks.semi import SemiSupervisedFramework, ignore_where, require_unlabeled, sup_only


class MeanTeacher(MeanTeacherSpec, SemiSupervisedFramework):
    """Student + one EMA teacher; hard pseudo-labels on CutMixed unlabeled images."""

    def train_step(self, batch: Batch, ctx: StepContext) -> StepResult:
        opts: MTOptions = self.options  # type: ignore[assignment]
        images_l, labels_l = batch.labeled["image"], batch.labeled["label"]
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
        losses["unsup"] = opts.unsup_weight * self.mean_ce(student.logits_u, pseudo)
        return StepResult(losses, self.step_logs(student, teacher_confidence=teacher.confidence.mean()))

    def after_optimizer_step(self, ctx: StepContext) -> None:
        opts: MTOptions = self.options  # type: ignore[assignment]
        if sup_only(ctx, opts.sup_only_epochs):
            self.reset_teacher(self.teacher)
        else:
            self.ema(self.teacher, opts.ema_decay, buffers="ema")
