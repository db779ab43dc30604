"""``build_head``: a head by name from the head registry, with its options checked against the constructor."""

from __future__ import annotations

from typing import Any

from .base import HEADS, ClassifierHead


def head_names() -> tuple[str, ...]:
    """Every registered head name (baseline, mc_dropout, np, then any registered later)."""
    return HEADS.names()


def head_class(name: str) -> type[ClassifierHead]:
    """The head class registered as ``name``; its ``label`` and ``description`` name it in tables and the UI."""
    return HEADS.get(name)


def head_options(name: str) -> dict[str, Any]:
    """The options of head ``name`` with their defaults (constructor keywords after the two sizes)."""
    return HEADS.get(name).option_defaults()


def build_head(name: str, in_channels: int, num_classes: int, **options: Any) -> ClassifierHead:
    """``build_head(name, in_channels, num_classes, **options)`` for any registered head.

    Unknown names and options raise a ValueError naming them (and the accepted ones).
    """
    cls = HEADS.get(name)
    allowed = cls.option_defaults()
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ValueError(f"head options: unknown option(s) {unknown} for head {name!r}, expected some of {sorted(allowed)}")
    return cls(in_channels, num_classes, **options)
