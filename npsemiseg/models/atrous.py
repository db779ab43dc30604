"""Dilated convolutions that skip the taps which can only read padding.

A "same"-padded dilated convolution (stride 1, padding = dilation x (k // 2)) whose dilation is at
least the feature map's height and width sees its input through the centre tap alone: every other
tap falls on the zero padding for every output pixel. DeepLabv3+'s ASPP rates (12 / 24 / 36 at output
stride 8, 6 / 12 / 18 at 16) and the multi-grid dilations of ResNet's layer 4 are set for crops of
~500 px; on the 8 x 8 and 4 x 4 maps of the CPU mini-study's 64 px images most of them are in that
case, and computing the padding's products costs a third of a training step. The centre tap as a 1 x 1
convolution gives the same output, and the same gradient (zero for the other taps, whose inputs are
all padding), up to the order of floating-point sums. At paper scale (65 x 65 maps) nothing changes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class AtrousConv2d(nn.Conv2d):
    """An ``nn.Conv2d`` (same parameters, state dict and initialisation) computed as the 1 x 1 convolution
    of its centre tap when every other tap reads only padding (see the module docstring)."""

    def _centre_only(self, input: Tensor) -> bool:
        kh, kw = self.kernel_size
        dh, dw = self.dilation
        return (self.stride == (1, 1) and self.padding_mode == "zeros" and kh % 2 == 1 and kw % 2 == 1
                and self.padding == (dh * (kh // 2), dw * (kw // 2))
                and dh >= input.shape[-2] and dw >= input.shape[-1])

    def _conv_forward(self, input: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        if self._centre_only(input):
            ch, cw = self.kernel_size[0] // 2, self.kernel_size[1] // 2
            return F.conv2d(input, weight[:, :, ch:ch + 1, cw:cw + 1], bias, 1, 0, 1, self.groups)
        return super()._conv_forward(input, weight, bias)

    @classmethod
    def from_conv(cls, conv: nn.Conv2d) -> AtrousConv2d:
        """``conv``'s parameters in an ``AtrousConv2d`` (shared, not copied; no random numbers drawn)."""
        atrous = torch.nn.utils.skip_init(
            cls, conv.in_channels, conv.out_channels, conv.kernel_size, stride=conv.stride, padding=conv.padding,
            dilation=conv.dilation, groups=conv.groups, bias=conv.bias is not None, padding_mode=conv.padding_mode,
            device=conv.weight.device, dtype=conv.weight.dtype)
        atrous.weight = conv.weight
        if conv.bias is not None:
            atrous.bias = conv.bias
        return atrous
