"""Memory-saving kernels of the NP head: the attention aggregator and the decoder's conv stages.

Each kernel gives the values of its plain PyTorch composition (up to rounding) and keeps less in memory:

- :func:`attention_aggregate`: the spatial mean of the attention aggregation (paper Eq. 5) as
  ``mean_hw(w) @ C``, never a ``[B, K, D, h, w]`` tensor; the per-channel form of the authors' code
  in channel slices, recomputed slice by slice in backward.
- :func:`norm_relu_conv`: ``conv(relu(instance_norm(y)))`` that autograd stores as one
  activation-sized tensor instead of three.
- :func:`add_constant_maps`: the 3x3 zero-padded conv of spatially constant maps (z and r in the
  decoder) added to a shared ``[B, O, h, w]`` map, exact on the border, without an activation-sized
  copy in backward.

Double backward is not supported (``once_differentiable``).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from .specs import ATTENTIONS  # noqa: E402,F401  (the choices, described without torch)


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
    """Spatial mean of the attention aggregation of paper Eq. 5: ``mean_hw(sum_k w_k C[k])``.

    query ``[B, D, h, w]``, centers ``[K, D]``, filled ``[K]`` bool (False = empty class, masked out)
    -> ``[B, D]``. Only the spatial mean is used downstream, so it is computed as
    ``mean_hw(w) @ C``; no ``[B, K, D, h, w]`` tensor is built.

    kind: ``"euclidean"`` w = softmax_k(-|q - c_k|) (the paper), ``"squared"`` softmax_k(-|q - c_k|^2),
    ``"per_channel"`` a separate softmax over classes for every channel of the squared residual
    (the authors' code; computed in slices of ``channel_chunk`` channels, recomputed in backward),
    ``"mean"`` uniform weights over filled classes (the paper's mean-aggregator ablation).
    Runs in float32 (the distance expansion cancels badly in half precision).
    """
    return attention_aggregates(query, [centers], [filled], kind, channel_chunk=channel_chunk)[0]


def attention_aggregates(
    query: Tensor, centers: Sequence[Tensor], filled: Sequence[Tensor], kind: str = "euclidean", *, channel_chunk: int = 4
) -> list[Tensor]:
    """:func:`attention_aggregate` of one query over the centers of several memories (M of them, each ``[K, D]``
    with its ``filled [K]``) -> M x ``[B, D]``: one distance conv and one softmax for all of them."""
    with torch.autocast(device_type=query.device.type, enabled=False):
        query, stacked, mask = query.float(), torch.stack(list(centers)).float(), torch.stack(list(filled))  # [M, K, D]
        m, k, d = stacked.shape
        if kind == "mean":
            weights = mask.float() / mask.sum(dim=1, keepdim=True).clamp_min(1)  # [M, K]
            return list((weights[:, None] @ stacked).expand(m, query.shape[0], d).unbind(0))
        if kind == "per_channel":
            return [_PerChannelAttention.apply(query, c, f, channel_chunk) for c, f in zip(stacked, mask)]
        if kind not in ("euclidean", "squared"):
            raise ValueError(f"attention: expected one of {ATTENTIONS}, got {kind!r}")
        flat = stacked.view(m * k, d)
        cross = F.conv2d(query, flat.view(m * k, d, 1, 1))  # [B, M * K, h, w] = q . c_k
        # |q|^2 - 2 q.c + |c|^2 (add with alpha=-2: the same values as subtracting 2 q.c)
        dist2 = torch.add(query.pow(2).sum(dim=1, keepdim=True), cross, alpha=-2.0).add_(flat.pow(2).sum(dim=1).view(m * k, 1, 1))
        # (clamp at 1e-12 before the root implies the clamp at 0)
        score = dist2.clamp_min(0.0).neg() if kind == "squared" else dist2.clamp_min(1e-12).sqrt().neg()
        score = score.view(-1, m, k, *score.shape[-2:]).masked_fill_(mask.logical_not().view(1, m, k, 1, 1), float("-inf"))
        weights = score.softmax(dim=2).mean(dim=(3, 4))  # [B, M, K]
        return list(torch.bmm(weights.transpose(0, 1), stacked).unbind(0))


@functools.lru_cache(maxsize=64)
def valid_taps(size: int, device: torch.device, dtype: torch.dtype) -> Tensor:
    """``[size, 3]``: 1 where tap a of a 3x3, padding-1 kernel falls inside the map at position i.

    A constant, built once per (size, device, dtype) and shared (read only): eight operator calls fewer per use,
    where a step's host time is what counts. Built outside inference mode, so autograd may save it."""
    with torch.inference_mode(False), torch.no_grad():
        i = torch.arange(size, device=device)[:, None] + torch.arange(3, device=device)[None] - 1
        return ((i >= 0) & (i < size)).to(dtype)


def border_slices(size: int) -> slice:
    """The first and last index of a side of ``size`` (one index when ``size`` is 1) as a slice: a view, not a copy."""
    return slice(0, None, max(size - 1, 1))


@functools.lru_cache(maxsize=64)
def border_projection(h: int, w: int, device: torch.device, dtype: torch.dtype) -> Tensor:
    """``[9, P]``: for each tap (u, v) of a 3x3 kernel and each of the P border pixels of an ``h x w`` map (the
    border rows ``border_slices(h)`` row by row, then the border columns ``border_slices(w)`` of rows 1 .. h - 2
    column by column), -1 where the tap falls outside the map at that pixel, else 0.

    ``taps.flatten(-2) @ border_projection(...)`` is what the zero padding takes from the interior value (the sum
    of all nine taps) on the border, one matrix product for all samples. A constant, built once and shared (read
    only), outside inference mode so that autograd may save it."""
    with torch.inference_mode(False), torch.no_grad():
        rows, cols = valid_taps(h, device, dtype), valid_taps(w, device, dtype)
        on_rows = torch.einsum("ia,jb->abij", rows[border_slices(h)], cols).reshape(9, -1)
        on_cols = torch.einsum("ia,jb->abji", rows[1 : h - 1], cols[border_slices(w)]).reshape(9, -1)
        return torch.cat([on_rows, on_cols], dim=1) - 1


@functools.lru_cache(maxsize=64)
def tap_projection(h: int, w: int, device: torch.device, dtype: torch.dtype) -> Tensor:
    """``[h * w, 9]``: 1 where tap (u, v) of a 3x3, padding-1 kernel falls inside the map at pixel (i, j), the
    transpose of the map a constant input's taps make (the gradient of the taps in one matrix product)."""
    with torch.inference_mode(False), torch.no_grad():
        rows, cols = valid_taps(h, device, dtype), valid_taps(w, device, dtype)
        return torch.einsum("ia,jb->ijab", rows, cols).reshape(h * w, 9)


def constant_map_border(taps: Tensor, h: int, w: int) -> tuple[Tensor, Tensor, Tensor]:
    """Where the 3x3 zero-padded conv of spatially constant maps differs from its interior value: the border.

    ``taps [T, B, O, 3, 3]`` (``W[:, constant channels, u, v] @ values``) -> ``interior [T, B, O, 1, 1]`` (the sum
    of all nine taps), ``edge_rows [T, B, O, r, w]`` on the border rows (``border_slices(h)``) and ``edge_cols
    [T, B, O, c, h - 2]`` on the border columns (``border_slices(w)``) of rows 1 .. h - 2, both minus the interior
    value: minus the taps that fall outside the map there, from one product with :func:`border_projection`.
    """
    r, c = len(range(h)[border_slices(h)]), len(range(w)[border_slices(w)])
    interior = taps.sum(dim=(-2, -1), keepdim=True)
    edges = taps.flatten(-2) @ border_projection(h, w, taps.device, taps.dtype)  # [T, B, O, P]
    edge_rows, edge_cols = edges.split([r * w, c * max(h - 2, 0)], dim=-1)
    return interior, edge_rows.unflatten(-1, (r, w)), edge_cols.unflatten(-1, (c, max(h - 2, 0)))


def _instance_norm_(y: Tensor, eps: float = 1e-5, *, scale: bool = True) -> tuple[Tensor, Tensor]:
    """In-place InstanceNorm without affine parameters of ``y [N, C, h, w]``; returns ``(mean, rstd)``, ``[N, C, 1, 1]``.

    Two-pass (mean, then the norm of the centred map): on CPU several times faster than
    ``var_mean`` over the spatial dims, and no temporary of the size of ``y``. ``scale=False``
    only centres ``y`` (the caller folds ``rstd`` into what follows). ``y.sub_(mean).mul_(rstd)`` on the same
    ``y`` gives the same values again, bit for bit (what :class:`_FirstStage` recomputes in backward).
    """
    n, c, h, w = y.shape
    flat = y.view(n * c, h * w)
    mean = (flat.sum(dim=1) / (h * w)).view(n, c, 1, 1)
    y.sub_(mean)
    var = torch.linalg.vector_norm(flat, dim=1).square().view(n, c, 1, 1) / (h * w)
    rstd = torch.rsqrt(var.to(var.dtype if var.dtype == torch.float64 else torch.float32) + eps).to(y.dtype)
    if scale:
        y.mul_(rstd)
    return mean, rstd


def conv_dtype(x: Tensor) -> torch.dtype:
    """The dtype a convolution of ``x`` runs in: autocast's where it is on for ``x``'s device, else ``x``'s."""
    device = x.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype


def _conv_backward(grad_out: Tensor, input: Tensor, weight: Tensor, mask: tuple[bool, bool, bool]):
    k = weight.shape[-1]
    return torch.ops.aten.convolution_backward(
        grad_out, input, weight, [weight.shape[0]], [1, 1], [k // 2, k // 2], [1, 1], False, [0, 0], 1, list(mask)
    )


def _norm_relu_conv_forward(y: Tensor, weight: Tensor, bias: Tensor, chunks: int,
                            keep_xhat: bool = True) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``conv(relu(instance_norm(y)))`` with ``y`` normalised in place (it becomes ``xhat``; with ``keep_xhat=False``
    its ReLU, in place, no copy) and the convs in ``chunks`` slices of N; returns the output, the InstanceNorm's
    ``mean`` and ``rstd``, and the weight in the conv's dtype (autocast's; backward repeats it)."""
    dtype = conv_dtype(y)
    weight_, bias_ = weight.to(dtype), bias.to(dtype)
    mean, rstd = _instance_norm_(y)
    padding = weight.shape[-1] // 2
    with torch.autocast(device_type=y.device.type, enabled=False):  # the dtype is explicit: backward repeats it
        relu = F.relu if keep_xhat else torch.relu_
        parts = [F.conv2d(relu(part).to(dtype), weight_, bias_, padding=padding) for part in y.chunk(chunks)]
    return (parts[0] if len(parts) == 1 else torch.cat(parts)), mean, rstd, weight_


def _norm_relu_conv_backward(grad_out: Tensor, xhat: Tensor, rstd: Tensor, weight: Tensor,
                             chunks: int) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients of :func:`_norm_relu_conv_forward` for ``y``, the weight and the bias (in the conv's dtype), from the
    normalised ``xhat`` (overwritten: its ReLU is the conv input recomputed for the weight's gradient)."""
    grad_out = grad_out.contiguous()
    grad_y = torch.empty_like(xhat) if chunks > 1 else None  # (one chunk: its own result, no copy)
    grad_weight = grad_bias = None
    parts = (xhat, rstd, grad_out, grad_y)
    for x, r, g_out, g_y in zip(*(part.chunk(chunks) for part in parts)) if chunks > 1 else [parts]:
        g_out = g_out.to(weight.dtype)
        g = _conv_backward(g_out, x.to(weight.dtype), weight, (True, False, False))[0]  # d loss / d relu(xhat)
        g = torch.ops.aten.threshold_backward(g.to(x.dtype), x, 0)  # through the ReLU
        n, c, h, w = x.shape
        mean_g = g.view(n * c, h * w).sum(dim=1).view(n, c, 1, 1) / (h * w)
        mean_gx = torch.bmm(g.view(n * c, 1, h * w), x.reshape(n * c, h * w, 1)).view(n, c, 1, 1) / (h * w)
        g = g.sub_(mean_g).addcmul_(x, mean_gx, value=-1.0)  # InstanceNorm backward
        if g_y is None:
            grad_y = g.mul_(r)
        else:
            torch.mul(g, r, out=g_y)
        _, g_w, g_b = _conv_backward(g_out, x.relu_().to(weight.dtype), weight, (False, True, True))
        grad_weight = g_w if grad_weight is None else grad_weight.add_(g_w)
        grad_bias = g_b if grad_bias is None else grad_bias.add_(g_b)
    return grad_y, grad_weight, grad_bias


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
        out, _, rstd, weight_ = _norm_relu_conv_forward(y, weight, bias, chunks)
        ctx.save_for_backward(y, rstd, weight_)
        ctx.chunks, ctx.param_dtype = chunks, weight.dtype
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out: Tensor):
        xhat, rstd, weight = ctx.saved_tensors
        grad_y, grad_weight, grad_bias = _norm_relu_conv_backward(grad_out, xhat, rstd, weight, ctx.chunks)
        return grad_y, grad_weight.to(ctx.param_dtype), grad_bias.to(ctx.param_dtype), None


def _constant_maps(conv_x: Tensor, border: tuple[Tensor, Tensor, Tensor]) -> Tensor:
    """``conv_x [B, O, h, w]`` plus the 3x3 zero-padded conv of constant maps (and the conv's bias) given by their
    :func:`_biased_border` -> ``[T, B, O, h, w]``: the interior value in one pass, the border rows and columns
    corrected in place."""
    h, w = conv_x.shape[-2:]
    interior, edge_rows, edge_cols = border
    out = conv_x + interior
    out[..., border_slices(h), :].add_(edge_rows)  # whole border rows
    if h > 2:  # border columns of the remaining rows
        out[..., 1 : h - 1, border_slices(w)].add_(edge_cols.transpose(-2, -1))
    return out


def _constant_maps_backward(grad: Tensor, bias_dtype: torch.dtype | None) -> tuple[Tensor, Tensor, Tensor | None]:
    """Gradients of :func:`_constant_maps` from ``grad [T, B, O, h, w]``: ``conv_x`` (the sum over T),
    ``taps`` (one product of the gradient with :func:`tap_projection`) and the bias (None without one)."""
    h, w = grad.shape[-2:]
    grad_taps = (grad.flatten(-2) @ tap_projection(h, w, grad.device, grad.dtype)).unflatten(-1, (3, 3))  # [T, B, O, 3, 3]
    grad_bias = None
    if bias_dtype is not None:  # the centre tap is inside everywhere: its gradient sums all pixels
        grad_bias = grad_taps[..., 1, 1].sum(dim=(0, 1)).to(bias_dtype)
    return grad.sum(dim=0), grad_taps, grad_bias


class _AddConstantMaps(torch.autograd.Function):
    """:func:`_constant_maps` (``[T, B, O, h, w]``); autograd never copies activation-sized tensors for its in-place
    border writes, and backward reads the gradient once."""

    @staticmethod
    def forward(ctx, conv_x: Tensor, taps: Tensor, bias: Tensor | None) -> Tensor:
        ctx.bias_dtype = None if bias is None else bias.dtype
        return _constant_maps(conv_x, _biased_border(taps, bias, *conv_x.shape[-2:]))

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor):
        return _constant_maps_backward(grad, ctx.bias_dtype)


