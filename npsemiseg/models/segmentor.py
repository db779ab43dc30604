"""The segmentor: ResNet encoder + DeepLabv3+ decoder + any classifier head.

``Segmentor.forward(images)`` normalises ``[B, 3, H, W]`` images in [0, 1] with the ImageNet
mean/std (buffers), encodes them once, decodes the feature map ``[B, C, h, w]`` (stride 4) and
hands it to the head, which returns ``HeadOutput(logits [S, B, K, h, w])``. ``extract`` and
``classify`` are the two halves (PS-MT's T-VAT perturbs the feature map between them);
``forward_feature_perturbed`` decodes clean and channel-dropped encoder maps as one batch (UniMatch's feature
perturbation).

MC dropout scopes (see :func:`build_segmentor`):

- ``"decoder"`` (the paper's): the decoder is built with always-active dropout after every
  activation; the encoder runs once and decoder + head run S times, each head call making one
  sample. ``samples_per_pass`` of the S passes run as one batch (the encoder outputs repeated
  along the batch dimension). Default 1, a loop: on CPU batching the passes is no faster (the
  per-pass convolutions are already large; ``docs/performance.md``) and needs S times the
  activation memory; on a GPU with small batches a larger value may pay off.
- ``"head"``: the decoder runs once and only the MC-dropout head samples.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from npsemiseg.constants import IGNORE_INDEX
from npsemiseg.heads.base import ClassifierHead, HeadOutput
from npsemiseg.heads.factory import build_head
from npsemiseg.heads.specs import COARSE_POOL

from .backbones import BackboneFeatures, ResNetBackbone, build_backbone
from .deeplab import AuxiliaryHead, DeepLabV3PlusDecoder, RepresentationHead, feature_channels, get_variant
from .dpt import DPTDecoder
from .vit import ViTBackbone, build_vit_backbone, is_vit_backbone

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
#: decoder-scope MC dropout: samples per batched decoder pass (None = all S in one batch); see
#: benchmarks/mc_dropout_decoder_passes.py and docs/performance.md for the measurement behind it
DEFAULT_SAMPLES_PER_PASS: int | None = 1


@dataclass
class SegmentorOutput:
    """What :meth:`Segmentor.forward` returns.

    features: ``[B, C, h, w]`` the feature map the head consumed (decoder scope of MC dropout:
        the first of the S decoder passes).
    head: the head's :class:`HeadOutput`, ``logits [S, B, K, h, w]`` at feature resolution.
    aux_logits: ``[B, K, h3, w3]`` of the layer-3 auxiliary head in training mode, else None.
    representation: ``[B, E, h, w]`` of the representation head (computed from ``features``), or None.
    """

    features: Tensor
    head: HeadOutput
    aux_logits: Tensor | None = None
    representation: Tensor | None = None


def upsample_logits(logits: Tensor, size: Sequence[int], *, align_corners: bool = False) -> Tensor:
    """Bilinear resize of per-sample logits ``[S, B, K, h, w]`` to ``[S, B, K, H, W]`` (``size = (H, W)``)."""
    if logits.dim() != 5:
        raise ValueError(f"logits: expected [S, B, K, h, w], got shape {tuple(logits.shape)}")
    size = tuple(int(s) for s in size)
    if logits.shape[-2:] == size:
        return logits
    s, b = logits.shape[:2]
    resized = F.interpolate(logits.flatten(0, 1), size=size, mode="bilinear", align_corners=align_corners)
    return resized.view(s, b, *resized.shape[1:])


def logit_align_corners(model: nn.Module) -> bool:
    """How ``model`` upsamples its logits to label size (``Segmentor.align_corners``; a DDP wrapper's module,
    an ensemble's property; False for models without one): every caller of :func:`upsample_logits` asks here."""
    return bool(getattr(getattr(model, "module", model), "align_corners", False))


def _repeat(x: Tensor, times: int) -> Tensor:
    """``[B, ...] -> [times x B, ...]``, sample-major (rows ``s * B + b``)."""
    return x if times == 1 else x.expand(times, *x.shape).reshape(times * x.shape[0], *x.shape[1:])


class Segmentor(nn.Module):
    """Backbone + DeepLabv3+ decoder + classifier head (+ optional auxiliary / representation heads).

    The decoder samples (MC dropout, decoder scope) when it was built with ``mc_dropout > 0``;
    the number of samples is then ``num_samples`` or the head's ``default_num_samples``, and
    ``samples_per_pass`` of them run as one batch (None: all S at once; 1: a loop of S passes).
    """

    def __init__(
        self,
        backbone: ResNetBackbone,
        decoder: DeepLabV3PlusDecoder,
        head: ClassifierHead,
        *,
        aux_head: AuxiliaryHead | None = None,
        representation_head: RepresentationHead | None = None,
        samples_per_pass: int | None = DEFAULT_SAMPLES_PER_PASS,
        align_corners: bool = False,
    ) -> None:
        super().__init__()
        if samples_per_pass is not None and (
            isinstance(samples_per_pass, bool) or not isinstance(samples_per_pass, int) or samples_per_pass < 1
        ):
            raise ValueError(f"samples_per_pass: expected a positive int or None, got {samples_per_pass!r}")
        self.samples_per_pass = samples_per_pass
        #: bilinear logit upsampling to label size with ``align_corners`` (True in every official model; switch
        #: ``align_corners`` of ``npsemiseg.protocol``); read through :func:`logit_align_corners`
        self.align_corners = bool(align_corners)
        if head.in_channels != decoder.out_channels:
            raise ValueError(
                f"head: in_channels {head.in_channels} does not match the decoder's feature channels "
                f"{decoder.out_channels} (variant {decoder.variant!r})"
            )
        self.backbone = backbone
        self.decoder = decoder
        self.head = head
        self.aux_head = aux_head
        self.representation_head = representation_head
        self.register_buffer("mean", torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(IMAGENET_STD).view(1, 3, 1, 1), persistent=False)

    @property
    def decoder_sampling(self) -> bool:
        """True when MC dropout samples the whole decoder (``mc_dropout_scope="decoder"``)."""
        return self.decoder.mc_dropout > 0

    @property
    def num_classes(self) -> int:
        return self.head.num_classes

    def encode(self, images: Tensor) -> BackboneFeatures:
        """Normalise ``images [B, 3, H, W]`` in [0, 1] and run the backbone once."""
        if images.dim() != 4 or images.shape[1] != 3 or not images.is_floating_point():
            raise ValueError(
                f"images: expected float [B, 3, H, W] in [0, 1], got {images.dtype} of shape {tuple(images.shape)}"
            )
        return self.backbone((images - self.mean) / self.std)

    def extract(self, images: Tensor) -> Tensor:
        """The feature map the head consumes, ``[B, C, h, w]`` (one decoder pass)."""
        encoded = self.encode(images)
        return self.decoder(encoded.low_level, encoded.high_level)

    def classify(
        self,
        features: Tensor,
        *,
        labels: Tensor | None = None,
        num_context: int = 0,
        num_samples: int | None = None,
        latent: Any = None,
    ) -> HeadOutput:
        """Run the head on ``features [B, C, h, w]``; with ``labels [B, H, W]`` and ``num_context = m``
        the context is ``features[:m]`` / ``labels[:m]``. ``latent`` goes to heads that take one (NP)."""
        return self.head(features, **self._head_kwargs(features, labels, num_context, num_samples, latent))

    def forward(
        self,
        images: Tensor,
        *,
        labels: Tensor | None = None,
        num_context: int = 0,
        num_samples: int | None = None,
        latent: Any = None,
    ) -> SegmentorOutput:
        """``images [B, 3, H, W]`` in [0, 1] -> :class:`SegmentorOutput` (logits ``[S, B, K, h, w]``)."""
        return self._decode(self.encode(images), labels=labels, num_context=num_context, num_samples=num_samples,
                            latent=latent)

    def forward_with_context(
        self,
        images: Tensor,
        context_images: Tensor,
        *,
        labels: Tensor,
        context_labels: Tensor,
        num_samples: int | None = None,
    ) -> SegmentorOutput:
        """:meth:`forward` whose head takes its context from a pass of its own over ``context_images [M, 3, H, W]``
        (labels ``context_labels [M, H, W]``): the NP-SemiSeg authors' model (U2PL ``model_helper.py`` 78 and
        ``decoder.py`` 124-134, AugSeg ``model_helper.py`` 109-111, ``decoder.py`` 68-78) encodes the targets, then
        the context, and decodes both in that order, so the context has its own BN batch (and BN update), dropout
        masks and features. The aux and representation heads see the targets only. Logits ``[S, B, K, h, w]``."""
        if self.decoder_sampling:
            raise ValueError("forward_with_context: a context pass of its own needs a head on one decoder pass "
                             "(mc_dropout_scope='decoder' samples the decoder)")
        encoded = self.encode(images)
        context_encoded = self.encode(context_images)
        features = self.decoder(encoded.low_level, encoded.high_level)
        context_features = self.decoder(context_encoded.low_level, context_encoded.high_level)
        head_output = self.head(features, labels=labels, num_samples=num_samples, context_features=context_features,
                                context_labels=context_labels)
        aux_logits = self.aux_head(encoded.layer3) if self.aux_head is not None and self.training else None
        representation = self.representation_head(features) if self.representation_head is not None else None
        return SegmentorOutput(features, head_output, aux_logits, representation)

    def forward_feature_perturbed(
        self,
        images: Tensor,
        *,
        dropout: float = 0.5,
        labels: Tensor | None = None,
        num_context: int = 0,
        num_samples: int | None = None,
    ) -> tuple[SegmentorOutput, SegmentorOutput]:
        """UniMatch's forward with feature perturbation (UniMatch@0324f3d model/semseg/deeplabv3plus.py 38-50): one
        encoder pass, then the clean and the channel-dropped encoder maps decoded together as ONE batch of 2B.

        images ``[B, 3, H, W]`` in [0, 1]. The encoder maps ``low_level [B, C1, H/4, W/4]`` and ``high_level
        [B, C4, H/os, W/os]`` of every image are concatenated with a copy whose whole channels are dropped with
        probability ``dropout`` (``Dropout2d``, active whatever the module's mode, kept channels scaled by
        ``1 / (1 - dropout)``; one mask for the low-level map, then one for the high-level map, as the official
        order), and decoder and head run once on the ``2B`` rows: every BatchNorm of the decoder and head normalises
        clean and perturbed features together and its running statistics track both, as the official
        ``_decode(cat(c1, dropout(c1)), cat(c4, dropout(c4)))``.

        Head targets and context: ``labels [B, H, W]`` are the clean rows' (as :meth:`forward`), the NP head's
        context is ``features[:num_context]`` (the clean labeled rows); the perturbed rows get labels 255, so they
        write nothing into the NP memories and are no targets, but take their latent as every training row does
        (attention of their own query over the memories) and count in the head's KL mean. The auxiliary layer-3
        head (not in UniMatch's model) sees the clean rows only. Returns ``(clean, perturbed)``
        :class:`SegmentorOutput` s, logits ``[S, B, K, h, w]`` each; the clean one carries the joint call's aux
        loss and stats, the perturbed one a zero aux loss, no stats and no aux logits.
        """
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout: expected a probability in [0, 1), got {dropout!r}")
        encoded = self.encode(images)
        batch = images.shape[0]
        joint = BackboneFeatures(
            torch.cat([encoded.low_level, F.dropout2d(encoded.low_level, dropout, training=True)]),
            encoded.layer3,
            torch.cat([encoded.high_level, F.dropout2d(encoded.high_level, dropout, training=True)]),
        )
        joint_labels = None if labels is None else torch.cat([labels, torch.full_like(labels, IGNORE_INDEX)])
        both = self._decode(joint, labels=joint_labels, num_context=num_context, num_samples=num_samples, aux=False)
        aux_logits = self.aux_head(encoded.layer3) if self.aux_head is not None and self.training else None
        head = both.head
        rep = both.representation
        clean = SegmentorOutput(both.features[:batch], HeadOutput(head.logits[:, :batch], head.aux_loss, head.stats),
                                aux_logits, rep[:batch] if rep is not None else None)
        perturbed = SegmentorOutput(both.features[batch:],
                                    HeadOutput(head.logits[:, batch:], torch.zeros_like(torch.as_tensor(head.aux_loss))),
                                    None, rep[batch:] if rep is not None else None)
        return clean, perturbed

    def _decode(
        self,
        encoded: BackboneFeatures,
        *,
        labels: Tensor | None = None,
        num_context: int = 0,
        num_samples: int | None = None,
        latent: Any = None,
        aux: bool = True,
    ) -> SegmentorOutput:
        """Decoder + head (+ aux / representation heads) on one encoding (the body of :meth:`forward`)."""
        if self.decoder_sampling:
            features, head_output = self.sample_decoder(
                encoded, labels=labels, num_context=num_context, num_samples=num_samples, latent=latent
            )
        else:
            features = self.decoder(encoded.low_level, encoded.high_level)
            head_output = self.classify(
                features, labels=labels, num_context=num_context, num_samples=num_samples, latent=latent
            )
        use_aux = aux and self.aux_head is not None and self.training
        aux_logits = self.aux_head(encoded.layer3) if use_aux else None  # type: ignore[misc]
        representation = self.representation_head(features) if self.representation_head is not None else None
        return SegmentorOutput(features, head_output, aux_logits, representation)

    def sample_decoder(
        self,
        encoded: BackboneFeatures,
        *,
        labels: Tensor | None = None,
        num_context: int = 0,
        num_samples: int | None = None,
        latent: Any = None,
    ) -> tuple[Tensor, HeadOutput]:
        """S decoder + head passes over one encoding, ``samples_per_pass`` of them batched at a time
        (the encoding repeated along the batch dimension, sample-major).

        Returns the first pass's features ``[B, C, h, w]`` and ``logits [S, B, K, h, w]``; the aux loss
        and stats are the means over the S passes.
        """
        samples = self.head.resolve_num_samples(num_samples)
        per_pass = min(samples, self.samples_per_pass or samples)
        batch = encoded.low_level.shape[0]
        first_features = None
        logits, aux_loss, stats = [], 0.0, {}
        for start in range(0, samples, per_pass):
            n = min(per_pass, samples - start)
            features = self.decoder(_repeat(encoded.low_level, n), _repeat(encoded.high_level, n))
            kwargs = self._head_kwargs(features[:batch], labels, num_context, 1, latent)
            if labels is not None:
                kwargs["labels"] = _repeat(labels, n)
            output = self.head(features, **kwargs)
            logits.append(output.logits.view(n, batch, *output.logits.shape[2:]))
            aux_loss = aux_loss + output.aux_loss * (n / samples)
            for key, value in output.stats.items():
                stats[key] = stats.get(key, 0.0) + value * (n / samples)
            first_features = features[:batch] if first_features is None else first_features
        return first_features, HeadOutput(torch.cat(logits), aux_loss, stats)

    @staticmethod
    def _head_kwargs(
        features: Tensor, labels: Tensor | None, num_context: int, num_samples: int | None, latent: Any
    ) -> dict[str, Any]:
        batch = features.shape[0]
        if isinstance(num_context, bool) or not isinstance(num_context, int) or not 0 <= num_context <= batch:
            raise ValueError(f"num_context: expected an int in [0, {batch}] (the batch size), got {num_context!r}")
        if num_context > 0 and labels is None:
            raise ValueError(f"num_context={num_context} needs labels (the context labels are labels[:num_context])")
        kwargs: dict[str, Any] = {"labels": labels, "num_samples": num_samples}
        if num_context > 0:
            kwargs["context_features"] = features[:num_context]
            kwargs["context_labels"] = labels[:num_context]  # type: ignore[index]
        if latent is not None:
            kwargs["latent"] = latent
        return kwargs

    def parameter_groups(self) -> list[dict[str, Any]]:
        """Two optimiser groups, every trainable parameter exactly once:
        ``{"name": "backbone", "params": [...]}`` and ``{"name": "decoder", "params": [...]}``
        (decoder, classifier head, auxiliary and representation heads), so the training loop can
        give the second group the head LR multiplier (x10 on VOC)."""
        backbone = [p for p in self.backbone.parameters() if p.requires_grad]
        backbone_ids = {id(p) for p in backbone}
        rest = [p for p in self.parameters() if p.requires_grad and id(p) not in backbone_ids]
        return [{"name": "backbone", "params": backbone}, {"name": "decoder", "params": rest}]


def convert_sync_batchnorm(module: nn.Module, process_group: Any = None) -> nn.Module:
    """Replace every BatchNorm of ``module`` (backbone, decoder, heads) with ``SyncBatchNorm`` for DDP
    on GPUs, in place; returns ``module`` (a new object only when ``module`` itself is a BatchNorm)."""
    return nn.SyncBatchNorm.convert_sync_batchnorm(module, process_group)


def build_segmentor(
    *, num_classes: int, head: ClassifierHead | str, head_options: dict[str, Any] | None = None,
    variant: str = "u2pl", backbone: str = "resnet50", weights: str | os.PathLike | None = None,
    deep_stem: bool = False, output_stride: int | None = None, multi_grid: Sequence[int] | None = (1, 2, 4),
    zero_init_residual: bool = True, aspp_channels: int | None = None, low_level_channels: int | None = None,
    aspp_rates: Sequence[int] | None = None, aux_head: bool = False, representation_head: bool = False,
    representation_dim: int = 256, mc_dropout_scope: str = "decoder",
    samples_per_pass: int | None = DEFAULT_SAMPLES_PER_PASS, allow_download: bool = True,
    align_corners: bool = False,
) -> Segmentor:
    """Build a segmentor for one framework variant.

    backbone: a ResNet (DeepLabv3+ of ``variant``) or a DINOv2 ViT (``npsemiseg.models.vit``: UniMatch V2's DPT
        decoder; ``variant``, ``output_stride``, ``multi_grid``, ``zero_init_residual`` and the ASPP / low-level
        widths are DeepLabv3+ settings and do not apply to it, so a framework's composed settings work with either).

    head: a built :class:`ClassifierHead` (its ``in_channels`` must equal
        ``feature_channels(variant, aspp_channels=..., low_level_channels=...)``) or a head name for
        ``npsemiseg.heads.build_head`` with ``head_options``.
    output_stride: defaults to the variant's (u2pl 8, augseg/psmt 16).
    aux_head / representation_head: U2PL's layer-3 auxiliary classifier (Cityscapes) and its
        contrastive representation head (``representation_dim``-d); their hidden width is the
        ASPP width (256 at full size, as U2PL).
    mc_dropout_scope: for an MC-dropout head, ``"decoder"`` (paper: the decoder gets always-active
        dropout after every activation, with the head's dropout rate, and runs S times) or
        ``"head"`` (only the head samples). Ignored for other heads.
    samples_per_pass: decoder scope only, how many of the S decoder passes run as one batch
        (None: all; 1: one at a time). Same result distribution, different speed and memory.
    allow_download: with ``weights="imagenet"``, whether torchvision may download a missing file.
    align_corners: how the segmentor's logits are upsampled to label size (:func:`logit_align_corners`).
    """
    _check_segmentor_arguments(num_classes, backbone, deep_stem, mc_dropout_scope)
    if is_vit_backbone(backbone):
        return _build_vit_segmentor(
            num_classes=num_classes, head=head, head_options=head_options, backbone=backbone, weights=weights,
            aux_head=aux_head, representation_head=representation_head, representation_dim=representation_dim,
            mc_dropout_scope=mc_dropout_scope, samples_per_pass=samples_per_pass, allow_download=allow_download,
            align_corners=align_corners)
    spec = get_variant(variant)
    channels = feature_channels(variant, aspp_channels=aspp_channels, low_level_channels=low_level_channels)
    head = _classifier_head(head, head_options, channels, num_classes, coarse_pool=1)
    encoder = build_backbone(backbone, output_stride=output_stride or spec.output_stride, multi_grid=multi_grid,
                             deep_stem=deep_stem, weights=weights, zero_init_residual=zero_init_residual,
                             allow_download=allow_download)
    decoder = DeepLabV3PlusDecoder(
        variant, encoder.channels["high_level"], encoder.channels["low_level"], aspp_channels=aspp_channels,
        low_level_channels=low_level_channels, aspp_rates=tuple(aspp_rates) if aspp_rates is not None else None,
        mc_dropout=decoder_mc_dropout(head, mc_dropout_scope),
    )
    hidden = aspp_channels or spec.aspp_channels  # 256 as U2PL's aux/representation heads; narrow in smoke runs
    return Segmentor(
        encoder, decoder, head,
        aux_head=AuxiliaryHead(encoder.channels["layer3"], num_classes, hidden) if aux_head else None,
        representation_head=(
            RepresentationHead(decoder.out_channels, representation_dim, hidden) if representation_head else None
        ),
        samples_per_pass=samples_per_pass, align_corners=align_corners,
    )


def _check_segmentor_arguments(num_classes: int, backbone: str, deep_stem: bool, mc_dropout_scope: str) -> None:
    """``ValueError`` naming the argument for what no segmentor can be built with."""
    if mc_dropout_scope not in ("decoder", "head"):
        raise ValueError(f"mc_dropout_scope must be 'decoder' or 'head', got {mc_dropout_scope!r}")
    if num_classes < 2:
        raise ValueError(f"num_classes must be >= 2, got {num_classes!r}")
    if deep_stem and is_vit_backbone(backbone):
        raise ValueError(f"deep_stem=True: the deep stem is a ResNet stem; the {backbone} backbone has none")


def decoder_mc_dropout(head: nn.Module, mc_dropout_scope: str) -> float:
    """The always-active dropout rate of the decoder: an MC-dropout head's rate in ``decoder`` scope, else 0."""
    if mc_dropout_scope == "decoder" and getattr(head, "mc_dropout", False) is True:
        return float(head.dropout)  # type: ignore[attr-defined]
    return 0.0


def _build_vit_segmentor(*, num_classes: int, head: ClassifierHead | str, head_options: dict[str, Any] | None,
                         backbone: str, weights: str | os.PathLike | None, aux_head: bool, representation_head: bool,
                         representation_dim: int, mc_dropout_scope: str, samples_per_pass: int | None,
                         allow_download: bool, align_corners: bool) -> Segmentor:
    """A DINOv2 ViT + UniMatch V2's DPT + ``head`` (``npsemiseg.models.dpt``: where each head reads); the aux head
    reads the third ViT map, the representation head the DPT's features, both at the DPT's width."""
    encoder: ViTBackbone = build_vit_backbone(backbone, weights=weights, allow_download=allow_download)
    spec = encoder.spec
    head = _classifier_head(head, head_options, spec.dpt_features, num_classes, coarse_pool=DPTDecoder.coarse_pool)
    decoder = DPTDecoder(spec.embed_dim, spec.dpt_features, spec.dpt_channels,
                         mc_dropout=decoder_mc_dropout(head, mc_dropout_scope))
    hidden = spec.dpt_features
    return Segmentor(
        encoder,  # type: ignore[arg-type]
        decoder,  # type: ignore[arg-type]
        head,
        aux_head=AuxiliaryHead(encoder.channels["layer3"], num_classes, hidden) if aux_head else None,
        representation_head=RepresentationHead(hidden, representation_dim, hidden) if representation_head else None,
        samples_per_pass=samples_per_pass,
        align_corners=align_corners,
    )


def _classifier_head(head: ClassifierHead | str, head_options: dict[str, Any] | None, channels: int,
                     num_classes: int, *, coarse_pool: int) -> ClassifierHead:
    """``head`` built by name with ``head_options`` (or checked, when already built) for ``channels`` features; an
    option ``feature_pool="coarse"`` (the NP head under ``corrected``) becomes the decoder's ``coarse_pool``."""
    if isinstance(head, str):
        options = dict(head_options or {})
        if options.get("feature_pool") == COARSE_POOL:
            options["feature_pool"] = coarse_pool
        head = build_head(head, channels, num_classes, **options)
    elif head_options:
        raise ValueError("head_options: only used when head is a name, not a built head")
    if head.num_classes != num_classes:
        raise ValueError(f"head: built for {head.num_classes} classes, num_classes is {num_classes}")
    return head
