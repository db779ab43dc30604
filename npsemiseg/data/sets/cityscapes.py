"""Cityscapes (fine annotations), 19 train ids::

    <root>/leftImg8bit/<split>/<city>/<name>_leftImg8bit.png
    <root>/gtFine/<split>/<city>/<name>_gtFine_labelTrainIds.png    (0..18, 255)
        or, when absent, <name>_gtFine_labelIds.png (0..33, converted 34 -> 19 at every read;
        ``npsemiseg data prepare cityscapes`` writes the labelTrainIds files once)

List entries are the image paths. Lists: U2PL's (``splits/cityscapes``) and CPS's (``splits/cityscapes_cps``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from npsemiseg.data.base import DatasetDef, ItemFiles
from npsemiseg.data.datasets import CITYSCAPES_NUM_LABEL_IDS, cityscapes_label_paths, cityscapes_labelids_to_trainids
from npsemiseg.data.info import CITYSCAPES_CLASSES, DATASETS, fraction_partitions
from npsemiseg.data.settings import CITYSCAPES_SETTINGS

CITYSCAPES_TRAIN_SIZE = 2975
_PARTITIONS, _ALIASES = fraction_partitions((186, 372, 744, 1488))


@DATASETS.register("cityscapes")
class Cityscapes(DatasetDef):
    """Cityscapes: 186 / 372 / 744 / 1488 labeled images of 2,975; sliding-window evaluation at 769 px."""

    name = "cityscapes"
    label = "Cityscapes"
    class_names = CITYSCAPES_CLASSES
    settings = CITYSCAPES_SETTINGS
    partitions = _PARTITIONS
    partition_aliases = _ALIASES
    list_variants = ("u2pl", "cps")
    list_folders = {"u2pl": "cityscapes", "cps": "cityscapes_cps"}
    train_size = CITYSCAPES_TRAIN_SIZE
    val_size = 500
    root_marker = "leftImg8bit"
    root_subfolders = ("cityscapes",)
    layout = ("leftImg8bit/<split>/<city>/*_leftImg8bit.png and gtFine/<split>/<city>/*_gtFine_labelTrainIds.png "
              "(or *_gtFine_labelIds.png)")
    layout_folders = ("leftImg8bit/train", "leftImg8bit/val", "gtFine/train", "gtFine/val")

    @classmethod
    def entry_image(cls, entry: str) -> str:
        cityscapes_label_paths(entry)  # validates the entry's form
        return entry

    @classmethod
    def entry_labels(cls, entry: str) -> tuple[str, ...]:
        return cityscapes_label_paths(entry)

    @classmethod
    def entry_id(cls, entry: str) -> str:
        return Path(entry).name[: -len("_leftImg8bit.png")]

    @classmethod
    def label_kind(cls, index: int) -> tuple[int, str, bool]:
        """Train ids (candidate 0) or labelIds (candidate 1, converted when read)."""
        if index == 1:
            return CITYSCAPES_NUM_LABEL_IDS - 1, "Cityscapes label ids", True
        return super().label_kind(index)

    @classmethod
    def convert_label(cls, array: np.ndarray, files: ItemFiles) -> np.ndarray:
        return cityscapes_labelids_to_trainids(array) if files.converted else array

    @classmethod
    def check_notes(cls, root: Path, entries: list[ItemFiles]) -> list[str]:
        converted = sum(1 for e in entries if e.converted)
        if not converted:
            return []
        return [f"{converted} labels are labelIds files, converted at every read: "
                "`npsemiseg data prepare cityscapes` writes labelTrainIds once"]
