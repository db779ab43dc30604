"""PS-MT (Liu et al., CVPR 2022): perturbed and strict mean teachers (``docs/frameworks.md``, PS-MT).

Per iteration (after ``warmup_epochs``):

1. Both teachers (eval mode) predict logits on the weak unlabeled view. The teacher updated
   this epoch is the core, the other the assist: the assist keeps its top-7 class logits per
   pixel and takes the core's elsewhere; the target is ``gamma t1 + (1 - gamma) t2`` (0.5).
   For stochastic heads a teacher's "logits" are the log of its predictive (mean of the
   per-sample softmaxes); for the baseline the raw logits.
2. CutMix among the unlabeled images of the strong view (option ``cutmix_boxes``: ``beta_box``, one box with
   lambda ~ Beta(4, 4), PS-MT's VOC code; ``random_boxes``, three boxes of random proportions, its Cityscapes
   code); the target's argmax and max prob (which is all the loss uses of it) move with the pixels.
3. Student: feature map of labeled (strong view) + mixed unlabeled images, T-VAT
   perturbation (``tvat.py``: xi 1e-6, eps 2.0, one power iteration, KL on the teachers'
   ensemble), classifier head on the perturbed features.
4. Supervised CE + ``w(t)`` x confidence-weighted CE: per pixel CE against the target's
   argmax times its max prob, averaged over the pixels with max prob >= 0.6, where ``w(t)``
   is a cosine ramp-up over 12 epochs (iterations) to the per-protocol weight.

Teachers: initialised from the student; EMA of the student's full state (parameters and
buffers) with keep rate 0.996 after every step, alternating: teacher 1 in the first (odd,
1-based) epoch, teacher 2 in the next, and so on. Evaluation: both teachers' predictions
averaged (``eval_teachers="both"``, VOC; their softmaxes, or their logits as the released code with
``eval_average="logits"``), or teacher 1 alone (``"first"``, Cityscapes). What differs per dataset (the unsupervised
weight, the box scheme, the evaluated teachers, the epochs, crop, batch and LR) is in the datasets' settings
(``npsemiseg/data/sets/pascal.py``, ``cityscapes.py``).

Warm-up (``warmup_epochs``, switch ``psmt_warmup_epochs``: 5 released, 0 corrected): the released code
trains teacher 1, teacher 2 and the student separately on labeled images for 5 epochs before the
semi-supervised ones, each with an optimiser of its own (VocCode/Base/base_trainer.py 137-145, 214-260:
``_warm_up(epoch, id)`` for id 1, 2, 3; teachers on the weak view, the student on the strong view;
EntireModel.py 42-53: plain CE; the three models have their own randomly initialised decoders, and the
teachers' optimisers are built like the student's and never scheduled). Here, in the warm-up epochs, each
step trains the student (strong view, the loop's optimiser) and each teacher (weak view of the same batch,
its own optimiser from ``build_optimizer``: the run's optimiser and groups at the base LR, no decay), the
teachers built as models of their own (own head initialisation), not copies of the student; with
``warmup_teacher_backbones="scratch"`` (switch ``psmt_warmup_teachers_scratch``) their backbones start from a
random initialisation as the released ones (EntireModel.py 15-20: ``pretrained_model=None`` for encoder1 and
encoder2), the student's from the run's weights. Sharing the
batch (the released teachers draw their own passes of the labeled loader) keeps one data stream. The
teachers' optimiser states are framework state (checkpointed); teacher gradients are averaged over the
processes under DDP; after the warm-up the teachers are frozen and follow the student by EMA. With
``warmup_epochs = 0`` the teachers start as copies of the student.

Quirk options (off by default): ``teacher_train_mode`` runs both teachers' predictions in train mode
(``self.model.train()`` in the released train.py 192: BN on the weak batch's statistics, which also
moves the teachers' running statistics); ``tvat_released_normalization`` divides the power iteration's
gradient by ``norm + 1e-8`` as the released code does, which at ``xi = 1e-6`` shrinks the
perturbation to ~1e-4 of ``eps`` (see ``tvat.py``).

Student passes (``student_passes``, switch ``psmt_split_passes``): ``joint`` runs labeled and unlabeled images
through the student as one batch (one BN batch and one BN update; the NP head sees the labeled slice as its
context); ``split`` runs them as the released student does (EntireModel.py 60 and 64: the student encoder and its
VAT decoder called on the labeled, then on the unlabeled images), so every BN of the student normalises each part
with its own statistics and updates its running statistics twice, and each part has its own T-VAT search. A head
with memories (NP) takes the two parts' perturbed features in one call (its labeled context and its memories as
in the joint pass: PS-MT has no NP code to follow); the other heads classify each part on its own. The
student's feature map comes from ``Segmentor.extract`` (one decoder pass), so MC dropout
with decoder scope samples only in the head during PS-MT training, and the auxiliary
layer-3 head (Cityscapes) is not trained by PS-MT (its released code has none).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from npsemiseg.data.mixing import psmt_cutmix
from npsemiseg.frameworks.base import Batch, StepContext, StepResult
from npsemiseg.frameworks.ema import unwrap
from npsemiseg.frameworks.losses import masked_mean
from npsemiseg.frameworks.schedules import rampup_weight
from npsemiseg.frameworks.semi import (
    SemiSupervisedFramework,
    StudentPass,
    ignore_where,
    labeled_view,
    require_unlabeled,
)
from npsemiseg.frameworks.specs.psmt import PSMTOptions, PSMTSpec
from npsemiseg.frameworks.tvat import at_size, frozen_classifier, tvat_perturbation
from npsemiseg.heads.base import HeadOutput
from npsemiseg.models import SegmentorOutput, logit_align_corners


def assist_combine(core: Tensor, assist: Tensor, topk: int) -> Tensor:
    """The assist teacher's logits ``[B, K, H, W]`` at its ``topk`` classes per pixel, the core's elsewhere."""
    k = min(topk, assist.shape[1])
    top = assist.topk(k, dim=1).indices
    keep = torch.zeros_like(assist, dtype=torch.bool).scatter_(1, top, True)
    return torch.where(keep, assist, core)


def teacher_target(logits_1: Tensor, logits_2: Tensor, core: int, *, topk: int, gamma: float) -> Tensor:
    """PS-MT's target logits ``gamma t1 + (1 - gamma) t2`` where the assist teacher (not ``core``,
    0 or 1) is restricted to its top-k classes (``assist_combine``)."""
    if core == 0:
        logits_2 = assist_combine(logits_1, logits_2, topk)
    else:
        logits_1 = assist_combine(logits_2, logits_1, topk)
    return gamma * logits_1 + (1.0 - gamma) * logits_2


class TeacherEnsemble(nn.Module):
    """Evaluation model averaging several segmentors.

    ``average="probabilities"``: their per-sample logits are concatenated along the sample axis, so the
    prediction (mean of per-sample softmaxes) averages them all. ``average="logits"`` (PS-MT's released VOC
    evaluation): the members' logits ``[S, B, K, h, w]`` are averaged sample by sample, and the prediction is
    the softmax of the mean logits. ``extract`` / ``head`` are the first teacher's (used by NP's whole-image latent)."""

    def __init__(self, members: list[nn.Module], *, average: str = "probabilities") -> None:
        super().__init__()
        if average not in ("probabilities", "logits"):
            raise ValueError(f"average: expected 'probabilities' or 'logits', got {average!r}")
        self.members = nn.ModuleList(members)
        self.average = average

    @property
    def head(self) -> nn.Module:
        return self.members[0].head

    @property
    def num_classes(self) -> int:
        return self.members[0].num_classes

    @property
    def align_corners(self) -> bool:
        return logit_align_corners(self.members[0])

    def extract(self, images: Tensor) -> Tensor:
        return self.members[0].extract(images)

    def forward(self, images: Tensor, *, labels: Tensor | None = None, num_context: int = 0,
                num_samples: int | None = None, latent: Any = None) -> Any:
        if labels is not None:
            raise ValueError("labels: the teacher ensemble is for inference only")
        outputs = [m(images, num_samples=num_samples, latent=latent) for m in self.members]
        member_logits = [o.head.logits for o in outputs]
        if self.average == "logits":
            logits = torch.stack(member_logits).mean(dim=0)
        else:
            logits = torch.cat(member_logits, dim=0)
        head = HeadOutput(logits, logits.new_zeros((), dtype=torch.float32), {})
        return SegmentorOutput(outputs[0].features, head, None, None)


def _joined(labeled: HeadOutput, unlabeled: HeadOutput) -> HeadOutput:
    """Two head calls as one output: logits ``[S, B_l + B_u, K, h, w]``, auxiliary losses summed, statistics
    averaged over the images."""
    n_l, n_u = labeled.logits.shape[1], unlabeled.logits.shape[1]
    stats = {k: (n_l * v + n_u * unlabeled.stats[k]) / (n_l + n_u) for k, v in labeled.stats.items() if k in unlabeled.stats}
    return HeadOutput(torch.cat([labeled.logits, unlabeled.logits], dim=1), labeled.aux_loss + unlabeled.aux_loss, stats)


def _average_gradients(model: nn.Module) -> None:
    """Average ``model``'s gradients over the processes (DDP does this for the student, not for a teacher)."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return
    world_size = torch.distributed.get_world_size()
    for parameter in model.parameters():
        if parameter.grad is not None:
            torch.distributed.all_reduce(parameter.grad)
            parameter.grad /= world_size


