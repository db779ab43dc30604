"""The training crop of a released U2PL cell pads as U2PL's released ``Crop`` does: evenly, the label with 0
(``tests/golden/u2pl_label_pad_released.npz``, recorded by ``tests/golden/record_u2pl_label_pad_golden.py``;
source and command in ``u2pl_label_pad_released.json``).

Images at most the crop size on both sides, so the official random offset can only be 0 and the record is the
padding alone. The image and label go through the released cell's whole weak pipeline (resize and flip off); ours
pads the [0, 1] image with the ImageNet mean before normalisation, theirs the normalised image with 0, so ours is
normalised with the same mean and std before comparing. Tolerance: labels exact; images float32 round-off, 1e-5.
"""

from __future__ import annotations


import numpy as np
import pytest

from golden_files import check_views, recorded, sidecar, weak_view
from npsemiseg.config import cell_config, with_overrides
from npsemiseg.models.segmentor import IMAGENET_MEAN, IMAGENET_STD

SIDECAR = sidecar("u2pl_label_pad_released")
DATA = recorded("u2pl_label_pad_released")
CROP = SIDECAR["sizes"]["crop"]
SIZES = [tuple(size) for size in SIDECAR["sizes"]["images"]]
CELL = dict(framework="u2pl", dataset="pascal_classic", partition="92", head="baseline")
ATOL = 1e-5

pytestmark = pytest.mark.usefixtures("single_seeded_thread")


def test_the_released_protocol_pads_labels_with_background_evenly():
    released = cell_config("paper", protocol="released", **CELL).data.augmentation
    corrected = cell_config("paper", protocol="corrected", **CELL).data.augmentation
    assert released["label_pad_value"] == 0
    assert released.get("crop_padding", "centered") == "centered"  # switch crop_padding leaves U2PL's even padding
    assert corrected["label_pad_value"] == 255
    # the official normalisation is ours, in [0, 255]
    assert np.allclose(np.array(SIDECAR["sizes"]["mean"]) / 255, IMAGENET_MEAN, atol=1e-6)
    assert np.allclose(np.array(SIDECAR["sizes"]["std"]) / 255, IMAGENET_STD, atol=1e-6)


def _crop(protocol: str, i: int) -> tuple[np.ndarray, np.ndarray]:
    config = cell_config("paper", protocol=protocol, **CELL)
    config = with_overrides(config, {"schedule.crop_size": CROP, "data.augmentation.resize": "none",
                                     "data.augmentation.flip": False})
    return weak_view(config, DATA[f"image{i}"], DATA[f"label{i}"])


def test_released_crop_reproduces_u2pl_crop():
    views = {i: _crop("released", i) for i in range(len(SIZES))}
    assert all(label.shape == (CROP, CROP) for _, label in views.values())
    check_views(views, DATA, "cropped", ATOL)


def test_the_golden_tells_the_label_padding_apart():
    """Corrected (labels padded with 255) moves every label that needs padding away from the record."""
    for i, size in enumerate(SIZES):
        _, label = _crop("corrected", i)
        assert (not np.array_equal(label, DATA[f"cropped_label{i}"])) == (size != (CROP, CROP)), size
