"""DINOv2 ViT encoders (timm's ``VisionTransformer``) read the way UniMatch V2's DPT reads them.

UniMatch V2 (``model/backbone/dinov2.py``, ``model/semseg/dpt.py``) takes four intermediate blocks of a DINOv2
ViT, each through the final LayerNorm and without its class token, as patch-grid maps ``[B, D, h, w]``
(``h, w = H / 14, W / 14``). :class:`ViTBackbone` builds the same network from timm's modules (patch embedding,
blocks with LayerScale, final norm; the DINOv2 architecture timm ships as ``vit_*_patch14_dinov2``) and runs the
official forward itself, so that the position embedding is resized as the official one is: bicubic with
``scale_factor = (grid + 0.1) / sqrt(N)`` (``interpolate_offset`` 0.1, no antialias), not timm's ``size=``
resampling, which samples other points whenever the grid is not the pretraining one (37 x 37 at 518 px).

The four maps fill the segmentor's :class:`BackboneFeatures` contract: ``low_level`` = the three shallower
layers concatenated ``[B, 3D, h, w]``, ``layer3`` = the third ``[B, D, h, w]``, ``high_level`` = the deepest
``[B, D, h, w]``; the DPT decoder (``npsemiseg.models.dpt``) splits ``low_level`` back into three.

===============  ====  =====  =====  ==================  ==============  =======================================
name             D     depth  heads  layers read         DPT features    DPT projections
===============  ====  =====  =====  ==================  ==============  =======================================
``dinov2_s``     384   12     6      2, 5, 8, 11         64              48, 96, 192, 384
``dinov2_b``     768   12     12     2, 5, 8, 11         128             96, 192, 384, 768
``dinov2_l``     1024  24     16     4, 11, 17, 23       256             256, 512, 1024, 1024
``dinov2_g``     1536  40     24     9, 19, 29, 39       384             1536 x 4 (SwiGLU MLP)
``vit_tiny``     32    4      2      0, 1, 2, 3          16              8, 16, 32, 32 (tests, smoke)
``vit_mini``     64    4      2      0, 1, 2, 3          16              8, 16, 32, 64 (the mini-study)
===============  ====  =====  =====  ==================  ==============  =======================================

(layers: UniMatch V2 ``dpt.py`` 123-128; widths: ``unimatch_v2.py`` 54-59.) Inputs must have sides that are
multiples of the patch size (14): the official patch embedding asserts it; here it is a ``ValueError``.
``vit_mini`` is the CPU mini-study's ViT (twice ``vit_tiny``'s width, a 4 x 4 grid at 56 px), pretrained on the
procedural corpus and shipped (``model.weights: pretrained:vit_mini``, ``npsemiseg.pretrain``) like the ResNet's
``pretrained:default``. Patch 14, not 8: at 8 the DPT ends at the full 64 px of the study's images and the heads'
per-pixel blocks make a step about 2.5 times as long on a 2-core CPU; 14 is also DINOv2's own patch.

Weights: ``None`` (random init), a local file in the official DINOv2 layout (``dinov2_vits14_pretrain.pth`` etc.,
the files UniMatch V2 loads from ``pretrained/``; keys ``cls_token``, ``pos_embed``, ``mask_token``,
``blocks.N....``, SwiGLU's ``w12``/``w3`` for the giant) or in timm's layout, or ``"timm"``: timm's pretrained
``<architecture>.lvd142m`` from the model hub (downloaded by timm where the machine reaches it; never in tests).
"""

from __future__ import annotations

import math
import os

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from npsemiseg.models.backbones import BackboneFeatures, read_state_dict
from npsemiseg.models.checkpointing import run_segment
from npsemiseg.models.specs import BACKBONES, ViTSpec

#: ``model.weights`` value that asks timm for the hub's pretrained DINOv2 weights
HUB_WEIGHTS = "timm"
#: the official position-embedding resize offset (``DINOv2(...)`` ``interpolate_offset=0.1``)
INTERPOLATE_OFFSET = 0.1


