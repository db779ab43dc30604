"""What each backbone and DeepLabv3+ decoder is, without its network: the ``BACKBONES`` and ``DECODERS``
registries and the keys ``model.options`` takes.

A configuration checks its ``model.backbone``, ``model.decoder`` and ``model.options`` against these without
importing torch; the networks (``backbones.py``, ``vit.py``, ``deeplab.py``, ``segmentor.py``) read the same
entries when they are built.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from npsemiseg._registry import Registry


@dataclass(frozen=True)
class ResNetSpec:
    """Depth and widths of one ResNet: bottleneck ``planes`` per layer (outputs ``4 x planes``);
    ``imagenet_weights``: torchvision's weights enum member (``"ResNet50_Weights.IMAGENET1K_V1"``), None: none."""

    blocks: tuple[int, int, int, int]
    planes: tuple[int, int, int, int]
    stem_width: int
    imagenet_weights: str | None


@dataclass(frozen=True)
class ViTSpec:
    """One DINOv2 ViT and the DPT decoder UniMatch V2 pairs with it (``npsemiseg.models.vit``'s module table)."""

    embed_dim: int
    depth: int
    num_heads: int
    #: the blocks whose outputs the DPT reads (0-based)
    layers: tuple[int, int, int, int]
    dpt_features: int
    dpt_channels: tuple[int, int, int, int]
    patch_size: int = 14
    #: the pretraining resolution: the position embedding has ``(img_size / patch_size) ** 2 + 1`` tokens
    img_size: int = 518
    swiglu: bool = False
    #: timm's architecture name (``<name>.lvd142m`` on the hub), None where there is no pretrained model
    timm_name: str | None = None


@dataclass(frozen=True)
class DecoderVariant:
    """Architecture of one framework's DeepLabv3+ decoder (``npsemiseg.models.deeplab``'s module table)."""

    name: str
    output_stride: int
    aspp_rates: tuple[int, ...]
    low_level_channels: int
    aspp_channels: int = 256
    aspp_dropout: float = 0.0  # train-only dropout after the ASPP projection


#: every backbone by name: the dilated ResNets (``ResNetSpec``), then the DINOv2 ViTs (``ViTSpec``)
BACKBONES: Registry[Any] = Registry("backbone")
BACKBONES.add("resnet50", ResNetSpec((3, 4, 6, 3), (64, 128, 256, 512), 64, "ResNet50_Weights.IMAGENET1K_V1"))
BACKBONES.add("resnet101", ResNetSpec((3, 4, 23, 3), (64, 128, 256, 512), 64, "ResNet101_Weights.IMAGENET1K_V1"))
# CPU smoke runs: same block type, strides and dilations, ~1/8 of the widths.
BACKBONES.add("resnet_small", ResNetSpec((1, 1, 1, 3), (8, 16, 32, 64), 16, None))
for _name, _spec in {
    "dinov2_s": ViTSpec(384, 12, 6, (2, 5, 8, 11), 64, (48, 96, 192, 384), timm_name="vit_small_patch14_dinov2"),
    "dinov2_b": ViTSpec(768, 12, 12, (2, 5, 8, 11), 128, (96, 192, 384, 768), timm_name="vit_base_patch14_dinov2"),
    "dinov2_l": ViTSpec(1024, 24, 16, (4, 11, 17, 23), 256, (256, 512, 1024, 1024),
                        timm_name="vit_large_patch14_dinov2"),
    "dinov2_g": ViTSpec(1536, 40, 24, (9, 19, 29, 39), 384, (1536,) * 4, swiglu=True,
                        timm_name="vit_giant_patch14_dinov2"),
    # CPU smoke runs and tests: the same network at a few blocks and a narrow width, random init only
    "vit_tiny": ViTSpec(32, 4, 2, (0, 1, 2, 3), 16, (8, 16, 32, 32), img_size=56),
    # the CPU mini-study's ViT: pretrained on the procedural corpus at 56 px (npsemiseg.pretrain, pretrained:vit_mini)
    "vit_mini": ViTSpec(64, 4, 2, (0, 1, 2, 3), 16, (8, 16, 32, 64), img_size=56),
}.items():
    BACKBONES.add(_name, _spec)

#: every DeepLabv3+ decoder variant by name (a framework names the one it uses: ``FrameworkSpec.decoder``; a record
#: its ``model.decoder``)
DECODERS: Registry[DecoderVariant] = Registry("decoder")
for _variant in (
    DecoderVariant("u2pl", 8, (12, 24, 36), low_level_channels=256, aspp_dropout=0.1),
    DecoderVariant("augseg", 16, (6, 12, 18), low_level_channels=48),
    DecoderVariant("psmt", 16, (6, 12, 18), low_level_channels=48),
):
    DECODERS.add(_variant.name, _variant)

#: the keys ``model.options`` takes: ``npsemiseg.models.build_segmentor``'s keyword arguments that the
#: configuration does not set itself (``model``'s own fields, the head, the dataset's class count). A new keyword
#: of ``build_segmentor`` that a configuration may set goes here too (``tests/test_registry.py`` checks both agree).
SEGMENTOR_OPTIONS: tuple[str, ...] = (
    "allow_download", "aspp_channels", "aspp_rates", "low_level_channels", "multi_grid", "output_stride",
    "representation_dim", "samples_per_pass", "zero_init_residual",
)
