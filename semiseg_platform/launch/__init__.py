"""Launching one cell: on Ray Train (:func:`run_cell`) or in this process (:func:`run_cell_in_process`).

- :mod:`.cell`: the launchers, :class:`CellResult`, :class:`CellFailedError`, :func:`cell_run_name`;
- :mod:`.reporters`: how checkpoints reach Ray Train, Ray Tune or the storage, and progress lines;
- :mod:`.ray_runtime`: starting or joining Ray (:func:`ensure_ray`).
"""

from semiseg_platform.launch.cell import (
                                          CellFailedError,
                                          CellResult,
                                          CellSpec,
                                          cell_run_name,
                                          execute,
                                          run_cell,
                                          run_cell_in_process,
                                          train_worker,
                                          validate_min_workers,
                                          validate_resources,
)
from semiseg_platform.launch.ray_runtime import embedded_env, ensure_ray, in_existing_cluster, worker_env
from semiseg_platform.launch.reporters import CheckpointReporter, ProgressLogger, StoreReporter, TrainReporter, TuneReporter

__all__ = [
    "CellFailedError", "CellResult", "CellSpec", "CheckpointReporter", "ProgressLogger", "StoreReporter",
    "TrainReporter", "TuneReporter", "cell_run_name", "embedded_env", "ensure_ray", "execute", "in_existing_cluster",
    "worker_env",
    "run_cell", "run_cell_in_process", "train_worker", "validate_min_workers", "validate_resources",
]
