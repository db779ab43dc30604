"""The contract every plug-in keeps, as one call: ``check_plugin(cls)`` for a registered head, framework or dataset.

The project's contract tests (``tests/test_plugin_contract.py``) call it for every registered entry; a plug-in's
author calls it in their own test, so that a plug-in registered outside the library (in a test file, in a
researcher's package) is checked by the same rules::

    from npsemiseg.testing import check_plugin

    def test_my_head_keeps_the_contract():
        check_plugin(MyHead)          # MyHead is decorated with @HEADS.register("my_head")

A broken rule raises :class:`PluginContractError` (an ``AssertionError``, so pytest reports it as a failed test)
naming the class and the rule.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from npsemiseg._registry import Registry, load_implementation
from npsemiseg.config import cell_config
from npsemiseg.data import DATASETS, DatasetDef, dataset_info
from npsemiseg.data.augmentation import PAPER_AUGMENTATIONS
from npsemiseg.frameworks import FRAMEWORKS, Framework, FrameworkSpec
from npsemiseg.heads import HEADS, ClassifierHead, HeadSpec, build_head, head_class
from npsemiseg.models import DECODERS
from npsemiseg.training import train

#: the sizes the head checks build with: feature channels C, classes K, batch B, feature map h x w
C, K, B, H, W = 8, 3, 2, 5, 6


class PluginContractError(AssertionError):
    """A registered class breaks the contract of its kind (the message names the class and the rule)."""


def check_plugin(cls: type, *, train_steps: bool = False) -> str:
    """Check ``cls``, a registered head, framework or dataset class, against its kind's contract; return its
    registered name. ``train_steps=True`` also trains a framework's smoke cell (supervised x baseline on the
    ``synthetic`` stand-in for a framework; the head with the supervised framework for a head): seconds on a CPU.
    A built-in entry's spec (``HEADS.get("np")``) is checked as the class it names (``NPHead``)."""
    if isinstance(cls, type) and issubclass(cls, (HeadSpec, FrameworkSpec)):
        cls = load_implementation(cls)
    for base, registry, check in ((ClassifierHead, HEADS, _check_head), (Framework, FRAMEWORKS, _check_framework),
                                  (DatasetDef, DATASETS, _check_dataset)):
        if isinstance(cls, type) and issubclass(cls, base):
            name = _registered_name(cls, registry)
            check(cls, name)
            if train_steps and registry is not DATASETS:
                _train_smoke_cell(name, registry)
            return name
    raise PluginContractError(f"{cls!r} is not a plug-in class: expected a subclass of ClassifierHead, Framework or "
                              "DatasetDef")


def _registered_name(cls: type, registry: Registry) -> str:
    names = [name for name, obj in registry.items() if obj is cls or load_implementation(obj) is cls]
    if not names:
        raise PluginContractError(f"{cls.__qualname__} is not registered: decorate it with "
                                  f"@{registry.kind.upper()}S.register(name) in a module that is imported")
    return names[0]


def _require(condition: bool, cls: type, rule: str) -> None:
    if not condition:
        raise PluginContractError(f"{cls.__qualname__}: {rule}")


def _raises_naming(cls: type, call: Callable[[], Any], word: str, what: str) -> None:
    """``call()`` must raise a ``ValueError`` whose message contains ``word`` (``what``: the bad input)."""
    try:
        call()
    except ValueError as error:
        _require(word in str(error), cls, f"{what}: the ValueError must name {word!r}, got {error}")
        return
    raise PluginContractError(f"{cls.__qualname__}: {what}: expected a ValueError naming {word!r}, nothing raised")


