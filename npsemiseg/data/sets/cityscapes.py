"""Cityscapes (fine annotations), 19 train ids::

    <root>/leftImg8bit/<split>/<city>/<name>_leftImg8bit.png
    <root>/gtFine/<split>/<city>/<name>_gtFine_labelTrainIds.png    (0..18, 255)
        or, when absent, <name>_gtFine_labelIds.png (0..33, converted 34 -> 19 at every read;
        ``npsemiseg data prepare cityscapes`` writes the labelTrainIds files once)

List entries are the image paths. Lists: U2PL's (``splits/cityscapes``) and CPS's (``splits/cityscapes_cps``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from npsemiseg.data.base import DatasetDef, ItemFiles
from npsemiseg.data.datasets import CITYSCAPES_NUM_LABEL_IDS, cityscapes_label_paths, cityscapes_labelids_to_trainids
from npsemiseg.data.info import CITYSCAPES_CLASSES, DATASETS, fraction_partitions
from npsemiseg.data.settings import CITYSCAPES_SETTINGS, Publication, unimatch_v2_config

if TYPE_CHECKING:
    import numpy as np

CITYSCAPES_TRAIN_SIZE = 2975
_PARTITIONS, _ALIASES = fraction_partitions((186, 372, 744, 1488))

#: U2PL@ab3d2be experiments/cityscapes/744/ours/config.yaml 12, 19: crop 769, 2 per GPU x 8 GPUs (the shared
#: trainer's: the supervised reference and the shared-trainer MT follow it; CPS's MeanTeacher has no Cityscapes
#: config, U2PL's stands in for it)
_U2PL = Publication(769, 16)
#: UniMatch@0324f3d configs/cityscapes.yaml 4, 8-11: crop 801, 240 epochs, 2 per GPU x 4 GPUs, lr 0.005 (x1)
_UNIMATCH = Publication(801, 8, lr=5e-3, epochs=240)
#: UniMatch@0324f3d configs/cityscapes.yaml 18: conf_thresh 0 (every pixel)
_UNIMATCH_OPTIONS = {"confidence_threshold": 0.0}
#: AugSeg@7ead870 exps/zrun_citys/r50_citys_semi744/config_semi.yaml 9, 15: crop 800, 4 per GPU x 4 GPUs
#: (scripts/zsing_run_citys.sh 2: ngpu=4)
_AUGSEG = Publication(800, 16)

#: what the frameworks' publications set on Cityscapes
CITYSCAPES_PAPER_SETTINGS = CITYSCAPES_SETTINGS.scaled(
    publications={
        "supervised": _U2PL, "mt": _U2PL, "u2pl": _U2PL, "mt_cps": _U2PL,
        "fixmatch": _UNIMATCH, "unimatch": _UNIMATCH, "augseg": _AUGSEG,
        # PS-MT@058cdc3 docs/before_start.md, CityCode/configs/config_deeplab_v3+.json 25 (lr 4.5e-3, not scaled:
        # main.py leaves the config's LR) at 2 GPUs x 4 (scripts/train_city.sh --batch_size=4), crop 800;
        # scripts/train_city.sh 40-45: 450 epochs on 744 labeled images, 550 on 1488, else 320
        "psmt": Publication(800, 8, lr=4.5e-3, epochs=320, partition_epochs={"744": 450, "1488": 550}),
        # UniMatch-V2@f6afb4d configs/cityscapes.yaml 5, 8-9, 13-17: crop 798, 180 epochs, 2 per GPU x 4, OHEM 0.7
        # with at least 200,000 pixels; sliding windows at the crop (unimatch_v2.py 239, supervised.py 47-63)
        **unimatch_v2_config("cityscapes", 798, 180, 2, ohem=(0.7, 200_000), eval_mode="sliding"),
    },
    framework_options={
        "fixmatch": _UNIMATCH_OPTIONS, "unimatch": _UNIMATCH_OPTIONS,
        # U2PL@ab3d2be experiments/cityscapes/744/ours/config.yaml 30: sup_only_epoch 0 (the shared trainer's)
        "mt": {"sup_only_epochs": 0}, "u2pl": {"sup_only_epochs": 0},
        # PS-MT@058cdc3 CityCode/configs/config_deeplab_v3+.json 6 (unsupervised_w 3.0), CityCode/train.py 96-101
        # (three CutMix boxes of rand_bbox_2), CityCode/train.py 31-36 (SlidingEval with val_id=1: teacher 1 alone)
        "psmt": {"unsup_weight": 3.0, "cutmix_boxes": "random_boxes", "eval_teachers": "first"},
        # NP-SemiSeg@afd9672 AugSeg/exps/zrun_citys/r50_citys_semi744/config_semi.yaml 78 (ema_decay 0.996), 51
        # (threshold -0.7: every pixel, as 0 here), 52 (loss_weight 2.0; AugSeg@7ead870's own config: 1.0)
        "augseg": {"ema_decay": 0.996, "confidence_threshold": 0.0, "unsup_weight": 2.0},
    },
    # NP-SemiSeg@afd9672 AugSeg/exps/zrun_citys/r50_citys_semi744/config_semi.yaml 36: 240 epochs, the shared schedule
    # of every head of AugSeg on Cityscapes
    framework_epochs={"augseg": 240},
)


@DATASETS.register("cityscapes")
class Cityscapes(DatasetDef):
    """Cityscapes: 186 / 372 / 744 / 1488 labeled images of 2,975; sliding-window evaluation at 769 px."""

    name = "cityscapes"
    label = "Cityscapes"
    class_names = CITYSCAPES_CLASSES
    settings = CITYSCAPES_PAPER_SETTINGS
    partitions = _PARTITIONS
    partition_aliases = _ALIASES
    partition_list_sources = ("u2pl", "cps")
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
