"""What the head tests share: small sizes, a small NP head, a batch, a training step."""

from __future__ import annotations

import torch

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
