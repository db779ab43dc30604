"""NP-SemiSeg's classifier head (paper Section 3.2; appendix tables of the small ConvNet and the decoder).

The paper's description is the default; every behaviour of the authors' released code
that differs is a named option (``../shared/notes/np_head_reference.md``):

========================  ================================  ======================================
option                    default (paper / careful)         authors' code
========================  ================================  ======================================
``attention``             ``"euclidean"`` (Eq. 8)           ``"per_channel"``
``kl``                    ``"paper"`` (Eq. 7, sigma = std)  ``"authors"`` (sigma used as variance)
``mask_empty``            True (empty classes masked)       False (zero centers take part)
``detach_query``          True                              True
``sync_memories``         True (all_gather under DDP)       False
``enqueue_per_class``     ``"auto"``: min(256, Q)/step     None (everything; newest Q kept)
``memory_rows``           ``"pixel"`` (a pixel's vector)     ``"scrambled"`` (one channel, many pixels)
``persist_memories``      True                              False (each step starts empty; zero
                                                            centers at inference)
========================  ================================  ======================================

The last two are bugs of the released code (``np_head_reference.md`` headlines 1-2), kept as options so
the ``released`` protocol (``npsemiseg.protocol``) reproduces them.
``attention="mean"`` is the paper's ablation (mean aggregator), ``decoder_norm`` an ablation of
the decoder's InstanceNorm (which cancels the spatially constant z and r away from the border).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn import functional as F

from .base import HEADS, IGNORE_INDEX, ClassifierHead, HeadOutput, check_label_values, downsample_labels, gaussian_kl

ATTENTIONS = ("euclidean", "squared", "per_channel", "mean")
MEMORY_ROWS = ("pixel", "scrambled")
KL_FORMS = ("paper", "authors")
DECODER_IMPLS = ("split", "concat")
DECODER_NORMS = ("instance", "group", "batch")
MEMORIES = ("target", "context")


def _choice(name: str, value: str, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise ValueError(f"{name}: expected one of {allowed}, got {value!r}")
    return value


#: ``enqueue_per_class="auto"``: this many pixels per class and step, at most the memory length Q
AUTO_ENQUEUE_PER_CLASS = 256


def enqueue_limit(enqueue_per_class: int | str | None, memory_size: int) -> int:
    """Pixels per class and step a memory of ``memory_size`` rows takes: ``"auto"`` = min(256, Q),
    ``None`` = Q, an int = itself (checked by :meth:`NPHead.check_values`)."""
    if enqueue_per_class == "auto":
        return min(AUTO_ENQUEUE_PER_CLASS, memory_size)
    return memory_size if enqueue_per_class is None else int(enqueue_per_class)


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}: expected a positive int, got {value!r}")
    return value


@dataclass
class NPLatent:
    """The per-image latent of one NP forward pass.

    z: ``[T, B, D]`` latent samples (latent path); r: ``[B, D]`` deterministic path vector.
    """

    z: Tensor
    r: Tensor

    @property
    def num_samples(self) -> int:
        return self.z.shape[0]


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
        mean, raw = self.mlp(aggregate).chunk(2, dim=-1)
        return mean, 0.1 + 0.9 * F.softplus(raw)


def _per_channel_mean(query: Tensor, centers: Tensor, filled: Tensor) -> Tensor:
    """Spatial mean of the authors' per-channel attention for a slice of channels.

    query ``[B, d, h, w]``, centers ``[K, d]``, filled ``[K]`` -> ``[B, d]``. Builds ``[B, K, d, h, w]``
    for this slice only.
    """
    c = centers[None, :, :, None, None]
    score = -(query[:, None] - c).pow(2)
    score = score.masked_fill(~filled[None, :, None, None, None], float("-inf"))
    return (score.softmax(dim=1) * c).sum(dim=1).mean(dim=(2, 3))


class _PerChannelAttention(torch.autograd.Function):
    """``_per_channel_mean`` over all channels, in slices of ``chunk`` channels, recomputed slice by
    slice in backward, so at most ``[B, K, chunk, h, w]`` exists at a time. Gradient for the query
    only (centers come from the memories, which carry none)."""

    @staticmethod
    def forward(ctx, query: Tensor, centers: Tensor, filled: Tensor, chunk: int) -> Tensor:
        ctx.save_for_backward(query, centers, filled)
        ctx.chunk = chunk
        return torch.cat(
            [_per_channel_mean(q, c, filled) for q, c in zip(query.split(chunk, dim=1), centers.split(chunk, dim=1))], dim=1
        )

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out: Tensor):
        query, centers, filled = ctx.saved_tensors
        grads = []
        for q, c, g in zip(query.split(ctx.chunk, dim=1), centers.split(ctx.chunk, dim=1), grad_out.split(ctx.chunk, dim=1)):
            with torch.enable_grad():
                q = q.detach().requires_grad_(True)
                grads.append(torch.autograd.grad(_per_channel_mean(q, c, filled), q, g)[0])
        return torch.cat(grads, dim=1), None, None, None


def attention_aggregate(
    query: Tensor, centers: Tensor, filled: Tensor, kind: str = "euclidean", *, channel_chunk: int = 4
) -> Tensor:
    """Spatial mean of the attention aggregation of paper Eq. 8: ``mean_hw(sum_k w_k C[k])``.

    query ``[B, D, h, w]``, centers ``[K, D]``, filled ``[K]`` bool (False = empty class, masked out)
    -> ``[B, D]``. Only the spatial mean is used downstream, so it is computed as
    ``mean_hw(w) @ C``; no ``[B, K, D, h, w]`` tensor is built.

    kind: ``"euclidean"`` w = softmax_k(-|q - c_k|) (the paper), ``"squared"`` softmax_k(-|q - c_k|^2),
    ``"per_channel"`` a separate softmax over classes for every channel of the squared residual
    (the authors' code; computed in slices of ``channel_chunk`` channels, recomputed in backward),
    ``"mean"`` uniform weights over filled classes (the paper's mean-aggregator ablation).
    Runs in float32 (the distance expansion cancels badly in half precision).
    """
    with torch.autocast(device_type=query.device.type, enabled=False):
        query, centers = query.float(), centers.float()
        if kind == "mean":
            weights = filled.float() / filled.sum().clamp_min(1)
            return (weights @ centers).expand(query.shape[0], -1)
        if kind == "per_channel":
            return _PerChannelAttention.apply(query, centers, filled, channel_chunk)
        if kind not in ("euclidean", "squared"):
            raise ValueError(f"attention: expected one of {ATTENTIONS}, got {kind!r}")
        cross = F.conv2d(query, centers[:, :, None, None])  # [B, K, h, w] = q . c_k
        dist2 = (query.pow(2).sum(dim=1, keepdim=True) - 2.0 * cross + centers.pow(2).sum(dim=1)[:, None, None]).clamp_min(0.0)
        score = -dist2 if kind == "squared" else -dist2.clamp_min(1e-12).sqrt()
        score = score.masked_fill(~filled[None, :, None, None], float("-inf"))
        return score.softmax(dim=1).mean(dim=(2, 3)) @ centers


def _valid_taps(size: int, device: torch.device, dtype: torch.dtype) -> Tensor:
    """``[size, 3]``: 1 where tap a of a 3x3, padding-1 kernel falls inside the map at position i."""
    i = torch.arange(size, device=device)[:, None] + torch.arange(3, device=device)[None] - 1
    return ((i >= 0) & (i < size)).to(dtype)


def _instance_norm_(y: Tensor, eps: float = 1e-5, *, scale: bool = True) -> Tensor:
    """In-place InstanceNorm without affine parameters of ``y [N, C, h, w]``; returns ``rstd [N, C, 1, 1]``.

    Two-pass (mean, then the norm of the centred map): on CPU several times faster than
    ``var_mean`` over the spatial dims, and no temporary of the size of ``y``. ``scale=False``
    only centres ``y`` (the caller folds ``rstd`` into what follows).
    """
    n, c, h, w = y.shape
    flat = y.view(n * c, h * w)
    y.sub_((flat.sum(dim=1) / (h * w)).view(n, c, 1, 1))
    var = torch.linalg.vector_norm(flat, dim=1).square().view(n, c, 1, 1) / (h * w)
    rstd = torch.rsqrt(var.to(torch.promote_types(var.dtype, torch.float32)) + eps).to(y.dtype)
    if scale:
        y.mul_(rstd)
    return rstd


def _conv_backward(grad_out: Tensor, input: Tensor, weight: Tensor, mask: tuple[bool, bool, bool]):
    k = weight.shape[-1]
    return torch.ops.aten.convolution_backward(
        grad_out, input, weight, [weight.shape[0]], [1, 1], [k // 2, k // 2], [1, 1], False, [0, 0], 1, list(mask)
    )


class _NormReLUConv(torch.autograd.Function):
    """``conv(relu(instance_norm(y)))`` saving one activation-sized tensor (the normalised ``y``).

    ``y [N, C, h, w]`` is normalised in place (callers pass a fresh intermediate), so autograd
    keeps one tensor per decoder stage instead of three (norm input, ReLU output, conv input):
    the conv input ``relu(xhat)`` is recomputed in backward. The convs run in ``chunks`` slices of
    N (InstanceNorm is per image, so slicing is exact), which bounds the convolution library's
    temporary buffers to one slice. Double backward is not supported.
    """

    @staticmethod
    def forward(ctx, y: Tensor, weight: Tensor, bias: Tensor, chunks: int) -> Tensor:
        weight_, bias_ = weight.to(y.dtype), bias.to(y.dtype)
        rstd = _instance_norm_(y)
        padding = weight.shape[-1] // 2
        parts = [F.conv2d(F.relu(part), weight_, bias_, padding=padding) for part in y.chunk(chunks)]
        ctx.save_for_backward(y, rstd, weight_)
        ctx.chunks, ctx.param_dtype = chunks, weight.dtype
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out: Tensor):
        xhat, rstd, weight = ctx.saved_tensors
        grad_out = grad_out.contiguous()
        grad_y = torch.empty_like(xhat)
        grad_weight = grad_bias = None
        for x, r, g_out, g_y in zip(
            xhat.chunk(ctx.chunks), rstd.chunk(ctx.chunks), grad_out.chunk(ctx.chunks), grad_y.chunk(ctx.chunks)
        ):
            g = _conv_backward(g_out, x, weight, (True, False, False))[0]  # d loss / d relu(xhat)
            g = torch.ops.aten.threshold_backward(g, x, 0)  # through the ReLU
            n, c, h, w = x.shape
            mean_g = g.view(n * c, h * w).sum(dim=1).view(n, c, 1, 1) / (h * w)
            mean_gx = torch.bmm(g.view(n * c, 1, h * w), x.reshape(n * c, h * w, 1)).view(n, c, 1, 1) / (h * w)
            g_y.copy_(g.sub_(mean_g).addcmul_(x, mean_gx, value=-1.0).mul_(r))  # InstanceNorm backward
            _, g_w, g_b = _conv_backward(g_out, x.relu_(), weight, (False, True, True))
            grad_weight = g_w if grad_weight is None else grad_weight.add_(g_w)
            grad_bias = g_b if grad_bias is None else grad_bias.add_(g_b)
        return grad_y, grad_weight.to(ctx.param_dtype), grad_bias.to(ctx.param_dtype), None


class _AddConstantMaps(torch.autograd.Function):
    """``conv_x [B, O, h, w]`` plus the 3x3 zero-padded conv of spatially constant input maps -> ``[T, B, O, h, w]``.

    ``taps [T, B, O, 3, 3]`` holds ``W[:, constant channels, u, v] @ values`` per tap (u, v). Pixel
    (i, j) receives the sum over the taps that fall inside the map (``rows[i, u] * cols[j, v]``):
    all nine in the interior, fewer on the border. Forward writes the interior value in one pass
    and corrects the border rows and columns in place; backward is
    ``grad_taps = rows^T @ grad @ cols`` (one read of the gradient), so autograd never copies
    activation-sized tensors for the in-place border writes.
    """

    @staticmethod
    def forward(ctx, conv_x: Tensor, taps: Tensor, bias: Tensor | None) -> Tensor:
        h, w = conv_x.shape[-2:]
        rows, cols = _valid_taps(h, conv_x.device, taps.dtype), _valid_taps(w, conv_x.device, taps.dtype)
        interior = taps.sum(dim=(-2, -1))  # [T, B, O]
        constant = interior if bias is None else interior + bias.to(interior.dtype)
        out = conv_x + constant[..., None, None]
        for i in sorted({0, h - 1}):  # whole border rows
            out[..., i, :] += torch.einsum("u,tnouv,jv->tnoj", rows[i], taps, cols) - interior[..., None]
        if h > 2:  # border columns of the remaining rows
            for j in sorted({0, w - 1}):
                out[..., 1 : h - 1, j] += torch.einsum("iu,tnouv,v->tnoi", rows[1 : h - 1], taps, cols[j]) - interior[..., None]
        ctx.save_for_backward(rows, cols)
        ctx.bias_dtype = None if bias is None else bias.dtype
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor):
        rows, cols = ctx.saved_tensors
        grad_cols = torch.matmul(grad, cols.to(grad.dtype))  # [T, B, O, h, 3]
        grad_taps = torch.matmul(rows.t().to(grad.dtype), grad_cols)  # [T, B, O, 3, 3]
        grad_bias = None
        if ctx.bias_dtype is not None:  # the centre tap is inside everywhere: its column sums all pixels
            grad_bias = grad_cols[..., 1].sum(dim=(0, 1, 3)).to(ctx.bias_dtype)
        return grad.sum(dim=0), grad_taps, grad_bias


def _records_grad(*tensors: Tensor) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def _norm_relu_conv(y: Tensor, conv: nn.Conv2d, chunks: int) -> Tensor:
    """``conv(relu(instance_norm(y)))``, overwriting ``y``: the lean autograd Function when
    gradients are recorded, otherwise in place (InstanceNorm and ReLU on ``y``, one conv)."""
    if _records_grad(y, conv.weight, conv.bias):
        return _NormReLUConv.apply(y, conv.weight, conv.bias, chunks)
    if conv.weight.shape[-1] == 1:  # 1x1: relu((y - mu) * rstd) = rstd * relu(y - mu), rstd folded into the weights
        n, c, h, w = y.shape
        rstd = _instance_norm_(y, scale=False).view(n, 1, c)
        weight = conv.weight.to(y.dtype).flatten(1)[None] * rstd  # [N, K, C]
        bias = conv.bias.to(y.dtype)[None, :, None].expand(n, -1, h * w)
        return torch.baddbmm(bias, weight, y.relu_().view(n, c, h * w)).view(n, -1, h, w)
    _instance_norm_(y)
    return F.conv2d(y.relu_(), conv.weight.to(y.dtype), conv.bias.to(y.dtype), padding=conv.weight.shape[-1] // 2)


class NPDecoder(nn.Module):
    """The appendix table of the decoder on ``[x, z, r]``: 3x3 -> 256, norm, ReLU, 3x3 256 -> 256, norm, ReLU, 1x1 -> K.

    ``x [B, C, h, w]``, ``z [T, B, D]``, ``r [B, D]`` -> logits ``[T, B, K, h, w]``.

    ``impl="split"``: the first conv is linear in its input, so it splits into ``conv_x(x)``,
    computed once for all T samples, plus the contribution of the spatially constant z and r
    maps. For a constant map the 3x3 zero-padded conv gives ``sum over the taps that fall inside
    the map`` of ``W[:, :, a, b] @ v``, which is computed exactly from the per-tap products and the
    masks of valid taps (rows x columns), border pixels included. ``impl="concat"`` builds the
    ``[T*B, C + 2D, h, w]`` concatenation (the reference).
    """

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
        self.impl = _choice("decoder_impl", impl, DECODER_IMPLS)
        _choice("decoder_norm", norm, DECODER_NORMS)
        self.conv1 = nn.Conv2d(in_channels + 2 * latent_dim, hidden_channels, 3, padding=1)
        self.tail = nn.Sequential(
            self._norm(norm, hidden_channels),
            nn.ReLU(inplace=True),
            nn.Conv2d(hidden_channels, hidden_channels, 3, padding=1),
            self._norm(norm, hidden_channels),
            nn.ReLU(inplace=True),
            nn.Conv2d(hidden_channels, num_classes, 1),
        )

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
        out = _AddConstantMaps.apply(conv_x, taps, self.conv1.bias)  # [T, B, O, h, w]
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
        """``relu(instance_norm(first_conv(x, z, r)))`` one sample at a time, without building
        ``first_conv``: yields T maps ``[B, O, h, w]``.

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
            rows, cols = _valid_taps(h, conv_x.device, taps.dtype), _valid_taps(w, conv_x.device, taps.dtype)
            interior = taps.sum(dim=(-2, -1))[..., None, None]  # [T, B, O, 1, 1]
            edge_rows = torch.einsum("ku,tnouv,jv->tnokj", rows[[0, h - 1]], taps, cols) - interior  # [T, B, O, 2, w]
            edge_cols = torch.einsum("iu,tnouv,kv->tnoki", rows[1 : h - 1], taps, cols[[0, w - 1]]) - interior  # [.., 2, h-2]
            area = h * w
            centred = conv_x.sub_(conv_x.sum(dim=(-2, -1), keepdim=True) / area)  # x' [B, O, h, w]
            var_x = torch.linalg.vector_norm(centred.flatten(-2), dim=-1).square() / area  # [B, O]
            x_rows, x_cols = centred[..., [0, h - 1], :], centred[..., 1 : h - 1, [0, w - 1]].transpose(-2, -1)
            mean_e = (edge_rows.sum(dim=(-2, -1)) + edge_cols.sum(dim=(-2, -1))) / area  # [T, B, O]
            var_e = (edge_rows.square().sum(dim=(-2, -1)) + edge_cols.square().sum(dim=(-2, -1))) / area - mean_e.square()
            cov = ((edge_rows * x_rows).sum(dim=(-2, -1)) + (edge_cols * x_cols).sum(dim=(-2, -1))) / area
            rstd = torch.rsqrt((var_x + 2.0 * cov + var_e).clamp_min(0.0) + eps)[..., None, None]  # [T, B, O, 1, 1]
            shift = -mean_e[..., None, None] * rstd
            edge_rows.mul_(rstd)
            edge_cols.mul_(rstd)
        for sample in range(z.shape[0]):
            out = torch.addcmul(shift[sample], centred, rstd[sample])  # [B, O, h, w]
            out[..., [0, h - 1], :] += edge_rows[sample]
            out[..., 1 : h - 1, [0, w - 1]] += edge_cols[sample].transpose(-2, -1)
            yield out.relu_()

    def forward(self, x: Tensor, z: Tensor, r: Tensor) -> Tensor:
        t, b = z.shape[:2]
        if not isinstance(self.tail[0], nn.InstanceNorm2d):
            logits = self.tail(self.first_conv(x, z, r))
        elif (
            self.impl == "split"
            and min(x.shape[-2:]) >= 3
            and not _records_grad(x, z, r, *self.conv1.parameters(), *self.tail.parameters())
        ):
            conv, last = self.tail[2], self.tail[5]
            logits = torch.cat(
                [
                    _norm_relu_conv(
                        F.conv2d(hidden, conv.weight.to(hidden.dtype), conv.bias.to(hidden.dtype), padding=1), last, 1
                    )
                    for hidden in self.normalized_first_stage(x, z, r)
                ]
            )
        else:  # same maths as self.tail, a third of the memory
            logits = _norm_relu_conv(_norm_relu_conv(self.first_conv(x, z, r), self.tail[2], t), self.tail[5], t)
        return logits.view(t, b, *logits.shape[1:])


@HEADS.register("np")
class NPHead(ClassifierHead):
    """NP-SemiSeg's head: per-class memories, attention aggregator, latent and deterministic paths.

    Call contract (``ClassifierHead``): ``features [B, C, h, w]`` -> ``logits [T, B, K, h, w]``.

    Training mode (``labels`` given): targets are all of ``features`` labelled by ``labels``
    (ground truth or pseudo-labels, 255 ignored); context is ``context_features`` /
    ``context_labels`` (normally the labelled slice of the same batch). When the module is in
    ``train()`` each call enqueues a bounded random subset of pixel feature vectors per class
    into the target and context memories and refreshes the centers. The latent path gives
    ``q(z | target)`` from the target centers, the prior ``q(z | context)`` from the context
    centers, both attended by the target queries; ``aux_loss = lambda_kl * mean_B KL``.
    Without context the context memory is left as it is and its stored centers serve.

    Inference mode (no labels): only the stored centers are used (target centers for the latent
    path, context centers for the deterministic path), ``aux_loss = 0``.

    Buffers (all in the state_dict): ``target_memory``/``context_memory`` ``[K, Q, D]``,
    ``*_pointer`` ``[K]`` (next write row), ``*_count`` ``[K]`` (filled rows),
    ``target_centers``/``context_centers`` ``[K, D]``.

    ``enqueue_per_class`` (default ``"auto"`` = min(256, Q): Q / 10 at the paper's Q): at most this
    many pixels of a class enter a memory per step and rank, so a full memory spans >= 10 steps of
    images rather than the last image; ``None`` enqueues up to Q (the authors push every pixel). The
    default follows Q (``memory_size=64`` enqueues 64); only an explicit value above Q is an error. Under
    torch.distributed every rank gathers the candidates of all ranks and enqueues the same rows.
    """

    stochastic = True
    label = "NP-SemiSeg"
    description = "the NP-SemiSeg neural-process head (uncertainty from T latent samples)"
    aux_loss_term = "kl"
    has_memories = True
    #: lambda_kl, memory length Q and T of the NP configs (``np_head_reference.md`` section 2), clipped at 5.0
    paper_options = {"lambda_kl": 0.005, "memory_size": 2560, "num_samples": 5}
    paper_grad_clip = 5.0
    smoke_options = {
        "lambda_kl": 0.005,
        "memory_size": 64,
        "num_samples": 2,
        "latent_dim": 8,
        "hidden_channels": 16,
        "enqueue_per_class": 16,
    }

    def __init__(
        self,
        in_channels: int,
        num_classes: int,
        latent_dim: int = 32,
        memory_size: int = 2560,
        num_samples: int = 5,
        attention: str = "euclidean",
        kl: str = "paper",
        decoder_impl: str = "split",
        enqueue_per_class: int | str | None = "auto",
        lambda_kl: float = 0.005,
        detach_query: bool = True,
        mask_empty: bool = True,
        sync_memories: bool = True,
        decoder_norm: str = "instance",
        hidden_channels: int = 256,
        memory_rows: str = "pixel",
        persist_memories: bool = True,
    ) -> None:
        super().__init__(in_channels, num_classes)
        self.check_values(
            latent_dim=latent_dim,
            memory_size=memory_size,
            num_samples=num_samples,
            attention=attention,
            kl=kl,
            decoder_impl=decoder_impl,
            enqueue_per_class=enqueue_per_class,
            lambda_kl=lambda_kl,
            decoder_norm=decoder_norm,
            hidden_channels=hidden_channels,
            memory_rows=memory_rows,
        )
        self.memory_rows, self.persist_memories = memory_rows, bool(persist_memories)
        self.latent_dim, self.memory_size, self.num_samples = latent_dim, memory_size, num_samples
        self.attention, self.kl = attention, kl
        self.enqueue_per_class = enqueue_limit(enqueue_per_class, memory_size)
        self.lambda_kl = float(lambda_kl)
        self.detach_query = bool(detach_query)
        self.mask_empty = bool(mask_empty)
        self.sync_memories = bool(sync_memories)

        self.query_net = SmallConvNet(in_channels, latent_dim)
        self.latent_encoder = LatentEncoder(latent_dim, latent_dim)
        self.decoder = NPDecoder(
            in_channels, latent_dim, num_classes, hidden_channels=hidden_channels, impl=decoder_impl, norm=decoder_norm
        )
        for name in MEMORIES:
            self.register_buffer(f"{name}_memory", torch.zeros(num_classes, memory_size, latent_dim))
            self.register_buffer(f"{name}_pointer", torch.zeros(num_classes, dtype=torch.long))
            self.register_buffer(f"{name}_count", torch.zeros(num_classes, dtype=torch.long))
            self.register_buffer(f"{name}_centers", torch.zeros(num_classes, latent_dim))
        self.reset_parameters()

    @classmethod
    def check_values(
        cls,
        *,
        latent_dim: int,
        memory_size: int,
        num_samples: int,
        attention: str,
        kl: str,
        decoder_impl: str,
        enqueue_per_class: int | str | None,
        lambda_kl: float,
        decoder_norm: str,
        hidden_channels: int,
        memory_rows: str = "pixel",
        **flags: bool,
    ) -> None:
        for name, value in (
            ("latent_dim", latent_dim),
            ("memory_size", memory_size),
            ("num_samples", num_samples),
            ("hidden_channels", hidden_channels),
        ):
            _positive_int(name, value)
        _choice("attention", attention, ATTENTIONS)
        _choice("kl", kl, KL_FORMS)
        _choice("decoder_impl", decoder_impl, DECODER_IMPLS)
        _choice("decoder_norm", decoder_norm, DECODER_NORMS)
        _choice("memory_rows", memory_rows, MEMORY_ROWS)
        if enqueue_per_class not in (None, "auto") and _positive_int("enqueue_per_class", enqueue_per_class) > memory_size:
            raise ValueError(f"enqueue_per_class: expected at most memory_size={memory_size}, got {enqueue_per_class}")
        if not (isinstance(lambda_kl, (int, float)) and lambda_kl >= 0.0):
            raise ValueError(f"lambda_kl: expected a number >= 0, got {lambda_kl!r}")

    def reset_parameters(self) -> None:
        """Xavier-normal weights and zero biases everywhere (as the authors' head)."""
        for module in self.modules():
            if isinstance(module, (nn.Conv2d, nn.Linear)):
                nn.init.xavier_normal_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)

    @property
    def default_num_samples(self) -> int:  # type: ignore[override]
        return self.num_samples

    @property
    def decoder_impl(self) -> str:
        return self.decoder.impl

    def extra_repr(self) -> str:
        return (
            f"num_classes={self.num_classes}, latent_dim={self.latent_dim}, memory_size={self.memory_size}, "
            f"num_samples={self.num_samples}, attention={self.attention!r}, kl={self.kl!r}, "
            f"enqueue_per_class={self.enqueue_per_class}, lambda_kl={self.lambda_kl}"
        )

    # ---- memories -------------------------------------------------------------------------

    def filled(self, memory: str) -> Tensor:
        """``[K]`` bool: classes taking part in attention (with ``mask_empty=False`` or memories that
        never persist: all, empty classes with a zero center)."""
        count = getattr(self, f"{memory}_count")
        if self.mask_empty and self.persist_memories:
            return count > 0
        return torch.ones_like(count, dtype=torch.bool)

    @torch.no_grad()
    def reset_memories(self) -> None:
        """Empty both memories and zero their centers (``persist_memories=False``: every training step)."""
        for name in MEMORIES:
            for kind in ("memory", "pointer", "count", "centers"):
                getattr(self, f"{name}_{kind}").zero_()

    def _scramble(self, picked: Tensor, valid: Tensor) -> Tensor:
        """The authors' rows (``memory_rows="scrambled"``): ``masked_select(feat, mask).view(-1, D)`` reads a
        class's values channel by channel, so row i holds D consecutive values of one channel from different
        pixels. picked ``[K, P, D]``, valid ``[K, P]`` (the first n_k valid) -> ``[K, P, D]``."""
        d = picked.shape[-1]
        n = valid.sum(dim=1).clamp(min=1)[:, None, None]  # [K, 1, 1]
        flat = (torch.arange(picked.shape[1], device=picked.device)[:, None] * d
                + torch.arange(d, device=picked.device)[None])[None]  # [1, P, D] index in the channel-major order
        pixel, channel = flat % n, (flat // n).clamp(max=d - 1)  # [K, P, D] each
        classes = torch.arange(picked.shape[0], device=picked.device)[:, None, None]
        return picked[classes, pixel, channel]

    def _candidates(self, rows: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
        """A random subset of at most P pixels per class, without a host sync.

        rows ``[B, D, h, w]``, labels ``[B, h, w]`` -> rows ``[K, P, D]`` (one pixel's feature
        vector each) and valid ``[K, P]`` (True for the first ``min(n_k, P)`` entries of class k).
        Pixels are sorted by (class, random rank); class k's candidates are the first P of its run.
        """
        k, p = self.num_classes, self.enqueue_per_class
        b, d, h, w = rows.shape
        n = b * h * w
        cls = labels.reshape(n)
        cls = torch.where(cls == IGNORE_INDEX, torch.full_like(cls, k), cls)  # ignore -> bucket K, never read
        order = torch.argsort(cls * n + torch.randperm(n, device=rows.device))
        counts = torch.zeros(k + 1, dtype=torch.long, device=rows.device).scatter_add_(0, cls, torch.ones_like(cls))
        starts = counts.cumsum(0) - counts
        j = torch.arange(p, device=rows.device)
        valid = j[None] < counts[:k, None]
        pixel = order[(starts[:k, None] + j[None]).clamp(max=n - 1)]  # [K, P]
        picked = rows.flatten(2)[pixel // (h * w), :, pixel % (h * w)]  # [K, P, D]
        if self.memory_rows == "scrambled":
            picked = self._scramble(picked, valid)
        return picked.float(), valid

    def _gather_ranks(self, rows: Tensor, valid: Tensor) -> tuple[Tensor, Tensor]:
        """Concatenate every rank's candidates along P: ``[K, W*P, D]``, ``[K, W*P]`` (identical on all ranks)."""
        if not (self.sync_memories and dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return rows, valid
        packed = torch.cat([rows, valid[..., None].to(rows.dtype)], dim=-1).contiguous()
        parts = [torch.empty_like(packed) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, packed)
        packed = torch.cat(parts, dim=1)
        return packed[..., :-1], packed[..., -1] > 0.5

    @torch.no_grad()
    def enqueue(self, memory: str, rows: Tensor, labels: Tensor) -> None:
        """Write a random subset of each class's pixels into ``memory`` (FIFO) and refresh its centers.

        rows ``[B, D, h, w]`` (query features), labels ``[B, h, w]`` at the same resolution
        (values validated; 255 never enters).
        """
        store = getattr(self, f"{memory}_memory")
        pointer, count = getattr(self, f"{memory}_pointer"), getattr(self, f"{memory}_count")
        q = self.memory_size
        rows, valid = self._gather_ranks(*self._candidates(rows.detach(), labels))
        if rows.shape[1] > self.enqueue_per_class:  # several ranks: valid entries first, at most Q
            order = torch.argsort((~valid).to(torch.uint8), dim=1, stable=True)[:, :q]
            rows = rows.gather(1, order[..., None].expand(-1, -1, rows.shape[-1]))
            valid = valid.gather(1, order)
        num_new = valid.sum(dim=1)
        position = (pointer[:, None] + torch.arange(rows.shape[1], device=rows.device)[None]) % q  # distinct per class
        index = position[..., None].expand(-1, -1, store.shape[-1])
        store.scatter_(1, index, torch.where(valid[..., None], rows.to(store.dtype), store.gather(1, index)))
        pointer.copy_((pointer + num_new) % q)
        count.copy_((count + num_new).clamp(max=q))
        centers = getattr(self, f"{memory}_centers")
        centers.copy_(store.sum(dim=1) / count.clamp(min=1)[:, None].to(store.dtype))

    def _check_memories_filled(self) -> None:
        if not self.persist_memories:  # the authors' empty banks: zero centers, never an error
            return
        filled = torch.stack([self.target_count.sum(), self.context_count.sum()]).tolist()
        for name, rows in zip(MEMORIES, filled):
            if rows == 0:
                raise ValueError(
                    f"NPHead: the {name} memory is empty; run training-mode steps (labels=..., "
                    f"context_features=..., context_labels=...) or load a state_dict before inference"
                )

    # ---- paths ----------------------------------------------------------------------------

    def query(self, features: Tensor) -> Tensor:
        """Small ConvNet on the features (detached unless ``detach_query=False``): ``[B, D, h, w]``."""
        return self.query_net(features.detach() if self.detach_query else features)

    def _aggregates(self, query: Tensor, *, inference: bool = False) -> tuple[Tensor, Tensor]:
        """Pooled attention of the queries on the target and on the context centers: 2 x ``[B, D]``.
        In inference with ``persist_memories=False`` every center is zero (the authors' banks never persist)."""
        zero = inference and not self.persist_memories
        target_centers = torch.zeros_like(self.target_centers) if zero else self.target_centers
        context_centers = torch.zeros_like(self.context_centers) if zero else self.context_centers
        target = attention_aggregate(query, target_centers, self.filled("target"), self.attention)
        context = attention_aggregate(query, context_centers, self.filled("context"), self.attention)
        return target, context

    @staticmethod
    def sample(mean: Tensor, sigma: Tensor, num_samples: int) -> Tensor:
        """T reparameterised samples ``mean + sigma * eps`` from one ``randn(T, B, D)``: ``[T, B, D]``."""
        mean, sigma = mean.float(), sigma.float()  # float32 noise: the same draws with or without autocast
        return mean + sigma * torch.randn((num_samples, *mean.shape), device=mean.device, dtype=torch.float32)

    def kl_divergence(self, mean_t: Tensor, sigma_t: Tensor, mean_c: Tensor, sigma_c: Tensor) -> Tensor:
        """KL(q_target || q_context) per image ``[B]``: paper Eq. 7, or the authors' sigma-as-variance form."""
        mean_t, sigma_t, mean_c, sigma_c = (v.float() for v in (mean_t, sigma_t, mean_c, sigma_c))
        if self.kl == "authors":
            return gaussian_kl(mean_t, sigma_t.sqrt(), mean_c, sigma_c.sqrt())
        return gaussian_kl(mean_t, sigma_t, mean_c, sigma_c)

    def _latent_from_centers(self, features: Tensor, num_samples: int | None) -> NPLatent:
        """Inference mode: target centers -> latent samples, context centers -> deterministic path."""
        t = self.resolve_num_samples(num_samples)
        self._check_memories_filled()
        target, context = self._aggregates(self.query(features), inference=True)
        mean, sigma = self.latent_encoder(target)
        return NPLatent(self.sample(mean, sigma, t), context)

    @torch.no_grad()
    def infer_latent(self, features: Tensor, num_samples: int | None = None) -> NPLatent:
        """Inference-mode latent from the stored centers: ``z [T, B, D]``, ``r [B, D]``.

        Used to share one latent per whole image across sliding windows (``forward(..., latent=)``).
        """
        self.check_features(features)
        return self._latent_from_centers(features, num_samples)

    def _check_latent(self, latent: NPLatent, features: Tensor, labels: Tensor | None) -> None:
        if labels is not None:
            raise ValueError("latent: decoding with a given latent is inference only; do not pass labels with it")
        b, d = features.shape[0], self.latent_dim
        if latent.z.dim() != 3 or latent.z.shape[1:] != (b, d) or tuple(latent.r.shape) != (b, d):
            raise ValueError(
                f"latent: expected z [T, {b}, {d}] and r [{b}, {d}], got {tuple(latent.z.shape)} and {tuple(latent.r.shape)}"
            )

    def forward(
        self,
        features: Tensor,
        *,
        labels: Tensor | None = None,
        context_features: Tensor | None = None,
        context_labels: Tensor | None = None,
        num_samples: int | None = None,
        latent: NPLatent | None = None,
    ) -> HeadOutput:
        """``features [B, C, h, w]`` -> ``HeadOutput(logits [T, B, K, h, w], aux_loss, stats)``."""
        self.check_features(features)
        stats: dict[str, Tensor] = {}
        if latent is not None:
            self._check_latent(latent, features, labels)
            z, r, aux = latent.z, latent.r, self.zero_aux(features)
        elif labels is None:
            if context_features is not None or context_labels is not None:
                raise ValueError("labels: context_features/context_labels need the targets' labels (training mode)")
            latent = self._latent_from_centers(features, num_samples)
            z, r, aux = latent.z, latent.r, self.zero_aux(features)
        else:
            z, r, aux, kl = self._training_latent(features, labels, context_features, context_labels, num_samples)
            stats["kl"] = kl
        logits = self.decoder(features, z.to(features.dtype), r.to(features.dtype))
        stats.update(self._stats(logits))
        values = torch.stack([v.float() for v in stats.values()]).tolist()  # one host sync for all stats
        return HeadOutput(logits, aux, dict(zip(stats, values)))

    def _training_latent(
        self,
        features: Tensor,
        labels: Tensor,
        context_features: Tensor | None,
        context_labels: Tensor | None,
        num_samples: int | None,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Training mode: enqueue (in ``train()``), then ``z [T, B, D]``, ``r [B, D]``, aux loss, KL."""
        self.check_labels(labels, features)
        check_label_values(labels, self.num_classes)
        if (context_features is None) != (context_labels is None):
            raise ValueError("context_features and context_labels: give both or neither")
        if context_features is not None:
            self.check_features(context_features)
            self.check_labels(context_labels, context_features, "context_labels")
            check_label_values(context_labels, self.num_classes, "context_labels")
        t = self.resolve_num_samples(num_samples)
        query = self.query(features)
        size = tuple(query.shape[-2:])
        if self.training and not self.persist_memories:
            self.reset_memories()
        if self.training:
            self.enqueue("target", query, downsample_labels(labels, size))
            if context_features is not None:
                if self._is_leading_slice(context_features, features):  # no second small-ConvNet pass
                    context_query = query[: context_features.shape[0]]
                else:
                    context_query = self.query(context_features)
                self.enqueue("context", context_query, downsample_labels(context_labels, tuple(context_query.shape[-2:])))
        self._check_memories_filled()
        target, context = self._aggregates(query)
        mean_t, sigma_t = self.latent_encoder(target)
        mean_c, sigma_c = self.latent_encoder(context)
        kl = self.kl_divergence(mean_t, sigma_t, mean_c, sigma_c).mean()
        return self.sample(mean_t, sigma_t, t), context, self.lambda_kl * kl, kl.detach()

    @staticmethod
    def _is_leading_slice(part: Tensor, whole: Tensor) -> bool:
        """True when ``part`` is the view ``whole[:m]`` (the labelled slice of the batch)."""
        return (
            part.data_ptr() == whole.data_ptr()
            and part.stride() == whole.stride()
            and part.shape[1:] == whole.shape[1:]
            and part.shape[0] <= whole.shape[0]
        )

    @torch.no_grad()
    def _stats(self, logits: Tensor) -> dict[str, Tensor]:
        """Diagnostics: filled classes, and the spread of the logits across samples (std over T,
        mean over B, K, pixels) in the interior (every 4th pixel) vs on the 1-pixel border, where
        the decoder's InstanceNorm lets the spatially constant z and r act."""
        stats = {
            "target_classes": (self.target_count > 0).sum(),
            "context_classes": (self.context_count > 0).sum(),
        }
        t, h, w = logits.shape[0], logits.shape[-2], logits.shape[-1]
        if t > 1 and h > 2 and w > 2:
            border = torch.cat([logits[..., 0, :], logits[..., -1, :], logits[..., 1:-1, 0], logits[..., 1:-1, -1]], dim=-1)
            interior = logits[..., 1:-1:4, 1:-1:4]  # every 4th interior pixel: cheap and representative
            stats["spread_interior"] = interior.float().std(dim=0).mean()
            stats["spread_border"] = border.float().std(dim=0).mean()
        return stats
