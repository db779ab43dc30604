"""FixMatch for segmentation as UniMatch's code runs it (Yang et al., CVPR 2023, its baseline;
``docs/frameworks.md``, FixMatch and UniMatch).

Source: LiheYoung/UniMatch@0324f3dd4a22128105a5eb135d2586c0bb3cc647 ``fixmatch.py`` 120-184. One network,
no EMA teacher; per iteration (whole-step golden under ``released``: ``tests/test_fixmatch_step_golden.py``):

1. The CutMix source (:meth:`FixMatch.cutmix_source`, option ``cutmix_source``, switch ``unimatch_cutmix_source``):
   the network in eval mode, without gradient, predicts its weak view (fixmatch.py 132-137). ``second_draw``
   (released): the source is a second augmentation draw of the same unlabeled items (``*_mix`` keys: the official
   loader zips the unlabeled loader with itself, fixmatch.py 120, the same images in the same order, each in another
   view; UniMatch issue #51). ``batch_shift`` (corrected): the batch shifted cyclically by a random ``1 <= k < B_u``
   (image i pastes image ``(i + k) mod B_u``; the maintainer, issue #34: a shuffled batch does as well), and the
   eval-mode prediction is of the weak view itself.
2. One box per image (:func:`unimatch_boxes`, ``obtain_cutmix_box`` of dataset/transform.py 66-84: probability
   ``cutmix_p``, area U[0.02, 0.4] of the crop, aspect U[0.3, 1/0.3]) pastes the source's strong view into the
   strong view ``image_strong`` (fixmatch.py 139-140).
3. The network in train mode on ``cat(labeled, weak)`` (fixmatch.py 142-146; the NP head: labeled = context,
   all = targets, the unlabeled ones labelled with the eval-mode pseudo-labels of the weak view, 255 below the
   threshold): the supervised loss, and the detached weak-view prediction (mean of the per-sample softmaxes for
   the stochastic heads) gives the pseudo-labels and confidences outside the boxes (fixmatch.py 149-158).
4. The network in train mode on the mixed strong view, no labels (the NP head draws its latent from its stored
   centers): per-pixel CE against the mixed pseudo-labels, summed over pixels whose (mixed) confidence is >=
   ``confidence_threshold`` and that are valid, divided by the number of valid pixels (fixmatch.py 162-164). Valid =
   not padded by the crop (the items' ``padding`` mask, and the source's inside the box: dataset/semi.py 64-68).
5. Loss ``(loss_x + loss_s) / 2`` (fixmatch.py 166): terms ``sup`` = 0.5 loss_x (and 0.5 of any other
   supervised term), ``unsup`` = 0.5 loss_s; the NP head's ``kl`` is added unscaled, as in every framework.

What the unlabeled items carry (``Framework.unlabeled_views``): one strong view per strong term, the padding mask,
and the second draw under ``second_draw``. The model evaluated is the network itself (no teacher).
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from npsemiseg.constants import IGNORE_INDEX
from npsemiseg.data.transforms import DRAW_SUFFIX, strong_key
from npsemiseg.frameworks.base import Batch, StepContext, StepResult
from npsemiseg.frameworks.losses import mean_probabilities
from npsemiseg.frameworks.pseudo_labels import TeacherPrediction, oracle_prediction, prediction_from_logits
from npsemiseg.frameworks.specs.fixmatch import FixMatchOptions, FixMatchSpec  # noqa: F401
from npsemiseg.frameworks.semi import SemiSupervisedFramework, StudentPass, ignore_where, require_unlabeled
from npsemiseg.models import upsample_logits

#: UniMatch@0324f3d dataset/transform.py 66: obtain_cutmix_box's size_min, size_max, ratio_1, ratio_2
BOX_AREA = (0.02, 0.4)
BOX_ASPECT = (0.3, 1 / 0.3)
#: tries of the rejection loop before a box is clipped to the image (only crops far from square need it)
BOX_TRIES = 1000


def host_rng(generator: torch.Generator | None = None) -> random.Random:
    """A Python RNG seeded by one 63-bit draw from torch's CPU generator (``generator``, default: the global one,
    which the run seeds and a checkpoint saves): a step's random draws (boxes, partners) then cost one draw and one
    conversion of a host value instead of one tensor draw and one read per number, and stay reproducible from the
    seed and exact across a resume."""
    return random.Random(int(torch.randint(0, 2**63 - 1, (), generator=generator)))


def unimatch_boxes(batch: int, height: int, width: int, *, p: float = 0.5, area: Sequence[float] = BOX_AREA,
                   aspect: Sequence[float] = BOX_ASPECT, generator: torch.Generator | None = None,
                   rng: random.Random | None = None, device: torch.device | str | None = None) -> Tensor:
    """UniMatch's CutMix boxes, one draw per image: bool ``[B, H, W]``, True inside the box.

    Per image (dataset/transform.py 66-84): no box with probability ``1 - p``; else area ``s ~ U[area] x H x W``,
    then aspect ``r ~ U[aspect]``, sides ``w = int(sqrt(s / r))``, ``h = int(sqrt(s r))`` and corner ``x ~ U{0..W-1}``,
    ``y ~ U{0..H-1}`` redrawn (area kept) until the box fits. Every number comes from ``rng`` on the host (as the
    official code draws them from Python's and numpy's RNGs), default :func:`host_rng` of ``generator``; the mask is
    built on the host and copied to ``device`` once.
    """
    rng = host_rng(generator) if rng is None else rng
    mask = torch.zeros(batch, height, width, dtype=torch.bool)
    for i in range(batch):
        if rng.random() > p:
            continue
        size = rng.uniform(area[0], area[1]) * height * width
        for _ in range(BOX_TRIES):
            ratio = rng.uniform(aspect[0], aspect[1])
            w, h = int(math.sqrt(size / ratio)), int(math.sqrt(size * ratio))
            x, y = rng.randrange(width), rng.randrange(height)
            if x + w <= width and y + h <= height:
                break
        mask[i, y:y + h, x:x + w] = True
    return mask.to(device) if device is not None else mask


def mix_partners(batch: int, generator: torch.Generator | None = None, rng: random.Random | None = None) -> Tensor:
    """``[B]`` long: image i's CutMix source ``(i + k) mod B`` for one random shift ``1 <= k < B`` (0 when B = 1),
    ``k`` drawn from ``rng`` (default :func:`host_rng` of ``generator``)."""
    shift = (host_rng(generator) if rng is None else rng).randrange(1, batch) if batch > 1 else 0
    return (torch.arange(batch) + shift) % batch


def thresholded_loss(pixel_loss: Tensor, confidence: Tensor, valid: Tensor, threshold: float) -> Tensor:
    """``sum(pixel_loss * [confidence >= threshold and valid]) / count(valid)`` over ``[B, H, W]`` (UniMatch's
    unsupervised normalisation: masked pixels count in the divisor, ignored ones do not; 0 when none is valid)."""
    keep = (confidence >= threshold) & valid
    return (pixel_loss * keep.to(pixel_loss.dtype)).sum() / valid.sum().clamp_min(1)


def mask_ratio(confidence: Tensor, valid: Tensor, threshold: float) -> Tensor:
    """The logged mask ratio: the share of valid pixels whose ``confidence [B, H, W]`` is at or above ``threshold``
    (UniMatch's ``mask_ratio``: padded pixels count neither above nor below; 0 when none is valid)."""
    return ((confidence >= threshold) & valid).float().sum() / valid.sum().clamp_min(1)


@dataclass
class PseudoLabels:
    """Hard pseudo-labels ``label [B, H, W]`` int64 and their confidences ``confidence [B, H, W]`` (max probability):
    all a FixMatch step reads of a prediction; keeping only these (not the ``[B, K, H, W]`` probabilities, the
    upsampled logits and the features of a :class:`TeacherPrediction`) frees the eval-mode pass's memory as the
    official code's ``conf_u_w_mix, mask_u_w_mix`` do."""

    label: Tensor
    confidence: Tensor

    @classmethod
    def of(cls, prediction: TeacherPrediction) -> PseudoLabels:
        return cls(prediction.label, prediction.confidence)

    def __getitem__(self, index: Tensor) -> PseudoLabels:
        return PseudoLabels(self.label[index], self.confidence[index])

    def flip(self) -> PseudoLabels:
        """The batch in reverse order (UniMatch V2's CutMix source: image ``B - 1 - i`` for image i)."""
        return PseudoLabels(self.label.flip(0), self.confidence.flip(0))


def cutmixed(box: Tensor, pasted: PseudoLabels, pasted_valid: Tensor, own: PseudoLabels,
             valid: Tensor) -> tuple[PseudoLabels, Tensor]:
    """The pseudo-labels, confidences and valid pixels ``[B, H, W]`` of a CutMixed view: ``pasted``'s inside ``box``,
    ``own``'s outside (UniMatch fixmatch.py 153-158, UniMatch V2 unimatch_v2.py 181-190: a padded pixel pasted into
    the box stays out of the loss, an unpadded one counts)."""
    mixed = PseudoLabels(torch.where(box, pasted.label, own.label), torch.where(box, pasted.confidence, own.confidence))
    return mixed, torch.where(box, pasted_valid, valid)


def pseudo_labels(logits: Tensor, size: tuple[int, int], *, align_corners: bool = False) -> PseudoLabels:
    """:class:`PseudoLabels` of per-sample logits ``[S, B, K, h, w]`` at image size ``size``: the max and argmax of
    the (mean of the per-sample) softmax, as :func:`prediction_from_logits` computes them, without its entropy."""
    if logits.shape[0] == 1:
        probs = upsample_logits(logits, size, align_corners=align_corners)[0].float().softmax(dim=1)
    else:
        probs = mean_probabilities(logits, size, align_corners=align_corners)
    confidence, label = probs.max(dim=1)
    return PseudoLabels(label, confidence)


@dataclass
class CutMixSource:
    """What the boxes paste, image by image: the source's eval-mode pseudo-labels (``[B_u, H, W]``), its strong views
    (one ``[B_u, 3, H, W]`` per view) and its valid (unpadded) pixels; ``weak``: the eval-mode pseudo-labels of the
    weak view itself where the NP head needs them as targets, else None."""

    prediction: PseudoLabels
    strong: list[Tensor]
    valid: Tensor
    weak: PseudoLabels | None


class FixMatch(FixMatchSpec, SemiSupervisedFramework):
    """One network, eval-mode CutMix-source pseudo-labels, train-mode weak-view pseudo-labels, one strong view."""

    teacher_names = ()
    #: fixmatch.py 166: loss = (loss_x + loss_s) / 2
    sup_weight: ClassVar[float] = 0.5
    strong_weights: ClassVar[tuple[float, ...]] = (0.5,)

    @classmethod
    def unlabeled_views(cls, options: Mapping[str, Any]) -> dict[str, Any]:
        """One strong view per strong term, each its own photometric draw (dataset/semi.py 51-60); the crop's padding
        mask (dataset/semi.py 45, 64-68); a second draw of every item when the CutMix source is ``second_draw``."""
        source = cls.Options.model_validate(dict(options)).cutmix_source
        return {"strong_views": len(cls.strong_weights), "padding_mask": True,
                "draws": 2 if source == "second_draw" else 1}

    def eval_model(self) -> nn.Module:
        return self.student

    # ----------------------------------------------------------------- pieces
    def draw_boxes(self, batch: int, height: int, width: int, device: torch.device,
                   rng: random.Random | None = None) -> list[Tensor]:
        """One independent box draw per strong view (``[B, H, W]`` bool each), in turn from ``rng`` (default: a
        :func:`host_rng` of torch's global generator)."""
        p, rng = self.options.cutmix_p, host_rng() if rng is None else rng  # type: ignore[attr-defined]
        return [unimatch_boxes(batch, height, width, p=p, rng=rng, device=device) for _ in self.strong_weights]

    def views(self, unlabeled: dict[str, Tensor], suffix: str = "") -> tuple[list[Tensor], Tensor]:
        """The strong views ``image_strong<suffix>``, ``image_strong2<suffix>``, ... ``[B_u, 3, H, W]`` (one per strong
        term) and the valid pixels ``[B_u, H, W]`` (not ``padding<suffix>``) of one augmentation draw."""
        keys = [strong_key(i) + suffix for i in range(len(self.strong_weights))]
        missing = [k for k in (*keys, "padding" + suffix) if k not in unlabeled]
        if missing:
            raise ValueError(f"batch.unlabeled: {self.name} needs {missing} (its unlabeled views: the data pipeline makes "
                             f"them from Framework.unlabeled_views)")
        return [unlabeled[k] for k in keys], ~unlabeled["padding" + suffix]

    def cutmix_source(self, unlabeled: dict[str, Tensor], strong: list[Tensor], valid: Tensor,
                      rng: random.Random | None = None) -> CutMixSource:
        """The eval-mode, no-gradient prediction of the CutMix source (fixmatch.py 132-137, unimatch.py 131-136) and
        what the boxes paste from it: the items' second draw (``cutmix_source="second_draw"``; the NP head's targets
        then need an eval-mode prediction of the weak view too), or the batch shifted by :func:`mix_partners`
        (``batch_shift``, the shift drawn from ``rng``; that prediction is also the weak view's)."""
        if self.options.cutmix_source == "second_draw":  # type: ignore[attr-defined]
            mix = {k.removesuffix(DRAW_SUFFIX): v for k, v in unlabeled.items() if k.endswith(DRAW_SUFFIX)}
            prediction = PseudoLabels.of(self.predict_unlabeled(self.student, mix))
            weak = PseudoLabels.of(self.predict(self.student, unlabeled["image"])) if self._memory_names else None
            return CutMixSource(prediction, *self.views(unlabeled, DRAW_SUFFIX), weak)
        prediction = PseudoLabels.of(self.predict_unlabeled(self.student, unlabeled))
        partner = mix_partners(strong[0].shape[0], rng=rng).to(strong[0].device)
        return CutMixSource(prediction[partner], [view[partner] for view in strong], valid[partner], prediction)

    def weak_pass(self, images_l: Tensor, labels_l: Tensor, weak: Tensor,
                  targets_u: Tensor) -> tuple[StudentPass, Tensor | None]:
        """The train-mode pass over ``cat(labeled, weak)`` (``targets_u``: the NP head's targets); FixMatch has no
        perturbed-feature logits (None)."""
        return self.student_pass(images_l, labels_l, weak, targets_u), None

    def extra_terms(self, perturbed: Tensor | None, weak: PseudoLabels, valid: Tensor) -> dict[str, Tensor]:
        """Loss terms beyond the strong views (UniMatch's feature perturbation)."""
        return {}

    def weak_pseudo_labels(self, logits_u: Tensor, unlabeled: dict[str, Tensor]) -> PseudoLabels:
        """The detached train-mode weak-view logits ``[S, B_u, K, h, w]`` as pseudo-labels at image size (the
        ground truth in their place under ``unlabeled_truth="oracle"``)."""
        size = tuple(unlabeled["image"].shape[-2:])
        if self.unlabeled_truth != "oracle":
            return pseudo_labels(logits_u, size, align_corners=self.align_corners)
        prediction = prediction_from_logits(logits_u, size, align_corners=self.align_corners)
        return PseudoLabels.of(oracle_prediction(prediction, unlabeled["label"]))

    def strong_term_names(self) -> list[str]:
        return ["unsup"] if len(self.strong_weights) == 1 else [f"unsup_s{i + 1}" for i in range(len(self.strong_weights))]

    def weighted_supervised_terms(self, student: StudentPass, labels_l: Tensor) -> dict[str, Tensor]:
        """The supervised terms x ``sup_weight`` (the head's auxiliary term, the NP head's KL, unscaled)."""
        aux_term = self.head_aux_term
        return {k: v if k == aux_term else self.sup_weight * v for k, v in self.supervised_terms(student, labels_l).items()}

    def strong_terms(self, strong_logits: Sequence[Tensor], mixed: Sequence[tuple[PseudoLabels, Tensor]]) -> dict[str, Tensor]:
        """One thresholded term per strong view (logits ``[S, B_u, K, h, w]``) against its CutMixed pseudo-labels and
        valid pixels (:func:`cutmixed`), x its weight: the per-pixel CE summed over the valid pixels at or above the
        threshold, divided by the valid pixels (:func:`thresholded_loss`)."""
        threshold = self.options.confidence_threshold  # type: ignore[attr-defined]
        return {name: weight * thresholded_loss(self.pixel_ce(logits, labels.label), labels.confidence, valid, threshold)
                for name, weight, logits, (labels, valid) in zip(self.strong_term_names(), self.strong_weights,
                                                                 strong_logits, mixed)}

    # ----------------------------------------------------------------- step
    def train_step(self, batch: Batch, ctx: StepContext) -> StepResult:
        threshold = self.options.confidence_threshold  # type: ignore[attr-defined]
        images_l, labels_l = batch.labeled["image"], batch.labeled["label"]
        unlabeled = require_unlabeled(batch, self.name)
        weak = unlabeled["image"]
        strong, valid = self.views(unlabeled)
        size = tuple(weak.shape[-2:])
        self.seed_memories(images_l, labels_l)

        # 1. eval mode, no gradient: the CutMix source's pseudo-labels (and the NP head's targets)
        rng = host_rng()  # the step's draws (partner shift, boxes) from one draw of torch's generator
        source = self.cutmix_source(unlabeled, strong, valid, rng)
        # 2. one independent box per strong view, the source's strong view pasted in
        boxes = self.draw_boxes(weak.shape[0], size[0], size[1], weak.device, rng)
        mixed = [torch.where(box[:, None], pasted, view) for box, pasted, view in zip(boxes, source.strong, strong)]

        # 3. train mode on labeled + weak: supervised loss, detached weak-view pseudo-labels
        targets_u = (ignore_where(source.weak.label, source.weak.confidence < threshold) if source.weak is not None
                     else torch.full((weak.shape[0], *size), IGNORE_INDEX, dtype=labels_l.dtype, device=weak.device))
        clean, perturbed = self.weak_pass(images_l, labels_l, weak, targets_u)
        weak_pred = self.weak_pseudo_labels(clean.logits_u.detach(), unlabeled)

        # 4. train mode on the mixed strong views (one batch), no labels
        output = self.student(torch.cat(mixed, dim=0))
        strong_logits = output.head.logits.chunk(len(mixed), dim=1)  # [S, B_u, K, h, w] each

        losses = self.weighted_supervised_terms(clean, labels_l)
        losses.update(self.strong_terms(strong_logits, [cutmixed(box, source.prediction, source.valid, weak_pred, valid)
                                                        for box in boxes]))
        losses.update(self.extra_terms(perturbed, weak_pred, valid))
        return StepResult(losses, self.step_logs(clean, mask_ratio=mask_ratio(weak_pred.confidence, valid, threshold),
                                                 box_fraction=torch.stack(boxes).float().mean()))
