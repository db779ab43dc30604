"""Classifier heads: baseline, MC dropout and NP-SemiSeg, behind one contract (``base.py``).

Each head is registered in :data:`HEADS` by its spec (``specs.py``: what a configuration reads of it, without
torch); its network class is imported when a head is built (``build_head``, ``head_class``). The network
classes below are imported on first use (PEP 562), so ``import npsemiseg.heads`` imports no torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .factory import build_head, head_class, head_names, head_options, head_spec
from .specs import HEADS, PAPER_LAMBDA_KL, PAPER_MEMORY_SIZE, HeadSpec

if TYPE_CHECKING:
    from .base import (
        IGNORE_INDEX,
        ClassifierHead,
        HeadOutput,
        LabelCheck,
        check_label_values,
        deferred_label_checks,
        downsample_labels,
        gaussian_kl,
        micro_batched_heads,
        predictive,
    )
    from .classifier import BaselineHead, ClassifierBlock, MCDropout2d, MCDropoutHead
    from .np_head import NPHead, NPLatent
    from .np_kernels import attention_aggregate
    from .np_layers import LatentEncoder, NPDecoder, SmallConvNet

_ON_FIRST_USE = {
    **dict.fromkeys(("IGNORE_INDEX", "ClassifierHead", "HeadOutput", "LabelCheck", "check_label_values",
                     "deferred_label_checks", "downsample_labels", "gaussian_kl", "micro_batched_heads", "predictive"),
                    "base"),
    **dict.fromkeys(("BaselineHead", "ClassifierBlock", "MCDropout2d", "MCDropoutHead"), "classifier"),
    **dict.fromkeys(("NPHead", "NPLatent"), "np_head"),
    "attention_aggregate": "np_kernels",
    **dict.fromkeys(("LatentEncoder", "NPDecoder", "SmallConvNet"), "np_layers"),
}


def __getattr__(name: str) -> Any:
    if name in _ON_FIRST_USE:
        return getattr(importlib.import_module(f"{__name__}.{_ON_FIRST_USE[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "IGNORE_INDEX", "ClassifierHead", "HeadOutput", "HeadSpec", "predictive", "gaussian_kl", "check_label_values",
    "deferred_label_checks", "LabelCheck", "micro_batched_heads",
    "downsample_labels", "BaselineHead", "MCDropoutHead", "ClassifierBlock", "MCDropout2d", "NPHead", "NPLatent",
    "NPDecoder", "LatentEncoder", "SmallConvNet", "attention_aggregate", "HEADS", "build_head", "head_class",
    "head_names", "head_options", "head_spec", "PAPER_LAMBDA_KL", "PAPER_MEMORY_SIZE",
]
