"""The random rescale of a released MT cell is TorchSemiSeg's MeanTeacher ``TrainPre``: one of its six scales, OpenCV's
bilinear image and nearest label, the size floored (``tests/golden/mt_cps_rescale_released.npz``, recorded by
``tests/golden/record_mt_cps_rescale_golden.py``; source and command in ``mt_cps_rescale_released.json``).

Each recorded image goes through the released MT cell's whole weak pipeline (flip off) with the scale draw answered
by the recorded scale and a crop of the recorded output's size, which then neither pads nor moves; ours resizes the
[0, 1] image and normalises after, TorchSemiSeg the uint8 image (rounded to uint8) and normalises after, so ours is
normalised with the same mean and std and compared within one uint8 level (:data:`ATOL`, 1 / 255 over the smallest
std; measured 2026-11-30: 1.3e-2). Labels exact.
"""

from __future__ import annotations


import numpy as np
import pytest

from golden_files import check_views, recorded, sidecar, weak_view
from npsemiseg.config import cell_config, with_overrides
from npsemiseg.models.segmentor import IMAGENET_STD

SIDECAR = sidecar("mt_cps_rescale_released")
DATA = recorded("mt_cps_rescale_released")
CASES = range(len(SIDECAR["sizes"]["sides"]))
CELL = dict(framework="mt", dataset="pascal_classic", partition="92", head="baseline")
ATOL = 1 / 255 / min(IMAGENET_STD)

pytestmark = pytest.mark.usefixtures("single_seeded_thread")


def test_the_released_mt_cell_draws_torchsemiseg_scales_and_resamples_as_opencv():
    released = cell_config("paper", protocol="released", **CELL).data.augmentation
    assert released["scale_choices"] == SIDECAR["sizes"]["scales"] and released["resize_resample"] == "interpolate"
    corrected = cell_config("paper", protocol="corrected", **CELL).data.augmentation
    assert corrected.get("scale_choices") is None and corrected.get("resize_resample", "antialiased") == "antialiased"


def _rescaled(protocol: str, i: int) -> tuple[np.ndarray, np.ndarray]:
    """Recorded image ``i`` and its label through the ``protocol`` MT cell's weak pipeline at the recorded scale (its
    only choice), cropped to the recorded output's size: (normalised image, label)."""
    scale = float(DATA[f"scale{i}"])
    config = with_overrides(cell_config("paper", protocol=protocol, **CELL),
                            {"schedule.crop_size": int(DATA[f"resized_label{i}"].shape[0]),
                             "data.augmentation.flip": False, "data.augmentation.scale_choices": [scale]})
    return weak_view(config, DATA[f"image{i}"], DATA[f"label{i}"])


def test_released_rescale_reproduces_torchsemiseg_train_pre():
    check_views({i: _rescaled("released", i) for i in CASES}, DATA, "resized", ATOL)


def test_the_golden_tells_the_antialiased_rescale_apart():
    """Corrected (antialiased image, pixel-centred labels, the size rounded) moves the shrunk cases away from the
    record (0.5 and 0.75: the images blur, the labels shift)."""
    for i in CASES:
        if float(DATA[f"scale{i}"]) >= 1:
            continue
        image, label = _rescaled("corrected", i)
        assert not np.array_equal(label, DATA[f"resized_label{i}"]) or \
            float(np.abs(image - DATA[f"resized_image{i}"]).max()) > ATOL, f"case {i}: corrected equals the record"
