"""SSL frameworks by name: every framework class registers itself in :data:`FRAMEWORKS` where it is defined.

Importing this package imports the built-in framework modules (so their registration has run);
``get_framework("u2pl")`` is the class, ``framework_names()`` every name in the paper's order. A
framework is built by the training loop (``npsemiseg.training.build_framework``) with its options,
a model factory, the class count and the loss settings.
"""

from __future__ import annotations

from npsemiseg.frameworks.base import (
    FRAMEWORKS,
    Batch,
    Framework,
    FrameworkOptions,
    StepContext,
    StepResult,
)
from npsemiseg.frameworks.losses import LossSettings

# the built-in frameworks, in the paper's order: importing them registers them
from npsemiseg.frameworks import supervised, mt, mt_cps, psmt, u2pl, augseg, fixmatch, unimatch  # noqa: E402,F401  isort: skip
from npsemiseg.frameworks import unimatch_v2  # noqa: E402,F401  isort: skip  (unimatch_v2, fixmatch_v2)

__all__ = [
    "FRAMEWORKS",
    "Batch",
    "Framework",
    "FrameworkOptions",
    "LossSettings",
    "StepContext",
    "StepResult",
    "framework_names",
    "get_framework",
]


def framework_names() -> tuple[str, ...]:
    """Every registered framework name, in the paper's order (then any registered later)."""
    return FRAMEWORKS.names()


def get_framework(name: str) -> type[Framework]:
    """The Framework subclass registered as ``name``."""
    return FRAMEWORKS.get(name)
