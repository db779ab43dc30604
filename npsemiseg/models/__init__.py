"""Segmentation models: dilated ResNet backbones, DeepLabv3+ variants and the segmentor."""

from .backbones import BACKBONES, BackboneFeatures, ResNetBackbone, build_backbone
from .deeplab import (
    MODEL_VARIANTS,
    AuxiliaryHead,
    DecoderVariant,
    DeepLabV3PlusDecoder,
    RepresentationHead,
    feature_channels,
)
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

__all__ = [
    "BACKBONES",
    "MODEL_VARIANTS",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "AuxiliaryHead",
    "BackboneFeatures",
    "DecoderVariant",
    "DeepLabV3PlusDecoder",
    "RepresentationHead",
    "ResNetBackbone",
    "Segmentor",
    "SegmentorOutput",
    "build_backbone",
    "build_segmentor",
    "convert_sync_batchnorm",
    "feature_channels",
    "logit_align_corners",
    "upsample_logits",
]
