"""Builders of small dataset trees in the real VOC / Cityscapes layouts and file formats.

Other tests import these to get a dataset on disk (``tmp_path``) without the real data:
JPEG images, single-channel index PNG labels (mode "L" or "P"), Cityscapes city
subfolders with ``labelTrainIds`` files or only ``labelIds`` files (the conversion case).
Labels are blocky random maps with a 255 outline, like VOC's. ``ade_tree`` / ``coco_tree``: ADEChallengeData2016's
folders and UniMatch's COCO layout, the first entries of the bundled lists. ``make_folder_tree``: a researcher's own folder
dataset (``classes.yaml``, ``images/``, ``masks/``).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np
import yaml
from PIL import Image

from npsemiseg.data.datasets import cityscapes_label_paths
from npsemiseg.data.partitions import partition_ids

#: entries per list of the ADE20K and COCO fixture trees (their bundled lists name 20,210 / 118,287 images)
PAIRED_ITEMS = 4

VOC_PALETTE = np.random.default_rng(0).integers(0, 256, size=(256, 3), dtype=np.uint8)


def random_label(rng: np.random.Generator, height: int, width: int, values: Iterable[int], *,
                 block: int = 4, outline: bool = True) -> np.ndarray:
    """Blocky uint8 label map ``[H, W]`` drawing from ``values``, with 255 on block edges if ``outline``."""
    values = np.asarray(list(values), dtype=np.uint8)
    coarse = rng.choice(values, size=(-(-height // block), -(-width // block)))
    label = np.kron(coarse, np.ones((block, block), dtype=np.uint8))[:height, :width]
    if outline:
        edge = np.zeros_like(label, dtype=bool)
        edge[1:] |= label[1:] != label[:-1]
        edge[:, 1:] |= label[:, 1:] != label[:, :-1]
        label = label.copy()
        label[edge] = 255
    return label


def write_image(path: Path, rng: np.random.Generator, height: int, width: int, *, fmt: str = "JPEG") -> np.ndarray:
    """Write a random RGB image; returns the uint8 ``[H, W, 3]`` array written (before compression)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    array = rng.integers(0, 256, size=(height, width, 3), dtype=np.uint8)
    Image.fromarray(array).save(path, format=fmt, **({"quality": 95} if fmt == "JPEG" else {}))
    return array


