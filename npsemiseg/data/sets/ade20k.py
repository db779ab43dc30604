"""ADE20K (SceneParsing, ``ADEChallengeData2016``), 150 classes, as UniMatch V2 benchmarks it::

    <root>/images/training/ADE_train_<8 digits>.jpg        20,210 train images
    <root>/images/validation/ADE_val_<8 digits>.jpg        2,000 val images
    <root>/annotations/training/ADE_train_<8 digits>.png   index PNG: 0 = "other" (ignored), 1..150 = the classes
    <root>/annotations/validation/ADE_val_<8 digits>.png

The official annotations are read as released: 0 -> 255 (ignored), k -> k - 1 (mmsegmentation's
``reduce_zero_label``); UniMatch V2's own download of the annotations is pre-processed (README "The ADE20K and
COCO annotations have already been pre-processed by us"): use the official ``ADEChallengeData2016.zip``.

Lists: UniMatch V2's ``splits/ade20k/1_64 .. 1_2/labeled.txt`` and ``val.txt`` (LiheYoung/UniMatch-V2 at
f6afb4d, copied line for line into ``npsemiseg/data/splits/ade20k/<count>/``); each partition's unlabeled list is
every other train image (the complement: UniMatch V2's ``unlabeled.txt`` files are exactly that, checked against
its ``splits/ade20k/all/labeled.txt`` when the lists were copied), derived here instead of copied (10 MB).
Classes: UniMatch V2's ``util/classes.py`` 33-56.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from npsemiseg.data.base import ItemFiles, PairedLines
from npsemiseg.data.info import DATASETS
from npsemiseg.data.settings import VOC_SETTINGS, Publication, unimatch_v2_config

if TYPE_CHECKING:
    import numpy as np

ADE20K_CLASSES: tuple[str, ...] = (
    "wall", "building", "sky", "floor", "tree", "ceiling", "road", "bed", "windowpane", "grass", "cabinet",
    "sidewalk", "person", "earth", "door", "table", "mountain", "plant", "curtain", "chair", "car", "water",
    "painting", "sofa", "shelf", "house", "sea", "mirror", "rug", "field", "armchair", "seat", "fence", "desk",
    "rock", "wardrobe", "lamp", "bathtub", "railing", "cushion", "base", "box", "column", "signboard",
    "chest of drawers", "counter", "sand", "sink", "skyscraper", "fireplace", "refrigerator", "grandstand", "path",
    "stairs", "runway", "case", "pool table", "pillow", "screen door", "stairway", "river", "bridge", "bookcase",
    "blind", "coffee table", "toilet", "flower", "book", "hill", "bench", "countertop", "stove", "palm",
    "kitchen island", "computer", "swivel chair", "boat", "bar", "arcade machine", "hovel", "bus", "towel", "light",
    "truck", "tower", "chandelier", "awning", "streetlight", "booth", "television receiver", "airplane",
    "dirt track", "apparel", "pole", "land", "bannister", "escalator", "ottoman", "bottle", "buffet", "poster",
    "stage", "van", "ship", "fountain", "conveyer belt", "canopy", "washer", "plaything", "swimming pool", "stool",
    "barrel", "basket", "waterfall", "tent", "bag", "minibike", "cradle", "oven", "ball", "food", "step", "tank",
    "trade name", "microwave", "pot", "animal", "bicycle", "lake", "dishwasher", "screen", "blanket", "sculpture",
    "hood", "sconce", "vase", "traffic light", "tray", "ashcan", "fan", "pier", "crt screen", "plate", "monitor",
    "bulletin board", "shower", "radiator", "glass", "clock", "flag",
)
ADE20K_TRAIN_SIZE, ADE20K_VAL_SIZE = 20210, 2000

#: UniMatch V2's ``configs/ade20k.yaml``: crop 518 (5), 60 epochs (8), 2 per GPU x 4 GPUs (9), cross-entropy with
#: 255 ignored (12-15), confidence threshold 0.95 (16, FixMatch's and UniMatch's default here); whole-image
#: evaluation (``unimatch_v2.py`` 239: "original" outside Cityscapes). Its LR (5e-6, x40 for the head, 10-11) is a
#: DINOv2 encoder's: kept as UniMatch's publication below; the shared LR is UniMatch V1's ResNet-era one on its
#: other large benchmark (COCO, LiheYoung/UniMatch ``configs/coco.yaml`` 10-11: 0.004, head x10), as no
#: ResNet-based publication trains these frameworks on ADE20K. UniMatch V2's own (DINOv2) frameworks train at the
#: whole config (``unimatch_v2_config``: crop 518, 60 epochs, 2 per GPU x 4, cross-entropy, whole images)
ADE20K_SETTINGS = VOC_SETTINGS.scaled(
    crop_size=518, batch=8, epochs=60, lr=4e-3, head_lr_mult=10.0, eval_mode="whole", eval_crop_size=None,
    publications={"unimatch": Publication(518, 8, lr=5e-6, epochs=60), **unimatch_v2_config("ade20k", 518, 60, 2)},
)


@DATASETS.register("ade20k")
class ADE20K(PairedLines):
    """ADE20K: 316 / 631 / 1263 / 2526 / 5052 / 10105 labeled images (1/64 .. 1/2) of 20,210."""

    name = "ade20k"
    label = "ADE20K"
    class_names = ADE20K_CLASSES
    settings = ADE20K_SETTINGS
    partitions = {"316": 316, "631": 631, "1263": 1263, "2526": 2526, "5052": 5052, "10105": 10105}
    partition_aliases = {"1/64": "316", "1/32": "631", "1/16": "1263", "1/8": "2526", "1/4": "5052", "1/2": "10105"}
    list_folders = {"u2pl": "ade20k"}
    train_size, val_size = ADE20K_TRAIN_SIZE, ADE20K_VAL_SIZE
    root_marker = "annotations"
    root_subfolders = ("ADEChallengeData2016", "ade20k")
    layout = "images/<training|validation>/<ID>.jpg and annotations/<training|validation>/<ID>.png"
    layout_folders = ("images/training", "images/validation", "annotations/training", "annotations/validation")

    @classmethod
    def list_ids(cls, split: str, partition: str | None, partition_lists: str = "u2pl", root: Path | None = None) -> list[str]:
        """UniMatch V2's lines (``"images/... annotations/..."``); unlabeled: every train image not labeled."""
        if split != "unlabeled":
            return super().list_ids(split, partition, partition_lists, root)
        labeled = set(super().list_ids("labeled", partition, partition_lists, root))
        train = (f"images/training/ADE_train_{i:08d}.jpg annotations/training/ADE_train_{i:08d}.png"
                 for i in range(1, ADE20K_TRAIN_SIZE + 1))
        return [entry for entry in train if entry not in labeled]

    @classmethod
    def label_kind(cls, index: int) -> tuple[int, str, bool]:
        """The released values: 0 (other, ignored) and the classes 1..150, shifted when read."""
        return len(cls.class_names), "ADE20K annotation values (0 = other)", True

    @classmethod
    def convert_label(cls, array: np.ndarray, files: ItemFiles) -> np.ndarray:
        """0 -> 255, k -> k - 1 (255 stays 255)."""
        import numpy as np

        return np.where((array == 0) | (array == 255), 255, array.astype(np.int16) - 1).astype(np.uint8)
