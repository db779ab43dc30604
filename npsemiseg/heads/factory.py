"""``build_head``: a head by name, with its options checked against the constructor."""

from __future__ import annotations

import inspect
from typing import Any

from .base import ClassifierHead
from .classifier import BaselineHead, MCDropoutHead
from .np_head import NPHead

HEADS: dict[str, type[ClassifierHead]] = {"baseline": BaselineHead, "mc_dropout": MCDropoutHead, "np": NPHead}


def head_names() -> tuple[str, ...]:
    """Every registered head name (baseline, mc_dropout, np)."""
    return tuple(HEADS)


def head_class(name: str) -> type[ClassifierHead]:
    """The head class registered as ``name``; its ``label`` and ``description`` name it in tables and the UI."""
    if name not in HEADS:
        raise ValueError(f"head: unknown name {name!r}, expected one of {list(HEADS)}")
    return HEADS[name]


def head_options(name: str) -> dict[str, Any]:
    """The options of head ``name`` with their defaults (constructor keywords after the two sizes)."""
    if name not in HEADS:
        raise ValueError(f"head: unknown head {name!r}, expected one of {sorted(HEADS)}")
    params = list(inspect.signature(HEADS[name].__init__).parameters.values())[3:]  # self, in_channels, num_classes
    return {p.name: p.default for p in params}


def build_head(name: str, in_channels: int, num_classes: int, **options: Any) -> ClassifierHead:
    """``build_head("baseline" | "mc_dropout" | "np", in_channels, num_classes, **options)``.

    Unknown names and options raise a ValueError naming them (and the accepted ones).
    """
    allowed = head_options(name)
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ValueError(f"head options: unknown option(s) {unknown} for head {name!r}, expected some of {sorted(allowed)}")
    return HEADS[name](in_channels, num_classes, **options)
