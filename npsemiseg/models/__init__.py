"""Segmentation models: dilated ResNet and DINOv2 ViT backbones, DeepLabv3+ variants, the DPT and the segmentor.

What a configuration checks (``BACKBONES``, ``DECODERS``, ``SEGMENTOR_OPTIONS``) is described in ``specs.py``
without torch; the networks are imported on first use (PEP 562), so ``import npsemiseg.models`` imports no torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .specs import BACKBONES, DECODERS, SEGMENTOR_OPTIONS, DecoderVariant, ResNetSpec, ViTSpec

if TYPE_CHECKING:
    from .backbones import BackboneFeatures, ResNetBackbone, build_backbone
    from .checkpointing import set_activation_checkpointing
    from .compile import COMPILE_MODES, check_compile_device, compile_segmentor, to_channels_last, uses_cuda_graphs
    from .deeplab import AuxiliaryHead, DeepLabV3PlusDecoder, RepresentationHead, feature_channels
    from .dpt import DPTDecoder
    from .segmentor import (
        IMAGENET_MEAN,
        IMAGENET_STD,
        Segmentor,
        SegmentorOutput,
        build_segmentor,
        convert_sync_batchnorm,
        logit_align_corners,
        upsample_logits,
    )
    from .vit import ViTBackbone, build_vit_backbone, is_vit_backbone

_ON_FIRST_USE = {
    **dict.fromkeys(("BackboneFeatures", "ResNetBackbone", "build_backbone"), "backbones"),
    "set_activation_checkpointing": "checkpointing",
    **dict.fromkeys(("COMPILE_MODES", "check_compile_device", "compile_segmentor", "to_channels_last",
                     "uses_cuda_graphs"), "compile"),
    **dict.fromkeys(("AuxiliaryHead", "DeepLabV3PlusDecoder", "RepresentationHead", "feature_channels"), "deeplab"),
    "DPTDecoder": "dpt",
    **dict.fromkeys(("IMAGENET_MEAN", "IMAGENET_STD", "Segmentor", "SegmentorOutput", "build_segmentor",
                     "convert_sync_batchnorm", "logit_align_corners", "upsample_logits"), "segmentor"),
    **dict.fromkeys(("ViTBackbone", "build_vit_backbone", "is_vit_backbone"), "vit"),
}


def __getattr__(name: str) -> Any:
    if name in _ON_FIRST_USE:
        return getattr(importlib.import_module(f"{__name__}.{_ON_FIRST_USE[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "BACKBONES",
    "COMPILE_MODES",
    "DECODERS",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "SEGMENTOR_OPTIONS",
    "AuxiliaryHead",
    "BackboneFeatures",
    "DecoderVariant",
    "DPTDecoder",
    "DeepLabV3PlusDecoder",
    "RepresentationHead",
    "ResNetBackbone",
    "ResNetSpec",
    "Segmentor",
    "ViTBackbone",
    "ViTSpec",
    "SegmentorOutput",
    "build_backbone",
    "build_segmentor",
    "build_vit_backbone",
    "check_compile_device",
    "compile_segmentor",
    "convert_sync_batchnorm",
    "feature_channels",
    "is_vit_backbone",
    "logit_align_corners",
    "set_activation_checkpointing",
    "to_channels_last",
    "upsample_logits",
    "uses_cuda_graphs",
]
