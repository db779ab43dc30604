"""Evaluation: mIoU, PAvPU, calibration, inference modes (whole / center crop / sliding), timing."""

from npsemiseg.evaluation.calibration import Calibration
from npsemiseg.evaluation.metrics import ConfusionMatrix, PAvPU, iou_from_confusion, miou, pavpu

__all__ = ["Calibration", "ConfusionMatrix", "PAvPU", "iou_from_confusion", "miou", "pavpu"]
