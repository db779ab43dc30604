"""What the head tests share: small sizes, a small NP head, a batch, a training step, the largest tensor an op
returns."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from npsemiseg.heads import IGNORE_INDEX, NPHead

C, K, D = 8, 4, 4


def small_np(**options) -> NPHead:
    defaults = dict(latent_dim=D, memory_size=16, enqueue_per_class=4, hidden_channels=8, training_samples=3)
    return NPHead(C, K, **{**defaults, **options})


def batch(b: int = 2, h: int = 5, w: int = 6, scale: int = 2):
    """Features ``[b, C, h, w]`` and labels ``[b, h * scale, w * scale]`` whose first row is ignored."""
    features = torch.randn(b, C, h, w)
    labels = torch.randint(0, K, (b, h * scale, w * scale))
    labels[:, 0] = IGNORE_INDEX
    return features, labels


def train_step(head: NPHead, features, labels, m: int = 1):
    """One training-mode forward with the first ``m`` images as the context."""
    head.train()
    return head(features, labels=labels, context_features=features[:m], context_labels=labels[:m])


class LargestOutput(TorchDispatchMode):
    """Records the largest number of elements of any tensor an op returns (``largest``), forward and backward."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out
