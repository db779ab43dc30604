"""The training crop under ``protocol: released`` pads as UniMatch's released ``crop`` does
(``tests/golden/crop_padding_released.npz``, recorded by ``tests/golden/record_crop_padding_golden.py``; source and
command in ``crop_padding_released.json``).

Images at most the crop size on both sides, so the official random offset can only be 0 and the record is the
padding alone: the image at the top left, the rest of the crop filled. The label goes through the released
cell's whole weak pipeline (resize and flip off); the image through :class:`PadCrop` with the released placement
and the official image fill (0; ours fills with the ImageNet mean, zero after normalisation, which this does not
compare). Tolerance: exact equality (integer pixels): max |difference| 0.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torchvision import tv_tensors

from golden_files import recorded, sidecar
from npsemiseg.config import cell_config, with_overrides
from npsemiseg.data.transforms import PadCrop
from npsemiseg.training import train_transforms

SIDECAR = sidecar("crop_padding_released")
DATA = recorded("crop_padding_released")
CROP = SIDECAR["sizes"]["crop"]
SIZES = [tuple(size) for size in SIDECAR["sizes"]["images"]]
CELL = dict(framework="unimatch", dataset="pascal_classic", partition="92", head="baseline")

pytestmark = pytest.mark.usefixtures("single_seeded_thread")


@pytest.mark.parametrize("framework", ["unimatch", "fixmatch", "psmt", "augseg"])
def test_the_released_protocol_pads_on_the_bottom_and_right(framework):
    cell = dict(CELL, framework=framework)
    assert cell_config("paper", protocol="released", **cell).data.augmentation["crop_padding"] == "bottom_right"
    assert cell_config("paper", protocol="corrected", **cell).data.augmentation["crop_padding"] == "centered"


def _labels(protocol: str, i: int) -> np.ndarray:
    config = cell_config("paper", protocol=protocol, **CELL)
    config = with_overrides(config, {"schedule.crop_size": CROP, "data.augmentation.resize": "none",
                                     "data.augmentation.flip": False})
    item = {"image": torch.rand(3, *SIZES[i]), "label": torch.from_numpy(DATA[f"mask{i}"]).long(), "id": str(i)}
    return train_transforms(config)["labeled"](item)["label"].numpy()


def _image(padding: str, i: int) -> np.ndarray:
    image = tv_tensors.Image(torch.from_numpy(DATA[f"image{i}"]).permute(2, 0, 1))
    mask = tv_tensors.Mask(torch.from_numpy(DATA[f"mask{i}"]))
    out, _ = PadCrop(CROP, random=True, image_fill=(0.0, 0.0, 0.0), padding=padding)(image, mask)
    return out.permute(1, 2, 0).numpy()


def test_released_crop_reproduces_unimatch_crop():
    padding = cell_config("paper", protocol="released", **CELL).data.augmentation["crop_padding"]
    deviations = {}
    for i, size in enumerate(SIZES):
        labels, image = _labels("released", i), _image(padding, i)
        assert labels.shape == DATA[f"cropped_mask{i}"].shape == (CROP, CROP), size
        deviations[f"label{i}"] = int(np.abs(labels.astype(np.int64) - DATA[f"cropped_mask{i}"]).max())
        deviations[f"image{i}"] = int(np.abs(image.astype(np.int64) - DATA[f"cropped_image{i}"]).max())
    print(json.dumps(deviations))
    assert not any(deviations.values()), deviations


def test_the_golden_tells_the_padding_apart():
    """Corrected (even padding) moves every image that needs padding away from the record."""
    for i, size in enumerate(SIZES):
        padded = size != (CROP, CROP)
        assert (not np.array_equal(_labels("corrected", i), DATA[f"cropped_mask{i}"])) == padded, size
        assert (not np.array_equal(_image("centered", i), DATA[f"cropped_image{i}"])) == padded, size