def write_label(path: Path, label: np.ndarray, *, mode: str = "L") -> None:
    """Write an index label PNG in mode "L" (grey) or "P" (palette); "RGB" writes a colour rendering."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if mode == "L":
        Image.fromarray(label).save(path)
    elif mode == "P":
        img = Image.fromarray(label)
        img.putpalette(VOC_PALETTE.flatten().tolist())
        img.save(path)
    elif mode == "RGB":
        Image.fromarray(VOC_PALETTE[label]).save(path)
    else:
        raise ValueError(f"mode must be 'L', 'P' or 'RGB', got {mode!r}")


def make_voc_tree(root: Path, ids: Iterable[str], *, size: tuple[int, int] = (24, 32), labels: bool = True,
                  label_mode: str = "L", num_classes: int = 21, seed: int = 0) -> dict[str, np.ndarray]:
    """``root/JPEGImages/<ID>.jpg`` and (if ``labels``) ``root/SegmentationClassAug/<ID>.png``.

    Returns ID -> label array written (values 0..num_classes-1 and 255).
    """
    rng = np.random.default_rng(seed)
    written = {}
    for image_id in ids:
        write_image(root / "JPEGImages" / f"{image_id}.jpg", rng, *size)
        if labels:
            label = random_label(rng, *size, range(num_classes))
            write_label(root / "SegmentationClassAug" / f"{image_id}.png", label, mode=label_mode)
            written[image_id] = label
    return written


def make_voc_split(root: Path, dataset: str, split: str, partition: str | None = None, *,
                   partition_lists: str = "u2pl", max_items: int | None = None, **kwargs) -> dict[str, np.ndarray]:
    """A VOC tree holding the first ``max_items`` entries of a package list (labels unless unlabeled)."""
    ids = partition_ids(dataset, split, partition, partition_lists=partition_lists)[:max_items]
    return make_voc_tree(root, ids, labels=split != "unlabeled", **kwargs)


def make_cityscapes_tree(root: Path, entries: Iterable[str], *, size: tuple[int, int] = (16, 32),
                         label_kind: str = "trainIds", labels: bool = True, seed: int = 0) -> dict[str, np.ndarray]:
    """``root/leftImg8bit/<split>/<city>/..._leftImg8bit.png`` and ``root/gtFine/...`` labels.

    label_kind ``"trainIds"`` writes ``_gtFine_labelTrainIds.png`` (0..18, 255); ``"labelIds"``
    writes only ``_gtFine_labelIds.png`` (0..33). Returns image name -> label array written.
    """
    if label_kind not in ("trainIds", "labelIds"):
        raise ValueError(f"label_kind must be 'trainIds' or 'labelIds', got {label_kind!r}")
    rng = np.random.default_rng(seed)
    written = {}
    for entry in entries:
        write_image(root / entry, rng, *size, fmt="PNG")
        if labels:
            train_path, ids_path = cityscapes_label_paths(entry)
            if label_kind == "trainIds":
                label = random_label(rng, *size, range(19))
                write_label(root / train_path, label)
            else:
                label = random_label(rng, *size, range(34), outline=False)
                write_label(root / ids_path, label)
            written[Path(entry).name[: -len("_leftImg8bit.png")]] = label
    return written


def make_cityscapes_split(root: Path, split: str, partition: str | None = None, *, partition_lists: str = "u2pl",
                          max_items: int | None = None, **kwargs) -> dict[str, np.ndarray]:
    """A Cityscapes tree holding the first ``max_items`` entries of a package list."""
    entries = partition_ids("cityscapes", split, partition, partition_lists=partition_lists)[:max_items]
    return make_cityscapes_tree(root, entries, labels=split != "unlabeled", **kwargs)


FOLDER_CLASSES = ["background", "leaf", "stem"]


def make_folder_tree(root: Path, name: str = "plants", *, count: int = 20, unlabeled: int = 4,
                     ignore: int | None = None, size: tuple[int, int] = (24, 32), seed: int = 0) -> Path:
    """``root/<name>``: ``count`` JPEG images with masks (values 0..2 of :data:`FOLDER_CLASSES`, and ``ignore``
    where given) plus ``unlabeled`` images without one; no lists yet."""
    folder = root / name
    (folder / "images").mkdir(parents=True)
    (folder / "masks").mkdir()
    classes: dict = {"names": FOLDER_CLASSES, "palette": [[0, 0, 0], [0, 200, 0], [120, 80, 0]]}
    if ignore is not None:
        classes["ignore_index"] = ignore
    (folder / "classes.yaml").write_text(yaml.safe_dump(classes))
    rng = np.random.default_rng(seed)
    for i in range(count + unlabeled):
        write_image(folder / "images" / f"p{i:03d}.jpg", rng, *size)
        if i < count:
            values = [0, 1, 2] + ([ignore] if ignore is not None else [])
            write_label(folder / "masks" / f"p{i:03d}.png", random_label(rng, *size, values))
    return folder


def _write(root: Path, entries: list[str], values: list[int], rng: np.random.Generator) -> None:
    """Each ``"image label"`` line's files: a JPEG and an index PNG of ``values`` (255 on block edges)."""
    for entry in entries:
        image, label = entry.split()
        (root / image).parent.mkdir(parents=True, exist_ok=True)
        (root / label).parent.mkdir(parents=True, exist_ok=True)
        write_image(root / image, rng, 20, 28)
        write_label(root / label, random_label(rng, 20, 28, values))


def ade_tree(root: Path, partition: str = "316") -> Path:
    """``root/ADEChallengeData2016``: the first PAIRED_ITEMS entries of the partition's lists and of val (raw
    annotation values 0 = other, 1..150)."""
    rng = np.random.default_rng(0)
    folder = root / "ADEChallengeData2016"
    for split in ("labeled", "unlabeled"):
        _write(folder, partition_ids("ade20k", split, partition)[:PAIRED_ITEMS], [0, 1, 75, 150], rng)
    _write(folder, partition_ids("ade20k", "val")[:PAIRED_ITEMS], [0, 3, 150], rng)
    return folder


def coco_tree(root: Path, partition: str = "232", unlabeled: int = PAIRED_ITEMS) -> Path:
    """The first PAIRED_ITEMS labeled and val entries, and ``unlabeled`` more train2017 images (no masks needed)."""
    rng = np.random.default_rng(1)
    folder = root / "coco"
    _write(folder, partition_ids("coco", "labeled", partition)[:PAIRED_ITEMS], [0, 1, 40, 80], rng)
    _write(folder, partition_ids("coco", "val")[:PAIRED_ITEMS], [0, 80], rng)
    for i in range(unlabeled):
        write_image(folder / "train2017" / f"9{i:011d}.jpg", rng, 20, 28)
    return folder
