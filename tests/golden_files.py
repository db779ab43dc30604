"""What the golden tests share: the recorder of a golden (its fixed inputs, small networks and stand-ins, imported
from ``tests/golden/record_<name>_golden.py``) and the arrays it recorded."""

from __future__ import annotations

import importlib.util
import json
import types
from pathlib import Path

import numpy as np
import torch

from npsemiseg.models.segmentor import IMAGENET_MEAN, IMAGENET_STD
from npsemiseg.training import train_transforms

GOLDEN = Path(__file__).resolve().parent / "golden"


def recorder(name: str) -> types.ModuleType:
    """``tests/golden/record_<name>_golden.py`` as a module (nothing of the official code: it is imported only when
    the recorder runs)."""
    module_name = f"record_{name}_golden"
    spec = importlib.util.spec_from_file_location(module_name, GOLDEN / f"{module_name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def weak_view(config, image: np.ndarray, label: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A recorded uint8 image ``[H, W, 3]`` and its label through ``config``'s labeled weak pipeline, the image
    normalised with the ImageNet mean and std as the official pipelines hand it on: (image ``[3, h, w]``, label)."""
    item = {"image": torch.from_numpy(image).permute(2, 0, 1).float() / 255, "label": torch.from_numpy(label).long(),
            "id": "recorded"}
    out = train_transforms(config)["labeled"](item)
    mean, std = torch.tensor(IMAGENET_MEAN).view(3, 1, 1), torch.tensor(IMAGENET_STD).view(3, 1, 1)
    return ((out["image"] - mean) / std).numpy(), out["label"].numpy()


def check_views(views: dict[int, tuple[np.ndarray, np.ndarray]], record: dict[str, np.ndarray], prefix: str,
                atol: float) -> dict[str, float]:
    """Each case's (image, label) of ``views`` against the record's ``<prefix>_image<i>`` and ``<prefix>_label<i>``:
    labels exact, images within ``atol``; returns (and prints) each max |difference|."""
    deviations = {}
    for i, (image, label) in views.items():
        expected_image, expected_label = record[f"{prefix}_image{i}"], record[f"{prefix}_label{i}"]
        assert label.shape == expected_label.shape, f"case {i}: size {label.shape}, recorded {expected_label.shape}"
        deviations[f"label{i}"] = float(np.abs(label.astype(np.int64) - expected_label).max())
        deviations[f"image{i}"] = float(np.abs(image - expected_image).max())
        assert deviations[f"label{i}"] == 0, f"case {i}: labels differ"
        assert deviations[f"image{i}"] <= atol, f"case {i}: max |difference| {deviations[f'image{i}']:.3g}"
    print(json.dumps({k: f"{v:.2e}" for k, v in deviations.items()}))
    return deviations


def recorded(stem: str) -> dict[str, np.ndarray]:
    """The arrays of ``tests/golden/<stem>.npz``."""
    return dict(np.load(GOLDEN / f"{stem}.npz"))


def sidecar(stem: str) -> dict:
    """``tests/golden/<stem>.json``: where the golden's arrays come from (repository, commit, lines, command)."""
    return json.loads((GOLDEN / f"{stem}.json").read_text())