def is_vit_backbone(name: str) -> bool:
    """Whether backbone ``name`` is a ViT (built here, decoded by the DPT) rather than a ResNet."""
    return isinstance(BACKBONES.get(name), ViTSpec)


def timm_vit(spec: ViTSpec) -> nn.Module:
    """timm's DINOv2 ``VisionTransformer`` for ``spec``, without classifier (random init).

    timm is imported here, where a ViT is built, not with the package: its import (every timm architecture
    registers itself) takes about 0.7 s on a 2-core machine, which every process importing ``npsemiseg`` (the CLI,
    each Ray worker, each test worker) would pay, ViT or not."""
    import timm.layers
    from timm.models.vision_transformer import VisionTransformer

    extra: dict = {}
    if spec.swiglu:  # timm's vit_giant_patch14_dinov2: SwiGLU with fc1 = the official w12 (packed)
        extra = dict(mlp_ratio=2.66667 * 2, mlp_layer=timm.layers.SwiGLUPacked, act_layer=nn.SiLU)
    return VisionTransformer(img_size=spec.img_size, patch_size=spec.patch_size, embed_dim=spec.embed_dim,
                             depth=spec.depth, num_heads=spec.num_heads, init_values=1.0, num_classes=0,
                             global_pool="", dynamic_img_size=True, **extra)


class ViTBackbone(nn.Module):
    """A DINOv2 ViT returning the four maps UniMatch V2's DPT reads as :class:`BackboneFeatures` (module docstring).

    ``forward(images [B, 3, H, W])`` (normalised; ``H, W`` multiples of ``patch_size``) ->
    ``BackboneFeatures(low_level [B, 3D, h, w], layer3 [B, D, h, w], high_level [B, D, h, w])``;
    :meth:`intermediate_layers` gives the four maps as a list.
    """

    def __init__(self, spec: ViTSpec, *, name: str = "vit") -> None:
        super().__init__()
        self.name = name
        self.spec = spec
        self.patch_size = spec.patch_size
        self.embed_dim = spec.embed_dim
        self.layers = tuple(spec.layers)
        self.vit = timm_vit(spec)
        #: the blocks recomputed in the backward pass (``runtime.activation_checkpointing``)
        self.activation_checkpointing = False
        self.channels = {"low_level": 3 * spec.embed_dim, "layer3": spec.embed_dim, "high_level": spec.embed_dim}

    def check_size(self, images: Tensor) -> tuple[int, int]:
        """The patch grid ``(h, w)`` of ``images [B, 3, H, W]``; ``ValueError`` unless H and W are multiples of the
        patch size."""
        height, width = images.shape[-2:]
        if height % self.patch_size or width % self.patch_size:
            raise ValueError(
                f"images: the {self.name} backbone takes sides that are multiples of its patch size {self.patch_size}, "
                f"got {height}x{width} (crop or resize to e.g. {height // self.patch_size * self.patch_size or self.patch_size}"
                f"x{width // self.patch_size * self.patch_size or self.patch_size})")
        return height // self.patch_size, width // self.patch_size

    def position_embedding(self, grid_h: int, grid_w: int) -> Tensor:
        """``[1, 1 + grid_h * grid_w, D]``: the stored embedding, bicubically resized to the grid the official
        way (``dinov2.py`` ``interpolate_pos_encoding``: ``scale_factor = (grid + 0.1) / sqrt(N)``)."""
        pos_embed = self.vit.pos_embed
        patches = pos_embed.shape[1] - 1
        if grid_h * grid_w == patches and grid_h == grid_w:
            return pos_embed
        side = math.sqrt(patches)
        patch_pos = pos_embed[:, 1:].float().reshape(1, int(side), int(side), -1).permute(0, 3, 1, 2)
        scale = ((grid_h + INTERPOLATE_OFFSET) / side, (grid_w + INTERPOLATE_OFFSET) / side)
        patch_pos = F.interpolate(patch_pos, scale_factor=scale, mode="bicubic", antialias=False)
        if patch_pos.shape[-2:] != (grid_h, grid_w):
            raise RuntimeError(f"position embedding resized to {tuple(patch_pos.shape[-2:])}, expected {(grid_h, grid_w)}")
        patch_pos = patch_pos.permute(0, 2, 3, 1).reshape(1, grid_h * grid_w, -1)
        return torch.cat([pos_embed[:, :1], patch_pos.to(pos_embed.dtype)], dim=1)

    def intermediate_layers(self, images: Tensor) -> list[Tensor]:
        """The outputs of blocks ``layers`` after the final norm, class token dropped: four ``[B, D, h, w]``; with
        ``activation_checkpointing`` each block is recomputed in the backward pass."""
        grid_h, grid_w = self.check_size(images)
        vit = self.vit
        tokens = vit.patch_embed.proj(images).flatten(2).transpose(1, 2)  # [B, h*w, D]
        tokens = torch.cat([vit.cls_token.expand(tokens.shape[0], -1, -1), tokens], dim=1)
        tokens = tokens + self.position_embedding(grid_h, grid_w)
        outputs = []
        for index, block in enumerate(vit.blocks):
            tokens = run_segment(block, tokens, checkpointed=self.activation_checkpointing)
            if index in self.layers:
                outputs.append(vit.norm(tokens)[:, 1:])
            if index == self.layers[-1]:
                break
        batch = images.shape[0]
        # contiguous NCHW (a reshaped transpose would carry token-major strides, and convs would keep them)
        return [out.transpose(1, 2).reshape(batch, -1, grid_h, grid_w).contiguous() for out in outputs]

    def forward(self, images: Tensor) -> BackboneFeatures:
        """images: normalised ``[B, 3, H, W]``."""
        first, second, third, fourth = self.intermediate_layers(images)
        return BackboneFeatures(torch.cat([first, second, third], dim=1), third, fourth)


