"""The platform around ``npsemiseg``: Ray Train / Tune, MLflow tracking, storage, the CLI.

The main entry points are importable from here; they load lazily, so ``import
semiseg_platform`` (and ``npsemiseg --help``) does not pay for importing Ray or MLflow.

- ``run_cell`` / ``run_cell_in_process`` / ``CellResult`` / ``CellFailedError`` / ``ensure_ray`` (``.launch``)
- ``CellRun`` / ``MLflowCallbacks`` / ``sweep_orphaned_runs`` / ``resolve_tracking_uri`` (``.tracking``)
- ``parse_storage`` / ``CheckpointStore`` (``.storage``)

Where things live: ``cli/`` (one module per command), ``sweeps/`` (grids and searches: their specs,
the spec base, what running them shares, the runners), ``preflight``, ``launch/``, ``reports/``, ``ui``,
``pretrain_runs`` (the pretraining's MLflow runs), ``checkpoint_lookup`` (a trained cell's checkpoint
from its run or URI), ``image_predictions`` (``predict``'s PNGs of one's own images), ``tracking/``
(``tracking/mlflow_names``: every MLflow name), ``storage``,
``reservations`` (what a cell reserves), ``devstack/``.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "run_cell": "launch", "run_cell_in_process": "launch", "CellResult": "launch", "CellFailedError": "launch",
    "CellRun": "tracking", "MLflowCallbacks": "tracking", "sweep_orphaned_runs": "tracking",
    "resolve_tracking_uri": "tracking", "parse_storage": "storage", "CheckpointStore": "storage",
    "ensure_ray": "launch",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
