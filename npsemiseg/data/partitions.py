"""The standard partition lists shipped in ``npsemiseg/data/splits`` (see its README), read through the dataset's
registered class (``DatasetDef.list_folders``).

U2PL's lists are the default (``partition_lists="u2pl"``); CPS's lists, where they differ,
are ``partition_lists="cps"``. Classic VOC has a single set of lists that every
framework uses, so both source names select it.
"""

from __future__ import annotations

from npsemiseg.data.base import PARTITION_LIST_SOURCES
from npsemiseg.data.info import DATASETS

__all__ = ["PARTITION_LIST_SOURCES", "list_folder", "partition_ids"]


def list_folder(dataset: str, partition_lists: str = "u2pl") -> str:
    """Name of the folder under ``splits/`` holding ``dataset``'s lists in ``partition_lists``."""
    return DATASETS.get(dataset).list_folder(partition_lists)


def partition_ids(dataset: str, split: str, partition: str | int | None = None, *,
                  partition_lists: str = "u2pl") -> list[str]:
    """Entries of one list: VOC image IDs or Cityscapes ``leftImg8bit/...png`` paths.

    split: ``"labeled"`` / ``"unlabeled"`` (need ``partition``: a name, count or alias such
    as ``"1/16"``) or ``"val"``.
    """
    definition = DATASETS.get(dataset)
    if partition_lists not in PARTITION_LIST_SOURCES:
        raise ValueError(f"partition_lists must be one of {PARTITION_LIST_SOURCES}, got {partition_lists!r}")
    if split == "val":
        return definition.list_ids("val", None, partition_lists)
    if split not in ("labeled", "unlabeled"):
        raise ValueError(f"split must be 'labeled', 'unlabeled' or 'val', got {split!r}")
    info = definition.info()
    if partition is None:
        raise ValueError(
            f"partition is required for the {split} split of {dataset}; valid: {', '.join(info.partitions)}"
        )
    return definition.list_ids(split, info.resolve_partition(partition), partition_lists)
