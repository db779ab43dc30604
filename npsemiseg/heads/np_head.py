"""NP-SemiSeg's classifier head (paper Section 3.2): per-class memories, attention, latent and deterministic paths.

The paper's description is the default; every behaviour of the authors' released code that differs
is a named option, set by the ``released`` protocol (``npsemiseg.protocol``). ``docs/np_head.md``
describes the head, and each option under the protocol switch named in the last column:

=====================  ================================  ==========================================  =====================
option                 default (paper / careful)         released code                               switch
=====================  ================================  ==========================================  =====================
``attention``          ``"euclidean"`` (Eq. 5)           ``"per_channel"``                           np_attention
``kl``                 ``"paper"`` (Eq. 6, sigma = std)  ``"authors"`` (sigma used as variance)      np_kl
``mask_empty``         True (empty classes masked)       False (zero centers take part)              np_zero_centers
``detach_query``       True                              True
``sync_memories``      True (all_gather under DDP)       False                                       np_sync_memories
``enqueue_per_class``  ``"auto"``: min(256, Q)/step      None (up to Q per step)                     np_push_every_pixel
``memory_rows``        ``"pixel"`` (a pixel's vector)    ``"scrambled"`` (one channel, many pixels)  np_scrambled_memories
``persist_memories``   True                              False (each step starts empty; zero         np_memories_persist
                                                         centers at inference)
``memory_zero_row``    False                             True (a memory starts with one zero row,    np_memory_zero_row
                                                         part of the center's mean)
``enqueue_order``      ``"random"`` (random pixels)      ``"stream"`` (masked_select order, the      np_memory_stream
                                                         last rows kept)
``memory_resolution``  ``"features"`` (labels resized)   ``"labels"`` (features upsampled)           np_memory_label_size
``feature_pool``       1 (``corrected``: ``"coarse"``)  1 (the decoder's last map as it is)         np_feature_pool
=====================  ================================  ==========================================  =====================

``feature_pool``: the head averages its input map over ``p x p`` cells before everything else (small ConvNet,
memories, decoder), so its T samples run on ``h/p x w/p`` pixels and its logits come back at that size (the segmentor
upsamples them to the labels, as it does every head's): on the DPT's 296 x 296 map at crop 518, ``p = 4`` gives the
1/7 map (74 x 74) at a fraction of the cost (``docs/vit.md``, "Where the NP head reads the DPT"). ``"coarse"``
(the ``corrected`` protocol's) is resolved by the segmentor's builder from its decoder: 4 on the DPT, 1 on
DeepLabv3+.

The networks are in :mod:`.np_layers`, the memory-saving kernels in :mod:`.np_kernels`.
``attention="mean"`` is the paper's ablation (mean aggregator), ``decoder_norm`` an ablation of the
decoder's InstanceNorm, which cancels the spatially constant z and r away from the border
(``docs/np_head.md``, "InstanceNorm and the latent").
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor, nn

from .base import IGNORE_INDEX, ClassifierHead, HeadOutput, check_label_values, downsample_labels, gaussian_kl
from .np_kernels import attention_aggregates
from .np_layers import LatentEncoder, NPDecoder, SmallConvNet
from .specs import (  # noqa: F401  (the option choices, also read from here)
    COARSE_POOL,
    ENQUEUE_ORDERS,
    KL_FORMS,
    MEMORY_RESOLUTIONS,
    MEMORY_ROWS,
    PAPER_LAMBDA_KL,
    PAPER_MEMORY_SIZE,
    NPHeadSpec,
)

MEMORIES = ("target", "context")


#: ``enqueue_per_class="auto"``: this many pixels per class and step, at most the memory length Q
AUTO_ENQUEUE_PER_CLASS = 256


def enqueue_limit(enqueue_per_class: int | str | None, memory_size: int) -> int:
    """Pixels per class and step a memory of ``memory_size`` rows takes: ``"auto"`` = min(256, Q),
    ``None`` = Q, an int = itself (checked by :meth:`NPHead.check_values`)."""
    if enqueue_per_class == "auto":
        return min(AUTO_ENQUEUE_PER_CLASS, memory_size)
    return memory_size if enqueue_per_class is None else int(enqueue_per_class)


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


class NPHead(NPHeadSpec, ClassifierHead):
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

    ``training_samples``: T latent samples per call that gives none, i.e. while the run trains (the ELBO's
    samples, a teacher's pseudo-labels); the T behind every reported metric is the caller's
    (``evaluation.num_samples``). The paper's hyper-parameter study varies this training T.

    Buffers (all in the state_dict): ``target_memory``/``context_memory`` ``[K, Q, D]``,
    ``*_pointer`` ``[K]`` (next write row), ``*_count`` ``[K]`` (filled rows),
    ``target_centers``/``context_centers`` ``[K, D]``.

    ``enqueue_per_class`` (default ``"auto"`` = min(256, Q): Q / 10 at the paper's Q): at most this
    many pixels of a class enter a memory per step and rank, so a full memory spans >= 10 steps of
    images rather than the last image; ``None`` enqueues up to Q (the authors push every pixel). The
    default follows Q (``memory_size=64`` enqueues 64); only an explicit value above Q is an error. Under
    torch.distributed every rank gathers the candidates of all ranks and enqueues the same rows. Under gradient
    accumulation each of an optimiser step's ``micro_batches`` training calls takes its share
    (:attr:`call_enqueue_limit`), so a memory takes the same rows per optimiser step.
    """

    def __init__(
        self,
        in_channels: int,
        num_classes: int,
        latent_dim: int = 32,
        memory_size: int = PAPER_MEMORY_SIZE,
        training_samples: int = 5,
        attention: str = "euclidean",
        kl: str = "paper",
        decoder_impl: str = "split",
        enqueue_per_class: int | str | None = "auto",
        lambda_kl: float = PAPER_LAMBDA_KL,
        detach_query: bool = True,
        mask_empty: bool = True,
        sync_memories: bool = True,
        decoder_norm: str = "instance",
        hidden_channels: int = 256,
        memory_rows: str = "pixel",
        persist_memories: bool = True,
        memory_zero_row: bool = False,
        enqueue_order: str = "random",
        memory_resolution: str = "features",
        feature_pool: int | str = 1,
    ) -> None:
        super().__init__(in_channels, num_classes)
        if feature_pool == COARSE_POOL:
            raise ValueError(f"feature_pool: {COARSE_POOL!r} is resolved from the decoder by build_segmentor "
                             f"(npsemiseg.models.segmentor); a head built on its own takes a positive int")
        self.check_values(
            latent_dim=latent_dim, memory_size=memory_size, training_samples=training_samples, attention=attention,
            kl=kl, decoder_impl=decoder_impl, enqueue_per_class=enqueue_per_class, lambda_kl=lambda_kl,
            decoder_norm=decoder_norm, hidden_channels=hidden_channels, memory_rows=memory_rows,
            enqueue_order=enqueue_order, memory_resolution=memory_resolution, feature_pool=feature_pool,
        )
        self.feature_pool = feature_pool
        self.memory_rows, self.persist_memories = memory_rows, bool(persist_memories)
        self.memory_zero_row, self.enqueue_order = bool(memory_zero_row), enqueue_order
        self.memory_resolution = memory_resolution
        self.latent_dim, self.memory_size, self.training_samples = latent_dim, memory_size, training_samples
        self.attention, self.kl = attention, kl
        self.enqueue_per_class = enqueue_limit(enqueue_per_class, memory_size)
        self._every_pixel = enqueue_per_class is None
        self.lambda_kl = float(lambda_kl)
        self.detach_query = bool(detach_query)
        self.mask_empty = bool(mask_empty)
        self.sync_memories = bool(sync_memories)

        self.query_net = SmallConvNet(in_channels, latent_dim)
        self.latent_encoder = LatentEncoder(latent_dim, latent_dim)
        self.decoder = NPDecoder(
            in_channels, latent_dim, num_classes, hidden_channels=hidden_channels, impl=decoder_impl, norm=decoder_norm
        )
        self._register_memories(num_classes, memory_size, latent_dim)
        self.reset_memories()
        self.reset_parameters()

    def _register_memories(self, num_classes: int, memory_size: int, latent_dim: int) -> None:
        """Per memory (``MEMORIES``): its rows ``[K, Q, D]``, write pointers and fill counts ``[K]``, centers ``[K, D]``."""
        for name in MEMORIES:
            self.register_buffer(f"{name}_memory", torch.zeros(num_classes, memory_size, latent_dim))
            self.register_buffer(f"{name}_pointer", torch.zeros(num_classes, dtype=torch.long))
            self.register_buffer(f"{name}_count", torch.zeros(num_classes, dtype=torch.long))
            self.register_buffer(f"{name}_centers", torch.zeros(num_classes, latent_dim))

    def reset_parameters(self) -> None:
        """Xavier-normal weights and zero biases everywhere (as the authors' head)."""
        for module in self.modules():
            if isinstance(module, (nn.Conv2d, nn.Linear)):
                nn.init.xavier_normal_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)

    @property
    def default_num_samples(self) -> int:  # type: ignore[override]
        return self.training_samples

    @property
    def decoder_impl(self) -> str:
        return self.decoder.impl

    def extra_repr(self) -> str:
        return (
            f"num_classes={self.num_classes}, latent_dim={self.latent_dim}, memory_size={self.memory_size}, "
            f"training_samples={self.training_samples}, attention={self.attention!r}, kl={self.kl!r}, "
            f"enqueue_per_class={self.enqueue_per_class}, lambda_kl={self.lambda_kl}, feature_pool={self.feature_pool}"
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
        """Empty both memories and zero their centers (``persist_memories=False``: every training step).
        With ``memory_zero_row`` each class's memory starts with one zero row that counts in its mean, the
        released code's ``zeros(1, 32)`` start (``docs/np_head.md``, np_memory_zero_row)."""
        for name in MEMORIES:
            for kind in ("memory", "pointer", "count", "centers"):
                getattr(self, f"{name}_{kind}").zero_()
            if self.memory_zero_row:
                getattr(self, f"{name}_pointer").fill_(1 % self.memory_size)
                getattr(self, f"{name}_count").fill_(1)
        self._memories_hold_rows = self.memory_zero_row  # (the zero rows count)

    @torch.no_grad()
    def swap_memories(self) -> None:
        """Exchange the target and the context memory (rows, pointers, counts, centers): what NP-SemiSeg's AugSeg
        loop does between two steps, whose model returns the two memory lists in the other order than it takes
        them (``AugSeg/train_semi.py`` 408, ``augseg/models/model_helper.py`` 50; switch ``augseg_np_memories``)."""
        for kind in ("memory", "pointer", "count", "centers"):
            target, context = getattr(self, f"target_{kind}"), getattr(self, f"context_{kind}")
            held = target.clone()
            target.copy_(context)
            context.copy_(held)

    def _load_from_state_dict(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        self._memories_hold_rows = False  # the loaded counts are read again
        super()._load_from_state_dict(*args, **kwargs)

    def empty_memories(self) -> list[str]:
        """The memories (``MEMORIES``) that hold no row. Reads the counts from the device until both memories
        hold rows, then answers ``[]`` without a read: rows leave a memory only through :meth:`reset_memories`
        or a loaded state_dict, after which the counts are read again. (A read waits for the device.)"""
        if self._memories_hold_rows:
            return []
        counts = torch.stack([self.target_count.sum(), self.context_count.sum()]).tolist()
        empty = [name for name, rows in zip(MEMORIES, counts) if rows == 0]
        self._memories_hold_rows = not empty
        return empty

    @property
    def call_enqueue_limit(self) -> int:
        """Pixels per class one training call writes into a memory: ``enqueue_per_class`` shared among the
        ``micro_batches`` calls of an optimiser step (rounded up), so the memories take the same rows per optimiser
        step under gradient accumulation; every pixel (``enqueue_per_class=None``) in every call."""
        if self._every_pixel or self.micro_batches == 1:
            return self.enqueue_per_class
        return -(-self.enqueue_per_class // self.micro_batches)

    def _scramble(self, picked: Tensor, valid: Tensor) -> Tensor:
        """The released code's rows (``memory_rows="scrambled"``; ``docs/np_head.md``, np_scrambled_memories):
        ``masked_select(feat, mask).view(-1, D)`` reads a class's values channel by channel, so row i holds D
        consecutive values of one channel from different pixels.
        picked ``[K, P, D]``, valid ``[K, P]`` (the first n_k valid) -> ``[K, P, D]``."""
        d = picked.shape[-1]
        n = valid.sum(dim=1).clamp(min=1)[:, None, None]  # [K, 1, 1]
        flat = (torch.arange(picked.shape[1], device=picked.device)[:, None] * d
                + torch.arange(d, device=picked.device)[None])[None]  # [1, P, D] index in the channel-major order
        pixel, channel = flat % n, (flat // n).clamp(max=d - 1)  # [K, P, D] each
        classes = torch.arange(picked.shape[0], device=picked.device)[:, None, None]
        return picked[classes, pixel, channel]

    def _stream_candidates(self, rows: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
        """The last P rows per class of the released code's stream (``enqueue_order="stream"``), without a host sync.

        The stream of class k is ``masked_select`` order: image by image, and within an image the class's pixels
        in raster order; with ``memory_rows="scrambled"`` image b's n_bk pixels give n_bk rows read channel by
        channel (row i holds the values D i .. D i + D - 1 of that channel-major run).
        rows ``[B, D, h, w]``, labels ``[B, h, w]`` -> rows ``[K, P, D]``, valid ``[K, P]`` (the first ones).
        """
        k, p = self.num_classes, self.call_enqueue_limit
        b, d, h, w = rows.shape
        hw, device = h * w, rows.device
        cls = labels.reshape(b, hw)
        cls = torch.where(cls == IGNORE_INDEX, torch.full_like(cls, k), cls)
        key = (torch.arange(b, device=device)[:, None] * (k + 1) + cls).reshape(-1)  # runs of (image, class)
        order = torch.argsort(key, stable=True)  # raster order within a run
        runs = torch.zeros(b * (k + 1), dtype=torch.long, device=device).scatter_add_(0, key, torch.ones_like(key))
        starts = (runs.cumsum(0) - runs).view(b, k + 1)[:, :k].T  # [K, B] first position of each run in order
        counts = runs.view(b, k + 1)[:, :k].T  # [K, B] pixels n_bk (= rows of image b in class k's stream)
        ends = counts.cumsum(1)  # [K, B] the stream's row index after image b
        total = ends[:, -1]
        kept = total.clamp(max=p)
        j = torch.arange(p, device=device)
        valid = j[None] < kept[:, None]
        g = (total - kept)[:, None] + j[None]  # [K, P] row index in the stream
        image = (ends[:, None, :] <= g[..., None]).sum(-1).clamp(max=b - 1)  # [K, P]
        n = counts.gather(1, image)
        i = g - (ends - counts).gather(1, image)  # row index within image b's run
        c = torch.arange(d, device=device)
        if self.memory_rows == "scrambled":
            flat = i[..., None] * d + c  # [K, P, D] value index in the channel-major run
            rank, channel = flat % n.clamp(min=1)[..., None], (flat // n.clamp(min=1)[..., None]).clamp(max=d - 1)
        else:
            rank, channel = i[..., None].expand(-1, -1, d), c.expand(k, p, d)
        pixel = order[(starts.gather(1, image)[..., None] + rank).clamp(min=0, max=b * hw - 1)]  # [K, P, D]
        picked = rows.reshape(b, d, hw)[pixel // hw, channel, pixel % hw]
        return picked.float(), valid

    def _candidates(self, rows: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
        """A random subset of at most P pixels per class, without a host sync.

        rows ``[B, D, h, w]``, labels ``[B, h, w]`` -> rows ``[K, P, D]`` (one pixel's feature
        vector each) and valid ``[K, P]`` (True for the first ``min(n_k, P)`` entries of class k).
        Pixels are sorted by (class, random rank); class k's candidates are the first P of its run.
        """
        if self.enqueue_order == "stream":
            return self._stream_candidates(rows, labels)
        k, p = self.num_classes, self.call_enqueue_limit
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
        if rows.shape[1] > self.call_enqueue_limit:  # several ranks: valid entries first, at most Q
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
        for name in self.empty_memories():
            raise ValueError(
                f"NPHead: the {name} memory is empty; run training-mode steps (labels=..., "
                f"context_features=..., context_labels=...) or load a state_dict before inference"
            )

    # ---- paths ----------------------------------------------------------------------------

    def pool(self, features: Tensor) -> Tensor:
        """The map the head works on: ``features`` averaged over ``feature_pool`` x ``feature_pool`` cells
        (``[B, C, ceil(h/p), ceil(w/p)]``; a partial cell at the edge is the mean of its pixels), or as they are."""
        if self.feature_pool == 1:
            return features
        return nn.functional.avg_pool2d(features, self.feature_pool, ceil_mode=True)

    def _pool_inputs(self, features: Tensor, context_features: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """:meth:`pool` of the targets and the context; a context that is the targets' leading slice stays one (its
        pooled rows are the pooled targets' first rows, and the head reuses their queries)."""
        if self.feature_pool == 1:
            return features, context_features
        pooled = self.pool(features)
        if context_features is None:
            return pooled, None
        if self._is_leading_slice(context_features, features):
            return pooled, pooled[: context_features.shape[0]]
        return pooled, self.pool(context_features)

    def query(self, features: Tensor) -> Tensor:
        """Small ConvNet on the features (detached unless ``detach_query=False``): ``[B, D, h, w]``."""
        return self.query_net(features.detach() if self.detach_query else features)

    def _aggregates(self, query: Tensor, *, inference: bool = False) -> tuple[Tensor, Tensor]:
        """Pooled attention of the queries on the target and on the context centers: 2 x ``[B, D]``.
        In inference with ``persist_memories=False`` every center is zero, as in the released code, whose memories
        never persist (``docs/np_head.md``, np_memories_persist)."""
        zero = inference and not self.persist_memories
        target_centers = torch.zeros_like(self.target_centers) if zero else self.target_centers
        context_centers = torch.zeros_like(self.context_centers) if zero else self.context_centers
        target, context = attention_aggregates(
            query, [target_centers, context_centers], [self.filled("target"), self.filled("context")], self.attention
        )
        return target, context

    @staticmethod
    def sample(mean: Tensor, sigma: Tensor, num_samples: int) -> Tensor:
        """T reparameterised samples ``mean + sigma * eps`` from one ``randn(T, B, D)``: ``[T, B, D]``."""
        mean, sigma = mean.float(), sigma.float()  # float32 noise: the same draws with or without autocast
        return mean + sigma * torch.randn((num_samples, *mean.shape), device=mean.device, dtype=torch.float32)

    def kl_divergence(self, mean_t: Tensor, sigma_t: Tensor, mean_c: Tensor, sigma_c: Tensor) -> Tensor:
        """KL(q_target || q_context) per image ``[B]``: paper Eq. 6, or the authors' sigma-as-variance form."""
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
        return self._latent_from_centers(self.pool(features), num_samples)

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
        """``features [B, C, h, w]`` -> ``HeadOutput(logits [T, B, K, h', w'], aux_loss, stats)``; ``h' x w'`` is
        ``h x w`` pooled by ``feature_pool`` (:meth:`pool`)."""
        self.check_features(features)
        if context_features is not None:
            self.check_features(context_features)
        features, context_features = self._pool_inputs(features, context_features)
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
        stats.update(self._stats(logits))  # 0-dim tensors: the loop reads them with the step's losses
        return HeadOutput(logits, aux, stats)

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
            if not self._is_leading_slice(context_labels, labels):  # (a slice of checked labels needs no read)
                check_label_values(context_labels, self.num_classes, "context_labels")
        t = self.resolve_num_samples(num_samples)
        query = self.query(features)
        if self.training and not self.persist_memories:
            self.reset_memories()
        if self.training:
            self.enqueue("target", *self._memory_rows(features, labels, query))
            if context_features is not None:
                leading = self._is_leading_slice(context_features, features)  # no second small-ConvNet pass
                self.enqueue("context", *self._memory_rows(context_features, context_labels,
                                                           query[: context_features.shape[0]] if leading else None))
        self._check_memories_filled()
        target, context = self._aggregates(query)
        mean_t, sigma_t = self.latent_encoder(target)
        mean_c, sigma_c = self.latent_encoder(context)
        kl = self.kl_divergence(mean_t, sigma_t, mean_c, sigma_c).mean()
        return self.sample(mean_t, sigma_t, t), context, self.lambda_kl * kl, kl.detach()

    @torch.no_grad()
    def _memory_rows(self, features: Tensor, labels: Tensor, query: Tensor | None) -> tuple[Tensor, Tensor]:
        """What a memory takes: ``(rows [B, D, s, s'], labels [B, s, s'])``. ``memory_resolution="features"``:
        the query (``query``, or computed) and the labels resized to it; ``"labels"``: the small ConvNet on the
        features upsampled to the labels' size (bilinear, align_corners=True), the released code's order
        (``docs/np_head.md``, np_memory_label_size). One image at a time: its InstanceNorm is per image, and only
        one upsampled ``[1, C, H, W]`` map exists at once."""
        if self.memory_resolution == "labels":
            size = tuple(labels.shape[-2:])
            rows = [self.query(nn.functional.interpolate(image[None].detach(), size=size, mode="bilinear",
                                                         align_corners=True)) for image in features]
            return torch.cat(rows), labels
        query = self.query(features) if query is None else query
        return query, downsample_labels(labels, tuple(query.shape[-2:]))

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
        seeded = int(self.memory_zero_row)  # a memory holding only its zero row has no class pixel yet
        stats = {
            "target_classes": (self.target_count > seeded).sum(),
            "context_classes": (self.context_count > seeded).sum(),
        }
        t, h, w = logits.shape[0], logits.shape[-2], logits.shape[-1]
        if t > 1 and h > 2 and w > 2:
            border = torch.cat([logits[..., 0, :], logits[..., -1, :], logits[..., 1:-1, 0], logits[..., 1:-1, -1]], dim=-1)
            interior = logits[..., 1:-1:4, 1:-1:4]  # every 4th interior pixel: cheap and representative
            stats["spread_interior"] = interior.float().std(dim=0).mean()
            stats["spread_border"] = border.float().std(dim=0).mean()
        return stats
