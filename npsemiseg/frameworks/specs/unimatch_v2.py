"""UniMatch V2 and its FixMatch row as a configuration sees them (their steps: ``npsemiseg.frameworks.unimatch_v2``):
the options and the publication settings of each official config (:meth:`UniMatchV2Spec.publication_values`)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from npsemiseg.data.settings import UNIMATCH_V2_GPUS, PaperSettings, Publication
from npsemiseg.frameworks.specs.base import FRAMEWORKS
from npsemiseg.frameworks.specs.fixmatch import FixMatchOptions, FixMatchSpec

#: (0.9, 0.999) (torch's AdamW default here) and weight decay 0.01 on every parameter (unimatch_v2.py 67-73); 4 GPUs
#: (README.md 134-135); the DINOv2-B encoder of every published table (README.md 36, 45, 53, 62; configs/*.yaml 20
#: ship dinov2_small)
OFFICIAL_LR_MULTI, OFFICIAL_WEIGHT_DECAY, OFFICIAL_GPUS = 40.0, 0.01, UNIMATCH_V2_GPUS
OFFICIAL_BACKBONE = "dinov2_b"
#: every published run trained the encoder: 'lock_backbone': False in the logs of Tables 1-4 (training-logs/
#: table0[1-4]-*.log, line 12; Cityscapes 15); configs/ade20k.yaml 21 ships True, the setting of Table 7's frozen-
#: encoder ablation (table07-*_frozen.log, line 12), which ``model.freeze_backbone=true`` runs
FROZEN_WHY = ("UniMatch-V2 training-logs/table0[1-4]-*.log 12 ('lock_backbone': False; configs/ade20k.yaml 21's True "
              "is Table 7's frozen-encoder ablation)")


_LOOP = "UniMatch-V2 unimatch_v2.py"


def shared_values(config: Publication) -> list[tuple[str, Any, str]]:
    """What every UniMatch V2 config sets alike (encoder, AdamW and its groups, schedule form, framework options),
    ``(key, value, why)``, the thresholds' line read from ``config``'s file (18 after an OHEM block, else 16)."""
    src = config.source
    return [
        ("model.backbone", OFFICIAL_BACKBONE, "UniMatch-V2 README.md 36, 45, 53, 62 (every published table: "
                                              f"DINOv2-Base; {src} 20 ships dinov2_small)"),
        ("model.weights", "timm", f"DINOv2 pretrained ({_LOOP} 61-62 loads pretrained/<backbone>.pth)"),
        ("model.aux_head", False, f"{_LOOP} 60 (the DPT has no auxiliary head)"),
        ("model.freeze_backbone", False, FROZEN_WHY),
        ("optim.name", "adamw", f"{_LOOP} 67-73"),
        ("optim.head_lr_mult", OFFICIAL_LR_MULTI, f"{src} 11, {_LOOP} 70"),
        ("optim.weight_decay", OFFICIAL_WEIGHT_DECAY, f"{_LOOP} 72"),
        ("optim.parameter_groups", "backbone_head", f"{_LOOP} 69-70"),
        ("optim.lr_scaling", "none", "UniMatch-V2 README.md 134-136 (4 GPUs; else adjust the LR by hand)"),
        ("schedule.epoch_length", "unlabeled", f"{_LOOP} 127 (len(trainloader_u) x epochs)"),
        ("schedule.poly_power", 0.9, f"{_LOOP} 217"),
        ("schedule.eval_every_epochs", 1, f"{_LOOP} 239-241 (after every epoch)"),
        ("framework_options.confidence_threshold", 0.95, f"{src} {18 if config.ohem else 16} (conf_thresh)"),
        ("framework_options.cutmix_p", 0.5, "UniMatch-V2 dataset/semi.py 58, 64"),
        ("framework_options.ema_decay", 0.996, f"{_LOOP} 221"),
        ("framework_options.comp_drop_kept", 0.5, "UniMatch-V2 model/semseg/dpt.py 153-154 (1 - dropout_prob)"),
    ]


def config_values(config: Publication) -> list[tuple[str, Any, str]]:
    """What a dataset's config file sets: LR, crop, batches (per GPU: the global batch over the 4 GPUs), epochs,
    the loss (OHEM with its threshold and minimum, or cross-entropy)."""
    src = config.source
    per_gpu = f"{src} 9 (per GPU) x {OFFICIAL_GPUS} GPUs (README.md 134-135)"
    batch = config.batch // OFFICIAL_GPUS
    values: list[tuple[str, Any, str]] = [
        ("optim.lr", config.lr, f"{src} 10"),
        ("optim.reference_batch", config.batch, per_gpu),
        ("schedule.crop_size", config.crop_size, f"{src} 5"),
        ("schedule.batch_size", batch, per_gpu),
        ("schedule.unlabeled_batch_size", batch, f"{src} 9 ({_LOOP} 113-120: both loaders)"),
        ("schedule.epochs", config.epochs, f"{src} 8"),
        ("loss.ohem", config.ohem is not None, f"{src} 12-17"),
    ]
    if config.ohem is not None:
        values += [("loss.ohem_thresh", config.ohem[0], f"{src} 16"), ("loss.ohem_min_kept", config.ohem[1], f"{src} 17")]
    return values


def evaluation_values(config: Publication) -> list[tuple[str, Any, str]]:
    """The evaluation of the official loop (unimatch_v2.py 239-240): sliding windows at the crop with stride 2/3 of
    it (Cityscapes' config), else the whole image resized to the nearest multiples of 14."""
    if config.eval_mode == "sliding":
        return [("evaluation.mode", "sliding", f"{_LOOP} 239"),
                ("evaluation.crop_size", config.crop_size, "UniMatch-V2 supervised.py 48 (the window: crop_size)"),
                ("evaluation.stride", int(config.crop_size * 2 / 3), "UniMatch-V2 supervised.py 60, 63"),
                ("evaluation.sliding_scheme", "unimatch_v2", "UniMatch-V2 supervised.py 52-63 (last window "
                                                              "shifted back, softmaxes summed)")]
    return [("evaluation.mode", "whole", f"{_LOOP} 239 ('original')"),
            ("evaluation.resize_multiple", 14, f"{_LOOP} 240, UniMatch-V2 supervised.py 70-81"),
            ("evaluation.resize_rounding", "nearest", "UniMatch-V2 supervised.py 75 (int(h / 14 + 0.5) x 14)")]


class UniMatchV2Options(FixMatchOptions):
    """UniMatch V2 options; defaults = the Pascal settings (configs/pascal.yaml 16, dpt.py 153-154, unimatch_v2.py 221)."""

    #: the fraction of strong-view pairs kept whole by the complementary dropout (dpt.py 153-154: 1 - dropout_prob)
    comp_drop_kept: float = Field(0.5, ge=0.0, le=1.0)
    ema_decay: float = Field(0.996, ge=0.0, le=1.0)


@FRAMEWORKS.register("unimatch_v2")
class UniMatchV2Spec(FixMatchSpec):
    """An EMA teacher's weak-view pseudo-labels; two strong views, batch-flipped CutMix, complementary dropout."""

    name = "unimatch_v2"
    implementation = "npsemiseg.frameworks.unimatch_v2:UniMatchV2"
    Options = UniMatchV2Options

    @classmethod
    def paper_options(cls, dataset: str, partition: str) -> dict[str, Any]:
        """Threshold 0.95 on every dataset (configs/pascal.yaml 16, configs/cityscapes.yaml 18)."""
        return cls.Options().model_dump()

    @classmethod
    def publication_values(cls, settings: PaperSettings) -> list[tuple[str, Any, str]]:
        """UniMatch V2's config for a dataset with ``settings`` (its entry for the framework,
        ``unimatch_v2_config``) as ``(key, value, why)``: what the ``paper`` preset's scale step sets for every head
        of this framework (the heads' study is on UniMatch V2's settings, which have no NP-SemiSeg configs of their
        own); none where the dataset has no UniMatch V2 config (the shared settings then). ``model.weights``: timm's
        DINOv2 weights (the official loads ``pretrained/<backbone>.pth``, unimatch_v2.py 61-62; give a local file with
        ``--set model.weights``)."""
        publication = cls.publication_on(settings)
        if publication is None:
            return []
        return shared_values(publication) + config_values(publication) + evaluation_values(publication)


@FRAMEWORKS.register("fixmatch_v2")
class FixMatchV2Spec(UniMatchV2Spec):
    """FixMatch as UniMatch V2's repository runs it (one strong view, no complementary dropout; the EMA teacher and
    the publication settings as UniMatch V2's)."""

    name = "fixmatch_v2"
    implementation = "npsemiseg.frameworks.unimatch_v2:FixMatchV2"
