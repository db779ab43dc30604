"""PASCAL VOC 2012 + SBD: ``pascal_classic`` (the 1,464 finely annotated images as the labeled pool) and
``pascal_blender`` (the 10,582 "aug" images), one layout::

    <root>/JPEGImages/<ID>.jpg
    <root>/SegmentationClassAug/<ID>.png     index PNG ("L" or "P"), 0..20, 255 ignore

``npsemiseg data prepare voc`` builds ``SegmentationClassAug/`` from VOC 2012 and SBD (``data/prepare.py``).
Lists: U2PL's (``splits/pascal_classic``, ``splits/pascal_blender``) and CPS's blender lists
(``splits/pascal_blender_cps``); ``splits/README.md`` gives their sources.
"""

from __future__ import annotations

from pathlib import Path
from npsemiseg.data.base import DatasetDef, ItemFiles
from npsemiseg.data.info import DATASETS, VOC_CLASSES, fraction_partitions
from npsemiseg.data.settings import VOC_SETTINGS

#: the "aug" train set (VOC 2012 train + SBD): the denominator of both datasets' label ratios
VOC_TRAIN_AUG_SIZE = 10582


class PascalVOC(DatasetDef):
    """What both PASCAL datasets share: classes, layout, root, paper settings (the VOC column)."""

    class_names = VOC_CLASSES
    settings = VOC_SETTINGS
    train_size = VOC_TRAIN_AUG_SIZE
    val_size = 1449
    root_marker = "JPEGImages"
    root_subfolders = ("VOC2012", "VOCdevkit/VOC2012")
    layout = "JPEGImages/<ID>.jpg and SegmentationClassAug/<ID>.png"
    layout_folders = ("JPEGImages", "SegmentationClassAug", "SegmentationClass")

    @classmethod
    def entry_image(cls, entry: str) -> str:
        return f"JPEGImages/{entry}.jpg"

    @classmethod
    def entry_labels(cls, entry: str) -> tuple[str, ...]:
        return (f"SegmentationClassAug/{entry}.png",)

    @classmethod
    def check_notes(cls, root: Path, entries: list[ItemFiles]) -> list[str]:
        if (root / "SegmentationClassAug").is_dir():
            return []
        return ["SegmentationClassAug/ is missing: build it from VOC 2012 and SBD with `npsemiseg data prepare voc`"]


_CLASSIC_PARTITIONS, _CLASSIC_ALIASES = fraction_partitions((92, 183, 366, 732), full=1464)
_BLENDER_PARTITIONS, _BLENDER_ALIASES = fraction_partitions((662, 1323, 2646, 5291))


@DATASETS.register("pascal_classic")
class PascalClassic(PascalVOC):
    """VOC classic: 92 / 183 / 366 / 732 / 1464 labeled images from the fine set; one set of lists (U2PL's)."""

    name = "pascal_classic"
    label = "VOC (classic)"
    latex_label = "VOC (\\it classic)"
    partitions = _CLASSIC_PARTITIONS
    partition_aliases = _CLASSIC_ALIASES
    list_variants = ("u2pl",)
    list_folders = {"u2pl": "pascal_classic"}


@DATASETS.register("pascal_blender")
class PascalBlender(PascalVOC):
    """VOC blender: 662 / 1323 / 2646 / 5291 labeled images of the aug set; U2PL's and CPS's lists."""

    name = "pascal_blender"
    label = "VOC (blender)"
    latex_label = "VOC (\\it blender)"
    partitions = _BLENDER_PARTITIONS
    partition_aliases = _BLENDER_ALIASES
    list_variants = ("u2pl", "cps")
    list_folders = {"u2pl": "pascal_blender", "cps": "pascal_blender_cps"}
