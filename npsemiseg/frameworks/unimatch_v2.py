"""UniMatch V2 (Yang et al., 2024): an EMA teacher, two CutMixed strong views with complementary channel dropout.

Source: LiheYoung/UniMatch-V2@f6afb4d ``unimatch_v2.py`` 170-226 (the loop body), ``model/semseg/dpt.py`` 148-167
(``comp_drop``). Per iteration:

1. The EMA teacher (eval mode, no gradient) predicts the weak view: confidences and hard pseudo-labels at image
   size (``unimatch_v2.py`` 170-173; the mean of the per-sample softmaxes for the stochastic heads).
2. Each strong view gets its own CutMix box (``dataset/transform.py`` ``obtain_cutmix_box``, FixMatch's draw)
   inside which the *batch flipped* (image ``B - 1 - i``) is pasted (175-176); the pseudo-labels, confidences and
   valid pixels are mixed the same way (181-190). The two views are the data pipeline's ``image_strong`` and
   ``image_strong2``, each its own photometric draw on the same crop (``dataset/semi.py`` 51-61; what
   ``FixMatch.unlabeled_views`` asks for, as in :mod:`npsemiseg.frameworks.unimatch`).
3. The student (train mode) on the labeled images: the supervised loss (178, 192; the NP head's context and
   targets are the labeled images: the official loop has no student pass on the weak view).
4. The student on ``cat(strong1, strong2)`` with **complementary dropout** (``dpt.py`` 148-161): per pair
   ``(i, B_u + i)`` a channel mask ``m = 2 x Bernoulli(1/2)`` over the encoder width D and its complement ``2 - m``,
   the same for the four ViT maps; ``int(B_u x (1 - 0.5))`` random pairs (``comp_drop_kept``: half) keep every
   channel (mask 1). The decoder and head then run on the masked maps without labels (the NP head draws its latent
   from its stored centers). On a ResNet encoder the pair of masks is drawn per map width (``low_level`` and
   ``high_level``), the same pairs kept whole.
5. Each strong term sums the per-pixel CE over pixels with mixed confidence >= ``confidence_threshold`` that are
   valid (not padded by the crop: the items' ``padding`` mask, the flipped batch's inside the box) and divides by
   the valid pixels (194-200); the logged mask ratio counts valid pixels only (213); loss
   ``(loss_x + (loss_s1 + loss_s2) / 2) / 2`` (202-204): terms ``sup`` (0.5), ``unsup_s1`` and ``unsup_s2`` (0.25
   each); the NP head's ``kl`` unscaled, as in every framework.
6. After the optimiser step the teacher follows the student over parameters and buffers with ratio
   ``min(1 - 1 / (iters + 1), ema_decay)`` (``ema_decay`` 0.996; 221-226; NP memories are copied, not averaged).

``fixmatch_v2`` (:class:`FixMatchV2`): the repository's ``fixmatch.py``, UniMatch V2's FixMatch row: the same
teacher, one strong view, labeled and strong images in one student pass, no complementary dropout.

Evaluated: the EMA teacher (the official loop evaluates both and the published numbers are the EMA's best: e.g.
Pascal 92 labels, DINOv2-B, ``training-logs/table01-pascal_unimatch_v2_92labels_dinov2_base.log``: EMA 86.29,
published 86.3). The training loop sets the LR after the step under switch ``unimatch_lr_timing`` (released: step
``i`` runs at the poly LR of ``i - 1``, 216-219). The publication settings of each official config (AdamW with the
backbone / head LRs, crop, batch, epochs, loss, evaluation, the DINOv2-B encoder of the published tables) are
:meth:`UniMatchV2.publication_values`: the values every config shares are this module's, the per-dataset ones
(crop, batch, epochs, OHEM, evaluation mode) the dataset's ``PaperSettings`` entry for the framework
(``npsemiseg.data.settings.unimatch_v2_config``, set in ``npsemiseg/data/sets/*.py`` and ``VOC_SETTINGS``); the
``paper`` preset trains every head at them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor, nn

from npsemiseg.frameworks.base import Batch, StepContext, StepResult
from npsemiseg.frameworks.ema import unwrap, warmup_decay
from npsemiseg.frameworks.fixmatch import FixMatch, PseudoLabels, cutmixed, mask_ratio
from npsemiseg.frameworks.pseudo_labels import TeacherPrediction
from npsemiseg.frameworks.semi import StudentPass, ignore_where, require_unlabeled
from npsemiseg.frameworks.specs.unimatch_v2 import (  # noqa: F401  (the publication settings, read from here too)
    FROZEN_WHY,
    OFFICIAL_BACKBONE,
    OFFICIAL_GPUS,
    OFFICIAL_LR_MULTI,
    OFFICIAL_WEIGHT_DECAY,
    FixMatchV2Spec,
    UniMatchV2Options,
    UniMatchV2Spec,
    config_values,
    evaluation_values,
    shared_values,
)
from npsemiseg.heads.base import HeadOutput
from npsemiseg.models import BackboneFeatures, Segmentor, ViTBackbone


def complementary_masks(pairs: int, widths: Sequence[int], *, kept_fraction: float = 0.5,
                        generator: torch.Generator | None = None, device: torch.device | str | None = None) -> list[Tensor]:
    """UniMatch V2's complementary channel masks, one ``[2 x pairs, C]`` per width ``C`` in ``widths``.

    Row ``i`` is ``2 x Bernoulli(1/2)`` per channel and row ``pairs + i`` its complement ``2 - m`` (``dpt.py``
    151-152); ``int(pairs x kept_fraction)`` random pairs, the same for every width, are all ones (153-157).
    """
    kept = torch.randperm(pairs, generator=generator)[:int(pairs * kept_fraction)]
    masks = []
    for width in widths:
        first = torch.bernoulli(torch.full((pairs, width), 0.5), generator=generator) * 2.0
        second = 2.0 - first
        first[kept], second[kept] = 1.0, 1.0
        masks.append(torch.cat([first, second]).to(device) if device is not None else torch.cat([first, second]))
    return masks


def masked_encoding(encoded: BackboneFeatures, masks: Sequence[Tensor], vit: bool) -> BackboneFeatures:
    """The encoder maps times their channel masks: a ViT's one ``[N, D]`` mask on all four maps (``low_level``
    holds three: the mask repeated), else ``masks = (low_level's, high_level's)`` (``layer3`` kept as it is)."""
    if vit:
        mask = masks[0]
        return BackboneFeatures(encoded.low_level * mask.repeat(1, 3)[:, :, None, None],
                                encoded.layer3 * mask[:, :, None, None], encoded.high_level * mask[:, :, None, None])
    low, high = masks
    return BackboneFeatures(encoded.low_level * low[:, :, None, None], encoded.layer3,
                            encoded.high_level * high[:, :, None, None])


def decode(model: Segmentor, encoded: BackboneFeatures) -> HeadOutput:
    """The decoder and head of ``model`` on given encoder maps, without labels (decoder-scope MC dropout samples
    the decoder as :meth:`Segmentor.forward` does)."""
    if model.decoder_sampling:
        return model.sample_decoder(encoded)[1]
    return model.classify(model.decoder(encoded.low_level, encoded.high_level))


def complementary_pass(model: Segmentor, views: Tensor,
                       draw_masks: Callable[[int, Sequence[int], torch.device], list[Tensor]]) -> HeadOutput:
    """``model`` on ``views [2 P, 3, H, W]`` (pairs ``(i, P + i)``) with complementary dropout on its encoder maps,
    the masks ``draw_masks(P, widths, device)`` (:func:`complementary_masks`): UniMatch V2's ``DPT.forward(x,
    comp_drop=True)`` (``dpt.py`` 148-167), the strong pass of :class:`UniMatchV2` and of the official loop run on the
    project's network (``benchmarks/official_runs.py``)."""
    encoded = model.encode(views)
    vit = isinstance(model.backbone, ViTBackbone)
    widths = [encoded.high_level.shape[1]] if vit else [encoded.low_level.shape[1], encoded.high_level.shape[1]]
    return decode(model, masked_encoding(encoded, draw_masks(views.shape[0] // 2, widths, views.device), vit))


@dataclass
class MixedViews:
    """What steps 1-2 make of the unlabeled batch: per strong view its CutMixed pseudo-labels and valid pixels
    (``targets``, :func:`cutmixed`), its mixed image ``[B_u, 3, H, W]`` (``views``) and its box ``[B_u, H, W]``
    (``boxes``); the EMA teacher's prediction on the weak view and the weak view's valid pixels ``[B_u, H, W]``."""

    targets: list[tuple[PseudoLabels, Tensor]]
    views: list[Tensor]
    boxes: list[Tensor]
    teacher: TeacherPrediction
    valid: Tensor


#: LiheYoung/UniMatch-V2@f6afb4d, the settings every config shares: AdamW over two groups, the backbone at ``lr``
#: (configs/*.yaml 10: 5e-6, in each dataset's entry) and every other parameter at ``lr x lr_multi`` (11: 40), betas
class UniMatchV2(UniMatchV2Spec, FixMatch):
    """An EMA teacher's weak-view pseudo-labels; two strong views, batch-flipped CutMix, complementary dropout.

    From FixMatch: the box draws (:meth:`draw_boxes`, one per strong view), the augmentation, the thresholded loss.
    """

    teacher_names = ("teacher",)
    #: unimatch_v2.py 202-204: loss = (loss_x + (loss_s1 + loss_s2) / 2) / 2
    sup_weight: ClassVar[float] = 0.5
    strong_weights: ClassVar[tuple[float, ...]] = (0.25, 0.25)

    def eval_model(self) -> nn.Module:
        return self.teacher

    def draw_masks(self, pairs: int, widths: Sequence[int], device: torch.device) -> list[Tensor]:
        """The complementary channel masks of the strong pass (:func:`complementary_masks`; a test injects them)."""
        kept = self.options.comp_drop_kept  # type: ignore[attr-defined]
        return complementary_masks(pairs, widths, kept_fraction=kept, device=device)

    # ----------------------------------------------------------------- step
    def strong_pass(self, views: Tensor) -> HeadOutput:
        """The student on ``views [2 B_u, 3, H, W]`` (``cat(strong1, strong2)``) with complementary dropout."""
        return complementary_pass(unwrap(self.student), views, self.draw_masks)

    def mixed_views(self, batch: Batch) -> MixedViews:
        """Steps 1-2: the EMA teacher's prediction on the weak view, a box per strong view (``[B_u, H, W]``) and
        per strong view (``image_strong``, ``image_strong2``: :meth:`FixMatch.views`) the view ``[B_u, 3, H, W]`` with
        the flipped batch pasted into its box and its pseudo-labels, confidences and valid (unpadded) pixels mixed the
        same way (:func:`cutmixed`)."""
        unlabeled = require_unlabeled(batch, self.name)
        strong, valid = self.views(unlabeled)
        weak = unlabeled["image"]
        self.seed_memories(batch.labeled["image"], batch.labeled["label"])
        teacher = self.predict_unlabeled(self.teacher, unlabeled)
        own = PseudoLabels.of(teacher)
        boxes = self.draw_boxes(weak.shape[0], weak.shape[-2], weak.shape[-1], weak.device)
        views = [torch.where(box[:, None], view.flip(0), view) for box, view in zip(boxes, strong)]
        targets = [cutmixed(box, own.flip(), valid.flip(0), own, valid) for box in boxes]
        return MixedViews(targets, views, boxes, teacher, valid)

    def step_result(self, student: StudentPass, labels_l: Tensor, strong_logits: Sequence[Tensor],
                    mixed: MixedViews) -> StepResult:
        """Step 5: the supervised terms (x ``sup_weight``) and a thresholded term per strong view (logits
        ``[S, B_u, K, h, w]``) over its valid pixels; the mask ratio over the weak view's valid pixels (213)."""
        threshold = self.options.confidence_threshold  # type: ignore[attr-defined]
        losses = self.weighted_supervised_terms(student, labels_l)
        losses.update(self.strong_terms(strong_logits, mixed.targets))
        ratio = mask_ratio(mixed.teacher.confidence, mixed.valid, threshold)
        return StepResult(losses, self.step_logs(student, mask_ratio=ratio,
                                                 box_fraction=torch.stack(mixed.boxes).float().mean()))

    def train_step(self, batch: Batch, ctx: StepContext) -> StepResult:
        mixed = self.mixed_views(batch)
        images_l, labels_l = batch.labeled["image"], batch.labeled["label"]
        labeled = self.labeled_pass(images_l, labels_l)  # 3. the supervised pass
        # 4. both strong views in one pass, complementary dropout on the encoder maps
        strong_logits = self.strong_pass(torch.cat(mixed.views)).logits.chunk(len(mixed.views), dim=1)
        return self.step_result(labeled, labels_l, strong_logits, mixed)

    @torch.no_grad()
    def after_optimizer_step(self, ctx: StepContext) -> None:
        """The teacher follows the student with ratio ``min(1 - 1 / (step + 1), ema_decay)`` (unimatch_v2.py 221-226)."""
        self.ema(self.teacher, warmup_decay(ctx.step, self.options.ema_decay))  # type: ignore[attr-defined]


class FixMatchV2(FixMatchV2Spec, UniMatchV2):
    """FixMatch as UniMatch V2's repository runs it (``fixmatch.py`` 171-217; UniMatch V2's comparison row): the
    EMA teacher, one strong view with the flipped batch CutMixed in, the labeled images and the strong view in one
    student pass (the NP head: labeled = context, targets = both, the strong view's with the mixed pseudo-labels,
    255 below the threshold), no complementary dropout; loss ``(loss_x + loss_s) / 2`` (fixmatch.py 193); the EMA
    and the evaluated teacher as UniMatch V2's."""

    strong_weights: ClassVar[tuple[float, ...]] = (0.5,)

    def train_step(self, batch: Batch, ctx: StepContext) -> StepResult:
        threshold = self.options.confidence_threshold  # type: ignore[attr-defined]
        mixed = self.mixed_views(batch)
        pseudo = mixed.targets[0][0]
        joint = self.student_pass(batch.labeled["image"], batch.labeled["label"], mixed.views[0],
                                  ignore_where(pseudo.label, pseudo.confidence < threshold))
        return self.step_result(joint, batch.labeled["label"], [joint.logits_u], mixed)
