"""The evaluation under shift (``evaluation.corruptions``): the reported weights on the corrupted copies of the
evaluated images (``npsemiseg.evaluation.corruptions``), each evaluated as the clean images are."""

from __future__ import annotations

import time
from pathlib import Path

import torch
from torch.utils.data import Dataset

from npsemiseg.config import RunConfig
from npsemiseg.evaluation.corruptions import SHIFT_PREFIX, corrupted_copy, source_key, summarize_shift
from npsemiseg.training.artifacts import evaluate_model


def shift_images(val: Dataset, config: RunConfig) -> int:
    """How many of ``val``'s first images the evaluation under shift corrupts."""
    ev = config.evaluation
    caps = [len(val)] + [n for n in (ev.max_images, ev.corruption_images) if n is not None]  # type: ignore[arg-type]
    return min(caps)


def evaluate_under_shift(model: torch.nn.Module, val: Dataset, config: RunConfig, *, step: int,
                         device: torch.device, cache_dir: Path | None = None) -> dict[str, float]:
    """``model`` on every corruption x severity copy of ``val`` (built or read from the cache, ``cache_dir`` or
    ``$NPSEMISEG_CACHE/corruptions``), named and summarised by ``summarize_shift``, plus ``shift/seconds``
    (copies built and evaluated); ``{}`` when ``evaluation.corruptions`` is empty. The copies' randomness comes
    from the dataset's seed (``data.options.seed``, 0 where it has none)."""
    ev = config.evaluation
    if not ev.corruptions:
        return {}
    started = time.perf_counter()
    num_images = shift_images(val, config)
    key = source_key(config.dataset, ev.split, dict(config.data.options), num_images)
    data_seed = int(config.data.options.get("seed", 0))
    per_copy = {}
    for corruption in ev.corruptions:
        for severity in ev.corruption_severities:
            copy = corrupted_copy(val, corruption, severity, data_seed=data_seed, key=key, cache_dir=cache_dir,
                                  max_images=num_images)
            per_copy[corruption, severity] = evaluate_model(model, copy, config, step=step, device=device)
    metrics = summarize_shift(per_copy)
    metrics[f"{SHIFT_PREFIX}/seconds"] = time.perf_counter() - started
    return metrics
