"""The project's networks behind the official models' interfaces (UniMatch's ``DeepLabV3Plus``, U2PL's and AugSeg's
``ModelBuilder``, UniMatch V2's ``DPT``), and the initial weights a project run starts from."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from npsemiseg.config import RunConfig
from npsemiseg.frameworks.ema import unwrap
from npsemiseg.frameworks.unimatch_v2 import complementary_masks, complementary_pass
from npsemiseg.models import upsample_logits
from npsemiseg.training.data_order import derive_seed
from npsemiseg.training.factories import build_framework

from official_side_by_side import IMAGENET_MEAN, IMAGENET_STD

class OfficialInterface(nn.Module):
    """The project's segmentor behind the official ``DeepLabV3Plus`` interface: ``backbone`` (its encoder, for the
    optimiser's groups), ``forward(x)`` -> logits ``[B, K, H, W]`` and ``forward(x, need_fp=True)`` -> (clean,
    feature-perturbed) logits (:meth:`npsemiseg.models.Segmentor.forward_feature_perturbed`, UniMatch's
    ``model/semseg/deeplabv3plus.py`` 38-50, golden-checked), upsampled bilinearly with ``align_corners=True`` as the
    official model. Its input is normalised with ImageNet's mean and std (the official loader's); the project's model
    normalises inside, so it gets the image back in [0, 1]."""

    def __init__(self, student: nn.Module, feature_dropout: float = 0.5) -> None:
        super().__init__()
        self.student, self.feature_dropout = student, feature_dropout
        self.backbone = student.backbone
        self.register_buffer("mean", torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(IMAGENET_STD).view(1, 3, 1, 1), persistent=False)

    def forward(self, x: Tensor, need_fp: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        images, size = x * self.std + self.mean, x.shape[-2:]
        if need_fp:
            clean, perturbed = self.student.forward_feature_perturbed(images, dropout=self.feature_dropout)
            return (upsample_logits(clean.head.logits, size, align_corners=True)[0],
                    upsample_logits(perturbed.head.logits, size, align_corners=True)[0])
        return upsample_logits(self.student(images).head.logits, size, align_corners=True)[0]


class U2PLInterface(OfficialInterface):
    """The project's U2PL segmentor behind U2PL's ``ModelBuilder``: ``encoder`` (its backbone: the optimiser's group
    at ``lr``), ``decoder`` (its decoder, classifier head and representation head, what U2PL's decoder holds: the
    group at ``lr x 10``) and ``forward(x)`` -> ``{"pred": logits [B, K, h, w], "rep": representation [B, E, h, w]}``
    at feature resolution, as U2PL's decoder returns them (its loop upsamples ``pred`` with ``align_corners=True``).
    Input normalised with ImageNet's mean and std as :class:`OfficialInterface`'s (U2PL's ``Normalize`` of 0-255
    images with the same values x 255)."""

    def __init__(self, student: nn.Module) -> None:
        super().__init__(student)
        self.encoder = student.backbone
        self.decoder = nn.ModuleList([student.decoder, student.head, student.representation_head])

    def forward(self, x: Tensor) -> dict[str, Tensor]:  # type: ignore[override]
        output = self.student(x * self.std + self.mean)
        return {"pred": output.head.logits[0], "rep": output.representation}


class AugSegInterface(OfficialInterface):
    """The project's AugSeg segmentor behind AugSeg's ``ModelBuilder``: ``encoder`` (its backbone: the optimiser's
    group at ``lr``), ``decoder`` (its decoder and classifier head: at ``lr x 10``) and ``forward(x)`` -> (logits
    upsampled to the input with ``align_corners=True``, None: no aux head), as AugSeg's model returns them. Its
    feature dropout (``flag_use_fdrop``) is never asked for by ``train_semi.py``; asked, it raises."""

    def __init__(self, student: nn.Module) -> None:
        super().__init__(student)
        self.encoder = student.backbone
        self.decoder = nn.ModuleList([student.decoder, student.head])

    def forward(self, x: Tensor, flag_use_fdrop: bool = False) -> tuple[Tensor, None]:  # type: ignore[override]
        if flag_use_fdrop:
            raise NotImplementedError("AugSegInterface: flag_use_fdrop (AugSeg's feature dropout) is not mapped")
        return super().forward(x), None


class DPTInterface(OfficialInterface):
    """The project's ViT + DPT segmentor behind UniMatch V2's ``DPT`` (``model/semseg/dpt.py``): ``backbone`` (its ViT:
    the optimiser's group at ``lr``, what ``./pretrained/<backbone>.pth`` is loaded into), ``head`` (its DPT decoder and
    class head: the parameters named without ``backbone``, at ``lr x lr_multi``), :meth:`lock_backbone` and
    ``forward(x, comp_drop=False)`` -> logits at the input's size (``align_corners=True``, as the official upsampling to
    the patch grid x 14 of an input whose sides are multiples of 14); ``comp_drop=True``: complementary channel dropout
    over the pairs ``(i, B / 2 + i)`` with ``kept_fraction`` of them whole (the official ``dropout_prob`` 0.5), by
    :func:`npsemiseg.frameworks.unimatch_v2.complementary_pass`, the project's strong pass (golden-checked against the
    official ``DPT.forward``)."""

    def __init__(self, student: nn.Module, kept_fraction: float = 0.5) -> None:
        super().__init__(student)
        self.kept_fraction = kept_fraction
        self.head = nn.ModuleList([student.decoder, student.head])

    def lock_backbone(self) -> None:
        for parameter in self.backbone.parameters():
            parameter.requires_grad = False

    def draw_masks(self, pairs: int, widths: list[int], device: torch.device) -> list[Tensor]:
        return complementary_masks(pairs, widths, kept_fraction=self.kept_fraction, device=device)

    def forward(self, x: Tensor, comp_drop: bool = False) -> Tensor:  # type: ignore[override]
        if not comp_drop:
            return super().forward(x)
        output = complementary_pass(self.student, x * self.std + self.mean, self.draw_masks)
        return upsample_logits(output.logits, x.shape[-2:], align_corners=True)[0]


def initial_networks(config: RunConfig) -> dict[str, nn.Module]:
    """The project's networks of ``config`` (``student`` and its teachers by name, if any) with the initial weights its run
    starts from (seeded as ``npsemiseg.training.setup`` seeds it; the pretrained backbone loaded by the model's
    construction)."""
    torch.manual_seed(derive_seed(config.seed, "model"))
    framework = build_framework(config)
    teachers = getattr(framework, "teachers", {})
    return {"student": unwrap(framework.student), **{name: unwrap(t) for name, t in teachers.items()}}


def initial_network(config: RunConfig) -> nn.Module:
    """The project's student of ``config`` with the initial weights its run starts from (:func:`initial_networks`)."""
    return initial_networks(config)["student"]
