"""The standard partition lists shipped in ``npsemiseg/data/splits`` (see its README).

U2PL's lists are the default (``list_variant="u2pl"``); CPS's lists, where they differ,
are ``list_variant="cps"``. Classic VOC has a single set of lists that every
framework uses, so both variant names select it.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources

from npsemiseg.data.info import REAL_DATASETS

LIST_VARIANTS = ("u2pl", "cps")

#: (dataset, list_variant) -> folder under splits/
_LIST_FOLDERS = {
    ("pascal_classic", "u2pl"): "pascal_classic",
    ("pascal_classic", "cps"): "pascal_classic",
    ("pascal_blender", "u2pl"): "pascal_blender",
    ("pascal_blender", "cps"): "pascal_blender_cps",
    ("cityscapes", "u2pl"): "cityscapes",
    ("cityscapes", "cps"): "cityscapes_cps",
}


def list_folder(dataset: str, list_variant: str = "u2pl") -> str:
    """Name of the folder under ``splits/`` holding ``dataset``'s lists in ``list_variant``."""
    if dataset not in REAL_DATASETS:
        raise ValueError(f"dataset {dataset!r} has no partition lists; valid: {sorted(REAL_DATASETS)}")
    if list_variant not in LIST_VARIANTS:
        raise ValueError(f"list_variant must be one of {LIST_VARIANTS}, got {list_variant!r}")
    return _LIST_FOLDERS[(dataset, list_variant)]


@lru_cache(maxsize=64)
def _read(folder: str, relative: str) -> tuple[str, ...]:
    node = resources.files("npsemiseg.data").joinpath("splits", folder, *relative.split("/"))
    if not node.is_file():
        raise FileNotFoundError(f"partition list splits/{folder}/{relative} is missing from the package")
    lines = tuple(line.strip() for line in node.read_text(encoding="utf-8").splitlines())
    return tuple(line for line in lines if line)


def partition_ids(dataset: str, split: str, partition: str | int | None = None, *,
                  list_variant: str = "u2pl") -> list[str]:
    """Entries of one list: VOC image IDs or Cityscapes ``leftImg8bit/...png`` paths.

    split: ``"labeled"`` / ``"unlabeled"`` (need ``partition``: a name, count or alias such
    as ``"1/16"``) or ``"val"``.
    """
    folder = list_folder(dataset, list_variant)
    if split == "val":
        return list(_read(folder, "val.txt"))
    if split not in ("labeled", "unlabeled"):
        raise ValueError(f"split must be 'labeled', 'unlabeled' or 'val', got {split!r}")
    info = REAL_DATASETS[dataset]
    if partition is None:
        raise ValueError(
            f"partition is required for the {split} split of {dataset}; valid: {', '.join(info.partitions)}"
        )
    name = info.resolve_partition(partition)
    return list(_read(folder, f"{name}/{split}.txt"))
