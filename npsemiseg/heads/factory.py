"""Heads by name: their specs (torch-free, what a configuration reads) and ``build_head``, which builds one."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .specs import HEADS, HeadSpec

if TYPE_CHECKING:
    from .base import ClassifierHead


def head_names() -> tuple[str, ...]:
    """Every registered head name (baseline, mc_dropout, np, then any registered later)."""
    return HEADS.names()


def head_spec(name: str) -> type[HeadSpec]:
    """What a configuration reads of head ``name`` (label, description, options, paper settings), without
    importing its network."""
    return HEADS.get(name)


def head_class(name: str) -> type[ClassifierHead]:
    """The network class of head ``name`` (its module imported on first use)."""
    return HEADS.get(name).load()


def head_options(name: str) -> dict[str, Any]:
    """The options of head ``name`` with their defaults (constructor keywords after the two sizes)."""
    return HEADS.get(name).option_defaults()


def build_head(name: str, in_channels: int, num_classes: int, **options: Any) -> ClassifierHead:
    """``build_head(name, in_channels, num_classes, **options)`` for any registered head.

    Unknown names and options raise a ValueError naming them (and the accepted ones).
    """
    spec = HEADS.get(name)
    allowed = spec.option_defaults()
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ValueError(f"head options: unknown option(s) {unknown} for head {name!r}, expected some of {sorted(allowed)}")
    return spec.load()(in_channels, num_classes, **options)
