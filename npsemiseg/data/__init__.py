"""Datasets (PASCAL VOC classic/blender, Cityscapes, synthetic stand-ins), the standard
partition lists, joint image + label transforms and batch CutMix.

Entry points: ``build_dataset(name, split, root=None, partition=None, *, list_variant="u2pl",
transform=None, **options)`` and ``dataset_info(name)``; ``npsemiseg.data.transforms`` and
``npsemiseg.data.mixing`` for the augmentation pipelines of the frameworks.
"""

from npsemiseg.data.datasets import (
    CITYSCAPES_ID_TO_TRAINID,
    DATA_ROOT_ENV,
    CityscapesSegmentation,
    VOCSegmentation,
    build_dataset,
    cityscapes_labelids_to_trainids,
    resolve_root,
)
from npsemiseg.data.info import (
    CITYSCAPES_CLASSES,
    IGNORE_INDEX,
    VOC_CLASSES,
    DatasetInfo,
    dataset_info,
    dataset_names,
    protocol_partitions,
)
from npsemiseg.data.partitions import LIST_VARIANTS, partition_ids
from npsemiseg.data.synthetic import SyntheticConfig, SyntheticSegmentation
from npsemiseg.data.transforms import augmentation_keys

__all__ = [
    "CITYSCAPES_CLASSES", "CITYSCAPES_ID_TO_TRAINID", "CityscapesSegmentation",
    "DATA_ROOT_ENV", "DatasetInfo", "IGNORE_INDEX", "LIST_VARIANTS", "SyntheticConfig",
    "SyntheticSegmentation", "VOCSegmentation", "VOC_CLASSES", "augmentation_keys", "build_dataset",
    "cityscapes_labelids_to_trainids", "dataset_info", "dataset_names", "partition_ids", "protocol_partitions",
    "resolve_root",
]
