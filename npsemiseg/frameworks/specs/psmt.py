"""PS-MT as a configuration sees it (its step: ``npsemiseg.frameworks.psmt``)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from npsemiseg.frameworks.specs.base import FRAMEWORKS, FrameworkOptions, FrameworkSpec


class PSMTOptions(FrameworkOptions):
    """PS-MT options; defaults = the VOC blender settings (a dataset's settings change them for it)."""

    ema_keep_rate: float = Field(0.996, ge=0.0, le=1.0)
    unsup_weight: float = Field(1.5, ge=0.0)
    rampup_epochs: float = Field(12.0, ge=0.0)
    confidence_threshold: float = Field(0.6, ge=0.0, le=1.0)
    gamma: float = Field(0.5, ge=0.0, le=1.0)
    assist_topk: int = Field(7, ge=1)
    tvat: bool = True
    tvat_xi: float = Field(1e-6, gt=0.0)
    tvat_eps: float = Field(2.0, ge=0.0)
    tvat_iterations: int = Field(1, ge=1)
    tvat_released_normalization: bool = False
    #: the KL of the T-VAT search between crop-size predictions (the released decoder upsamples first)
    #: instead of feature-size ones; switch ``psmt_tvat_crop_kl``
    tvat_kl_at_crop_size: bool = False
    #: the T-VAT search run once on the labeled and once on the unlabeled features (the released decoder's two
    #: calls) instead of once on the whole batch; switch ``psmt_tvat_per_batch`` (with ``student_passes="split"``
    #: each pass searches its own part whatever this says)
    tvat_per_batch: bool = False
    #: the CutMix box scheme (``npsemiseg.data.mixing.psmt_cutmix``): ``beta_box`` (PS-MT's VOC code) or
    #: ``random_boxes`` (its Cityscapes code); records before the rename say ``cutmix_variant: voc / cityscapes``
    #: (read as these: ``npsemiseg.renames``)
    cutmix_boxes: Literal["beta_box", "random_boxes"] = "beta_box"
    eval_teachers: Literal["both", "first"] = "both"
    #: how both teachers are averaged at evaluation: their per-sample softmaxes (``probabilities``) or their
    #: logits (``logits``, the released VOC evaluation); switch ``psmt_eval_logits``
    eval_average: Literal["probabilities", "logits"] = "probabilities"
    strong_labeled: bool = True
    warmup_epochs: int = Field(0, ge=0)
    #: the warm-up teachers' backbones (only with ``warmup_epochs`` > 0): the run's weights (``pretrained``) or a
    #: random initialisation (``scratch``: the released EntireModel.py 15-20 builds encoder1 and encoder2 with
    #: ``pretrained_model=None``, the student's encoder_s from the ImageNet file); switch psmt_warmup_teachers_scratch
    warmup_teacher_backbones: Literal["pretrained", "scratch"] = "pretrained"
    teacher_train_mode: bool = False
    #: one student pass over labeled + unlabeled images (``joint``) or one per part (``split``, the released
    #: EntireModel.py 60 and 64); switch ``psmt_split_passes``
    student_passes: Literal["joint", "split"] = "joint"


@FRAMEWORKS.register("psmt")
class PSMTSpec(FrameworkSpec):
    """One student, two alternating EMA teachers, T-VAT and confidence-weighted CE."""

    name = "psmt"
    implementation = "npsemiseg.frameworks.psmt:PSMT"
    decoder = "psmt"
    augmentation = "psmt"
    Options = PSMTOptions
    # its publications (crop, batch, LR, epochs per partition) and options per dataset (unsupervised weight, box
    # scheme, evaluated teachers): the datasets' settings (pascal.py, cityscapes.py: PS-MT@058cdc3's scripts/configs)

    @classmethod
    def paper_options(cls, dataset: str, partition: str) -> dict[str, Any]:
        """The options' defaults (VOC blender's: unsupervised weight 1.5, one Beta box, both teachers evaluated); a
        dataset's settings change them (VOC classic's weight, Cityscapes')."""
        return PSMTOptions().model_dump()
