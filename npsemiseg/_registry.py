"""One name -> object registry, used by frameworks, heads, datasets, decoders and presets.

A class (or builder) registers itself where it is defined::

    HEADS = Registry("head")

    @HEADS.register("np")
    class NPHead(ClassifierHead): ...

and is found by name everywhere else (``HEADS.get("np")``, ``HEADS.names()``). An unknown name
raises the same ``ValueError`` everywhere: ``head: unknown name 'foo', expected one of [...]``, led by the
nearest name when one is close (``dataset: unknown name 'ade20K' (did you mean 'ade20k'?), expected one of [...]``).
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """Named objects of one kind, in registration order (the paper's order where it has one)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}
        #: where :meth:`get` looks for a name no entry holds (an object found there is returned, not registered):
        #: the datasets' folder datasets of the record being read (``npsemiseg.data.info.dataset_root``)
        self.finder: Callable[[str], T | None] | None = None

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator: register the decorated object as ``name`` (a second object under one name is an error)."""

        def add(obj: T) -> T:
            self.add(name, obj)
            return obj

        return add

    def add(self, name: str, obj: T) -> None:
        """Register ``obj`` as ``name``; registering the same object again is a no-op (module reloads)."""
        if not name or not isinstance(name, str):
            raise ValueError(f"{self.kind}: a registered name must be a non-empty string, got {name!r}")
        existing = self._entries.get(name)
        if existing is not None and existing is not obj and _qualname(existing) != _qualname(obj):
            raise ValueError(f"{self.kind}: name {name!r} is already registered to {_qualname(existing)}")
        self._entries[name] = obj

    def remove(self, name: str) -> None:
        """Forget ``name`` (tests that register a throwaway entry clean up with this)."""
        self.get(name)
        del self._entries[name]

    def get(self, name: str) -> T:
        """The object registered as ``name``, else the one :attr:`finder` finds for it (not registered);
        ``ValueError`` listing the valid names otherwise, the nearest first (:meth:`nearest`) when one is close."""
        try:
            return self._entries[name]
        except (KeyError, TypeError):
            found = self.finder(name) if self.finder is not None and isinstance(name, str) and name else None
            if found is not None:
                return found
            near = self.nearest(name)
            hint = f" (did you mean {near!r}?)" if near else ""
            raise ValueError(f"{self.kind}: unknown name {name!r}{hint}, expected one of {list(self._entries)}") from None

    def nearest(self, name: object) -> str | None:
        """The registered name closest to ``name`` ignoring case (``difflib``, ratio >= 0.75), or None."""
        if not isinstance(name, str):
            return None
        lowered = {n.lower(): n for n in self._entries}
        found = difflib.get_close_matches(name.lower(), list(lowered), n=1, cutoff=0.75)
        return lowered[found[0]] if found else None

    def check(self, name: str) -> str:
        """``name`` if it is registered, else the same ``ValueError`` as :meth:`get`."""
        self.get(name)
        return name

    def names(self) -> tuple[str, ...]:
        return tuple(self._entries)

    def items(self) -> Iterator[tuple[str, T]]:
        return iter(list(self._entries.items()))

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {list(self._entries)})"


def load_implementation(entry: type) -> type:
    """The class that does the work of registry entry ``entry``: the class its ``implementation`` names
    (``"package.module:attribute"``, the module imported on this call), or ``entry`` itself where it names none or
    is that class or a subclass of it (a plug-in deriving from a built-in network class). A registry entry that
    describes a network names the class that builds it this way, so that describing it imports no torch."""
    path = getattr(entry, "implementation", "")
    if not path:
        return entry
    module, _, attribute = path.partition(":")
    loaded = getattr(importlib.import_module(module), attribute)
    return entry if issubclass(entry, loaded) else loaded


def _qualname(obj: object) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', repr(obj))}"
