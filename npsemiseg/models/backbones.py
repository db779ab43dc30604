"""Dilated ResNet encoders for DeepLabv3+, built from torchvision's residual blocks.

A backbone maps normalised images ``[B, 3, H, W]`` to three feature maps: ``low_level``
(layer 1, stride 4), ``layer3`` (for the Cityscapes auxiliary head) and ``high_level``
(layer 4, stride = output stride 8 or 16). Layers 3/4 trade their stride for dilation as
torchvision's ``replace_stride_with_dilation`` does; layer 4 additionally uses multi-grid
dilations ``base x (1, 2, 4)``. The optional deep stem ("v1c": three 3x3 convs 64-64-128,
max-pool with ``ceil_mode``) is the stem of the ResNet-50 file the SSL repositories
distribute; module names match both that file and torchvision's, so either layout loads
without renaming.

Weights: ``None`` (random init), ``"imagenet"`` (torchvision's IMAGENET1K_V1 through its
weights API and cache) or a path to a local ``.pth``. A requested file that cannot be
found or does not fit is an error, never a silent random init.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple

import torch
from torch import Tensor, nn
import torchvision.models
from torchvision.models.resnet import Bottleneck, conv1x1

from npsemiseg.models.atrous import AtrousConv2d
from npsemiseg.models.checkpointing import run_segment
from npsemiseg.models.specs import BACKBONES, ResNetSpec
from npsemiseg.untrusted import UnsafeFileError, load_torch_file

NormLayer = Callable[[int], nn.Module]


class BackboneFeatures(NamedTuple):
    """Encoder outputs: ``low_level [B, C1, H/4, W/4]``, ``layer3 [B, C3, H/os', W/os']``,
    ``high_level [B, C4, H/os, W/os]`` (os = output stride; layer 3 is at stride 8 for os 8,
    16 for os 16)."""

    low_level: Tensor
    layer3: Tensor
    high_level: Tensor


def _layer_dilations(output_stride: int, blocks: Sequence[int], multi_grid: Sequence[int] | None) -> list[tuple[int, list[int]]]:
    """(stride, per-block dilations) for layers 1-4.

    A layer whose stride is replaced by dilation keeps the previous dilation in its first
    block (torchvision's rule); layer 4 with multi-grid uses ``base x grid[i]`` in every block.
    """
    dilate = {8: (False, False, True, True), 16: (False, False, False, True)}
    if output_stride not in dilate:
        raise ValueError(f"output_stride must be 8 or 16, got {output_stride!r}")
    plan: list[tuple[int, list[int]]] = []
    dilation = 1
    for index, (num_blocks, dilated) in enumerate(zip(blocks, dilate[output_stride])):
        stride = 1 if index == 0 else 2
        previous = dilation
        if dilated:
            dilation *= stride
            stride = 1
        per_block = [previous] + [dilation] * (num_blocks - 1)
        if index == 3 and multi_grid is not None:
            if len(multi_grid) != num_blocks:
                raise ValueError(
                    f"multi_grid must have one factor per layer-4 block ({num_blocks}), got {tuple(multi_grid)}"
                )
            per_block = [dilation * grid for grid in multi_grid]
        plan.append((stride, per_block))
    return plan


class ResNetBackbone(nn.Module):
    """Dilated ResNet (torchvision bottleneck blocks) returning :class:`BackboneFeatures`.

    ``channels`` maps ``low_level``/``layer3``/``high_level`` to their channel counts
    (ResNet-50: 256 / 1024 / 2048). ``dilations`` records layer 4's per-block dilations.
    """

    def __init__(
        self,
        spec: ResNetSpec,
        *,
        output_stride: int = 16,
        multi_grid: Sequence[int] | None = (1, 2, 4),
        deep_stem: bool = False,
        zero_init_residual: bool = True,
        norm_layer: NormLayer = nn.BatchNorm2d,
    ) -> None:
        super().__init__()
        self.output_stride = output_stride
        self.deep_stem = deep_stem
        #: the stages recomputed in the backward pass (``runtime.activation_checkpointing``)
        self.activation_checkpointing = False
        width = spec.stem_width
        if deep_stem:
            self.conv1: nn.Module = nn.Sequential(
                nn.Conv2d(3, width, 3, stride=2, padding=1, bias=False),
                norm_layer(width),
                nn.ReLU(inplace=True),
                nn.Conv2d(width, width, 3, padding=1, bias=False),
                norm_layer(width),
                nn.ReLU(inplace=True),
                nn.Conv2d(width, 2 * width, 3, padding=1, bias=False),
            )
            stem_out = 2 * width
        else:
            self.conv1 = nn.Conv2d(3, width, 7, stride=2, padding=3, bias=False)
            stem_out = width
        self.bn1 = norm_layer(stem_out)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1, ceil_mode=deep_stem)

        plan = _layer_dilations(output_stride, spec.blocks, multi_grid)
        inplanes = stem_out
        layers = []
        for planes, (stride, dilations) in zip(spec.planes, plan):
            layers.append(self._make_layer(inplanes, planes, stride, dilations, norm_layer))
            inplanes = planes * Bottleneck.expansion
        self.layer1, self.layer2, self.layer3, self.layer4 = layers
        self.dilations = tuple(plan[3][1])
        self.channels = {
            "low_level": spec.planes[0] * Bottleneck.expansion,
            "layer3": spec.planes[2] * Bottleneck.expansion,
            "high_level": spec.planes[3] * Bottleneck.expansion,
        }
        self._init_weights(zero_init_residual)

    @staticmethod
    def _make_layer(inplanes: int, planes: int, stride: int, dilations: list[int], norm_layer: NormLayer) -> nn.Sequential:
        out = planes * Bottleneck.expansion
        downsample = None
        if stride != 1 or inplanes != out:
            downsample = nn.Sequential(conv1x1(inplanes, out, stride), norm_layer(out))
        blocks = [Bottleneck(inplanes, planes, stride, downsample, dilation=dilations[0], norm_layer=norm_layer)]
        blocks += [Bottleneck(out, planes, dilation=d, norm_layer=norm_layer) for d in dilations[1:]]
        for block in blocks:  # small maps: a dilated 3x3 that reads only padding off-centre runs as its centre tap
            if block.conv2.dilation != (1, 1):
                block.conv2 = AtrousConv2d.from_conv(block.conv2)
        return nn.Sequential(*blocks)

    def reset_parameters(self, zero_init_residual: bool = True) -> None:
        """A random initialisation, as built with ``weights=None``: the weights re-drawn, BN statistics reset."""
        self._init_weights(zero_init_residual)
        for module in self.modules():
            if isinstance(module, nn.modules.batchnorm._BatchNorm):
                module.reset_running_stats()

    def _init_weights(self, zero_init_residual: bool) -> None:
        # torchvision's initialisation
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(module, (nn.BatchNorm2d, nn.GroupNorm)):
                nn.init.constant_(module.weight, 1)
                nn.init.constant_(module.bias, 0)
        if zero_init_residual:
            for module in self.modules():
                if isinstance(module, Bottleneck):
                    nn.init.constant_(module.bn3.weight, 0)

    def forward(self, images: Tensor) -> BackboneFeatures:
        """images: normalised ``[B, 3, H, W]``; with ``activation_checkpointing`` each of the four stages is
        recomputed in the backward pass (:mod:`~npsemiseg.models.checkpointing`)."""
        x = self.maxpool(self.relu(self.bn1(self.conv1(images))))
        on = self.activation_checkpointing
        low_level = run_segment(self.layer1, x, checkpointed=on)
        layer3 = run_segment(self.layer3, run_segment(self.layer2, low_level, checkpointed=on), checkpointed=on)
        return BackboneFeatures(low_level, layer3, run_segment(self.layer4, layer3, checkpointed=on))


def build_backbone(
    name: str = "resnet50",
    *,
    output_stride: int = 16,
    multi_grid: Sequence[int] | None = (1, 2, 4),
    deep_stem: bool = False,
    weights: str | os.PathLike | None = None,
    zero_init_residual: bool = True,
    norm_layer: NormLayer = nn.BatchNorm2d,
    allow_download: bool = True,
) -> ResNetBackbone:
    """Build ``resnet50``, ``resnet101`` or ``resnet_small`` and load ``weights``.

    weights: ``None`` (random init), ``"imagenet"`` (torchvision IMAGENET1K_V1, from torchvision's
    cache under ``torch.hub.get_dir()``; downloaded there when ``allow_download`` and online) or a
    path to a local file (torchvision layout, or the deep-stem layout with ``deep_stem=True``).
    """
    spec = BACKBONES.get(name)
    if not isinstance(spec, ResNetSpec):
        raise ValueError(f"backbone: {name!r} is not a ResNet; build it with npsemiseg.models.build_vit_backbone")
    state_dict = None
    if isinstance(weights, str) and weights == "imagenet":
        state_dict = imagenet_state_dict(name, deep_stem=deep_stem, allow_download=allow_download)
        source = f"torchvision {spec.imagenet_weights}"
    elif weights is not None:
        state_dict = read_state_dict(weights)
        source = str(weights)
    backbone = ResNetBackbone(
        spec,
        output_stride=output_stride,
        multi_grid=multi_grid,
        deep_stem=deep_stem,
        zero_init_residual=zero_init_residual,
        norm_layer=norm_layer,
    )
    if state_dict is not None:
        load_backbone_state_dict(backbone, state_dict, source=source)
    return backbone


def imagenet_state_dict(name: str, *, deep_stem: bool = False, allow_download: bool = True) -> dict[str, Tensor]:
    """torchvision's ImageNet weights for ``name`` from its cache (``$TORCH_HOME/hub/checkpoints``).

    Raises ``ValueError`` where none fit (``resnet_small``, deep stem) and ``FileNotFoundError``
    naming the cache path when the file is not cached and cannot be downloaded.
    """
    weights_name = BACKBONES.get(name).imagenet_weights
    if weights_name is None:
        raise ValueError(f"weights='imagenet': no ImageNet weights exist for backbone {name!r}; use weights=None")
    if deep_stem:
        raise ValueError(
            "weights='imagenet' with deep_stem=True: torchvision's weights have the 7x7 stem; "
            "pass the deep-stem resnet50.pth of the SSL repositories as weights=<path>, or deep_stem=False"
        )
    enum_name, _, member = weights_name.partition(".")
    weights = getattr(getattr(torchvision.models, enum_name), member)
    cached = Path(torch.hub.get_dir()) / "checkpoints" / os.path.basename(weights.url)
    if cached.is_file():
        return read_state_dict(cached)
    if not allow_download:
        raise FileNotFoundError(_not_cached_message(cached, weights.url, "downloading is disabled"))
    try:
        return weights.get_state_dict(progress=False, check_hash=True, weights_only=True)
    except (OSError, RuntimeError) as error:  # URLError is an OSError; hash mismatch a RuntimeError
        raise FileNotFoundError(_not_cached_message(cached, weights.url, f"download failed: {error}")) from error


def _not_cached_message(cached: Path, url: str, reason: str) -> str:
    return (
        f"weights='imagenet': {cached} is not in torchvision's cache and {reason}. "
        f"Copy {url} to {cached} (the cache root is $TORCH_HOME, default ~/.cache/torch), "
        "or pass weights=<path to a local resnet .pth>."
    )


def read_state_dict(path: str | os.PathLike) -> dict[str, Tensor]:
    """Tensors of a checkpoint file, unwrapped from ``{"state_dict": ...}``/``{"model": ...}`` and
    with DataParallel's ``module.`` prefix removed."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"weights: backbone weights file {str(path)!r} does not exist")
    try:
        loaded = load_torch_file(path, what="weights")  # read as data: a file asking to run code is refused
    except UnsafeFileError:
        raise
    except Exception as error:  # pickle/zip errors have no common base class
        raise ValueError(f"weights: cannot read {str(path)!r} as a PyTorch state dict: {error}") from error
    for key in ("state_dict", "model"):
        if isinstance(loaded, dict) and isinstance(loaded.get(key), dict):
            loaded = loaded[key]
    if not isinstance(loaded, dict) or not all(isinstance(v, Tensor) for v in loaded.values()):
        raise ValueError(f"weights: {str(path)!r} does not hold a state dict of tensors")
    return {k.removeprefix("module."): v for k, v in loaded.items()}


def load_backbone_state_dict(backbone: ResNetBackbone, state_dict: dict[str, Tensor], *, source: str) -> None:
    """Load a torchvision-layout or deep-stem-layout ResNet state dict into ``backbone``.

    The classifier (``fc.*``) is dropped. The stem layout is detected from the keys
    (``conv1.weight`` vs ``conv1.0.weight``) and must match ``backbone.deep_stem``; any other
    missing, unexpected or wrongly shaped key is a ``ValueError`` listing them.
    """
    state_dict = {k: v for k, v in state_dict.items() if not k.startswith("fc.")}
    file_deep_stem = "conv1.0.weight" in state_dict
    if not file_deep_stem and "conv1.weight" not in state_dict:
        raise ValueError(f"weights: {source} is not a ResNet state dict (no conv1.weight or conv1.0.weight key)")
    if file_deep_stem != backbone.deep_stem:
        layout = "deep-stem (conv1.0.*)" if file_deep_stem else "torchvision 7x7-stem (conv1.weight)"
        raise ValueError(f"weights: {source} has the {layout} layout; build the backbone with deep_stem={file_deep_stem}")
    own = backbone.state_dict()
    missing = sorted(k for k in own if k not in state_dict and not k.endswith("num_batches_tracked"))
    unexpected = sorted(k for k in state_dict if k not in own)
    wrong_shape = sorted(
        f"{k} {tuple(v.shape)} (expected {tuple(own[k].shape)})"
        for k, v in state_dict.items()
        if k in own and v.shape != own[k].shape
    )
    problems = [
        f"{label} ({len(keys)}): {', '.join(keys[:12])}{' ...' if len(keys) > 12 else ''}"
        for label, keys in (("missing", missing), ("unexpected", unexpected), ("wrong shape", wrong_shape))
        if keys
    ]
    if problems:
        raise ValueError(f"weights: {source} does not fit the backbone; " + "; ".join(problems))
    backbone.load_state_dict(state_dict, strict=False)
