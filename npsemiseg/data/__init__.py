"""Datasets (PASCAL VOC classic/blender, Cityscapes, ADE20K, COCO, synthetic stand-ins, the mini-study's ``study``,
a researcher's own folder, and any registered later), the standard partition lists, joint image + label transforms
and batch CutMix.

A dataset is one registered class (``npsemiseg.data.base.DatasetDef``, the built-in ones in
``npsemiseg/data/sets/``). Entry points: ``build_dataset(name, split, root=None, partition=None, *,
partition_lists="u2pl", transform=None, **options)``, ``dataset_info(name)`` (with ``info.settings``, the
dataset's paper settings) and ``dataset_definition(name)``; ``npsemiseg.data.transforms`` and
``npsemiseg.data.mixing`` for the augmentation pipelines of the frameworks. What needs torch (the synthetic
generator, the transforms, ``FilesDataset``) is imported on first use (PEP 562): describing and checking a dataset
(``npsemiseg data check``) reads files with Pillow and numpy only.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from npsemiseg.data.datasets import (
    CITYSCAPES_ID_TO_TRAINID,
    DATA_ROOT_ENV,
    build_dataset,
    cityscapes_labelids_to_trainids,
    resolve_root,
)
from npsemiseg.data.info import (
    CITYSCAPES_CLASSES,
    DATASETS,
    IGNORE_INDEX,
    VOC_CLASSES,
    DatasetInfo,
    dataset_info,
    dataset_names,
    protocol_partitions,
)
from npsemiseg.data.augmentation import augmentation_keys, unknown_augmentation_values
from npsemiseg.data.base import DatasetDef, ItemFiles
from npsemiseg.data.settings import PaperSettings, Publication
from npsemiseg.data import sets  # noqa: F401  (registers the built-in datasets)
from npsemiseg.data.partitions import PARTITION_LIST_SOURCES, partition_ids

if TYPE_CHECKING:
    from npsemiseg.data.files_dataset import FilesDataset
    from npsemiseg.data.synthetic import SyntheticConfig, SyntheticSegmentation

_ON_FIRST_USE = {"FilesDataset": "npsemiseg.data.files_dataset", "SyntheticConfig": "npsemiseg.data.synthetic",
                 "SyntheticSegmentation": "npsemiseg.data.synthetic"}


def __getattr__(name: str) -> Any:
    if name in _ON_FIRST_USE:
        return getattr(importlib.import_module(_ON_FIRST_USE[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def dataset_definition(name: str) -> type[DatasetDef]:
    """The registered class of dataset ``name`` (``ValueError`` listing the names otherwise)."""
    return DATASETS.get(name)


__all__ = [
    "CITYSCAPES_CLASSES", "CITYSCAPES_ID_TO_TRAINID", "DATASETS", "DATA_ROOT_ENV", "DatasetDef", "DatasetInfo",
    "FilesDataset", "IGNORE_INDEX", "ItemFiles", "PARTITION_LIST_SOURCES", "PaperSettings", "Publication", "SyntheticConfig",
    "SyntheticSegmentation", "VOC_CLASSES", "augmentation_keys", "build_dataset", "cityscapes_labelids_to_trainids",
    "dataset_definition", "dataset_info", "dataset_names", "partition_ids", "protocol_partitions", "resolve_root",
    "unknown_augmentation_values",
]
