"""UniMatch V2's DPT decoder (``model/semseg/dpt.py`` ``DPTHead``, ``model/util/blocks.py``) up to its classifier.

``forward(low_level [B, 3D, h, w], high_level [B, D, h, w]) -> features [B, F, 8h, 8w]`` on the four ViT maps of
``npsemiseg.models.vit`` (``low_level`` = the three shallower ones concatenated; ``h, w = H / 14, W / 14``):

1. projections: a 1x1 conv per map to ``C_i`` (``channels``, by encoder size), then resize layers: 4x and 2x
   transposed convs, identity, a stride-2 3x3 conv -> strides 14/4, 14/2, 14, 28;
2. ``scratch.layer{i}_rn``: 3x3 convs (no bias) to ``F`` (``features``: 64 / 128 / 256 for S / B / L);
3. refinenets 4 -> 1 (feature fusion: a residual conv unit on the skip, added; another residual unit; bilinear
   upsampling with ``align_corners=True`` to the next map's size, the last one x2; a 1x1 conv), so the path ends at
   ``8h x 8w`` (stride 14/8 = 1.75 px);
4. ``output_conv``'s first two layers: a 3x3 conv ``F -> F`` and ReLU.

The official ``output_conv`` ends with a 1x1 conv ``F -> K``: the class projection. The decoder stops before it, so
its output is the last map the official network shares across classes, post-ReLU like DeepLabv3+'s concatenated
map, and the classifier head of the segmentor contract comes after it:

- ``baseline``: U2PL's classifier block (two 3x3 conv-BN-ReLU-dropout, 1x1 to K) on ``[B, F, 8h, 8w]``, the same
  head as on DeepLabv3+, so a comparison of heads changes only the head;
- ``mc_dropout``: the same block with dropout active at test time; with ``mc_dropout_scope="decoder"`` (the
  paper's: "dropout after every activation of the decoder") this decoder also places an always-active channel
  dropout after every activation: the two ReLUs of each residual conv unit and the ReLU of ``output_conv``; the
  ViT runs once and the DPT + head run T times (``Segmentor.sample_decoder``);
- ``np``: NP-SemiSeg's head on the same map: its context and target pixels are these ``F``-dim features.

Where the heads read: at the decoder's full resolution ``8h x 8w``, the resolution the official classifier reads;
at a 518 crop that is 296 x 296, about (4 / 1.75)^2 = 5.2 times the pixels of DeepLabv3+'s stride-4 map at the same
crop, which the per-pixel heads (T samples, NP attention) pay for in time and memory. The NP head under
``corrected`` averages the map over ``coarse_pool`` x ``coarse_pool`` cells first (``docs/vit.md``).

Module names are the official ones (``projects``, ``resize_layers``, ``scratch.refinenet1.resConfUnit2.conv1``,
``scratch.output_conv.0``), so an official ``DPTHead`` state dict without ``scratch.output_conv.2.*`` loads as is.
The official ``use_bn`` is False in every UniMatch V2 model and not offered here.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch.nn.functional as F
from torch import Tensor, nn

from npsemiseg.heads.classifier import MCDropout2d


def _activation(mc_dropout: float) -> nn.Module:
    """ReLU (not in place: the residual units add their input), followed by MC dropout when ``mc_dropout`` > 0."""
    return nn.Sequential(nn.ReLU(), MCDropout2d(mc_dropout)) if mc_dropout > 0 else nn.ReLU()


class ResidualConvUnit(nn.Module):
    """``x + conv2(act(conv1(act(x))))`` with 3x3 convs (bias) at ``features`` channels (``blocks.py``)."""

    def __init__(self, features: int, *, mc_dropout: float = 0.0) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(features, features, 3, padding=1)
        self.conv2 = nn.Conv2d(features, features, 3, padding=1)
        self.activation = _activation(mc_dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.conv2(self.activation(self.conv1(self.activation(x)))) + x


class FeatureFusionBlock(nn.Module):
    """``out_conv(upsample(unit2(x + unit1(skip))))``: the refinenet of ``blocks.py`` (``deconv``/``bn``/``expand``
    False, ``align_corners=True``); upsampled to ``size``, or x2 when none is given."""

    def __init__(self, features: int, *, mc_dropout: float = 0.0) -> None:
        super().__init__()
        self.resConfUnit1 = ResidualConvUnit(features, mc_dropout=mc_dropout)
        self.resConfUnit2 = ResidualConvUnit(features, mc_dropout=mc_dropout)
        self.out_conv = nn.Conv2d(features, features, 1)

    def forward(self, x: Tensor, skip: Tensor | None = None, *, size: Sequence[int] | None = None) -> Tensor:
        if skip is not None:
            x = x + self.resConfUnit1(skip)
        x = self.resConfUnit2(x)
        if size is None:
            x = F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=True)
        else:
            x = F.interpolate(x, size=tuple(size), mode="bilinear", align_corners=True)
        return self.out_conv(x)


class DPTDecoder(nn.Module):
    """The DPT of UniMatch V2 without its final class projection (module docstring).

    embed_dim: the ViT width D; features: F; channels: the four projection widths.
    ``out_channels`` = F (the head's ``in_channels``); ``variant`` = ``"dpt"``; ``mc_dropout`` as DeepLabv3+'s.
    """

    variant = "dpt"
    #: the NP head's ``feature_pool="coarse"`` on this decoder: its ``8h x 8w`` map averaged to ``2h x 2w``, the
    #: 1/7 map (``docs/vit.md``, "Where the NP head reads the DPT")
    coarse_pool = 4

    def __init__(self, embed_dim: int, features: int, channels: Sequence[int], *, mc_dropout: float = 0.0) -> None:
        super().__init__()
        if len(channels) != 4:
            raise ValueError(f"channels: expected the 4 projection widths of the DPT, got {tuple(channels)}")
        if not 0.0 <= mc_dropout < 1.0:
            raise ValueError(f"mc_dropout must be in [0, 1), got {mc_dropout!r}")
        self.embed_dim = embed_dim
        self.mc_dropout = mc_dropout
        self.out_channels = features
        self.projects = nn.ModuleList([nn.Conv2d(embed_dim, c, 1) for c in channels])
        self.resize_layers = nn.ModuleList([
            nn.ConvTranspose2d(channels[0], channels[0], 4, stride=4),
            nn.ConvTranspose2d(channels[1], channels[1], 2, stride=2),
            nn.Identity(),
            nn.Conv2d(channels[3], channels[3], 3, stride=2, padding=1),
        ])
        self.scratch = nn.Module()
        for index, width in enumerate(channels, start=1):
            setattr(self.scratch, f"layer{index}_rn", nn.Conv2d(width, features, 3, padding=1, bias=False))
            setattr(self.scratch, f"refinenet{index}", FeatureFusionBlock(features, mc_dropout=mc_dropout))
        self.scratch.output_conv = nn.Sequential(nn.Conv2d(features, features, 3, padding=1), _activation(mc_dropout))

    def forward(self, low_level: Tensor, high_level: Tensor) -> Tensor:
        """``low_level [B, 3D, h, w]`` (layers 1-3), ``high_level [B, D, h, w]`` (layer 4) -> ``[B, F, 8h, 8w]``."""
        if low_level.shape[1] != 3 * self.embed_dim or high_level.shape[1] != self.embed_dim:
            raise ValueError(f"DPT inputs: expected [B, {3 * self.embed_dim}, h, w] and [B, {self.embed_dim}, h, w], "
                             f"got {tuple(low_level.shape)} and {tuple(high_level.shape)}")
        maps = [*low_level.split(self.embed_dim, dim=1), high_level]
        s = self.scratch
        layer1, layer2, layer3, layer4 = (
            rn(resize(project(x))) for x, project, resize, rn in
            zip(maps, self.projects, self.resize_layers, (s.layer1_rn, s.layer2_rn, s.layer3_rn, s.layer4_rn)))
        path = s.refinenet4(layer4, size=layer3.shape[-2:])
        path = s.refinenet3(path, layer3, size=layer2.shape[-2:])
        path = s.refinenet2(path, layer2, size=layer1.shape[-2:])
        path = s.refinenet1(path, layer1)
        return s.output_conv(path)
