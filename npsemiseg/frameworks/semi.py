"""What the four SSL frameworks (MT, PS-MT, U2PL, AugSeg) share: a student, EMA teachers, and
one student pass over labeled + unlabeled images that works with every head.

The student pass (:meth:`SemiSupervisedFramework.student_pass`) concatenates the labeled
images and the (mixed, augmented) unlabeled images into one batch and calls the segmentor
with ``labels`` = ground truth + pseudo-labels (255 where the framework ignores a pixel)
and ``num_context = B_l``. For the NP head that is the paper's setting: context = the
labeled slice of the student's features, targets = the whole batch, memories updated from
them inside the head, ``aux_loss = lambda_kl x KL`` returned as its own loss term ``kl``.
The baseline and MC-dropout heads ignore the labels. Logits ``[S, B, K, h, w]`` are
upsampled to the image size and every cross-entropy is taken over the S samples in the form
``loss.sample_ce`` chooses (ELBO by default).

NP memories and the teacher: the NP head's memories are written by the student; a teacher
copies them after every EMA update (:func:`~npsemiseg.frameworks.ema.memory_buffer_names`).
Before the first teacher prediction of a run the memories are empty, so they are seeded
once from the labeled batch (a no-gradient student pass with the head in training mode,
the rest of the network in eval mode so no BN statistics move).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from npsemiseg.constants import IGNORE_INDEX
from npsemiseg.frameworks.base import Framework, FrameworkOptions, StepContext, head_logs
from npsemiseg.frameworks.ema import BufferMode, copy_model, ema_update, make_teacher, memory_buffer_names, unwrap
from npsemiseg.frameworks.losses import cross_entropy_loss, pixel_cross_entropy
from npsemiseg.frameworks.pseudo_labels import (
    TeacherPrediction,
    mode,
    oracle_prediction,
    pseudo_label_accuracy,
    pseudo_label_confusion,
    teacher_predict,
)
from npsemiseg.frameworks.supervised import supervised_loss_terms
from npsemiseg.heads.base import HeadOutput
from npsemiseg.models import SegmentorOutput


@dataclass
class StudentPass:
    """The student's output on labeled + unlabeled images.

    output: the SegmentorOutput (features, head output at feature resolution, aux logits,
    representation); logits_l ``[S, B_l, K, h, w]`` and logits_u ``[S, B_u, K, h, w]`` at feature
    resolution (the losses upsample them to the labels one sample at a time: ``pixel_ce``,
    :func:`~npsemiseg.frameworks.losses.pixel_cross_entropy`); num_labeled = B_l.
    """

    output: Any
    logits_l: Tensor
    logits_u: Tensor
    num_labeled: int

    @property
    def head(self) -> HeadOutput:
        return self.output.head

    def labeled_output(self) -> Any:
        """The SegmentorOutput restricted to the labeled images (for the supervised loss)."""
        out, m = self.output, self.num_labeled
        head = HeadOutput(out.head.logits[:, :m], out.head.aux_loss, out.head.stats)
        aux = out.aux_logits[:m] if out.aux_logits is not None else None
        rep = out.representation[:m] if out.representation is not None else None
        return SegmentorOutput(out.features[:m], head, aux, rep)


def ignore_where(labels: Tensor, drop: Tensor) -> Tensor:
    """``labels [B, H, W]`` with ``IGNORE_INDEX`` where ``drop [B, H, W]`` (bool) holds."""
    return labels.masked_fill(drop, IGNORE_INDEX)


class SemiSupervisedFramework(Framework):
    """Base of MT, PS-MT, U2PL and AugSeg: student + teacher(s) + a shared student pass.

    Subclasses set ``teacher_names`` (one EMA teacher by default) and implement ``train_step``
    and ``after_optimizer_step``.
    """

    teacher_names: tuple[str, ...] = ("teacher",)

    def __init__(self, options: FrameworkOptions, build_model: Callable[[], nn.Module], *, num_classes: int,
                 **collaborators: Any) -> None:
        super().__init__(options, build_model, num_classes=num_classes, **collaborators)
        #: the pseudo-labels against the truth of the unlabeled images (``data.unlabeled_truth`` measured / oracle),
        #: ``[K, K]`` counts (:func:`~npsemiseg.frameworks.pseudo_labels.pseudo_label_confusion`) over this step's
        #: teachers and over the whole run in this process (a resumed run counts from its resumption)
        self._step_confusion: Tensor | None = None
        self.pseudo_label_confusion = torch.zeros(num_classes, num_classes, dtype=torch.int64)
        self.teachers: dict[str, nn.Module] = {name: make_teacher(build_model(), self.student) for name in self.teacher_names}
        self._memory_names = memory_buffer_names(self.student)

    # ----------------------------------------------------------------- contract
    def modules(self) -> dict[str, nn.Module]:
        return {"student": self.student, **self.teachers}

    @property
    def teacher(self) -> nn.Module:
        return self.teachers[self.teacher_names[0]]

    def eval_model(self) -> nn.Module:
        return self.teacher

    # ----------------------------------------------------------------- head facts
    @property
    def sample_ce(self) -> str:
        return self.loss.sample_ce

    # ----------------------------------------------------------------- teachers
    def ema(self, teacher: nn.Module, decay: float, buffers: BufferMode = "ema") -> None:
        """EMA of the student into ``teacher``; NP memories are copied, not averaged."""
        ema_update(teacher, self.student, decay, buffers=buffers, copy_buffers=self._memory_names)

    def reset_teacher(self, teacher: nn.Module) -> None:
        """Make ``teacher`` an exact copy of the student (parameters and buffers)."""
        copy_model(teacher, self.student)

    def sync_memories(self, teacher: nn.Module) -> None:
        """Copy the student's NP memories and centers into ``teacher``."""
        if not self._memory_names:
            return
        student_buffers = dict(unwrap(self.student).named_buffers())
        with torch.no_grad():
            for name, buf in unwrap(teacher).named_buffers():
                if name in self._memory_names:
                    buf.copy_(student_buffers[name])

    @torch.no_grad()
    def seed_memories(self, images_l: Tensor, labels_l: Tensor) -> None:
        """Fill empty NP memories from the labeled batch and copy them to every teacher (no-op
        for other heads or once the memories hold rows). The pass records no autograd graph: only
        the memories it writes are kept (the first step used to pay for a discarded graph)."""
        if not self._memory_names:
            return
        student = unwrap(self.student)
        if not student.head.empty_memories():
            return
        with torch.no_grad(), mode(student, False), mode(student.head, True):
            student(images_l, labels=labels_l, num_context=images_l.shape[0])
        for teacher in self.teachers.values():
            self.sync_memories(teacher)

    def predict(self, teacher: nn.Module, images: Tensor, *, train_mode: bool = False) -> TeacherPrediction:
        """``teacher``'s prediction (mean of per-sample softmaxes) at image resolution."""
        return teacher_predict(teacher, images, train_mode=train_mode)

    def predict_unlabeled(self, teacher: nn.Module, unlabeled: dict[str, Tensor], *,
                          train_mode: bool = False) -> TeacherPrediction:
        """``teacher``'s prediction on the weak unlabeled view ``unlabeled["image"]``: where every framework's
        pseudo-labels come from.

        ``unlabeled_truth``: ``hidden`` = the prediction; ``measured`` = the same, and the step logs how right it
        is against ``unlabeled["label"]``, overall, per class and by class mean
        (:func:`~npsemiseg.frameworks.pseudo_labels.pseudo_label_accuracy`; the step's teachers pooled), while
        ``pseudo_label_confusion`` sums the run's counts; ``oracle`` = the ground truth in its place where known
        (:func:`~npsemiseg.frameworks.pseudo_labels.oracle_prediction`; what is measured is the real teacher).
        """
        prediction = self.predict(teacher, unlabeled["image"], train_mode=train_mode)
        if self.unlabeled_truth == "hidden":
            return prediction
        truth = unlabeled["label"]
        confusion = pseudo_label_confusion(prediction.label, truth, self.num_classes)
        self.pseudo_label_confusion += confusion
        step = self._step_confusion
        self._step_confusion = confusion if step is None else step + confusion
        return oracle_prediction(prediction, truth) if self.unlabeled_truth == "oracle" else prediction

    # ----------------------------------------------------------------- student
    def student_pass(self, images_l: Tensor, labels_l: Tensor, images_u: Tensor, labels_u: Tensor) -> StudentPass:
        """One student forward over ``cat(images_l, images_u)`` with labels ``cat(labels_l, labels_u)``
        (``labels_u``: pseudo-labels with 255 where ignored) and the labeled slice as NP context."""
        images = torch.cat([images_l, images_u], dim=0)
        labels = torch.cat([labels_l, labels_u], dim=0)
        return self._split(self._forward(self.student, images, labels, images_l, labels_l), images_l.shape[0])

    def labeled_pass(self, images_l: Tensor, labels_l: Tensor, model: nn.Module | None = None) -> StudentPass:
        """A forward of ``model`` (default: the student) over the labeled images only (supervised-only epochs,
        warm-ups); the NP head takes them as context and targets."""
        return self._split(self._forward(model or self.student, images_l, labels_l, images_l, labels_l), images_l.shape[0])

    def _forward(self, model: nn.Module, images: Tensor, labels: Tensor, images_l: Tensor, labels_l: Tensor) -> Any:
        """``model`` on ``images`` whose first ``B_l`` are ``images_l``: the NP context is their slice of the one
        pass, or (option ``np_context="pass"``, switch ``np_context_pass``, with a head that has memories) a pass
        of its own over ``images_l`` (:meth:`~npsemiseg.models.Segmentor.forward_with_context`)."""
        if getattr(self.options, "np_context", "slice") == "pass" and self._memory_names:
            return unwrap(model).forward_with_context(images, images_l, labels=labels, context_labels=labels_l)
        return model(images, labels=labels, num_context=images_l.shape[0])

    def _split(self, output: Any, num_labeled: int) -> StudentPass:
        logits = output.head.logits
        return StudentPass(output, logits[:, :num_labeled], logits[:, num_labeled:], num_labeled)

    def supervised_terms(self, student: StudentPass, labels_l: Tensor) -> dict[str, Tensor]:
        """The supervised loss terms (CE or OHEM, + aux head) on the labeled slice, plus the head's
        auxiliary term (``kl``: the NP head's lambda_kl x KL) when the head has one."""
        terms = supervised_loss_terms(student.labeled_output(), labels_l, self.loss, align_corners=self.align_corners)
        terms.update(self.head_aux_losses(student.head))
        return terms

    def pixel_ce(self, logits: Tensor, labels: Tensor) -> Tensor:
        """Per-pixel CE ``[B, H, W]`` over the samples of ``logits [S, B, K, h, w]`` (feature or label
        resolution; upsampled with the model's ``align_corners``), 0 where ignored."""
        return pixel_cross_entropy(logits, labels, form=self.sample_ce, align_corners=self.align_corners)

    def mean_ce(self, logits: Tensor, labels: Tensor) -> Tensor:
        """:meth:`pixel_ce` averaged over the non-ignored pixels (0 when all are ignored)."""
        return cross_entropy_loss(logits, labels, form=self.sample_ce, align_corners=self.align_corners)

    def step_logs(self, student: StudentPass, **values: float | Tensor) -> dict[str, float | Tensor]:
        """The head's statistics, ``values`` (floats or 0-dim tensors, read by the loop with the losses), and the
        pseudo-label accuracy measured in this step (if any)."""
        logs = head_logs(student.head.stats)
        logs.update(values)
        if self._step_confusion is not None:
            logs.update(pseudo_label_accuracy(self._step_confusion))
            self._step_confusion = None
        return logs


def labeled_view(batch_part: dict[str, Tensor], strong: bool) -> Tensor:
    """``image_strong`` when asked for and present, else the weak ``image``."""
    if strong and "image_strong" in batch_part:
        return batch_part["image_strong"]
    return batch_part["image"]


def require_unlabeled(batch: Any, name: str) -> dict[str, Tensor]:
    if batch.unlabeled is None:
        raise ValueError(f"batch.unlabeled: the {name} framework needs unlabeled images, got None")
    return batch.unlabeled


def sup_only(ctx: StepContext, epochs: int) -> bool:
    return ctx.epoch < epochs
