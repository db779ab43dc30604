"""PASCAL VOC 2012 (+SBD) and Cityscapes readers, and ``build_dataset`` for every dataset.

Layouts (``splits/README.md``)::

    <voc_root>/JPEGImages/<ID>.jpg
    <voc_root>/SegmentationClassAug/<ID>.png          index PNG ("L" or "P"), 0..20, 255 ignore
    <cityscapes_root>/leftImg8bit/<split>/<city>/<name>_leftImg8bit.png
    <cityscapes_root>/gtFine/<split>/<city>/<name>_gtFine_labelTrainIds.png   (0..18, 255)
        or, when absent, <name>_gtFine_labelIds.png (0..33, converted 34 -> 19 here)

Data root: the ``root`` argument, else the ``NPSEMISEG_DATA`` environment variable. The
root is either the dataset folder itself or a folder holding it as ``VOC2012`` (or
``VOCdevkit/VOC2012``) for both PASCAL datasets and ``cityscapes`` for Cityscapes.

File existence is checked when a dataset is built (a partial dataset fails at once,
naming the first missing files); a file's content (decodable image, label mode, label
values, matching sizes) is checked when the item is loaded.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from PIL import UnidentifiedImageError
from torch.utils.data import Dataset

from npsemiseg.data.info import (
    IGNORE_INDEX,
    DatasetInfo,
    dataset_info,
)
from npsemiseg.data.partitions import partition_ids
from npsemiseg.data.study import STUDY_DATASETS, build_study_dataset
from npsemiseg.data.synthetic import SyntheticConfig, SyntheticSegmentation
from npsemiseg.untrusted import open_image

DATA_ROOT_ENV = "NPSEMISEG_DATA"
SPLITS = ("labeled", "unlabeled", "val")

#: cityscapesScripts' labels.py: label id -> train id (everything else -> 255)
CITYSCAPES_ID_TO_TRAINID: dict[int, int] = {
    7: 0, 8: 1, 11: 2, 12: 3, 13: 4, 17: 5, 19: 6, 20: 7, 21: 8, 22: 9, 23: 10,
    24: 11, 25: 12, 26: 13, 27: 14, 28: 15, 31: 16, 32: 17, 33: 18,
}
CITYSCAPES_NUM_LABEL_IDS = 34  # labelIds images hold 0..33


def _id_to_trainid_table() -> np.ndarray:
    table = np.full(256, IGNORE_INDEX, dtype=np.uint8)
    for label_id, train_id in CITYSCAPES_ID_TO_TRAINID.items():
        table[label_id] = train_id
    return table


_ID_TO_TRAINID = _id_to_trainid_table()

Transform = Callable[[dict], dict]


def cityscapes_labelids_to_trainids(label_ids: np.ndarray) -> np.ndarray:
    """Map a Cityscapes ``labelIds`` array (values 0..33) to train ids (0..18, 255)."""
    return _ID_TO_TRAINID[label_ids]


def load_image(path: Path) -> torch.Tensor:
    """RGB image file -> float32 ``[3, H, W]`` in [0, 1]. ``ValueError`` if it cannot be decoded or declares
    more pixels than any image may have (:func:`~npsemiseg.untrusted.open_image`)."""
    try:
        with open_image(path) as img:
            img.load()
            rgb = img.convert("RGB")
    except FileNotFoundError:
        raise FileNotFoundError(f"image file {path} does not exist") from None
    except (UnidentifiedImageError, OSError, SyntaxError) as err:
        raise ValueError(f"image file {path} is corrupt or not an image ({err})") from None
    array = np.asarray(rgb, dtype=np.uint8)
    return torch.from_numpy(array.copy()).permute(2, 0, 1).float().div_(255.0)


def load_index_png(path: Path, *, max_value: int, what: str) -> np.ndarray:
    """Single-channel index PNG (mode "L" or "P") -> uint8 ``[H, W]``.

    Values must be in ``0..max_value`` or 255; ``what`` says in the error what they are.
    """
    try:
        with open_image(path) as img:
            img.load()
            mode = img.mode
            array = np.asarray(img) if mode in ("L", "P") else None
    except FileNotFoundError:
        raise FileNotFoundError(f"label file {path} does not exist") from None
    except (UnidentifiedImageError, OSError, SyntaxError) as err:
        raise ValueError(f"label file {path} is corrupt or not an image ({err})") from None
    if array is None:
        raise ValueError(
            f"label file {path} has PIL mode {mode!r}; expected a single-channel index PNG (mode 'L' or 'P') "
            f"holding {what} (a colour-rendered mask is not a label map)"
        )
    bad = np.unique(array[(array > max_value) & (array != IGNORE_INDEX)])
    if bad.size:
        raise ValueError(
            f"label file {path} holds values {bad[:10].tolist()} outside {what} (0..{max_value}, 255 = ignore)"
        )
    return array


_LAYOUTS = {
    "pascal_classic": "JPEGImages/<ID>.jpg and SegmentationClassAug/<ID>.png",
    "pascal_blender": "JPEGImages/<ID>.jpg and SegmentationClassAug/<ID>.png",
    "cityscapes": "leftImg8bit/<split>/<city>/*_leftImg8bit.png and gtFine/<split>/<city>/*_gtFine_labelTrainIds.png "
                  "(or *_gtFine_labelIds.png)",
}


def _check_exist(paths: list[Path], dataset: str, root: Path) -> None:
    missing = [p for p in paths if not p.is_file()]
    if missing:
        shown = ", ".join(str(p) for p in missing[:5])
        raise FileNotFoundError(
            f"{dataset} under {root} is missing {len(missing)} of {len(paths)} listed files, e.g. {shown} "
            f"(expected {_LAYOUTS[dataset]} for every entry of the list)"
        )


class SegmentationFiles(Dataset):
    """Items from (image path, label path or None) pairs. Base of the VOC and Cityscapes readers.

    Items: ``image [3, H, W]`` float32 in [0, 1], ``label [H, W]`` int64 (all 255 on the
    unlabeled split, whose label files are never read), ``id`` str; then ``transform``.
    """

    info: DatasetInfo

    def __init__(self, info: DatasetInfo, root: Path, split: str, ids: list[str],
                 images: list[Path], labels: list[Path] | None, *, partition: str | None,
                 list_variant: str, transform: Transform | None) -> None:
        self.info = info
        self.root = root
        self.split = split
        self.ids = ids
        self.images = images
        self.labels = labels
        self.partition = partition
        self.list_variant = list_variant
        self.transform = transform
        _check_exist(images + (labels or []), info.name, root)

    def __len__(self) -> int:
        return len(self.ids)

    def load_label(self, i: int) -> np.ndarray:
        assert self.labels is not None
        return load_index_png(self.labels[i], max_value=self.info.num_classes - 1,
                              what=f"{self.info.name} class indices")

    def __getitem__(self, i: int) -> dict:
        image = load_image(self.images[i])
        height, width = image.shape[1:]
        if self.labels is None:
            label = torch.full((height, width), IGNORE_INDEX, dtype=torch.int64)
        else:
            array = self.load_label(i)
            if array.shape != (height, width):
                raise ValueError(
                    f"label file {self.labels[i]} is {array.shape[1]}x{array.shape[0]} (WxH) but image "
                    f"{self.images[i]} is {width}x{height}; expected the same size"
                )
            label = torch.from_numpy(array.astype(np.int64))
        item = {"image": image, "label": label, "id": self.ids[i]}
        return self.transform(item) if self.transform is not None else item


class VOCSegmentation(SegmentationFiles):
    """PASCAL VOC 2012 + SBD (``pascal_classic`` / ``pascal_blender``) for one list of IDs."""

    def __init__(self, info: DatasetInfo, root: Path, split: str, ids: list[str], *, reveal_labels: bool = False,
                 **kwargs) -> None:
        images = [root / "JPEGImages" / f"{i}.jpg" for i in ids]
        hidden = split == "unlabeled" and not reveal_labels
        labels = None if hidden else [root / "SegmentationClassAug" / f"{i}.png" for i in ids]
        super().__init__(info, root, split, ids, images, labels, **kwargs)


def cityscapes_label_paths(image_entry: str) -> tuple[str, str]:
    """``leftImg8bit/.../x_leftImg8bit.png`` -> (``gtFine/.../x_gtFine_labelTrainIds.png``, ``..._labelIds.png``)."""
    if not (image_entry.startswith("leftImg8bit/") and image_entry.endswith("_leftImg8bit.png")):
        raise ValueError(f"Cityscapes list entry {image_entry!r}: expected leftImg8bit/<split>/<city>/<name>_leftImg8bit.png")
    stem = "gtFine/" + image_entry[len("leftImg8bit/"): -len("leftImg8bit.png")]
    return stem + "gtFine_labelTrainIds.png", stem + "gtFine_labelIds.png"


class CityscapesSegmentation(SegmentationFiles):
    """Cityscapes fine annotations; ``labelTrainIds`` files, else ``labelIds`` converted 34 -> 19."""

    def __init__(self, info: DatasetInfo, root: Path, split: str, ids: list[str], *, reveal_labels: bool = False,
                 **kwargs) -> None:
        images = [root / entry for entry in ids]
        labels: list[Path] | None = None
        self.converted: list[bool] = []
        if split != "unlabeled" or reveal_labels:
            labels = []
            for entry in ids:
                train_ids, label_ids = (root / p for p in cityscapes_label_paths(entry))
                use_ids = not train_ids.is_file() and label_ids.is_file()
                labels.append(label_ids if use_ids else train_ids)
                self.converted.append(use_ids)
        names = [Path(entry).name[: -len("_leftImg8bit.png")] for entry in ids]
        super().__init__(info, root, split, names, images, labels, **kwargs)

    def load_label(self, i: int) -> np.ndarray:
        assert self.labels is not None
        if self.converted[i]:
            label_ids = load_index_png(self.labels[i], max_value=CITYSCAPES_NUM_LABEL_IDS - 1,
                                       what="Cityscapes label ids")
            return cityscapes_labelids_to_trainids(label_ids)
        return super().load_label(i)


_ROOT_SUBFOLDERS = {
    "pascal_classic": (("VOC2012",), ("VOCdevkit", "VOC2012")),
    "pascal_blender": (("VOC2012",), ("VOCdevkit", "VOC2012")),
    "cityscapes": (("cityscapes",),),
}
_ROOT_MARKERS = {"pascal_classic": "JPEGImages", "pascal_blender": "JPEGImages", "cityscapes": "leftImg8bit"}


def root_subfolders(name: str) -> list[str]:
    """The conventional subfolders of a data root holding dataset ``name`` (``["VOC2012", "VOCdevkit/VOC2012"]``)."""
    return ["/".join(sub) for sub in _ROOT_SUBFOLDERS.get(name, ())]


def resolve_root(name: str, root: str | os.PathLike | None = None) -> Path:
    """The folder of dataset ``name``: ``root`` (or ``$NPSEMISEG_DATA``) itself or its conventional subfolder."""
    if root is None:
        root = os.environ.get(DATA_ROOT_ENV)
        if not root:
            raise FileNotFoundError(
                f"no data root for {name}: pass root=... or set {DATA_ROOT_ENV} "
                f"(expected {DATA_ROOT_ENV}/{'/'.join(_ROOT_SUBFOLDERS[name][0])})"
            )
    base = Path(root).expanduser()
    marker = _ROOT_MARKERS[name]
    candidates = [base] + [base.joinpath(*sub) for sub in _ROOT_SUBFOLDERS[name]]
    for candidate in candidates:
        if (candidate / marker).is_dir():
            return candidate
    tried = ", ".join(str(c / marker) for c in candidates)
    raise FileNotFoundError(f"{name} not found under {base}: expected a {marker}/ folder at one of {tried}")


def build_dataset(name: str, split: str, root: str | os.PathLike | None = None,
                  partition: str | int | None = None, *, list_variant: str = "u2pl",
                  transform: Transform | None = None, reveal_labels: bool = False, **options: object) -> Dataset:
    """One split of dataset ``name``.

    split: ``"labeled"``, ``"unlabeled"`` (both need ``partition``, e.g. ``"92"`` or ``"1/16"``)
    or ``"val"``. list_variant: ``"u2pl"`` (default) or ``"cps"`` partition lists (real
    datasets; for synthetic ones it is recorded only). options: synthetic generator settings
    (``image_size``, ``train_size``, ``val_size``, ``seed``, ``num_classes``, ...); real
    datasets take only ``max_items`` (keep the first N list entries: smoke runs on real data).
    Items are dicts ``image [3,H,W]`` float32 in [0,1], ``label [H,W]``
    int64 (255 = ignore; all 255 on the unlabeled split unless ``reveal_labels``: the pseudo-label
    diagnostics of ``data.unlabeled_truth``), ``id`` str, passed through ``transform``.
    The returned dataset has ``info``, ``split``, ``partition`` and ``list_variant`` attributes.
    """
    if name in STUDY_DATASETS:  # its own splits (a "tune" split besides val)
        return build_study_dataset(name, split, partition, list_variant=list_variant, transform=transform,
                                   reveal_labels=reveal_labels, **options)
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if list_variant not in ("u2pl", "cps"):
        raise ValueError(f"list_variant must be 'u2pl' or 'cps', got {list_variant!r}")
    max_items = options.pop("max_items", None)
    if max_items is not None and (not isinstance(max_items, int) or max_items < 1):
        raise ValueError(f"max_items must be a positive int or None, got {max_items!r}")
    info = dataset_info(name, **options)
    if info.synthetic:
        part = None if split == "val" else _partition_name(info, split, partition)
        return SyntheticSegmentation(
            SyntheticConfig(**info.options), split, num_labeled=None if part is None else info.partitions[part],
            partition=part, info=info, list_variant=list_variant, max_items=max_items, transform=transform,
            reveal_labels=reveal_labels,
        )
    part = None if split == "val" else _partition_name(info, split, partition)
    ids = partition_ids(name, split, part, list_variant=list_variant)[:max_items]
    folder = resolve_root(name, root)
    reader = CityscapesSegmentation if name == "cityscapes" else VOCSegmentation
    return reader(info, folder, split, ids, partition=part, list_variant=list_variant, transform=transform,
                  reveal_labels=reveal_labels)


def _partition_name(info: DatasetInfo, split: str, partition: str | int | None) -> str:
    if partition is None:
        raise ValueError(
            f"partition is required for the {split} split of {info.name}; valid: {', '.join(info.partitions)}"
        )
    return info.resolve_partition(partition)
