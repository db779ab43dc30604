"""Evaluation: mIoU, PAvPU and calibration metrics, inference modes (whole / center crop /
sliding / sliding with one global NP latent), ``evaluate``, figures and timing."""

from npsemiseg.evaluation.calibration import Calibration
from npsemiseg.evaluation.evaluator import evaluate
from npsemiseg.evaluation.inference import (
    MODES,
    SLIDING_SCHEMES,
    SlidingScheme,
    center_crop,
    center_crop_box,
    predict,
    sliding_windows,
)
from npsemiseg.evaluation.metrics import (
    ConfusionMatrix,
    PAvPU,
    confusion_matrix,
    iou_from_confusion,
    miou,
    pavpu,
    pavpu_counts,
)
from npsemiseg.evaluation.timing import Timing, time_interleaved, time_prediction
from npsemiseg.evaluation.visualize import save_reliability_diagram, save_uncertainty_figure, uncertainty_panel

__all__ = [
    "MODES",
    "SLIDING_SCHEMES",
    "Calibration",
    "ConfusionMatrix",
    "PAvPU",
    "SlidingScheme",
    "Timing",
    "center_crop",
    "center_crop_box",
    "confusion_matrix",
    "evaluate",
    "iou_from_confusion",
    "miou",
    "pavpu",
    "pavpu_counts",
    "predict",
    "save_reliability_diagram",
    "save_uncertainty_figure",
    "sliding_windows",
    "time_interleaved",
    "time_prediction",
    "uncertainty_panel",
]
