"""The NP head's networks (the paper's appendix tables): the small ConvNet, the latent encoder MLP
and the decoder.

Shapes: C feature channels, D latent channels, K classes, T latent samples, O hidden decoder channels.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from .base import check_choice
from .np_kernels import (
    add_constant_maps,
    border_slices,
    constant_map_border,
    first_stage_conv,
    norm_relu_conv,
    records_grad,
)

from .specs import DECODER_IMPLS, DECODER_NORMS  # noqa: E402,F401  (the choices, described without torch)


class SmallConvNet(nn.Sequential):
    """The appendix table of the small ConvNet: 1x1 in -> D, IN, ReLU, 1x1 D -> D, IN, ReLU, 1x1 D -> D.
    ``[B, C, h, w] -> [B, D, h, w]``.

    InstanceNorm without affine parameters, as the authors' code.
    """

    def __init__(self, in_channels: int, out_channels: int = 32) -> None:
        super().__init__(
            nn.Conv2d(in_channels, out_channels, 1),
            nn.InstanceNorm2d(out_channels),
            nn.ReLU(inplace=True),
            nn.Conv2d(out_channels, out_channels, 1),
            nn.InstanceNorm2d(out_channels),
            nn.ReLU(inplace=True),
            nn.Conv2d(out_channels, out_channels, 1),
        )


class LatentEncoder(nn.Module):
    """The MLP shared by target and context: ``[B, D] -> (mean [B, D], sigma [B, D])``.

    Linear D -> D, ReLU, Linear D -> 2D; sigma = 0.1 + 0.9 softplus(raw), a standard deviation.
    """

    def __init__(self, in_dim: int, latent_dim: int) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(in_dim, in_dim), nn.ReLU(inplace=True), nn.Linear(in_dim, 2 * latent_dim))

    def forward(self, aggregate: Tensor) -> tuple[Tensor, Tensor]:
        # the aggregate comes from the float32 attention: in the MLP's dtype (a float64 head's), as the decoder's z, r
        mean, raw = self.mlp(aggregate.to(self.mlp[0].weight.dtype)).chunk(2, dim=-1)
        return mean, 0.1 + 0.9 * F.softplus(raw)


class NPDecoder(nn.Module):
    """The appendix table of the decoder on ``[x, z, r]``: 3x3 -> 256, norm, ReLU, 3x3 256 -> 256, norm, ReLU, 1x1 -> K.

    ``x [B, C, h, w]``, ``z [T, B, D]``, ``r [B, D]`` -> logits ``[T, B, K, h, w]``.

    ``impl="split"``: the first conv is linear in its input, so it splits into ``conv_x(x)``,
    computed once for all T samples, plus the contribution of the spatially constant z and r
    maps. For a constant map the 3x3 zero-padded conv gives ``sum over the taps that fall inside
    the map`` of ``W[:, :, a, b] @ v``, which is computed exactly from the per-tap products and the
    masks of valid taps (rows x columns), border pixels included. ``impl="concat"`` builds the
    ``[T*B, C + 2D, h, w]`` concatenation (the reference).

    ``samples_per_conv``: how many of the T samples' maps one convolution call takes. None (the default)
    suits the device: all T on CUDA, where one launch for all samples beats T small ones and the host's
    time per call is what a small batch is bound by; one sample at a time elsewhere, which bounds the CPU
    convolution library's buffers. The results agree at float round-off whatever the value.

    ``keep_first_stage``: False (the default), the split decoder keeps no ``[T * B, O, h, w]`` map of its first
    stage for backward, which recomputes it from the shared ``conv_x`` one sample at a time
    (``np_kernels.first_stage_conv``): less memory at the peak of a step, more operator calls; True keeps it
    (the other side of that trade, for measuring it). Results equal either way.
    """

    samples_per_conv: int | None = None
    keep_first_stage: bool = False

    def __init__(
        self,
        in_channels: int,
        latent_dim: int,
        num_classes: int,
        *,
        hidden_channels: int = 256,
        impl: str = "split",
        norm: str = "instance",
    ) -> None:
        super().__init__()
        self.in_channels = in_channels
        self.latent_dim = latent_dim
        self.impl = check_choice("decoder_impl", impl, DECODER_IMPLS)
        check_choice("decoder_norm", norm, DECODER_NORMS)
        self.conv1 = nn.Conv2d(in_channels + 2 * latent_dim, hidden_channels, 3, padding=1)
        self.tail = nn.Sequential(
            self._norm(norm, hidden_channels),
            nn.ReLU(inplace=True),
            nn.Conv2d(hidden_channels, hidden_channels, 3, padding=1),
            self._norm(norm, hidden_channels),
            nn.ReLU(inplace=True),
            nn.Conv2d(hidden_channels, num_classes, 1),
        )

    def sample_groups(self, t: int, device: torch.device) -> int:
        """Into how many convolution calls the T samples' maps go (``samples_per_conv``)."""
        per_conv = self.samples_per_conv or (t if device.type == "cuda" else 1)
        return -(-t // min(per_conv, t))

    @staticmethod
    def _norm(kind: str, channels: int) -> nn.Module:
        if kind == "instance":
            return nn.InstanceNorm2d(channels)
        if kind == "group":
            return nn.GroupNorm(32, channels, affine=False)
        return nn.BatchNorm2d(channels)

    def first_conv(self, x: Tensor, z: Tensor, r: Tensor) -> Tensor:
        """The first conv on ``[x, z, r]``: ``[T * B, hidden, h, w]``."""
        t, b, d = z.shape
        h, w = x.shape[-2:]
        r = r.expand(t, b, d)
        if self.impl == "concat":
            maps = torch.cat(
                [x.expand(t, *x.shape), z[..., None, None].expand(t, b, d, h, w), r[..., None, None].expand(t, b, d, h, w)], dim=2
            )
            return self.conv1(maps.flatten(0, 1))
        conv_x, taps = self._split_parts(x, z, r)
        out = add_constant_maps(conv_x, taps, self.conv1.bias)  # [T, B, O, h, w]
        return out.flatten(0, 1)

    def _split_parts(self, x: Tensor, z: Tensor, r: Tensor) -> tuple[Tensor, Tensor]:
        """The split first conv's two parts: ``conv_x [B, O, h, w]`` (x channels, no bias) and the
        per-tap products of the constant channels ``W[:, z|r, a, b] @ (z|r)``: ``taps [T, B, O, 3, 3]``."""
        t, b, d = z.shape
        weight = self.conv1.weight
        out_channels = weight.shape[0]
        conv_x = F.conv2d(x, weight[:, : self.in_channels], None, padding=1)
        w_zr = weight[:, self.in_channels :].permute(1, 0, 2, 3).reshape(2 * d, out_channels * 9)
        taps = (torch.cat([z, r.expand(t, b, d)], dim=-1).to(w_zr.dtype) @ w_zr).view(t, b, out_channels, 3, 3)
        return conv_x.to(taps.dtype), taps

    def normalized_first_stage(self, x: Tensor, z: Tensor, r: Tensor, eps: float = 1e-5) -> Iterator[Tensor]:
        """``relu(instance_norm(first_conv(x, z, r)))`` a group of samples at a time (``samples_per_conv``),
        without building ``first_conv``: yields the maps ``[g * B, O, h, w]`` of g consecutive samples.

        Inference only (no autograd), split decoder, maps of at least 3 x 3. The first conv's
        output is ``conv_x + c + e_t``: c is constant over the map (interior taps and bias) and
        InstanceNorm removes it; ``e_t``, the missing taps on the border, is all that differs between
        samples. So ``conv_x`` is centred once for all T samples, the per-sample mean and variance
        come from its border values and ``e_t`` (``var = var_x + 2 cov(x, e_t) + var(e_t)``), and
        each sample is written in one pass, ``(x' - mean(e_t)) * rstd``, plus ``e_t * rstd`` on the border.
        """
        conv_x, taps = self._split_parts(x, z, r)
        if conv_x.dtype in (torch.float16, torch.bfloat16):  # the statistics in float32 at least
            conv_x, taps = conv_x.float(), taps.float()
        h, w = conv_x.shape[-2:]
        with torch.autocast(device_type=x.device.type, enabled=False):  # (not around the yields: the caller's convs keep it)
            _, edge_rows, edge_cols = constant_map_border(taps, h, w)  # [T, B, O, 2, w], [T, B, O, 2, h - 2]
            area = h * w
            centred = conv_x.sub_(conv_x.sum(dim=(-2, -1), keepdim=True) / area)  # x' [B, O, h, w]
            var_x = torch.linalg.vector_norm(centred.flatten(-2), dim=-1).square() / area  # [B, O]
            x_rows = centred[..., border_slices(h), :]
            x_cols = centred[..., 1 : h - 1, border_slices(w)].transpose(-2, -1)
            mean_e = (edge_rows.sum(dim=(-2, -1)) + edge_cols.sum(dim=(-2, -1))) / area  # [T, B, O]
            var_e = (edge_rows.square().sum(dim=(-2, -1)) + edge_cols.square().sum(dim=(-2, -1))) / area - mean_e.square()
            cov = ((edge_rows * x_rows).sum(dim=(-2, -1)) + (edge_cols * x_cols).sum(dim=(-2, -1))) / area
            rstd = torch.rsqrt((var_x + 2.0 * cov + var_e).clamp_min(0.0) + eps)[..., None, None]  # [T, B, O, 1, 1]
            shift = -mean_e[..., None, None] * rstd
            edge_rows.mul_(rstd)
            edge_cols.mul_(rstd)
        for group in zip(*(part.tensor_split(self.sample_groups(z.shape[0], x.device)) for part in
                           (shift, rstd, edge_rows, edge_cols))):
            shift_g, rstd_g, rows_g, cols_g = group
            out = torch.addcmul(shift_g, centred, rstd_g)  # [g, B, O, h, w]
            out[..., border_slices(h), :].add_(rows_g)
            out[..., 1 : h - 1, border_slices(w)].add_(cols_g.transpose(-2, -1))
            yield out.flatten(0, 1).relu_()

    def forward(self, x: Tensor, z: Tensor, r: Tensor) -> Tensor:
        t, b = z.shape[:2]
        x = x.contiguous()  # the kernels view NCHW maps in place; channels-last features (runtime.channels_last) copied
        if not isinstance(self.tail[0], nn.InstanceNorm2d):
            logits = self.tail(self.first_conv(x, z, r))
        elif (
            self.impl == "split"
            and min(x.shape[-2:]) >= 3
            and not records_grad(x, z, r, *self.conv1.parameters(), *self.tail.parameters())
        ):
            conv, last = self.tail[2], self.tail[5]
            logits = torch.cat(
                [
                    norm_relu_conv(
                        F.conv2d(hidden, conv.weight.to(hidden.dtype), conv.bias.to(hidden.dtype), padding=1), last, 1
                    )
                    for hidden in self.normalized_first_stage(x, z, r)
                ]
            )
        else:  # same maths as self.tail, in less memory: the split first stage is recomputed in backward
            groups = self.sample_groups(t, x.device)
            if self.impl == "split" and not self.keep_first_stage:
                hidden = first_stage_conv(*self._split_parts(x, z, r), self.conv1.bias, self.tail[2], groups, t)
            else:
                hidden = norm_relu_conv(self.first_conv(x, z, r), self.tail[2], groups)
            logits = norm_relu_conv(hidden, self.tail[5], groups)
        return logits.view(t, b, *logits.shape[1:])
