"""The framework registry and what every framework declares, without its training step (no torch).

A registry entry (:class:`FrameworkSpec`) says what a configuration needs to know of a framework: its options
(``Options``, a pydantic model), decoder, augmentation pipeline, what its papers set, and where its training step
is (``implementation``, ``"module:attribute"``), which is imported only when a run builds the framework
(:meth:`FrameworkSpec.load`). The framework classes inherit their spec (``class U2PL(U2PLSpec,
SemiSupervisedFramework)``); a plug-in framework registers its ``Framework`` subclass itself, which is then its
own spec (``implementation`` empty).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict

from npsemiseg._registry import Registry, load_implementation
from npsemiseg.data.info import DatasetInfo
from npsemiseg.data.settings import PaperSettings, Publication


class FrameworkOptions(BaseModel):
    """Base of each framework's own options (validated, unknown keys rejected)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class FrameworkSpec:
    """A framework as a configuration sees it: subclasses set ``name``, ``Options`` and what differs below.

    A new option of a built-in framework is a field of its ``Options`` model (``npsemiseg/frameworks/specs/``), read
    by its training step as ``self.options.<field>``."""

    name: ClassVar[str] = ""
    Options: ClassVar[type[FrameworkOptions]] = FrameworkOptions
    #: ``"module:attribute"`` of the ``Framework`` subclass; empty: this class is the framework class
    implementation: ClassVar[str] = ""
    #: False for the supervised reference: the loop then loads no unlabeled data
    uses_unlabeled: ClassVar[bool] = True
    #: the DeepLabv3+ decoder of the framework's paper (``npsemiseg.models.DECODERS``; the record's ``model.decoder``)
    decoder: ClassVar[str] = "u2pl"
    #: the training augmentation pipeline (``npsemiseg.data.augmentation.paper_augmentation``)
    augmentation: ClassVar[str] = "u2pl"
    #: whether the segmentor needs its representation head (U2PL's contrastive loss)
    representation_head: ClassVar[bool] = False
    #: framework options of the ``smoke`` preset (beyond its shared shrinking)
    smoke_options: ClassVar[Mapping[str, Any]] = {}
    # what a dataset's publications set for a framework (crop, batch, LR, epochs, options) lives in the dataset's
    # ``PaperSettings`` (``npsemiseg.data.sets``), which the framework asks (:meth:`publication_on`,
    # :meth:`own_epochs`, :meth:`shared_epochs`, :meth:`publication_values`), never naming a dataset

    @classmethod
    def load(cls) -> type:
        """The framework class with its training step (its module imported now)."""
        return load_implementation(cls)

    @classmethod
    def publication_values(cls, settings: PaperSettings) -> list[tuple[str, Any, str]]:
        """A publication of the framework's own on a dataset with ``settings`` that the ``paper`` preset sets for
        every head, as ``(key, value, why)`` (UniMatch V2's DINOv2 configs); none by default."""
        return []

    @classmethod
    def paper_options(cls, dataset: str, partition: str) -> dict[str, Any]:
        """The framework's own paper options (its defaults); what a dataset's publications change for it
        (``PaperSettings.options_for``) is laid over them at composition."""
        return {}

    @classmethod
    def publication_on(cls, settings: PaperSettings) -> Publication | None:
        """The framework's own publication on a dataset with ``settings`` (crop, global batch, LR, epochs; None:
        none): the dataset's entry for it."""
        return settings.publication(cls.name)

    @classmethod
    def own_epochs(cls, info: DatasetInfo, partition: str) -> int | None:
        """The epochs of the framework's own publication on ``info``'s canonical ``partition`` (None: none of its
        own, the shared schedule's)."""
        publication = cls.publication_on(info.settings)
        return publication.epochs_for(partition) if publication is not None else None

    @classmethod
    def shared_epochs(cls, settings: PaperSettings) -> int:
        """The shared schedule's epochs on a dataset with ``settings`` for this framework (the dataset's, or its
        ``framework_epochs`` entry for the framework)."""
        return settings.shared_epochs(cls.name)


#: every framework by name, in the paper's order: a built-in framework's spec, or a plug-in's ``Framework`` subclass
FRAMEWORKS: Registry[type[FrameworkSpec]] = Registry("framework")
