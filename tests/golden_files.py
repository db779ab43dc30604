"""What the golden tests share: the recorder of a golden (its fixed inputs, small networks and stand-ins, imported
from ``tests/golden/record_<name>_golden.py``) and the arrays it recorded."""

from __future__ import annotations

import importlib.util
import json
import types
from pathlib import Path

import numpy as np

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
    import torch  # noqa: PLC0415 - the goldens' own helpers stay importable without it

    from npsemiseg.models.segmentor import IMAGENET_MEAN, IMAGENET_STD  # noqa: PLC0415
    from npsemiseg.training import train_transforms  # noqa: PLC0415

    item = {"image": torch.from_numpy(image).permute(2, 0, 1).float() / 255, "label": torch.from_numpy(label).long(),
            "id": "recorded"}
    out = train_transforms(config)["labeled"](item)
    mean, std = torch.tensor(IMAGENET_MEAN).view(3, 1, 1), torch.tensor(IMAGENET_STD).view(3, 1, 1)
    return ((out["image"] - mean) / std).numpy(), out["label"].numpy()


def recorded(stem: str) -> dict[str, np.ndarray]:
    """The arrays of ``tests/golden/<stem>.npz``."""
    return dict(np.load(GOLDEN / f"{stem}.npz"))


def sidecar(stem: str) -> dict:
    """``tests/golden/<stem>.json``: where the golden's arrays come from (repository, commit, lines, command)."""
    return json.loads((GOLDEN / f"{stem}.json").read_text())
