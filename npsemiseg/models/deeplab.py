"""One configurable DeepLabv3+ decoder covering the U2PL, AugSeg and PS-MT variants.

The decoder maps the encoder's layer-1 (``low_level``) and layer-4 (``high_level``) maps to
the feature map every classifier head consumes, ``[B, C_low + C_aspp, H/4, W/4]``:

=========  ======  ============  =============================================  =========  =======
variant    stride  ASPP rates    ASPP output                                    low-level  feature
=========  ======  ============  =============================================  =========  =======
``u2pl``   8       12/24/36      5 branches -> 1280 -> 3x3 256 BN ReLU Drop0.1  256        512
``augseg`` 16      6/12/18       5 branches -> 1280 -> 1x1 256 BN ReLU          48         304
``psmt``   16      6/12/18       4 branches -> 1024 BN LReLU -> 1x1 256,        48         304
                                 + image-pool branch added, BN LReLU
=========  ======  ============  =============================================  =========  =======

Widths are configurable (``aspp_channels``, ``low_level_channels``) so smoke presets can be
tiny; :func:`feature_channels` gives the resulting head ``in_channels``.

MC dropout the paper's way ("inserted after every activation layer in their decoders"):
``mc_dropout=p > 0`` places an always-active channel dropout (``MCDropout2d``, the one the
MC-dropout head uses) after every activation of the decoder; where the variant already has a dropout at that place (U2PL's
ASPP projection) the MC dropout replaces it.
"""

from __future__ import annotations


import torch
import torch.nn.functional as F
from torch import Tensor, nn

from npsemiseg.heads.classifier import MCDropout2d
from npsemiseg.models.atrous import AtrousConv2d
from npsemiseg.models.specs import DECODERS, DecoderVariant


def get_variant(variant: str) -> DecoderVariant:
    return DECODERS.get(variant)


def feature_channels(variant: str, *, aspp_channels: int | None = None, low_level_channels: int | None = None) -> int:
    """Channels of the decoder feature map (= the head's ``in_channels``): u2pl 512, augseg/psmt 304."""
    spec = get_variant(variant)
    return (aspp_channels or spec.aspp_channels) + (low_level_channels or spec.low_level_channels)


def _dropout(mc_dropout: float, train_dropout: float = 0.0) -> list[nn.Module]:
    """The dropout after an activation: MC dropout when requested, else the variant's own (if any)."""
    if mc_dropout > 0:
        return [MCDropout2d(mc_dropout)]
    if train_dropout > 0:
        return [nn.Dropout2d(train_dropout)]
    return []


