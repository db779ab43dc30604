"""MLflow tracking of cells: the store, one run per cell, rank-0 logging, orphan sweep.

The tracking schema (run name, tags, params, metric and artifact names) is :mod:`.mlflow_names`
(``docs/CONTRACTS.md``, "Tracking schema"): the grid, the search, the tables and the UI read it.

- :mod:`.store`: the tracking URI, experiments, paging through runs, finding a cell's run, the
  orphan sweep (:func:`sweep_orphaned_runs` ends RUNNING runs whose owning process is gone;
  :func:`reconcile_submission` does it for one grid or search on every submission; owners beat a
  :class:`Heartbeat` so that owners on other hosts can be judged too);
- :mod:`.cell_run`: :class:`CellRun`, the run of one cell owned by the launching process (ended
  FINISHED, FAILED or KILLED whatever happens; a restarted cell reuses it), :func:`ending_run`;
- :mod:`.callbacks`: :class:`MLflowCallbacks`, rank 0's logging into that run;
- :mod:`.tags`: the cell run's tags; :mod:`.describe`: its description and per-class IoU figure;
  :mod:`.metric_logging`: writing metrics in batches;
- :mod:`.experiment_page`: what a study's experiment shows in the MLflow UI (its kind, description and
  saved view of its cells), written by :func:`prepare_experiment`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from semiseg_platform.tracking.callbacks import MLflowCallbacks, artifact_path
    from semiseg_platform.tracking.cell_run import (
        CellKilled,
        CellRun,
        RunEnd,
        ending_run,
        error_reason,
        format_error,
        sigterm_as_killed,
    )
    from semiseg_platform.tracking.describe import cell_description, per_class_iou_figure
    from semiseg_platform.tracking.store import (
        DEFAULT_ARTIFACT_DIR,
        DEFAULT_EXPERIMENT,
        DEFAULT_STORE_FILE,
        Heartbeat,
        existing_experiment,
        experiment_id,
        find_cell_run,
        owner_tags,
        prepare_experiment,
        reconcile_submission,
        resolve_tracking_uri,
        run_url,
        search_all_runs,
        submission_runs,
        sweep_orphaned_runs,
        ui_hint,
    )
    from semiseg_platform.tracking.tags import cell_tags, git_commit, package_version

#: the names below, imported from their module on first use (PEP 562): MLflow and matplotlib load when tracking is
#: used, not when a spec reads the tracking schema (``mlflow_names``: ``grid --dry-run``, ``search --dry-run``)
_ON_FIRST_USE = {
    **dict.fromkeys(("MLflowCallbacks", "artifact_path"), "callbacks"),
    **dict.fromkeys(("CellKilled", "CellRun", "RunEnd", "ending_run", "error_reason", "format_error",
                     "sigterm_as_killed"), "cell_run"),
    **dict.fromkeys(("cell_description", "per_class_iou_figure"), "describe"),
    **dict.fromkeys(("cell_tags", "git_commit", "package_version"), "tags"),
    **dict.fromkeys(("DEFAULT_ARTIFACT_DIR", "DEFAULT_EXPERIMENT", "DEFAULT_STORE_FILE", "Heartbeat",
                     "existing_experiment", "experiment_id", "find_cell_run", "owner_tags", "prepare_experiment",
                     "reconcile_submission", "resolve_tracking_uri", "run_url", "search_all_runs", "submission_runs",
                     "sweep_orphaned_runs", "ui_hint"), "store"),
}


def __getattr__(name: str) -> Any:
    if name in _ON_FIRST_USE:
        return getattr(importlib.import_module(f"{__name__}.{_ON_FIRST_USE[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "DEFAULT_ARTIFACT_DIR", "DEFAULT_EXPERIMENT", "DEFAULT_STORE_FILE", "CellKilled", "CellRun", "Heartbeat",
    "MLflowCallbacks", "RunEnd", "artifact_path", "cell_description", "cell_tags", "ending_run", "error_reason",
    "existing_experiment", "experiment_id", "find_cell_run", "format_error", "git_commit", "owner_tags",
    "package_version", "per_class_iou_figure", "prepare_experiment", "reconcile_submission", "resolve_tracking_uri",
    "run_url", "search_all_runs", "sigterm_as_killed", "submission_runs",
    "sweep_orphaned_runs", "ui_hint",
]
