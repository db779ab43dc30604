"""AugSeg (Zhao et al., CVPR 2023): random intensity augmentation and adaptive CutMix
(``docs/frameworks.md``, AugSeg).

Per iteration:

1. Teacher (eval mode) on the weak unlabeled view -> probabilities, hard pseudo-labels,
   confidences (max prob), and the per-image confidence rho_i
   (:func:`npsemiseg.data.mixing.adaptive_confidence`).
2. The strong view ``image_strong`` (random intensity augmentation, made by the data
   pipeline after the weak crop) is mixed by the adaptive CutMix
   (:func:`npsemiseg.data.mixing.augseg_cutmix`): with probability ``1 - rho_i`` a box
   from a labeled image with its ground truth and confidence 1, then an ordinary CutMix
   among the unlabeled images; image, pseudo-label and confidence move together.
3. Student on labeled (weak) + mixed strong unlabeled images; unsupervised CE with pixels of
   (mixed) confidence below ``confidence_threshold`` masked (0.95 on VOC, none on
   Cityscapes), averaged over all pixels (masked pixels count as zero), weight ``unsup_weight``.

Teacher: EMA over parameters and BN buffers; decay 0 during epoch 0 (the teacher follows the
student), then ``min(1 - 1/(i + 1), d)`` with i the global iteration, d = 0.999 (VOC) /
0.996 (Cityscapes). With the NP head, the student's targets are the unlabeled images with
the masked pseudo-labels (255 where masked) plus the labeled images; with ``np_targets="unfiltered"`` (switch
``np_unfiltered_targets``, released) the unlabeled targets are the mixed pseudo-labels unmasked, as NP-SemiSeg's
AugSeg/train_semi.py 405-408 passes the argmax labels after the adaptive CutMix to the NP head (the threshold only
masks the unsupervised CE there, lines 425-427). The authors' model also computes the NP context in a pass of its own
(``np_context="pass"``, switch ``np_context_pass``) and their loop carries the memories from step to step within an
epoch, target and context exchanged at every step (``np_memories="swapped"``, switch ``augseg_np_memories``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from torch import Tensor

from npsemiseg.data.mixing import adaptive_confidence, augseg_cutmix
from npsemiseg.frameworks.base import Batch, StepContext, StepResult
from npsemiseg.frameworks.ema import augseg_decay, unwrap
from npsemiseg.frameworks.specs.augseg import AugSegOptions, AugSegSpec
from npsemiseg.frameworks.semi import SemiSupervisedFramework, ignore_where, labeled_view, require_unlabeled
from npsemiseg.heads.base import predictive_entropy


class AugSeg(AugSegSpec, SemiSupervisedFramework):
    """Student + EMA teacher (parameters and buffers), intensity-augmented adaptive-CutMix view."""

    def train_step(self, batch: Batch, ctx: StepContext) -> StepResult:
        opts: AugSegOptions = self.options  # type: ignore[assignment]
        images_l, labels_l = batch.labeled["image"], batch.labeled["label"]
        unlabeled = require_unlabeled(batch, self.name)
        if "image_strong" not in unlabeled:
            raise ValueError("batch.unlabeled: AugSeg needs 'image_strong' (the random intensity-augmented view)")
        self.seed_memories(images_l, labels_l)

        teacher = self.predict_unlabeled(self.teacher, unlabeled)
        rho = self.image_confidence(teacher.probs)
        mixed = augseg_cutmix(
            labeled_view(unlabeled, strong=True), teacher.label, teacher.confidence, images_l, labels_l, rho,
            labeled_beta=opts.labeled_beta, beta=opts.unlabeled_beta,
        )
        pseudo = ignore_where(mixed.label, mixed.confidence < opts.confidence_threshold)

        with self._carried_memories(ctx, opts):
            student = self.student_pass(images_l, labels_l, mixed.image,
                                        mixed.label if opts.np_targets == "unfiltered" else pseudo)
        losses = self.supervised_terms(student, labels_l)
        # mean over all pixels: masked pixels contribute 0 to the sum and count in the mean
        losses["unsup"] = opts.unsup_weight * self.pixel_ce(student.logits_u, pseudo).mean()
        logs = self.step_logs(student, rho=rho.mean(), kept_fraction=(pseudo != 255).float().mean())
        return StepResult(losses, logs)

    def image_confidence(self, probs: Tensor) -> Tensor:
        """rho ``[B]`` of the teacher's probabilities ``[B, K, H, W]`` (:func:`adaptive_confidence`), the entropy's log
        taken as ``entropy_log`` says."""
        return adaptive_confidence(probs, predictive_entropy(probs, self.options.entropy_log))  # type: ignore[attr-defined]

    @contextmanager
    def _carried_memories(self, ctx: StepContext, opts: AugSegOptions) -> Iterator[None]:
        """Under ``np_memories="swapped"`` (with the NP head): the student's memories start the epoch's first step
        from their start (one zero row each, as the loop's lists) and later steps from the previous step's, target
        and context exchanged; the head keeps what it writes during the pass. Otherwise nothing."""
        if opts.np_memories != "swapped" or not self._memory_names:
            yield
            return
        head = unwrap(self.student).head
        if ctx.step % ctx.iters_per_epoch == 0:
            head.reset_memories()
        else:
            head.swap_memories()
        persist, head.persist_memories = head.persist_memories, True
        try:
            yield
        finally:
            head.persist_memories = persist

    def after_optimizer_step(self, ctx: StepContext) -> None:
        decay = augseg_decay(ctx.step, ctx.epoch, self.options.ema_decay)  # type: ignore[attr-defined]
        self.ema(self.teacher, decay, buffers="ema")
