"""The training crop under ``protocol: released`` pads as UniMatch's released ``crop`` does
(``tests/golden/crop_padding_released.npz``, recorded by ``tests/golden/record_crop_padding_golden.py``; source and
command in ``crop_padding_released.json``).

Images at most the crop size on both sides, so the official random offset can only be 0 and the record is the
padding alone: the image at the top left, the rest of the crop filled. Image and label go through the released
cell's whole weak pipeline (resize and flip off): its placement (switch ``crop_padding``) and its image fill (switch
``crop_fill``: UniMatch's black). Tolerance: exact equality (integer pixels): max |difference| 0.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torchvision import tv_tensors

from golden_files import recorded, sidecar
from npsemiseg.config import cell_config, with_overrides
from npsemiseg.data.transforms import CROP_FILLS, PadCrop
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


def _crop(protocol: str, i: int) -> tuple[np.ndarray, np.ndarray]:
    """Recorded image ``i`` and its mask through the ``protocol`` cell's weak pipeline: (label, image as 0-255)."""
    config = cell_config("paper", protocol=protocol, **CELL)
    config = with_overrides(config, {"schedule.crop_size": CROP, "data.augmentation.resize": "none",
                                     "data.augmentation.flip": False})
    image = torch.from_numpy(DATA[f"image{i}"]).permute(2, 0, 1).double() / 255
    item = {"image": image, "label": torch.from_numpy(DATA[f"mask{i}"]).long(), "id": str(i)}
    out = train_transforms(config)["labeled"](item)
    return out["label"].numpy(), (out["image"] * 255).round().permute(1, 2, 0).numpy()


def test_released_crop_reproduces_unimatch_crop():
    deviations = {}
    for i, size in enumerate(SIZES):
        labels, image = _crop("released", i)
        assert labels.shape == DATA[f"cropped_mask{i}"].shape == (CROP, CROP), size
        deviations[f"label{i}"] = int(np.abs(labels.astype(np.int64) - DATA[f"cropped_mask{i}"]).max())
        deviations[f"image{i}"] = int(np.abs(image.astype(np.int64) - DATA[f"cropped_image{i}"]).max())
    print(json.dumps(deviations))
    assert not any(deviations.values()), deviations


def test_the_golden_tells_the_padding_apart():
    """Corrected (even padding) moves every image that needs padding away from the record."""
    for i, size in enumerate(SIZES):
        padded = size != (CROP, CROP)
        labels, image = _crop("corrected", i)
        assert (not np.array_equal(labels, DATA[f"cropped_mask{i}"])) == padded, size
        assert (not np.array_equal(image, DATA[f"cropped_image{i}"])) == padded, size


def test_the_golden_tells_the_fill_apart():
    """The released placement with the corrected fill (the ImageNet mean) moves every padded image's pixels."""
    config = with_overrides(cell_config("paper", protocol="released", **CELL), {"data.augmentation.crop_fill": "mean"})
    assert config.data.augmentation["crop_padding"] == "bottom_right"
    for i, size in enumerate(SIZES):
        image = tv_tensors.Image(torch.from_numpy(DATA[f"image{i}"]).permute(2, 0, 1))
        mean_fill = tuple(255 * v for v in CROP_FILLS[config.data.augmentation["crop_fill"]])
        out, _ = PadCrop(CROP, random=True, image_fill=mean_fill, padding="bottom_right")(
            image, tv_tensors.Mask(torch.from_numpy(DATA[f"mask{i}"])))
        moved = not np.array_equal(out.permute(1, 2, 0).numpy(), DATA[f"cropped_image{i}"])
        assert moved == (size != (CROP, CROP)), size
