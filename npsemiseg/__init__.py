"""NP-SemiSeg (ICML 2023) re-implemented: uncertainty-aware semi-supervised semantic segmentation.

The Python API runs one cell in-process (no Ray, no MLflow)::

    from npsemiseg import compose, train

    composition = compose("smoke", framework="supervised", dataset="synthetic", partition="1/16", head="np",
                          overrides={"optim.lr": 0.02})
    config = composition.config                    # a frozen RunConfig
    print(composition.explain("optim.lr"))         # every step that set the key, and why
    result = train(config)
    print(config.cell_id, result.metrics["miou"], result.metrics["pavpu"])

and predicts with a trained cell's model (a checkpoint directory or a file ``npsemiseg export`` wrote)::

    model = npsemiseg.load_model("model.pt", num_samples=8)
    labels, uncertainty = model.predict(images)  # [B, 3, H, W] in [0, 1] -> [B, H, W], [B, H, W] (nats)

``RunConfig``, ``compose``, ``cell_config``, ``with_overrides``, ``train`` and ``RunResult`` are imported on
first use (PEP 562), so importing a sub-package such as ``npsemiseg.heads`` stays light.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["RunConfig", "RunResult", "SegmentationModel", "cell_config", "compose", "load_model", "train",
           "with_overrides", "__version__"]

if TYPE_CHECKING:
    from npsemiseg.config import RunConfig, cell_config, compose, with_overrides
    from npsemiseg.inference_model import SegmentationModel, load_model
    from npsemiseg.training import RunResult, train

_EXPORTS = {"RunConfig": "npsemiseg.config", "compose": "npsemiseg.config", "cell_config": "npsemiseg.config",
            "with_overrides": "npsemiseg.config", "RunResult": "npsemiseg.training", "train": "npsemiseg.training",
            "SegmentationModel": "npsemiseg.inference_model", "load_model": "npsemiseg.inference_model"}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:  # on first use: importing npsemiseg must not import torch and every sub-package
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'npsemiseg' has no attribute {name!r}")
