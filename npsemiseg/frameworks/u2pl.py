"""U2PL (Wang et al., CVPR 2022): entropy-filtered pseudo-labels and a contrastive loss whose
negatives are the unreliable pixels (``docs/frameworks.md``, U2PL).

Per iteration (after ``sup_only_epochs`` labeled-only epochs):

1. Teacher (eval mode) on the weak unlabeled images -> hard pseudo-labels and confidences.
2. U2PL's CutMix (probability 0.5; each image gets a rectangle of half its area from image
   ``(i + 1) mod B``), mixing image, pseudo-label and confidence together.
3. Teacher on labeled + mixed unlabeled images -> probabilities, entropy and representations
   (the statistics pass).
4. Unsupervised CE on the pseudo-labels, ignoring pixels whose entropy is at or above the
   ``u2pl_drop_percent(t, T)`` = (80 + 20 t/T)-th percentile, scaled by all / kept pixels.
5. Contrastive loss (``contrastive.py``) at feature resolution, ``alpha_t = 20 (1 - t/T)``.

Teacher: EMA of the parameters with ``min(1 - 1/(k + 1), 0.99)``, k counted from the first semi-supervised
iteration. During the first semi-supervised epoch the teacher is reset to the student before every step; how
(``teacher_reset``) and what the EMA covers (``ema_buffers``) are not equivalent choices:

- ``teacher_reset="share"`` (switch ``u2pl_teacher_reset``, released): the released code makes the teacher's
  parameters share the student's storage (``train_semi.py`` 309-315) and keeps the teacher's own BN statistics;
  here the parameters are copied before the step and again after the optimiser step (what the shared storage
  holds then), the buffers are left alone. ``"copy"`` (corrected): parameters *and* buffers copied, then the EMA
  as in every later epoch: the eval-mode teacher of ``corrected`` has no statistics of its own to keep.
- ``ema_buffers="none"`` (switch ``u2pl_teacher_buffers``, released): the released EMA touches ``parameters()``
  only (543-548); the teacher's statistics come from its train-mode passes. ``"ema"`` (corrected): averaged like
  the parameters, the statistics an eval-mode teacher needs.

Quirks of the released code, as options off by default:

- ``teacher_train_mode``: the statistics pass (3) runs the teacher in train mode (batch BN
  statistics, dropout active), which also updates the teacher's BN running statistics; the
  released code does this, also during the supervised-only epochs.
- ``sup_only_kl=False``: the NP head's KL term is zero during the supervised-only epochs, as the NP-SemiSeg
  code's U2PL loop sets it (its U2PL/train_semi.py 355); default: the head's KL is trained from the first step.
- label padding with 0 (background) instead of 255 is a data option, not a framework one.

The paper's contrastive definitions are used; the released code's negative masks differ
(see ``contrastive.py``). With the NP head, the student's targets are the labeled images
plus the unlabeled ones with their entropy-filtered pseudo-labels (255 where dropped);
``np_targets="unfiltered"`` gives the NP head the unfiltered pseudo-labels, as the NP-SemiSeg code
does (its U2PL/train_semi.py 406-411; the unsupervised CE stays filtered). The authors' model also computes the NP
context in a pass of its own over the labeled images (``np_context="pass"``, switch ``np_context_pass``), and their
statistics pass takes the entropy of the softmax of the mean of the T logits (``teacher_entropy="mean_logits"``,
switch ``u2pl_entropy_mean_logits``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from npsemiseg.constants import IGNORE_INDEX
from npsemiseg.data.mixing import u2pl_cutmix
from npsemiseg.frameworks.base import Batch, StepContext, StepResult
from npsemiseg.frameworks.contrastive import U2PL_BUGS, ClassQueues, contrastive_loss
from npsemiseg.frameworks.ema import copy_parameters, u2pl_decay
from npsemiseg.frameworks.pseudo_labels import mode, prediction_from_logits
from npsemiseg.frameworks.schedules import contrastive_alpha, entropy_filter, percentile, u2pl_drop_percent
from npsemiseg.frameworks.specs.u2pl import U2PLOptions, U2PLSpec
from npsemiseg.frameworks.semi import SemiSupervisedFramework, require_unlabeled, sup_only
from npsemiseg.heads.base import downsample_labels, predictive, predictive_entropy


class U2PL(U2PLSpec, SemiSupervisedFramework):
    """Student + EMA teacher with entropy-filtered pseudo-labels and the contrastive loss."""

    def __init__(self, options, build_model, **collaborators: Any) -> None:
        super().__init__(options, build_model, **collaborators)
        opts: U2PLOptions = self.options  # type: ignore[assignment]
        self.queues: ClassQueues | None = None
        if opts.contrastive:
            rep_head = getattr(self.student, "representation_head", None)
            if rep_head is None:
                raise ValueError(
                    "model.representation_head: U2PL's contrastive loss needs the representation head "
                    "(set model.representation_head=true or framework_options.contrastive=false)"
                )
            dim = _representation_dim(rep_head)
            sizes = [opts.background_queue_size] + [opts.queue_size] * (self.num_classes - 1)
            self.queues = ClassQueues(sizes, dim)
        #: False during the supervised-only epochs: the teacher is neither trained nor evaluated
        #: then (U2PL validates the student until its first semi-supervised epoch)
        self.teacher_active = opts.sup_only_epochs == 0

    def eval_model(self) -> nn.Module:
        return self.teacher if self.teacher_active else self.student

    # ----------------------------------------------------------------- step
    def train_step(self, batch: Batch, ctx: StepContext) -> StepResult:
        opts: U2PLOptions = self.options  # type: ignore[assignment]
        images_l, labels_l = batch.labeled["image"], batch.labeled["label"]
        if sup_only(ctx, opts.sup_only_epochs):
            return self._supervised_step(images_l, labels_l, opts)
        if ctx.epoch == opts.sup_only_epochs:
            self._reset_teacher(opts)
        self.teacher_active = True
        unlabeled = require_unlabeled(batch, self.name)
        images_u = unlabeled["image"]
        self.seed_memories(images_l, labels_l)

        weak = self.predict_unlabeled(self.teacher, unlabeled)
        mixed = u2pl_cutmix(images_u, weak.label, weak.confidence, p=opts.cutmix_prob)
        mixed_images, pseudo = mixed.image, mixed.label

        # statistics pass: teacher on labeled + mixed unlabeled images
        num_l = images_l.shape[0]
        stats = self.predict(self.teacher, torch.cat([images_l, mixed_images]), train_mode=opts.teacher_train_mode)
        entropy_u = self._entropy_u(stats, num_l, tuple(images_u.shape[-2:]), opts)

        kept = entropy_filter(entropy_u, pseudo, u2pl_drop_percent(ctx.epoch, ctx.total_epochs, opts.drop_percent))
        num_kept = (kept != IGNORE_INDEX).sum()

        student = self.student_pass(images_l, labels_l, mixed_images, pseudo if opts.np_targets == "unfiltered" else kept)
        losses = self.supervised_terms(student, labels_l)
        scale = kept.numel() / num_kept.clamp_min(1).float()
        losses["unsup"] = opts.unsup_weight * scale * self.mean_ce(student.logits_u, kept)
        logs = self.step_logs(student, kept_fraction=num_kept / kept.numel(),
                              teacher_confidence=weak.confidence.mean())
        if self.queues is not None:
            contra, contra_logs = self._contrastive(student, stats, labels_l, pseudo, entropy_u, ctx, opts)
            losses["contrastive"] = opts.contrastive_weight * contra
            logs.update(contra_logs)
        return StepResult(losses, logs)

    def _entropy_u(self, stats, num_l: int, size: tuple[int, int], opts: U2PLOptions) -> torch.Tensor:
        """The unlabeled images' entropy ``[B_u, H, W]`` of the statistics pass (``teacher_entropy``), its log taken
        as ``entropy_log`` says."""
        if opts.teacher_entropy == "mean_logits":
            logits = stats.output.head.logits[:, num_l:].mean(0, keepdim=True)
            probs = prediction_from_logits(logits, size, align_corners=self.align_corners).probs
        else:
            probs = stats.probs[num_l:]
        return predictive_entropy(probs, opts.entropy_log)

    def _supervised_step(self, images_l, labels_l, opts: U2PLOptions) -> StepResult:
        """Labeled images only (U2PL's ``sup_only_epoch``); with the quirk the teacher also runs
        in train mode on them, which moves its BN statistics as the released code does (the NP-SemiSeg authors'
        teacher with the labels and its context pass, ``U2PL/train_semi.py`` 349-351, under ``np_context="pass"``)."""
        student = self.labeled_pass(images_l, labels_l)
        if opts.teacher_train_mode:
            self.sync_memories(self.teacher)  # an NP teacher needs the memories the student just filled
            if opts.np_context == "pass" and self._memory_names:  # the authors' NP teacher: labels, its context pass
                with torch.no_grad(), mode(self.teacher, True):
                    self.labeled_pass(images_l, labels_l, self.teacher)
            else:
                self.predict(self.teacher, images_l, train_mode=True)
        terms = self.supervised_terms(student, labels_l)
        representation = student.output.representation
        if opts.sup_only_zero_terms and representation is not None:
            terms["unsup"] = terms["contrastive"] = 0 * representation.sum()
        if not opts.sup_only_kl and self.head_aux_term in terms:
            terms[self.head_aux_term] = torch.zeros_like(terms[self.head_aux_term])
        return StepResult(terms, self.step_logs(student))

    def _contrastive(self, student, stats, labels_l, pseudo, entropy_u, ctx: StepContext, opts: U2PLOptions):
        """U2PL's contrastive loss at the representation's resolution."""
        rep_student = student.output.representation
        rep_teacher = stats.output.representation
        if rep_student is None or rep_teacher is None:
            raise ValueError("model.representation_head: U2PL's contrastive loss needs the representation head")
        size = tuple(rep_student.shape[-2:])
        num_l = labels_l.shape[0]
        # teacher probabilities at feature resolution (mean of per-sample softmaxes)
        prob_small, _ = predictive(stats.output.head.logits)
        if tuple(prob_small.shape[-2:]) != size:
            prob_small = prediction_from_logits(stats.output.head.logits, size, align_corners=self.align_corners).probs

        alpha = contrastive_alpha(ctx.epoch, ctx.total_epochs, opts.alpha_0)
        valid_u = pseudo != IGNORE_INDEX
        reliable_u = torch.zeros_like(valid_u)
        unreliable_u = torch.zeros_like(valid_u)
        if bool(valid_u.any()):
            values = entropy_u[valid_u]
            reliable_u = valid_u & (entropy_u <= percentile(values, alpha))
            unreliable_u = valid_u & (entropy_u >= percentile(values, 100.0 - alpha))
        valid_l = labels_l != IGNORE_INDEX
        labels_small = downsample_labels(torch.cat([labels_l, pseudo]), size)
        reliable = downsample_labels(torch.cat([valid_l, reliable_u]).long(), size).bool()
        unreliable = downsample_labels(torch.cat([valid_l, unreliable_u]).long(), size).bool()
        if self.queues is None:
            raise ValueError("contrastive: the queues were not built (framework_options.contrastive=false)")
        return contrastive_loss(
            rep_student, rep_teacher, prob_small, labels_small, reliable, unreliable, num_l, self.queues,
            anchor_threshold=opts.anchor_threshold, low_rank=opts.low_rank, high_rank=opts.high_rank,
            temperature=opts.temperature, num_queries=opts.num_queries, num_negatives=opts.num_negatives,
            released_bugs=[bug for bug in U2PL_BUGS if getattr(opts, f"{bug}_bug")],
        )

    def _reset_teacher(self, opts: U2PLOptions) -> None:
        """The first semi-supervised epoch's teacher (``teacher_reset``): the student's parameters, and its buffers
        too under ``copy``."""
        if opts.teacher_reset == "share":
            copy_parameters(self.teacher, self.student)
            self.sync_memories(self.teacher)
        else:
            self.reset_teacher(self.teacher)

    def after_optimizer_step(self, ctx: StepContext) -> None:
        opts: U2PLOptions = self.options  # type: ignore[assignment]
        if sup_only(ctx, opts.sup_only_epochs):
            return
        if opts.teacher_reset == "share" and ctx.epoch == opts.sup_only_epochs:
            self._reset_teacher(opts)  # the shared storage holds the stepped student (the EMA of x with x is x)
            return
        decay = u2pl_decay(ctx.step, opts.sup_only_epochs * ctx.iters_per_epoch, opts.ema_decay)
        self.ema(self.teacher, decay, buffers=opts.ema_buffers)

    # ----------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"teacher_active": self.teacher_active}
        if self.queues is not None:
            state["queues"] = self.queues.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        expected = {"teacher_active"} | ({"queues"} if self.queues is not None else set())
        if set(state) != expected:
            raise ValueError(f"U2PL state: expected keys {sorted(expected)}, got {sorted(state)}")
        self.teacher_active = bool(state["teacher_active"])
        if self.queues is not None:
            self.queues.load_state_dict(state["queues"])


def _representation_dim(rep_head: Any) -> int:
    """Embedding size of the representation head (``RepresentationHead.dim``)."""
    dim = getattr(rep_head, "dim", None)
    if not isinstance(dim, int):
        raise ValueError(f"model.representation_head: expected a module with an int 'dim', got {type(rep_head).__name__}")
    return dim