def _biased_border(taps: Tensor, bias: Tensor | None, h: int, w: int) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`constant_map_border` with the conv's ``bias [O]`` added to the interior value once for all samples
    (what :func:`_constant_maps` takes as ``border`` with no bias)."""
    interior, edge_rows, edge_cols = constant_map_border(taps, h, w)
    return (interior if bias is None else interior + bias.to(interior.dtype)[:, None, None]), edge_rows, edge_cols


class _FirstStage(torch.autograd.Function):
    """The split decoder's first stage and the conv after it, ``conv(relu(instance_norm(conv_x + constant maps)))``
    -> ``[T * B, O', h, w]``, keeping none of its ``[T * B, O, h, w]`` maps for backward.

    The first conv's output for T samples is ``conv_x`` (``[B, O, h, w]``, shared by the samples) plus the constant
    maps' terms, cheap to recompute: backward rebuilds it from ``conv_x``, ``taps`` and the saved InstanceNorm
    statistics (the same values, bit for bit where forward grouped the samples alike). Forward takes the samples in
    ``groups`` groups (all at once on CUDA: fewer calls), backward in ``backward_groups`` (one at a time: backward
    starts where a step's memory peaks, so only one sample's maps exist at once there). Autograd keeps ``conv_x``:
    1 / T of the maps that the first stage kept before."""

    @staticmethod
    def forward(ctx, conv_x: Tensor, taps: Tensor, bias: Tensor | None, weight: Tensor, conv_bias: Tensor,
                groups: int, backward_groups: int) -> Tensor:
        outs, means, rstds = [], [], []
        border = _biased_border(taps, bias, *conv_x.shape[-2:])  # for all samples, sliced per group
        for border_g in zip(*(part.tensor_split(groups) for part in border)):
            y = _constant_maps(conv_x, border_g).flatten(0, 1)  # [g * B, O, h, w]
            out, mean, rstd, weight_ = _norm_relu_conv_forward(y, weight, conv_bias, 1, keep_xhat=False)
            outs.append(out)
            means.append(mean)
            rstds.append(rstd)
        ctx.save_for_backward(conv_x, taps, bias, weight_, torch.cat(means), torch.cat(rstds))
        ctx.groups, ctx.param_dtype = backward_groups, weight.dtype
        ctx.bias_dtype = None if bias is None else bias.dtype
        return outs[0] if len(outs) == 1 else torch.cat(outs)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out: Tensor):
        conv_x, taps, bias, weight, means, rstds = ctx.saved_tensors
        b, start = conv_x.shape[0], 0
        grad_x = grad_bias = grad_w = grad_b = None
        grad_taps = []
        border = _biased_border(taps, bias, *conv_x.shape[-2:])  # recomputed: kept, it would add T x B x O x perimeter
        for border_g in zip(*(part.tensor_split(ctx.groups) for part in border)):
            t_g = border_g[0].shape[0]
            rows = slice(start, start + t_g * b)
            start = rows.stop
            xhat = _constant_maps(conv_x, border_g).flatten(0, 1).sub_(means[rows]).mul_(rstds[rows])
            g_y, g_w, g_b = _norm_relu_conv_backward(grad_out[rows], xhat, rstds[rows], weight, 1)
            g_x, g_taps, g_bias = _constant_maps_backward(g_y.view(t_g, b, *g_y.shape[1:]), ctx.bias_dtype)
            grad_taps.append(g_taps)
            grad_x, grad_bias, grad_w, grad_b = (
                part if total is None else total.add_(part)
                for total, part in zip((grad_x, grad_bias, grad_w, grad_b), (g_x, g_bias, g_w, g_b))
            )
        grad_taps_all = grad_taps[0] if len(grad_taps) == 1 else torch.cat(grad_taps)
        return grad_x, grad_taps_all, grad_bias, grad_w.to(ctx.param_dtype), grad_b.to(ctx.param_dtype), None, None


def records_grad(*tensors: Tensor) -> bool:
    """True when autograd records operations on any of ``tensors`` (then the kernels keep what backward needs)."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def norm_relu_conv(y: Tensor, conv: nn.Conv2d, chunks: int) -> Tensor:
    """``conv(relu(instance_norm(y)))``, overwriting ``y``: the lean autograd Function when
    gradients are recorded, otherwise in place (InstanceNorm and ReLU on ``y``, one conv)."""
    if records_grad(y, conv.weight, conv.bias):
        return _NormReLUConv.apply(y, conv.weight, conv.bias, chunks)
    if conv.weight.shape[-1] == 1:  # 1x1: relu((y - mu) * rstd) = rstd * relu(y - mu), rstd folded into the weights
        n, c, h, w = y.shape
        rstd = _instance_norm_(y, scale=False)[1].view(n, 1, c)
        weight = conv.weight.to(y.dtype).flatten(1)[None] * rstd  # [N, K, C]
        bias = conv.bias.to(y.dtype)[None, :, None].expand(n, -1, h * w)
        return torch.baddbmm(bias, weight, y.relu_().view(n, c, h * w)).view(n, -1, h, w)
    _instance_norm_(y)
    return F.conv2d(y.relu_(), conv.weight.to(y.dtype), conv.bias.to(y.dtype), padding=conv.weight.shape[-1] // 2)


def first_stage_conv(conv_x: Tensor, taps: Tensor, bias: Tensor | None, conv: nn.Conv2d, groups: int,
                     backward_groups: int) -> Tensor:
    """``conv(relu(instance_norm(conv_x + constant maps)))`` for T samples -> ``[T * B, O', h, w]``, its
    ``[T * B, O, h, w]`` maps recomputed in backward instead of kept (:class:`_FirstStage`): ``groups`` groups of
    samples at a time in forward, ``backward_groups`` in backward."""
    return _FirstStage.apply(conv_x, taps, bias, conv.weight, conv.bias, groups, backward_groups)


def add_constant_maps(conv_x: Tensor, taps: Tensor, bias: Tensor | None) -> Tensor:
    """``conv_x [B, O, h, w]`` plus the 3x3 zero-padded conv of constant maps given by their per-tap
    products ``taps [T, B, O, 3, 3]`` and the conv's ``bias [O]`` (or None) -> ``[T, B, O, h, w]``."""
    return _AddConstantMaps.apply(conv_x, taps, bias)
