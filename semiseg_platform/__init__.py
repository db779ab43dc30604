"""The platform around ``npsemiseg``: Ray Train / Tune, MLflow tracking, storage, the CLI.

The main entry points are importable from here; they load lazily, so ``import
semiseg_platform`` (and ``npsemiseg --help``) does not pay for importing Ray or MLflow.

- ``run_cell`` / ``run_cell_in_process`` / ``CellResult`` / ``CellFailedError`` (``.cell``)
- ``CellRun`` / ``MLflowCallbacks`` / ``sweep_orphaned_runs`` / ``resolve_tracking_uri`` (``.tracking``)
- ``parse_storage`` / ``CheckpointStore`` (``.storage``); ``ensure_ray`` (``.ray_runtime``)
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "run_cell": "cell", "run_cell_in_process": "cell", "CellResult": "cell", "CellFailedError": "cell",
    "CellRun": "tracking", "MLflowCallbacks": "tracking", "sweep_orphaned_runs": "tracking",
    "resolve_tracking_uri": "tracking", "parse_storage": "storage", "CheckpointStore": "storage",
    "ensure_ray": "ray_runtime",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
