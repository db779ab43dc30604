"""Helpers of the platform tests: fresh MLflow SQLite stores without re-running the migrations.

Creating a SQLite store runs MLflow's schema migrations (10-25 s on the shared 2-core
machine); a store migrated once per test session is copied for each test module instead.
"""

from __future__ import annotations

import fcntl
import shutil
from pathlib import Path

import pytest


def fresh_store(tmp_path_factory: pytest.TempPathFactory, name: str) -> str:
    """An absolute ``sqlite:///`` URI of a new, empty, migrated MLflow store in its own directory."""
    from mlflow.tracking import MlflowClient

    base = tmp_path_factory.getbasetemp()
    template = base / "mlflow-template.db"
    with open(base / "mlflow-template.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not template.exists():
            building = base / "mlflow-template-building.db"
            MlflowClient(f"sqlite:///{building}").search_experiments()  # runs the migrations
            building.rename(template)
    directory = Path(tmp_path_factory.mktemp(name))
    shutil.copyfile(template, directory / "mlruns.db")
    return f"sqlite:///{directory / 'mlruns.db'}"
