"""The mean teacher as a configuration sees it (its step: ``npsemiseg.frameworks.mt``)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from npsemiseg.frameworks.specs.base import FRAMEWORKS, FrameworkOptions, FrameworkSpec


class MeanTeacherOptions(FrameworkOptions):
    """What both mean teachers (``mt``, ``mt_cps``) take: the teacher's EMA decay."""

    ema_decay: float = Field(0.99, ge=0.0, le=1.0)


class MTOptions(MeanTeacherOptions):
    """Mean teacher options (defaults = the shared-trainer MT, ``docs/frameworks.md``)."""

    unsup_weight: float = Field(1.0, ge=0.0)
    cutmix_prob: float = Field(0.5, ge=0.0, le=1.0)
    confidence_threshold: float = Field(0.0, ge=0.0, le=1.0)
    sup_only_epochs: int = Field(0, ge=0)


@FRAMEWORKS.register("mt")
class MeanTeacherSpec(FrameworkSpec):
    """Student + one EMA teacher; hard pseudo-labels on CutMixed unlabeled images."""

    name = "mt"
    implementation = "npsemiseg.frameworks.mt:MeanTeacher"
    Options = MTOptions
    # decoder, augmentation and publication settings: the shared trainer's, U2PL's (the FrameworkSpec defaults);
    # CPS's MeanTeacher's publication settings, LR and epochs are those of ``mt_cps``

    @classmethod
    def paper_options(cls, dataset: str, partition: str) -> dict[str, Any]:
        """The shared U2PL trainer's schedule: one supervised-only epoch (U2PL@ab3d2be train_semi.py 205, 288:
        ``sup_only_epoch`` defaults to 1); a dataset's settings change it (Cityscapes' config: 0)."""
        return MTOptions(sup_only_epochs=1).model_dump()
