"""SSL frameworks by name: every built-in framework is registered in :data:`FRAMEWORKS` by its spec.

Importing this package registers the built-in frameworks' specs (``npsemiseg/frameworks/specs/``: options, decoder,
augmentation, paper settings) without torch; ``framework_spec("u2pl")`` is what a configuration reads,
``get_framework("u2pl")`` the class with the training step (its module imported then), ``framework_names()``
every name in the paper's order. A framework is built by the training loop (``npsemiseg.training.build_framework``)
with its options, a model factory, the class count and the loss settings. ``Framework``, ``Batch``,
``StepContext``, ``StepResult`` and ``LossSettings`` are imported on first use (PEP 562).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from npsemiseg.frameworks.specs import FRAMEWORKS, FrameworkOptions, FrameworkSpec

if TYPE_CHECKING:
    from npsemiseg.frameworks.base import Batch, Framework, StepContext, StepResult
    from npsemiseg.frameworks.losses import LossSettings

_ON_FIRST_USE = {**dict.fromkeys(("Batch", "Framework", "StepContext", "StepResult"), "base"),
                 "LossSettings": "losses"}

__all__ = [
    "FRAMEWORKS",
    "Batch",
    "Framework",
    "FrameworkOptions",
    "FrameworkSpec",
    "LossSettings",
    "StepContext",
    "StepResult",
    "framework_names",
    "framework_spec",
    "get_framework",
]


def __getattr__(name: str) -> Any:
    if name in _ON_FIRST_USE:
        return getattr(importlib.import_module(f"{__name__}.{_ON_FIRST_USE[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def framework_names() -> tuple[str, ...]:
    """Every registered framework name, in the paper's order (then any registered later)."""
    return FRAMEWORKS.names()


def framework_spec(name: str) -> type[FrameworkSpec]:
    """What a configuration reads of framework ``name`` (options, decoder, augmentation, paper settings), without
    importing its training step."""
    return FRAMEWORKS.get(name)


def get_framework(name: str) -> type[Framework]:
    """The Framework subclass registered as ``name`` (its module imported on first use)."""
    return FRAMEWORKS.get(name).load()
