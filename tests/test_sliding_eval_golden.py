"""UniMatch's and FixMatch's Cityscapes evaluation under the released options reproduces what UniMatch's released
``evaluate`` predicted on the same images (``tests/golden/sliding_eval_released.npz``, recorded by
``tests/golden/record_sliding_eval_golden.py``; source and command in ``sliding_eval_released.json``).

Same images and network (the recorder's :class:`Net`), windows of 8 pixels at stride ``int(8 x 2 / 3)`` = 5, the
scheme the released configuration names (switch ``unimatch_eval_scheme``: ``augseg``, windows cut at the border,
probabilities summed). Compared exactly: the windows, the predicted classes and the per-class IoU. AugSeg's
``validate_citys`` is the same loop (switch ``augseg_eval_scheme``).
"""

from __future__ import annotations


import numpy as np
import pytest
import torch
from torch import nn

from golden_files import recorded, recorder
from npsemiseg.config import compose, with_overrides
from npsemiseg.evaluation.inference import SLIDING_SCHEMES, SlidingScheme, predict, sliding_windows
from npsemiseg.heads.base import HeadOutput
from npsemiseg.models import SegmentorOutput


pytestmark = pytest.mark.usefixtures("single_seeded_thread")



REC = recorder("sliding_eval")
DATA = recorded("sliding_eval_released")
STRIDE = int(REC.GRID * 2 / 3)  # UniMatch's int(grid * 2 / 3): 5


class _Segmentor(nn.Module):
    """The recorder's network as a Segmentor: logits ``[1, B, K, h, w]`` at the window's size."""

    align_corners = True
    head = None  # deterministic

    def __init__(self) -> None:
        super().__init__()
        self.net = REC.Net()

    def forward(self, images, *, num_samples=None, latent=None):
        logits = self.net.classifier(torch.relu(self.net.conv(images))).unsqueeze(0)
        return SegmentorOutput(images, HeadOutput(logits, logits.new_zeros(()), {}), None, None)


def _classes(scheme: str) -> list[np.ndarray]:
    model = _Segmentor().eval()
    return [predict(model, torch.from_numpy(DATA[f"image{i}"]), mode="sliding", crop_size=REC.GRID, stride=STRIDE,
                    scheme=scheme)[0].argmax(1).numpy() for i in range(len(REC.SIZES))]


def _released_cityscapes(framework: str):
    return compose("paper", framework=framework, dataset="cityscapes", partition="186", head="np",
                   protocol="released").config


@pytest.mark.parametrize("framework", ["unimatch", "fixmatch"])
def test_released_cityscapes_cells_slide_as_unimatch(framework):
    released = _released_cityscapes(framework)
    assert (released.evaluation.mode, released.evaluation.sliding_scheme) == ("sliding", "augseg")
    assert released.evaluation.stride == int(released.evaluation.crop_size * 2 / 3) == 534
    corrected = compose("paper", framework=framework, dataset="cityscapes", partition="186", head="np",
                        protocol="corrected").config
    assert corrected.evaluation.sliding_scheme == "u2pl"


def test_released_scheme_reproduces_unimatch_evaluate():
    scheme = _released_cityscapes("unimatch").evaluation.sliding_scheme
    windows = [[rows.start, rows.stop, cols.start, cols.stop]
               for height, width in REC.SIZES
               for rows, cols in sliding_windows(height, width, SlidingScheme(REC.GRID, STRIDE, *_fields(scheme)))]
    assert windows == DATA["windows"].tolist()
    for i, ours in enumerate(_classes(scheme)):
        assert np.array_equal(ours, DATA[f"classes{i}"]), f"image {i}: {(ours != DATA[f'classes{i}']).sum()} pixels differ"


def _fields(scheme: str) -> tuple[str, str]:
    named = SLIDING_SCHEMES[scheme]
    return named.placement, named.combine


def test_the_golden_tells_the_schemes_apart():
    """The corrected scheme (last window shifted inside, logits averaged) predicts other classes on the golden's
    images, and places other windows where a side is longer than the stride."""
    differing = sum(int((ours != DATA[f"classes{i}"]).sum()) for i, ours in enumerate(_classes("u2pl")))
    assert differing > 0
    shifted = [(rows.start, rows.stop) for rows, _ in sliding_windows(7, 12, SlidingScheme(REC.GRID, STRIDE))]
    assert shifted == [(0, 7)] * 2  # one row of windows: 7 <= 8, where the official loop cuts a second at row 5


def test_a_released_run_evaluates_as_unimatch():
    """The run's evaluation (``evaluate_model`` with a released UniMatch Cityscapes-like cell, windows set to the
    golden's): pixel accuracy and every per-class IoU of the official evaluation (in percent there)."""
    from npsemiseg.training.artifacts import evaluate_model

    config = compose("smoke", framework="unimatch", dataset="synthetic_cityscapes", partition="1/8", head="baseline",
                     protocol="released").config
    assert config.evaluation.sliding_scheme == "augseg"
    config = with_overrides(config, {"evaluation.mode": "sliding", "evaluation.crop_size": REC.GRID,
                                     "evaluation.stride": STRIDE, "evaluation.max_images": None})
    val = [{"image": torch.from_numpy(DATA[f"image{i}"][0]), "label": torch.from_numpy(DATA[f"label{i}"][0])}
           for i in range(len(REC.SIZES))]
    metrics = evaluate_model(_Segmentor(), val, config, step=0, device=torch.device("cpu"))
    correct = sum(int((DATA[f"classes{i}"] == DATA[f"label{i}"]).sum()) for i in range(len(REC.SIZES)))
    pixels = sum(DATA[f"label{i}"].size for i in range(len(REC.SIZES)))
    assert metrics["pixel_acc"] == pytest.approx(correct / pixels, abs=1e-12)
    names = config.dataset_info.class_names
    for k, theirs in enumerate(DATA["iou_class"]):
        ours = metrics[f"iou/{names[k]}"]
        if np.isnan(ours):  # a class neither predicted nor labelled: 0 there (0 / 1e-10)
            assert theirs == 0
        else:
            assert ours * 100 == pytest.approx(theirs, abs=1e-9), names[k]
