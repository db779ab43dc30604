"""COCO 2017 as UniMatch trains on it: 81 classes (index 0 = UniMatch's "void", the background class, trained
like any other; 1..80 = the thing classes), masks prepared by UniMatch from the official instance annotations::

    <root>/train2017/<12-digit ID>.jpg      118,287 train images
    <root>/val2017/<12-digit ID>.jpg
    <root>/masks/<12-digit ID>.png          index PNG 0..80, 255 ignored (train and val masks in one folder)

The masks are UniMatch's download (README, "COCO: ... masks"), or built from the official ``instances_*.json`` by
``npsemiseg data prepare coco`` (``npsemiseg/data/prepare_coco.py``: the standard conversion with pycocotools, as
UniMatch documents none; 0 background, 1..80 by ascending category id, 255 where annotations overlap).
Lists: UniMatch V2's ``splits/coco/1_512 .. 1_32/labeled.txt`` and ``val.txt`` (LiheYoung/UniMatch-V2 at f6afb4d;
identical to UniMatch V1's at 0324f3d), copied line for line into ``npsemiseg/data/splits/coco/<count>/``. Neither
checkout holds the unlabeled lists (``splits/coco/all/`` is empty in UniMatch V2's): a partition's unlabeled list
is every image under ``train2017/`` that is not labeled, read from the data root. Classes: UniMatch V2's
``util/classes.py`` 9-19 (the first 81).
"""

from __future__ import annotations

import os
from pathlib import Path

from npsemiseg.data.base import PairedLines
from npsemiseg.data.info import DATASETS
from npsemiseg.data.settings import VOC_SETTINGS, unimatch_v2_config

COCO_CLASSES: tuple[str, ...] = (
    "void", "person", "bicycle", "car", "motorcycle", "airplane", "bus", "train", "truck", "boat", "traffic light",
    "fire hydrant", "stop sign", "parking meter", "bench", "bird", "cat", "dog", "horse", "sheep", "cow", "elephant",
    "bear", "zebra", "giraffe", "backpack", "umbrella", "handbag", "tie", "suitcase", "frisbee", "skis", "snowboard",
    "sports ball", "kite", "baseball bat", "baseball glove", "skateboard", "surfboard", "tennis racket", "bottle",
    "wine glass", "cup", "fork", "knife", "spoon", "bowl", "banana", "apple", "sandwich", "orange", "broccoli",
    "carrot", "hot dog", "pizza", "donut", "cake", "chair", "couch", "potted plant", "bed", "dining table", "toilet",
    "tv", "laptop", "mouse", "remote", "keyboard", "cell phone", "microwave", "oven", "toaster", "sink",
    "refrigerator", "book", "clock", "vase", "scissors", "teddy bear", "hair drier", "toothbrush",
)
COCO_TRAIN_SIZE, COCO_VAL_SIZE = 118287, 5000

#: UniMatch V1's ``configs/coco.yaml`` (LiheYoung/UniMatch 0324f3d): crop 513 (4), 30 epochs (8), 2 per GPU x 4
#: GPUs (9), lr 0.004 (10) with the head at x10 (11), cross-entropy with 255 ignored (12-15), threshold 0.95 (16:
#: FixMatch's and UniMatch's default here); whole-image evaluation (``unimatch.py`` 222: "original" outside
#: Cityscapes). UniMatch V2's own (DINOv2) frameworks train at UniMatch V2's ``configs/coco.yaml`` (LiheYoung/UniMatch-V2
#: f6afb4d: crop 518 (5), 20 epochs (8), 4 per GPU x 4 (9), cross-entropy (12-15), whole images)
COCO_SETTINGS = VOC_SETTINGS.scaled(crop_size=513, batch=8, epochs=30, lr=4e-3, head_lr_mult=10.0,
                                    eval_mode="whole", eval_crop_size=None,
                                    publications=unimatch_v2_config("coco", 518, 20, 4))


@DATASETS.register("coco")
class COCO(PairedLines):
    """COCO: 232 / 463 / 925 / 1849 / 3697 labeled images (1/512 .. 1/32) of 118,287."""

    name = "coco"
    label = "COCO"
    class_names = COCO_CLASSES
    settings = COCO_SETTINGS
    partitions = {"232": 232, "463": 463, "925": 925, "1849": 1849, "3697": 3697}
    partition_aliases = {"1/512": "232", "1/256": "463", "1/128": "925", "1/64": "1849", "1/32": "3697"}
    list_folders = {"u2pl": "coco"}
    train_size, val_size = COCO_TRAIN_SIZE, COCO_VAL_SIZE
    root_marker = "masks"
    root_subfolders = ("coco",)
    layout = "train2017/<ID>.jpg or val2017/<ID>.jpg and masks/<ID>.png"
    layout_folders = ("train2017", "val2017", "masks")

    @classmethod
    def resolve_root(cls, root: str | os.PathLike | None = None) -> Path:
        """The base class's, with how to build a missing ``masks/``."""
        try:
            return super().resolve_root(root)
        except FileNotFoundError as error:
            raise FileNotFoundError(f"{error} (build masks/ from COCO's instances_*.json: `npsemiseg data prepare coco "
                                    "--root <COCO folder>`)") from None

    @classmethod
    def list_ids(cls, split: str, partition: str | None, partition_lists: str = "u2pl", root: Path | None = None) -> list[str]:
        """UniMatch's lines (``"train2017/<ID>.jpg masks/<ID>.png"``); unlabeled: every other image of ``train2017/``
        under ``root`` (sorted), which it needs."""
        if split != "unlabeled":
            return super().list_ids(split, partition, partition_lists, root)
        if root is None:
            raise ValueError("coco's unlabeled lists are every train2017 image that is not labeled: they need the data "
                             "root (pass root=... or set NPSEMISEG_DATA)")
        labeled = set(super().list_ids("labeled", partition, partition_lists, root))
        train = (f"train2017/{p.name} masks/{p.stem}.png" for p in sorted((root / "train2017").glob("*.jpg")))
        return [entry for entry in train if entry not in labeled]
