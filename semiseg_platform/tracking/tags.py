"""What a cell run is tagged with: its axes, ids, code version and description."""

from __future__ import annotations

import os
import subprocess
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from npsemiseg.config import RunConfig
from semiseg_platform.tracking import mlflow_names
from semiseg_platform.tracking.describe import cell_description

#: MLflow's limit on a tag's length
MAX_TAG_LENGTH = 4000


def git_commit() -> str:
    """The commit of the checkout this package runs from (``NPSEMISEG_GIT_COMMIT`` overrides; else "unknown")."""
    if os.environ.get("NPSEMISEG_GIT_COMMIT"):
        return os.environ["NPSEMISEG_GIT_COMMIT"]
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else "unknown"


def package_version() -> str:
    try:
        return version("npsemiseg")
    except PackageNotFoundError:
        return "unknown"


def cell_tags(config: RunConfig, *, grid_id: str | None = None, search_id: str | None = None,
              parent_run_id: str | None = None) -> dict[str, str]:
    """The schema's tags of a cell run, with the run's
    description (``mlflow.note.content``: what the cell is, shown on its page in the UI)."""
    tags = {
        mlflow_names.FRAMEWORK: config.framework_label,
        mlflow_names.FRAMEWORK_NAME: config.framework,
        mlflow_names.DATASET: config.dataset,
        mlflow_names.PARTITION: str(config.partition),
        mlflow_names.HEAD: config.head.label,
        mlflow_names.HEAD_NAME: config.head.name,
        mlflow_names.SEED: str(config.seed),
        mlflow_names.PROTOCOL: config.protocol,
        mlflow_names.CELL_ID: config.cell_id,
        mlflow_names.GIT_COMMIT: git_commit(),
        mlflow_names.VERSION: package_version(),
        mlflow_names.KIND: mlflow_names.KIND_CELL,
        mlflow_names.NOTE: cell_description(config, grid_id=grid_id, search_id=search_id),
    }
    if grid_id:
        tags[mlflow_names.GRID_ID] = grid_id
    if search_id:
        tags[mlflow_names.SEARCH_ID] = search_id
    if parent_run_id:
        tags[mlflow_names.PARENT_RUN_ID] = parent_run_id
    return tags
