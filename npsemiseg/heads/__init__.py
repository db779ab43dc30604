"""Classifier heads: baseline, MC dropout and NP-SemiSeg, behind one contract (``base.py``).

Each head registers itself in :data:`HEADS` where it is defined; importing this package imports the
built-in head modules, so their registration has run before anyone looks a head up by name.
"""

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
from .factory import HEADS, build_head, head_class, head_names
from .np_head import PAPER_LAMBDA_KL, PAPER_MEMORY_SIZE, NPHead, NPLatent
from .np_kernels import attention_aggregate
from .np_layers import LatentEncoder, NPDecoder, SmallConvNet

__all__ = [
    "IGNORE_INDEX", "ClassifierHead", "HeadOutput", "predictive", "gaussian_kl", "check_label_values",
    "deferred_label_checks", "LabelCheck", "micro_batched_heads",
    "downsample_labels", "BaselineHead", "MCDropoutHead", "ClassifierBlock", "MCDropout2d", "NPHead", "NPLatent",
    "NPDecoder", "LatentEncoder", "SmallConvNet", "attention_aggregate", "HEADS", "build_head", "head_class",
    "head_names", "PAPER_LAMBDA_KL", "PAPER_MEMORY_SIZE",
]