def build_vit_backbone(name: str, *, weights: str | os.PathLike | None = None, allow_download: bool = True) -> ViTBackbone:
    """The ViT ``name`` (module table) with ``weights``: None, a local file (official DINOv2 or timm layout) or
    ``"timm"`` (timm's hub weights; ``allow_download=False`` makes that an error)."""
    spec = BACKBONES.get(name)
    if not isinstance(spec, ViTSpec):
        raise ValueError(f"backbone: {name!r} is not a ViT backbone, expected one of {vit_backbone_names()}")
    backbone = ViTBackbone(spec, name=name)
    if weights is None:
        return backbone
    if isinstance(weights, str) and weights == HUB_WEIGHTS:
        state_dict, source = hub_state_dict(name, spec, allow_download=allow_download), f"timm hub {spec.timm_name}"
    elif isinstance(weights, str) and weights == "imagenet":
        raise ValueError(f"weights='imagenet': torchvision's ImageNet weights are ResNet weights; the {name} backbone "
                         f"takes a DINOv2 checkpoint file (official or timm layout), '{HUB_WEIGHTS}' or null")
    else:
        state_dict, source = read_state_dict(weights), str(weights)
    load_vit_state_dict(backbone, state_dict, source=source)
    return backbone


def vit_backbone_names() -> list[str]:
    return [name for name, spec in BACKBONES.items() if isinstance(spec, ViTSpec)]


def hub_state_dict(name: str, spec: ViTSpec, *, allow_download: bool) -> dict[str, Tensor]:
    """timm's pretrained ``<timm_name>.lvd142m`` (timm's hub cache; downloaded where allowed and reachable)."""
    if spec.timm_name is None:
        raise ValueError(f"weights='{HUB_WEIGHTS}': the {name} backbone has no pretrained weights on the hub; use null")
    if not allow_download:
        raise ValueError(f"weights='{HUB_WEIGHTS}': downloading is disabled; pass a local DINOv2 checkpoint file")
    import timm

    try:
        model = timm.create_model(f"{spec.timm_name}.lvd142m", pretrained=True, num_classes=0, img_size=spec.img_size)
    except Exception as error:  # hub/network errors have no common base class
        raise FileNotFoundError(f"weights='{HUB_WEIGHTS}': timm could not load {spec.timm_name}.lvd142m ({error}); "
                                "pass a local DINOv2 checkpoint file instead") from error
    return model.state_dict()


