"""SSL frameworks by name: a lazy registry, so importing one framework never imports the others.

``get_framework("u2pl")`` imports ``npsemiseg.frameworks.u2pl`` and returns the
:class:`~npsemiseg.frameworks.base.Framework` subclass in it whose ``name`` is ``"u2pl"``.
``build_framework(config)`` builds it with the run configuration's options and a model
factory that builds one segmentor (backbone + decoder + head) per call.
"""

from __future__ import annotations

import importlib
import inspect
from typing import TYPE_CHECKING, Any, Callable

from npsemiseg.frameworks.base import Batch, Framework, FrameworkOptions, StepContext, StepResult

if TYPE_CHECKING:
    from torch import nn

    from npsemiseg.config import RunConfig

#: framework name -> module that defines it
FRAMEWORK_MODULES: dict[str, str] = {
    "supervised": "npsemiseg.frameworks.supervised",
    "mt": "npsemiseg.frameworks.mt",
    "psmt": "npsemiseg.frameworks.psmt",
    "u2pl": "npsemiseg.frameworks.u2pl",
    "augseg": "npsemiseg.frameworks.augseg",
}

__all__ = [
    "FRAMEWORK_MODULES",
    "Batch",
    "Framework",
    "FrameworkOptions",
    "StepContext",
    "StepResult",
    "build_framework",
    "framework_names",
    "get_framework",
]


def framework_names() -> tuple[str, ...]:
    """Every registered framework name, in the paper's order."""
    return tuple(FRAMEWORK_MODULES)


def get_framework(name: str) -> type[Framework]:
    """The Framework subclass registered as ``name`` (imported on first use)."""
    if name not in FRAMEWORK_MODULES:
        raise ValueError(f"framework: expected one of {list(FRAMEWORK_MODULES)}, got {name!r}")
    module = importlib.import_module(FRAMEWORK_MODULES[name])
    found = [
        obj
        for obj in vars(module).values()
        if inspect.isclass(obj) and issubclass(obj, Framework) and obj is not Framework and obj.name == name
    ]
    if len(found) != 1:
        raise ValueError(
            f"framework {name!r}: module {module.__name__} must define exactly one Framework subclass "
            f"with name = {name!r}, found {len(found)}"
        )
    return found[0]


def build_framework(config: RunConfig, build_model: Callable[[], nn.Module] | None = None) -> Framework:
    """The framework of ``config`` with its validated options.

    ``build_model`` builds one fresh segmentor per call; by default
    :func:`npsemiseg.training.build_model` for ``config``.
    """
    cls = get_framework(config.framework)
    options = cls.Options.model_validate(config.framework_options)
    if build_model is None:
        from npsemiseg.training import build_model as build_from_config

        def build_model() -> Any:
            return build_from_config(config)

    return cls(options, build_model, num_classes=config.num_classes, config=config)