class PSMT(PSMTSpec, SemiSupervisedFramework):
    """One student, two alternating EMA teachers, T-VAT and confidence-weighted CE."""

    teacher_names = ("teacher1", "teacher2")

    def __init__(self, options, build_model, **collaborators: Any) -> None:
        super().__init__(options, build_model, **collaborators)
        self._teacher_optimizers: dict[str, torch.optim.Optimizer] = {}
        if options.warmup_epochs > 0:  # teachers of their own, trained in the warm-up (see the module docstring)
            self.teachers.update((name, build_model().eval()) for name in self.teacher_names)
            if options.warmup_teacher_backbones == "scratch":
                for name in self.teacher_names:
                    unwrap(self.teachers[name]).backbone.reset_parameters()
        self._ensemble = TeacherEnsemble([self.teachers[n] for n in self.teacher_names],
                                         average=options.eval_average)  # type: ignore[attr-defined]

    def eval_model(self) -> nn.Module:
        if self.options.eval_teachers == "both":  # type: ignore[attr-defined]
            return self._ensemble
        return self.teachers["teacher1"]

    @property
    def warmup_epochs(self) -> int:
        return self.options.warmup_epochs  # type: ignore[attr-defined]

    def core_index(self, ctx: StepContext) -> int:
        """0 (teacher 1) in the first semi-supervised epoch, 1 in the next, alternating."""
        return (ctx.epoch - self.options.warmup_epochs) % 2  # type: ignore[attr-defined]

    def train_step(self, batch: Batch, ctx: StepContext) -> StepResult:
        opts: PSMTOptions = self.options  # type: ignore[assignment]
        images_l = labeled_view(batch.labeled, strong=opts.strong_labeled)
        labels_l = batch.labeled["label"]
        if ctx.epoch < opts.warmup_epochs:
            teacher_logs = self._warm_up_teachers(batch.labeled)
            student = self.labeled_pass(images_l, labels_l)
            return StepResult(self.supervised_terms(student, labels_l), self.step_logs(student, **teacher_logs))
        self._freeze_teachers()
        unlabeled = require_unlabeled(batch, self.name)
        self.seed_memories(images_l, labels_l)

        t1, t2 = (self.predict_unlabeled(self.teachers[n], unlabeled, train_mode=opts.teacher_train_mode)
                  for n in self.teacher_names)
        target = teacher_target(t1.log_probs(), t2.log_probs(), self.core_index(ctx), topk=opts.assist_topk, gamma=opts.gamma)
        confidence, pseudo = torch.softmax(target, dim=1).max(dim=1)
        mixed = psmt_cutmix(labeled_view(unlabeled, strong=True), pseudo, confidence, scheme=opts.cutmix_boxes)
        confident = mixed.confidence >= opts.confidence_threshold
        head_labels = ignore_where(mixed.label, ~confident)

        student = self._perturbed_pass(images_l, labels_l, mixed.image, head_labels, opts)
        losses = self.supervised_terms(student, labels_l)
        per_pixel = self.pixel_ce(student.logits_u, mixed.label) * mixed.confidence
        weight = rampup_weight(ctx.step - opts.warmup_epochs * ctx.iters_per_epoch, ctx.iters_per_epoch,
                               opts.unsup_weight, opts.rampup_epochs)
        losses["unsup"] = weight * masked_mean(per_pixel, confident)
        logs = self.step_logs(student, unsup_weight=weight, kept_fraction=confident.float().mean())
        return StepResult(losses, logs)

    def _warm_up_teachers(self, labeled: dict[str, Tensor]) -> dict[str, Tensor]:
        """One supervised step of each teacher on the weak labeled view with its own optimiser; returns
        ``{"warmup/<teacher>_loss": loss}``."""
        images, labels = labeled_view(labeled, strong=False), labeled["label"]
        logs = {}
        for name in self.teacher_names:
            teacher, optimizer = self.teachers[name], self._teacher_optimizer(name)
            teacher.train()
            loss = sum(self.supervised_terms(self.labeled_pass(images, labels, model=teacher), labels).values())
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            _average_gradients(teacher)
            optimizer.step()
            teacher.eval()
            logs[f"warmup/{name}_loss"] = loss.detach()
        return logs

    def _teacher_optimizer(self, name: str) -> torch.optim.Optimizer:
        if name not in self._teacher_optimizers:
            if self.build_optimizer is None:
                raise ValueError("psmt: warmup_epochs > 0 trains the teachers and needs build_optimizer (the run's "
                                 "optimizer factory; npsemiseg.training.build_framework passes it)")
            for parameter in self.teachers[name].parameters():
                parameter.requires_grad_(True)
            self._teacher_optimizers[name] = self.build_optimizer(self.teachers[name])
        return self._teacher_optimizers[name]

    def _freeze_teachers(self) -> None:
        """After the warm-up: EMA teachers take no gradients and their optimisers are dropped (as the released code)."""
        if self._teacher_optimizers or any(p.requires_grad for t in self.teachers.values() for p in t.parameters()):
            for parameter in (p for t in self.teachers.values() for p in t.parameters()):
                parameter.requires_grad_(False)
            self._teacher_optimizers.clear()

    def state_dict(self) -> dict[str, Any]:
        """The warm-up teachers' optimiser states (empty outside the warm-up)."""
        return {"teacher_optimizers": {n: o.state_dict() for n, o in self._teacher_optimizers.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name, optimizer_state in state.get("teacher_optimizers", {}).items():
            self._teacher_optimizer(name).load_state_dict(optimizer_state)

    def _perturbed_pass(self, images_l: Tensor, labels_l: Tensor, images_u: Tensor, labels_u: Tensor,
                        opts: PSMTOptions) -> StudentPass:
        """Student features (one pass over both parts, or one per part: ``student_passes``), T-VAT perturbation,
        head on the perturbed features."""
        model = unwrap(self.student)
        labels = torch.cat([labels_l, labels_u], dim=0)
        if opts.student_passes == "split":
            parts = [self._perturbed_features(model, images, opts, None) for images in (images_l, images_u)]
            features = torch.cat(parts, dim=0)
            if model.head.has_memories:  # NP: labeled context and memories as in the joint pass
                head = model.classify(features, labels=labels, num_context=images_l.shape[0])
            else:
                head = _joined(model.classify(parts[0]), model.classify(parts[1]))
        else:
            images = torch.cat([images_l, images_u], dim=0)
            features = self._perturbed_features(model, images, opts,
                                                (images_l.shape[0], images_u.shape[0]) if opts.tvat_per_batch else None)
            head = model.classify(features, labels=labels, num_context=images_l.shape[0])
        return self._split(SegmentorOutput(features, head, None, None), images_l.shape[0])

    def _perturbed_features(self, model: nn.Module, images: Tensor, opts: PSMTOptions,
                            parts: tuple[int, int] | None) -> Tensor:
        """The student's features ``[B, C, h, w]`` of ``images [B, 3, H, W]`` plus their T-VAT perturbation
        (searched per ``parts`` when given)."""
        features = model.extract(images)
        if not opts.tvat:
            return features
        teachers = [frozen_classifier(self.teachers[n]) for n in self.teacher_names]
        if opts.tvat_kl_at_crop_size:
            teachers = [at_size(t, images.shape[-2:], align_corners=logit_align_corners(model)) for t in teachers]
        return features + tvat_perturbation(features, teachers, xi=opts.tvat_xi, eps=opts.tvat_eps,
                                            iterations=opts.tvat_iterations,
                                            released_normalization=opts.tvat_released_normalization, parts=parts)

    def after_optimizer_step(self, ctx: StepContext) -> None:
        opts: PSMTOptions = self.options  # type: ignore[assignment]
        if ctx.epoch < opts.warmup_epochs:  # the teachers trained themselves in train_step
            return
        core = self.teachers[self.teacher_names[self.core_index(ctx)]]
        self.ema(core, opts.ema_keep_rate, buffers="ema")
        # the other teacher keeps its weights but must query the student's current NP memories
        self.sync_memories(self.teachers[self.teacher_names[1 - self.core_index(ctx)]])
