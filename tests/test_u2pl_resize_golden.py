"""The random rescale of a released U2PL cell resamples as U2PL's released ``RandResize`` does: bilinear without
antialiasing, the label with torch's legacy nearest, the size floored (``tests/golden/u2pl_resize_released.npz``,
recorded by ``tests/golden/record_u2pl_resize_golden.py``; source and command in ``u2pl_resize_released.json``).

Each recorded image goes through the released cell's whole weak pipeline (flip off) at the recorded scale (the
pipeline's scale draw answered with it) and a crop of the recorded output's size, which then neither pads nor moves;
ours resizes the [0, 1] image and normalises after, theirs the normalised image (both linear), so ours is normalised
with the same mean and std before comparing. Tolerance: labels exact; images float32 round-off, :data:`ATOL`
(measured 2026-11-29: 4.8e-7).
"""

from __future__ import annotations


import numpy as np
import pytest

from golden_files import check_views, recorded, sidecar, weak_view
from npsemiseg.config import cell_config, with_overrides
from npsemiseg.data import transforms

SIDECAR = sidecar("u2pl_resize_released")
DATA = recorded("u2pl_resize_released")
CASES = range(len(SIDECAR["sizes"]["cases"]))
CELL = dict(framework="u2pl", dataset="pascal_classic", partition="92", head="baseline")
ATOL = 1e-5

pytestmark = pytest.mark.usefixtures("single_seeded_thread")


def test_the_released_protocol_resamples_as_u2pl():
    assert cell_config("paper", protocol="released", **CELL).data.augmentation["resize_resample"] == "interpolate"
    assert cell_config("paper", protocol="corrected", **CELL).data.augmentation["resize_resample"] == "antialiased"
    for framework in ("augseg", "unimatch", "psmt"):  # their official pipelines resample otherwise
        released = cell_config("paper", protocol="released", **dict(CELL, framework=framework))
        assert released.data.augmentation.get("resize_resample", "antialiased") == "antialiased", framework


def _rescaled(monkeypatch, protocol: str, i: int) -> tuple[np.ndarray, np.ndarray]:
    """Recorded image ``i`` and its label through the ``protocol`` cell's weak pipeline at the recorded scale, cropped
    to the recorded output's size: (normalised image, label)."""
    scale = float(DATA[f"scale{i}"])
    monkeypatch.setattr(transforms, "_uniform", lambda low, high: scale)
    config = with_overrides(cell_config("paper", protocol=protocol, **CELL),
                            {"schedule.crop_size": int(DATA[f"resized_label{i}"].shape[0]),
                             "data.augmentation.flip": False})
    assert config.data.augmentation["resize"] == "rescale_balanced"
    return weak_view(config, DATA[f"image{i}"], DATA[f"label{i}"])


def test_released_rescale_reproduces_u2pl_randresize(monkeypatch):
    check_views({i: _rescaled(monkeypatch, "released", i) for i in CASES}, DATA, "resized", ATOL)


def test_the_golden_tells_the_antialiased_rescale_apart(monkeypatch):
    """Corrected (antialiased image, pixel-centred labels, the size rounded) moves every case away from the record:
    the shrunk images blur, the labels shift, and where rounding gives another size the crop pads or cuts."""
    for i in CASES:
        image, label = _rescaled(monkeypatch, "corrected", i)
        moved = (not np.array_equal(label, DATA[f"resized_label{i}"])
                 or float(np.abs(image - DATA[f"resized_image{i}"]).max()) > ATOL)
        assert moved, f"case {i} (scale {float(DATA[f'scale{i}'])}): corrected equals the record"
