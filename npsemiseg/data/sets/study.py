"""The mini-study's generated dataset ``study`` (scene families of shapes and textures; its own ``tune`` split
besides ``val``). The generator and its options: ``npsemiseg.data.study``."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from npsemiseg.data.base import DatasetDef, Transform
from npsemiseg.data.info import DATASETS, DatasetInfo

if TYPE_CHECKING:
    from torch.utils.data import Dataset


@DATASETS.register("study")
class Study(DatasetDef):
    """``study``: partitions 1/16 .. 1/2 and ``full`` of its train size; evaluated on whole images."""

    name = "study"
    label = "study"

    @classmethod
    def info(cls, **options: object) -> DatasetInfo:
        from npsemiseg.data.study_settings import study_info

        return study_info(cls.name, **options)

    @classmethod
    def build(cls, split: str, root: str | os.PathLike | None = None, partition: str | int | None = None, *,
              partition_lists: str = "u2pl", transform: Transform | None = None, reveal_labels: bool = False,
              max_items: int | None = None, **options: object) -> Dataset:
        """One split (``labeled`` / ``unlabeled`` / ``val`` / ``tune``) generated in memory."""
        from npsemiseg.data.study import build_study_dataset

        return build_study_dataset(cls.name, split, partition, partition_lists=partition_lists, transform=transform,
                                   max_items=max_items, reveal_labels=reveal_labels, **options)
