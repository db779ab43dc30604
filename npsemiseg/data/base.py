"""A dataset is one registered class: ``DatasetDef``.

A subclass sets its class attributes (name, classes, palette, ignore value, partitions, lists, layout and paper
settings) and registers itself where it is defined::

    @DATASETS.register("my_dataset")
    class MyDataset(DatasetDef):
        name = "my_dataset"
        class_names = ("background", "thing")
        settings = VOC_SETTINGS.scaled(crop_size=321)
        ...

Everything else asks it: ``dataset_info`` (:meth:`DatasetDef.info`), ``build_dataset`` (:meth:`DatasetDef.build`),
``npsemiseg data check`` (:meth:`DatasetDef.item_files`, :meth:`DatasetDef.check_notes`) and the presets
(``settings``). A dataset of files describes one list entry by its image and label paths relative to the
dataset's folder (:meth:`DatasetDef.entry_image`, :meth:`DatasetDef.entry_labels`); the reader, the checker and
the staging check share them. Generated datasets (synthetic, study) override :meth:`info` and :meth:`build`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from npsemiseg.constants import IGNORE_INDEX
from npsemiseg.data.datasets import DATA_ROOT_ENV, load_index_png
from npsemiseg.data.info import DatasetInfo
from npsemiseg.data.paths import inside_root
from npsemiseg.data.settings import VOC_SETTINGS, PaperSettings

if TYPE_CHECKING:
    import numpy as np
    from torch.utils.data import Dataset

SPLITS = ("labeled", "unlabeled", "val")
PARTITION_LIST_SOURCES = ("u2pl", "cps")
Transform = Callable[[dict], dict]


@dataclass(frozen=True)
class ItemFiles:
    """The files of one list entry: ``image``, ``label`` (None: not read), ``id``; ``max_value`` / ``what``: the
    valid label values (``0..max_value``, 255) and what they are; ``converted``: the label goes through
    :meth:`DatasetDef.convert_label` (Cityscapes' labelIds); ``ignore_value``: the value the file marks ignored
    pixels with (255 unless the dataset says otherwise)."""

    image: Path
    label: Path | None
    id: str
    max_value: int
    what: str
    converted: bool = False
    ignore_value: int = IGNORE_INDEX


class DatasetDef:
    """Base class of every dataset; the class attributes say what the dataset is (see the module docstring).

    partitions: name -> labeled count; partition_aliases: ``"1/16" -> "92"``; list_folders: partition-list source ->
    folder of its bundled lists under :meth:`lists_root` (``val.txt``, ``<partition>/labeled.txt``,
    ``<partition>/unlabeled.txt``); root_marker / root_subfolders: the folder that marks the dataset's root and
    the conventional subfolders of a data root that hold it; layout: one line saying which files each entry
    names (for messages); layout_folders: the folders ``data check`` counts.
    """

    name: ClassVar[str] = ""
    label: ClassVar[str] = ""
    latex_label: ClassVar[str] = ""
    class_names: ClassVar[tuple[str, ...]] = ()
    palette: ClassVar[tuple[tuple[int, int, int], ...] | None] = None
    ignore_index: ClassVar[int] = IGNORE_INDEX
    settings: ClassVar[PaperSettings] = VOC_SETTINGS
    partitions: ClassVar[Mapping[str, int]] = {}
    partition_aliases: ClassVar[Mapping[str, str]] = {}
    partition_list_sources: ClassVar[tuple[str, ...]] = ("u2pl",)
    list_folders: ClassVar[Mapping[str, str]] = {}
    train_size: ClassVar[int] = 0
    val_size: ClassVar[int] = 0
    root_marker: ClassVar[str] = ""
    root_subfolders: ClassVar[tuple[str, ...]] = ()
    layout: ClassVar[str] = ""
    layout_folders: ClassVar[tuple[str, ...]] = ()

    # ------------------------------------------------------------------ description
    @classmethod
    def info(cls, **options: object) -> DatasetInfo:
        """The dataset's ``DatasetInfo``; a dataset of files takes no options."""
        if options:
            raise ValueError(f"dataset_info: {cls.name} takes no options, got {sorted(options)}")
        return DatasetInfo(
            name=cls.name, num_classes=len(cls.class_names), class_names=cls.class_names,
            partitions=dict(cls.partitions), partition_aliases=dict(cls.partition_aliases),
            eval_mode=cls.settings.eval_mode, eval_crop_size=cls.settings.eval_crop_size or cls.settings.crop_size,
            train_size=cls.train_size, val_size=cls.val_size, partition_list_sources=cls.partition_list_sources,
            ignore_index=cls.ignore_index, settings=cls.settings, label=cls.label or cls.name,
        )

    # ------------------------------------------------------------------ lists
    @classmethod
    def lists_root(cls) -> Traversable:
        """Where the bundled lists are: ``npsemiseg/data/splits`` (a plug-in dataset may return its own folder)."""
        return resources.files("npsemiseg.data").joinpath("splits")

    @classmethod
    def list_folder(cls, partition_lists: str = "u2pl") -> str:
        """The folder under :meth:`lists_root` of the lists in ``partition_lists`` (one set serves both names where
        the dataset has one)."""
        if not cls.list_folders:
            raise ValueError(f"dataset {cls.name!r} has no partition lists")
        if partition_lists not in PARTITION_LIST_SOURCES:
            raise ValueError(f"partition_lists must be one of {PARTITION_LIST_SOURCES}, got {partition_lists!r}")
        return cls.list_folders.get(partition_lists, cls.list_folders["u2pl"])

    @classmethod
    def list_ids(cls, split: str, partition: str | None, partition_lists: str = "u2pl", root: Path | None = None) -> list[str]:
        """Entries of one list: ``val`` or a canonical partition's ``labeled`` / ``unlabeled`` list. ``root``: the
        dataset's folder where known (a list derived from the files on disk needs it: COCO's unlabeled lists)."""
        folder = cls.list_folder(partition_lists)
        relative = "val.txt" if split == "val" else f"{partition}/{split}.txt"
        return list(read_list(cls.lists_root(), folder, relative))

    # ------------------------------------------------------------------ files of one entry
    @classmethod
    def entry_image(cls, entry: str) -> str:
        """The image of list entry ``entry``, relative to the dataset's folder."""
        raise NotImplementedError(f"{cls.name}: a dataset of files defines entry_image")

    @classmethod
    def entry_labels(cls, entry: str) -> tuple[str, ...]:
        """The label files that may hold ``entry``'s label, preferred first (relative to the folder)."""
        raise NotImplementedError(f"{cls.name}: a dataset of files defines entry_labels")

    @classmethod
    def entry_id(cls, entry: str) -> str:
        """The item id of list entry ``entry`` (the entry itself by default)."""
        return entry

    @classmethod
    def label_kind(cls, index: int) -> tuple[int, str, bool]:
        """``(max_value, what, converted)`` of the ``index``-th of :meth:`entry_labels`' candidates."""
        return len(cls.class_names) - 1, f"{cls.name} class indices", False

    @classmethod
    def item_files(cls, root: Path, entry: str, with_label: bool) -> ItemFiles:
        """The files the reader opens for ``entry``: the first label candidate on disk (else the preferred one).
        Every path is :func:`~npsemiseg.data.paths.inside_root`'s: an entry or a symlink leading out of ``root`` is
        an ``OutsideRootError``."""
        what = f"{cls.name} list entry"
        image = inside_root(root, cls.entry_image(entry), what=what)
        if not with_label:
            max_value, kind, _ = cls.label_kind(0)
            return ItemFiles(image, None, cls.entry_id(entry), max_value, kind)
        candidates = [inside_root(root, p, what=what) for p in cls.entry_labels(entry)]
        index = next((i for i, p in enumerate(candidates) if p.is_file()), 0)
        return ItemFiles(image, candidates[index], cls.entry_id(entry), *cls.label_kind(index))

    @classmethod
    def convert_label(cls, array: np.ndarray, files: ItemFiles) -> np.ndarray:
        """A decoded label ``[H, W]`` -> class indices (identity; Cityscapes maps labelIds to train ids)."""
        return array

    @classmethod
    def read_label(cls, files: ItemFiles) -> np.ndarray:
        """Decode and validate ``files.label`` -> uint8 ``[H, W]`` of class indices and 255."""
        assert files.label is not None
        return cls.convert_label(load_index_png(files.label, max_value=files.max_value, what=files.what), files)

    @classmethod
    def check_notes(cls, root: Path, entries: list[ItemFiles]) -> list[str]:
        """Extra lines of ``data check``'s layout summary (what to prepare); none by default."""
        return []

    @classmethod
    def unusable_files(cls, root: Path) -> list[tuple[str, str]]:
        """Files under ``root`` the layout cannot use, as ``(relative path, why)``, for ``data check`` to name
        (a folder dataset's mask without an image, a JPEG mask, ...); none by default."""
        return []

    # ------------------------------------------------------------------ root and build
    @classmethod
    def resolve_root(cls, root: str | os.PathLike | None = None) -> Path:
        """The dataset's folder: ``root`` (or ``$NPSEMISEG_DATA``) itself or one of its ``root_subfolders``."""
        if root is None:
            root = os.environ.get(DATA_ROOT_ENV)
            if not root:
                where = f"{DATA_ROOT_ENV}/{cls.root_subfolders[0]}" if cls.root_subfolders else DATA_ROOT_ENV
                raise FileNotFoundError(f"no data root for {cls.name}: pass root=... or set {DATA_ROOT_ENV} "
                                        f"(expected {where})")
        base = Path(root).expanduser()
        candidates = [base] + [base / sub for sub in cls.root_subfolders]
        for candidate in candidates:
            if (candidate / cls.root_marker).is_dir():
                return candidate
        tried = ", ".join(str(c / cls.root_marker) for c in candidates)
        raise FileNotFoundError(f"{cls.name} not found under {base}: expected a {cls.root_marker}/ folder at one of {tried}")

    @classmethod
    def split_info(cls, split: str, partition: str | int | None, **options: object) -> tuple[DatasetInfo, str | None]:
        """``(info, canonical partition or None for val)`` of one split; a clear error for a wrong split or partition."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        info = cls.info(**options)
        return info, None if split == "val" else required_partition(info, split, partition)

    @classmethod
    def build(cls, split: str, root: str | os.PathLike | None = None, partition: str | int | None = None, *,
              partition_lists: str = "u2pl", transform: Transform | None = None, reveal_labels: bool = False,
              max_items: int | None = None, **options: object) -> Dataset:
        """One split read from files (``build_dataset``'s contract)."""
        from npsemiseg.data.files_dataset import FilesDataset  # torch: imported when a split is built

        info, part = cls.split_info(split, partition, **options)
        folder = cls.resolve_root(root)
        entries = cls.list_ids(split, part, partition_lists, root=folder)[:max_items]
        with_label = split != "unlabeled" or reveal_labels
        files = [cls.item_files(folder, entry, with_label) for entry in entries]
        return FilesDataset(cls, info, folder, split, files, partition=part, partition_lists=partition_lists,
                            transform=transform)


class PairedLines(DatasetDef):
    """A dataset whose list lines name both files, ``"<image> <label>"`` relative to its folder (UniMatch's lists:
    ADE20K, COCO); the item id is the image's file stem."""

    @classmethod
    def entry_pair(cls, entry: str) -> tuple[str, str]:
        """``(image, label)`` of a line; ``ValueError`` naming it unless it holds exactly two paths."""
        parts = entry.split()
        if len(parts) != 2:
            raise ValueError(f"{cls.name} list entry {entry!r}: expected '<image> <label>' (two paths)")
        return parts[0], parts[1]

    @classmethod
    def entry_image(cls, entry: str) -> str:
        return cls.entry_pair(entry)[0]

    @classmethod
    def entry_labels(cls, entry: str) -> tuple[str, ...]:
        return (cls.entry_pair(entry)[1],)

    @classmethod
    def entry_id(cls, entry: str) -> str:
        return Path(entry.split()[0]).stem


def required_partition(info: DatasetInfo, split: str, partition: str | int | None) -> str:
    """The canonical partition of a ``labeled`` / ``unlabeled`` split; a clear error when none or a wrong one."""
    if partition is None:
        raise ValueError(f"partition is required for the {split} split of {info.name}; valid: {', '.join(info.partitions)}")
    return info.resolve_partition(partition)


@lru_cache(maxsize=64)
def read_list(root: Traversable, folder: str, relative: str) -> tuple[str, ...]:
    """The non-empty lines of list ``<root>/<folder>/<relative>``."""
    node = root.joinpath(folder, *relative.split("/"))
    if not node.is_file():
        raise FileNotFoundError(f"partition list {folder}/{relative} is missing under {root}")
    lines = (line.strip() for line in node.read_text(encoding="utf-8").splitlines())
    return tuple(line for line in lines if line)
