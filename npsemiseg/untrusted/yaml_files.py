"""YAML from others (configurations, specs, ``classes.yaml``, the configuration inside an exported model), read
safely and within a budget.

PyYAML's safe loader builds no object but plain data, yet an alias repeats its anchor's whole subtree: ten
levels of ten aliases are 10^10 nodes from 200 bytes, which whoever walks the result (validation, a deep copy,
printing) then walks for hours; and a list nested thousands deep ends in a RecursionError thousands of lines
long. :func:`load_yaml` follows the parser's events first (libyaml's, no object built): the nodes the document
stands for, aliases expanded, are counted up to :data:`MAX_YAML_NODES` and its nesting up to
:data:`MAX_YAML_DEPTH`; then it loads with libyaml's safe loader when available.
"""

from __future__ import annotations

import os
from typing import Any

import yaml

from npsemiseg.untrusted.errors import UnsafeFileError

#: nodes (scalars, lists, mappings) a document may stand for, aliases expanded: a grid spec or a
#: configuration is a few hundred
MAX_YAML_NODES = 100_000
#: lists and mappings nested in one another: a configuration nests 4 deep
MAX_YAML_DEPTH = 64

#: libyaml's safe loader when available (10x faster than the pure-Python one, same result)
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class YamlBudgetError(UnsafeFileError):
    """A YAML document standing for more nodes or nesting deeper than the budget allows."""


class InvalidYamlError(ValueError, yaml.YAMLError):
    """Text that is not YAML (or asks for a Python object): one line naming the document, line and column."""


def check_yaml(text: str, *, where: str) -> None:
    """Refuse ``text`` with :class:`YamlBudgetError` naming ``where`` when it stands for more than
    :data:`MAX_YAML_NODES` nodes (aliases expanded) or nests deeper than :data:`MAX_YAML_DEPTH`; syntax errors
    are ``yaml.YAMLError`` as from the loader."""
    anchors: dict[str, int] = {}
    open_nodes: list[tuple[str | None, int]] = []  # (anchor, nodes counted when it opened) per open collection
    nodes = 0
    for event in yaml.parse(text, Loader=SAFE_LOADER):
        if isinstance(event, yaml.AliasEvent):
            nodes += anchors.get(event.anchor, 1)
        elif isinstance(event, yaml.ScalarEvent):
            nodes += 1
            if event.anchor is not None:
                anchors[event.anchor] = 1
        elif isinstance(event, yaml.CollectionStartEvent):
            nodes += 1
            open_nodes.append((event.anchor, nodes))
            if len(open_nodes) > MAX_YAML_DEPTH:
                raise YamlBudgetError(f"{where}: nests lists and mappings more than {MAX_YAML_DEPTH} deep (line "
                                      f"{event.start_mark.line + 1}); refused")
        elif isinstance(event, yaml.CollectionEndEvent):
            anchor, started = open_nodes.pop()
            if anchor is not None:
                anchors[anchor] = nodes - started + 1
        if nodes > MAX_YAML_NODES:
            raise YamlBudgetError(f"{where}: stands for more than {MAX_YAML_NODES:,} values once its aliases are "
                                  f"expanded (line {event.start_mark.line + 1}); refused before building it")


def load_yaml(text: str, *, where: str, path: str | os.PathLike | None = None) -> Any:
    """The plain data of YAML ``text`` after :func:`check_yaml` (``where`` names it in errors): mappings, lists,
    strings, numbers, booleans, None, dates. Text that is not YAML, or asks for a Python object (a
    ``!!python/...`` tag), is an :class:`InvalidYamlError`: ``"<where>: not valid YAML at <path>:<line>:<column>:
    <problem>"`` (``path``: the file it was read from, for the position)."""
    try:
        check_yaml(text, where=where)
        return yaml.load(text, Loader=SAFE_LOADER)  # noqa: S506 - the safe loader (libyaml's or PyYAML's)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        if mark is None:
            at = f" in {path}" if path is not None else ""
        else:
            at = f" at {path}:{mark.line + 1}:{mark.column + 1}" if path is not None else \
                f" at line {mark.line + 1}, column {mark.column + 1}"
        problem = getattr(error, "problem", None) or " ".join(str(error).split())
        context = getattr(error, "context", None)
        raise InvalidYamlError(f"{where}: not valid YAML{at}: {problem}" + (f" ({context})" if context else "")) from None