def load_vit_state_dict(backbone: ViTBackbone, state_dict: dict[str, Tensor], *, source: str) -> None:
    """Load an official-DINOv2-layout or timm-layout state dict (timm's ``checkpoint_filter_fn`` maps the official
    keys: ``mask_token`` dropped, SwiGLU ``w12``/``w3`` -> ``fc1``/``fc2``). A missing, unexpected or wrongly shaped
    key is a ``ValueError`` listing them."""
    from timm.models.vision_transformer import checkpoint_filter_fn  # imported late: see timm_vit

    if "patch_embed.proj.weight" not in state_dict:
        raise ValueError(f"weights: {source} is not a DINOv2 ViT state dict (no patch_embed.proj.weight key)")
    own = backbone.vit.state_dict()
    mapped = checkpoint_filter_fn(dict(state_dict), backbone.vit)
    missing = sorted(k for k in own if k not in mapped)
    unexpected = sorted(k for k in mapped if k not in own)
    wrong_shape = sorted(f"{k} {tuple(v.shape)} (expected {tuple(own[k].shape)})" for k, v in mapped.items()
                         if k in own and v.shape != own[k].shape)
    problems = [f"{label} ({len(keys)}): {', '.join(keys[:8])}{' ...' if len(keys) > 8 else ''}"
                for label, keys in (("missing", missing), ("unexpected", unexpected), ("wrong shape", wrong_shape)) if keys]
    if problems:
        raise ValueError(f"weights: {source} does not fit the {backbone.name} backbone; " + "; ".join(problems))
    backbone.vit.load_state_dict(mapped)


def vit_settings_problem(backbone: str, weights: str | None, crop_size: int, *, eval_mode: str = "whole",
                         eval_crop_size: int | None = None, resize_multiple: int | None = None) -> str | None:
    """One line saying why a cell's ``model.weights``, ``schedule.crop_size`` or evaluation cannot work with the ViT
    ``backbone`` (checked before a run starts: ``semiseg_platform.preflight``), or None. ``eval_mode`` /
    ``eval_crop_size``: the evaluation's, resolved; ``resize_multiple``: ``evaluation.resize_multiple``."""
    patch = BACKBONES.get(backbone).patch_size
    sides = f"the {backbone} backbone takes sides that are multiples of its patch size {patch}"
    if crop_size % patch:
        return f"schedule.crop_size: {sides}, got {crop_size} (e.g. {max(patch, crop_size // patch * patch)})"
    if eval_mode == "whole" and (resize_multiple is None or resize_multiple % patch):
        return (f"evaluation.resize_multiple: {sides}; whole images need resize_multiple={patch} (or a multiple), "
                f"got {resize_multiple}")
    if eval_mode != "whole" and eval_crop_size is not None and eval_crop_size % patch:
        return f"evaluation.crop_size: {sides}, got {eval_crop_size} (e.g. {max(patch, eval_crop_size // patch * patch)})"
    return _weights_problem(backbone, weights)


def _weights_problem(backbone: str, weights: str | None) -> str | None:
    if weights is None:
        return None
    if weights == "imagenet":
        return (f"model.weights: 'imagenet' names torchvision's ResNet weights; the {backbone} backbone takes a DINOv2 "
                f"checkpoint file, '{HUB_WEIGHTS}' or null")
    if weights == HUB_WEIGHTS:
        has_hub = BACKBONES.get(backbone).timm_name is not None
        return None if has_hub else f"model.weights: the {backbone} backbone has no hub weights; use null"
    if not os.path.isfile(os.path.expanduser(weights)):
        return (f"model.weights: file {weights} does not exist (expected a DINOv2 checkpoint .pth in the official or "
                f"timm layout, '{HUB_WEIGHTS}' for timm's hub weights, or null for random init)")
    return None
