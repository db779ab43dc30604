"""Segmentation models: dilated ResNet and DINOv2 ViT backbones, DeepLabv3+ variants, the DPT and the segmentor."""

from .backbones import BACKBONES, BackboneFeatures, ResNetBackbone, build_backbone
from .checkpointing import set_activation_checkpointing
from .compile import COMPILE_MODES, check_compile_device, compile_segmentor, to_channels_last, uses_cuda_graphs
from .deeplab import (
    DECODERS,
    AuxiliaryHead,
    DecoderVariant,
    DeepLabV3PlusDecoder,
    RepresentationHead,
    feature_channels,
)
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
from .vit import ViTBackbone, ViTSpec, build_vit_backbone, is_vit_backbone

__all__ = [
    "BACKBONES",
    "COMPILE_MODES",
    "DECODERS",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "AuxiliaryHead",
    "BackboneFeatures",
    "DecoderVariant",
    "DPTDecoder",
    "DeepLabV3PlusDecoder",
    "RepresentationHead",
    "ResNetBackbone",
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