def _check_head(cls: type[ClassifierHead], name: str) -> None:
    """Options checked without building; one prediction shape in train and eval; bad input named (docs/CONTRACTS.md)."""
    _require(bool(cls.description), cls, "`description` (one line for the UI and --help) is empty")
    for preset, options in (("paper_options", cls.paper_options), ("smoke_options", cls.smoke_options)):
        try:
            cls.check_options(options)
        except ValueError as error:
            raise PluginContractError(f"{cls.__qualname__}: {preset} {dict(options)} fail check_options: {error}") from None
    _raises_naming(cls, lambda: cls.check_options({"no_such_option": 1}), "unknown option", "an unknown option")
    torch.manual_seed(0)
    head = build_head(name, C, K, **cls.smoke_options)
    _require(isinstance(head, cls) and head_class(name) is cls, cls, f"build_head({name!r}) must build this class")
    features, labels = torch.randn(B, C, H, W), torch.randint(0, K, (B, H, W))
    out = head.train()(features, labels=labels, context_features=features[:1], context_labels=labels[:1])
    _require(out.logits.dim() == 5 and tuple(out.logits.shape[1:]) == (B, K, H, W), cls,
             f"train-mode logits must be [S, {B}, {K}, {H}, {W}], got {tuple(out.logits.shape)}")
    _require(out.aux_loss.dim() == 0 and bool(torch.isfinite(out.aux_loss)), cls, "aux_loss must be a finite scalar")
    out = head.eval()(features)
    _require(tuple(out.logits.shape[1:]) == (B, K, H, W), cls,
             f"eval-mode logits must be [S, {B}, {K}, {H}, {W}], got {tuple(out.logits.shape)}")
    _require((out.logits.shape[0] > 1) == (cls.stochastic and head.default_num_samples > 1), cls,
             "eval-mode logits have S > 1 exactly when the head is `stochastic` with default_num_samples > 1")
    head.train()
    _raises_naming(cls, lambda: head(torch.randn(B, C + 1, H, W)), "features", "features of the wrong width")
    _raises_naming(cls, lambda: head(features, labels=labels[:1]), "labels", "labels of another batch size")
    _raises_naming(cls, lambda: head(features, labels=labels.float()), "labels", "float labels")
    _raises_naming(cls, lambda: head(features, labels=labels, num_samples=0), "num_samples", "num_samples=0")


def _check_framework(cls: type[Framework], name: str) -> None:
    """Its name, decoder, augmentation and options are declared, valid on every registered dataset, and compose."""
    _require(cls.name == name, cls, f"`name` must be the registered name {name!r}, got {cls.name!r}")
    _require(cls.decoder in DECODERS, cls, f"`decoder` {cls.decoder!r} is not a registered decoder {list(DECODERS.names())}")
    _require(cls.augmentation in PAPER_AUGMENTATIONS, cls,
             f"`augmentation` {cls.augmentation!r} is not one of {sorted(PAPER_AUGMENTATIONS)}")
    unknown = sorted(set(cls.smoke_options) - set(cls.Options.model_fields))
    _require(not unknown, cls, f"smoke_options {unknown} are not fields of its Options")
    for dataset in DATASETS.names():
        for partition in dataset_info(dataset).partitions:
            try:
                cls.Options.model_validate(cls.paper_options(dataset, partition))
            except ValueError as error:
                raise PluginContractError(f"{cls.__qualname__}: paper_options({dataset!r}, {partition!r}) are not "
                                          f"valid Options: {error}") from None
    config = cell_config("smoke", framework=name, **{"runtime.device": "cpu"})
    _require(dict(cls.smoke_options).items() <= config.framework_options.items(), cls,
             "the smoke preset must carry its smoke_options")


def _check_dataset(cls: type[DatasetDef], name: str) -> None:
    """Its info describes it (classes, partitions and their aliases), and a smoke cell composes on it."""
    _require(cls.name == name, cls, f"`name` must be the registered name {name!r}, got {cls.name!r}")
    info = dataset_info(name)
    _require(info.name == name and info.num_classes == len(info.class_names) > 1, cls,
             f"`class_names` must name at least 2 classes, got {info.class_names}")
    _require(bool(info.partitions) and all(count > 0 for count in info.partitions.values()), cls,
             f"`partitions` must map each name to a positive labeled count, got {dict(info.partitions)}")
    for alias, partition in info.partition_aliases.items():
        _require(partition in info.partitions and info.resolve_partition(alias) == partition, cls,
                 f"partition alias {alias!r} must name one of its partitions, got {partition!r}")
    partition = next(iter(info.partitions))
    config = cell_config("smoke", dataset=name, partition=partition, **{"runtime.device": "cpu"})
    _require(config.dataset == name, cls, "a smoke cell on it must compose")


def _train_smoke_cell(name: str, registry: Registry) -> None:
    """Train a smoke cell of the framework (baseline head) or of the head (supervised framework) and check it ends
    with finite losses and an mIoU in [0, 1]."""
    cell = {"framework": name} if registry is FRAMEWORKS else {"head": name}
    config = cell_config("smoke", **cell, **{"runtime.device": "cpu"})
    result = train(config)
    miou = result.metrics.get("miou", math.nan)
    if not (result.steps == config.schedule.max_steps and 0.0 <= miou <= 1.0):
        raise PluginContractError(f"{registry.kind} {name!r}: its smoke cell trained {result.steps} of "
                                  f"{config.schedule.max_steps} steps and ended with mIoU {miou}")