def conv_bn_act(
    in_channels: int,
    out_channels: int,
    kernel_size: int = 1,
    *,
    dilation: int = 1,
    activation: str = "relu",
    mc_dropout: float = 0.0,
    dropout: float = 0.0,
) -> nn.Sequential:
    """Conv (no bias) + BatchNorm + ReLU/LeakyReLU (+ dropout, see :func:`_dropout`)."""
    padding = dilation * (kernel_size // 2)
    act = nn.ReLU(inplace=True) if activation == "relu" else nn.LeakyReLU(inplace=True)
    return nn.Sequential(
        AtrousConv2d(in_channels, out_channels, kernel_size, padding=padding, dilation=dilation, bias=False),
        nn.BatchNorm2d(out_channels),
        act,
        *_dropout(mc_dropout, dropout),
    )


class ImagePooling(nn.Module):
    """Global average pool -> 1x1 conv (+ BN + activation), broadcast back to ``[B, C, h, w]``."""

    def __init__(self, in_channels: int, out_channels: int, *, activation: str = "relu", mc_dropout: float = 0.0) -> None:
        super().__init__()
        self.project = conv_bn_act(in_channels, out_channels, 1, activation=activation, mc_dropout=mc_dropout)

    def forward(self, x: Tensor) -> Tensor:
        pooled = self.project(x.mean(dim=(2, 3), keepdim=True))
        return pooled.expand(-1, -1, x.shape[2], x.shape[3])


class ASPP(nn.Module):
    """U2PL/AugSeg ASPP: image pooling, 1x1 and one dilated 3x3 per rate, each conv-BN-ReLU,
    concatenated to ``[B, (2 + len(rates)) x C, h, w]``."""

    def __init__(self, in_channels: int, channels: int, rates: tuple[int, ...], *, mc_dropout: float = 0.0) -> None:
        super().__init__()
        self.branches = nn.ModuleList(
            [
                ImagePooling(in_channels, channels, mc_dropout=mc_dropout),
                conv_bn_act(in_channels, channels, 1, mc_dropout=mc_dropout),
            ]
            + [conv_bn_act(in_channels, channels, 3, dilation=r, mc_dropout=mc_dropout) for r in rates]
        )
        self.out_channels = channels * len(self.branches)

    def forward(self, x: Tensor) -> Tensor:
        return torch.cat([branch(x) for branch in self.branches], dim=1)


class PSMTASPP(nn.Module):
    """PS-MT ASPP: 1x1 and dilated 3x3 branches (plain convs) concatenated, BN, LeakyReLU, 1x1 to
    ``out_channels``; plus the image-pooling branch (conv-BN-LeakyReLU, 1x1) added; BN, LeakyReLU.
    Output ``[B, out_channels, h, w]``."""

    def __init__(
        self, in_channels: int, out_channels: int, rates: tuple[int, ...], *, hidden: int = 256, mc_dropout: float = 0.0
    ) -> None:
        super().__init__()
        self.branches = nn.ModuleList(
            [nn.Conv2d(in_channels, hidden, 1, bias=False)]
            + [AtrousConv2d(in_channels, hidden, 3, padding=r, dilation=r, bias=False) for r in rates]
        )
        self.branches_act = nn.Sequential(
            nn.BatchNorm2d(hidden * len(self.branches)), nn.LeakyReLU(inplace=True), *_dropout(mc_dropout)
        )
        self.reduce = nn.Conv2d(hidden * len(self.branches), out_channels, 1, bias=False)
        self.pool = ImagePooling(in_channels, hidden, activation="leaky", mc_dropout=mc_dropout)
        self.pool_reduce = nn.Conv2d(hidden, out_channels, 1, bias=False)
        self.out_act = nn.Sequential(nn.BatchNorm2d(out_channels), nn.LeakyReLU(inplace=True), *_dropout(mc_dropout))
        self.out_channels = out_channels

    def forward(self, x: Tensor) -> Tensor:
        out = self.reduce(self.branches_act(torch.cat([branch(x) for branch in self.branches], dim=1)))
        return self.out_act(out + self.pool_reduce(self.pool(x)))


class DeepLabV3PlusDecoder(nn.Module):
    """ASPP on the high-level map, upsampled to the low-level map and concatenated after it.

    ``forward(low_level [B, C1, h4, w4], high_level [B, C4, h, w]) -> [B, out_channels, h4, w4]``
    with ``out_channels = low_level_channels + aspp_channels``. ``mc_dropout`` > 0 makes every
    activation of the decoder followed by an always-active dropout (module docstring).
    """

    def __init__(
        self,
        variant: str,
        in_channels: int,
        low_level_in_channels: int,
        *,
        aspp_channels: int | None = None,
        low_level_channels: int | None = None,
        aspp_rates: tuple[int, ...] | None = None,
        mc_dropout: float = 0.0,
    ) -> None:
        super().__init__()
        spec = get_variant(variant)
        if not 0.0 <= mc_dropout < 1.0:
            raise ValueError(f"mc_dropout must be in [0, 1), got {mc_dropout!r}")
        self.variant = spec.name
        self.mc_dropout = mc_dropout
        aspp_channels = aspp_channels or spec.aspp_channels
        low_level_channels = low_level_channels or spec.low_level_channels
        rates = tuple(aspp_rates or spec.aspp_rates)
        if spec.name == "psmt":
            self.aspp: nn.Module = PSMTASPP(in_channels, aspp_channels, rates, hidden=aspp_channels, mc_dropout=mc_dropout)
        else:
            aspp = ASPP(in_channels, aspp_channels, rates, mc_dropout=mc_dropout)
            kernel = 3 if spec.name == "u2pl" else 1
            project = conv_bn_act(aspp.out_channels, aspp_channels, kernel, mc_dropout=mc_dropout, dropout=spec.aspp_dropout)
            self.aspp = nn.Sequential(aspp, project)
        self.low_level = conv_bn_act(low_level_in_channels, low_level_channels, 1, mc_dropout=mc_dropout)
        self.out_channels = low_level_channels + aspp_channels

    def forward(self, low_level: Tensor, high_level: Tensor) -> Tensor:
        low = self.low_level(low_level)
        context = self.aspp(high_level)
        # align_corners=True as the three frameworks' decoders upsample
        context = F.interpolate(context, size=low.shape[-2:], mode="bilinear", align_corners=True)
        return torch.cat([low, context], dim=1)


class AuxiliaryHead(nn.Module):
    """U2PL's Cityscapes auxiliary classifier on layer 3: 3x3 conv to ``hidden`` + BN + ReLU +
    Dropout2d(0.1), 1x1 conv to K. ``[B, C3, h, w] -> [B, K, h, w]``."""

    def __init__(self, in_channels: int, num_classes: int, hidden: int = 256) -> None:
        super().__init__()
        self.block = conv_bn_act(in_channels, hidden, 3, dropout=0.1)
        self.classifier = nn.Conv2d(hidden, num_classes, 1)

    def forward(self, layer3: Tensor) -> Tensor:
        return self.classifier(self.block(layer3))


class RepresentationHead(nn.Module):
    """U2PL's representation head for its contrastive loss, shaped like the baseline classifier:
    (3x3 conv + BN + ReLU + Dropout2d(0.1)) x 2, 1x1 conv to ``dim``.
    ``[B, C, h, w] -> [B, dim, h, w]``."""

    def __init__(self, in_channels: int, dim: int = 256, hidden: int = 256) -> None:
        super().__init__()
        self.block = nn.Sequential(conv_bn_act(in_channels, hidden, 3, dropout=0.1), conv_bn_act(hidden, hidden, 3, dropout=0.1))
        self.embed = nn.Conv2d(hidden, dim, 1)
        self.dim = dim

    def forward(self, features: Tensor) -> Tensor:
        return self.embed(self.block(features))
