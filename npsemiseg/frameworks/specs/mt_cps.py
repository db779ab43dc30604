"""CPS's mean teacher as a configuration sees it (its step: ``npsemiseg.frameworks.mt_cps``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from npsemiseg.frameworks.specs.base import FRAMEWORKS, FrameworkSpec
from npsemiseg.frameworks.specs.mt import MeanTeacherOptions


class CPSMeanTeacherOptions(MeanTeacherOptions):
    """CPS's MeanTeacher options (TorchSemiSeg MeanTeacher config.py: ``ema_decay`` 0.99, ``unsup_weight`` 100)."""

    mse_weight: float = Field(100.0, ge=0.0)
    #: ``split``: the labeled and the unlabeled half in two forwards (BN statistics per half, TorchSemiSeg train.py
    #: 180-181); ``joint``: one forward over both
    passes: Literal["joint", "split"] = "joint"
    #: ``before_unlabeled``: the EMA from the student before this step's optimiser step, before the teacher predicts
    #: the unlabeled half (network.py 39-41: between the two passes; with ``passes="joint"`` before the one
    #: pass); ``after_step``: after the optimiser step
    ema_timing: Literal["after_step", "before_unlabeled"] = "after_step"
    #: False: every train-only ``Dropout2d`` of the models becomes an identity (CPS's network has none)
    train_dropout: bool = True


@FRAMEWORKS.register("mt_cps")
class CPSMeanTeacherSpec(FrameworkSpec):
    """Student + one train-mode EMA teacher; MSE between their softmaxes on the same weak batch."""

    name = "mt_cps"
    implementation = "npsemiseg.frameworks.mt_cps:CPSMeanTeacher"
    Options = CPSMeanTeacherOptions
    # decoder and augmentation pipeline: the FrameworkSpec defaults (U2PL's), as ``mt``; its publication (crop 512,
    # batch 8, LR 0.01, 34 epochs on VOC; none on Cityscapes): the datasets' settings (pascal.py, cityscapes.py)
