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
from npsemiseg.data.settings import VOC_SETTINGS, Publication

#: the "aug" train set (VOC 2012 train + SBD): the denominator of both datasets' label ratios
VOC_TRAIN_AUG_SIZE = 10582

#: U2PL@ab3d2be experiments/pascal/1464/ours/config.yaml 12, 19, 28: crop 513, 4 per GPU x 4 GPUs, 80 epochs (the
#: shared trainer's: the supervised reference and the shared-trainer MT follow it)
_U2PL = Publication(513, 16)
#: UniMatch@0324f3d configs/pascal.yaml 4, 8-11: crop 321, 80 epochs, 2 per GPU x 4 GPUs, lr 0.001 (x10 for the
#: decoder); FixMatch and UniMatch share the file
_UNIMATCH = Publication(321, 8, lr=1e-3, epochs=80)
#: PS-MT@058cdc3 docs/before_start.md and VocCode configs: crop 512, 4 GPUs x 8 = 32; scripts/train_voc_*.sh pass
#: --learning-rate=2.5e-3, which VocCode/main.py 194-200 multiplies by the world size (4): 0.01, one LR for all
#: parameters (switch ``psmt_single_lr``; ``optim.lr_scaling=linear`` with ``optim.reference_batch`` 32 scales it
#: with the GPUs as PS-MT does); epochs: scripts/train_voc_hq.sh 46 (classic: 80), train_voc_blender.sh 41-45
#: (blender 662 / 1323: 80, 2646: 200, 5291: 300)
_PSMT_EPOCHS = 80
#: CPS's MeanTeacher as run (TorchSemiSeg@5e0c29c exp.voc/voc8.res50v3+.MeanTeacher): crop 512 (config.py 81-82),
#: global batch 8 (script.sh ``batch_size=8``; dataloader.py 86-91 splits it over NGPUS=4: 2 labeled + 2 unlabeled
#: per GPU; config.py's default 16 is overridden), script.sh ``learning_rate=0.0025`` x world size 4 (train.py
#: 91-93) = 0.01, one LR for backbone and head (train.py 95-100; switch ``mt_single_lr``), 34 epochs (config.py 102,
#: ``C.nepochs = 34``)
_MT_CPS = Publication(512, 8, lr=1e-2, epochs=34)
#: AugSeg@7ead870 exps/zrun_vocs/r50_voc_semi662/config_semi.yaml 9, 15: crop 513, 8 per GPU x 2 GPUs
#: (scripts/zsing_run_voc.sh 2: ngpu=2)
_AUGSEG = Publication(513, 16)

#: what the frameworks' publications set on PASCAL VOC (both datasets; PS-MT's differ per dataset, below)
PASCAL_SETTINGS = VOC_SETTINGS.scaled(
    # UniMatch V2's configs/pascal.yaml: VOC_SETTINGS' publication (npsemiseg/data/settings.py)
    publications={**VOC_SETTINGS.publications,
                  "supervised": _U2PL, "mt": _U2PL, "u2pl": _U2PL, "fixmatch": _UNIMATCH, "unimatch": _UNIMATCH,
                  "mt_cps": _MT_CPS, "psmt": Publication(512, 32, lr=1e-2, epochs=_PSMT_EPOCHS), "augseg": _AUGSEG},
    framework_options={
        # UniMatch@0324f3d configs/pascal.yaml 16: conf_thresh 0.95
        "fixmatch": {"confidence_threshold": 0.95}, "unimatch": {"confidence_threshold": 0.95},
    },
    # NP-SemiSeg@afd9672 AugSeg/exps/zrun_vocs/r50_voc_semi732/config_semi.yaml 9, 15 (batch_size 2, crop 480) with
    # scripts/zsing_run_voc.sh 2 (ngpu=4): 8 labeled images in all where the paper says 12; its LR stays 0.001 (43)
    np_configs={"augseg": (480, 8)},
)


class PascalVOC(DatasetDef):
    """What both PASCAL datasets share: classes, layout, root, paper settings (:data:`PASCAL_SETTINGS`)."""

    class_names = VOC_CLASSES
    settings = PASCAL_SETTINGS
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
    partition_list_sources = ("u2pl",)
    list_folders = {"u2pl": "pascal_classic"}
    #: PS-MT@058cdc3 scripts/train_voc_hq.sh 40-44: unsupervised weight 0.06 on 92 labeled images, 0.6 on the others
    settings = PASCAL_SETTINGS.scaled(
        framework_options={**PASCAL_SETTINGS.framework_options, "psmt": {"unsup_weight": 0.6}},
        partition_options={"psmt": {"92": {"unsup_weight": 0.06}}},
    )


@DATASETS.register("pascal_blender")
class PascalBlender(PascalVOC):
    """VOC blender: 662 / 1323 / 2646 / 5291 labeled images of the aug set; U2PL's and CPS's lists."""

    name = "pascal_blender"
    label = "VOC (blender)"
    latex_label = "VOC (\\it blender)"
    partitions = _BLENDER_PARTITIONS
    partition_aliases = _BLENDER_ALIASES
    partition_list_sources = ("u2pl", "cps")
    list_folders = {"u2pl": "pascal_blender", "cps": "pascal_blender_cps"}
    #: PS-MT@058cdc3 scripts/train_voc_blender.sh 40-47: 200 epochs on 2646 labeled images, 300 on 5291, else 80;
    #: unsupervised weight 1.5 (PS-MT's option default)
    settings = PASCAL_SETTINGS.scaled(publications={
        **PASCAL_SETTINGS.publications,
        "psmt": Publication(512, 32, lr=1e-2, epochs=_PSMT_EPOCHS, partition_epochs={"2646": 200, "5291": 300})})
