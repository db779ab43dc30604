"""Writing metrics to MLflow: finite numbers (NaN kept for undefined evaluation metrics), in batches."""

from __future__ import annotations

import math
import time
from typing import Any

from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

#: log_batch accepts at most 1000 metrics per call
MLFLOW_BATCH = 1000


def finite(value: Any) -> float | None:
    """``value`` as a finite float, else None."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def defined_or_nan(value: Any) -> float | None:
    """A finite number, or NaN for an undefined one (None for non-numbers and infinities).

    NaN is kept for evaluation metrics, e.g. the IoU of a class absent from the evaluated
    images: every cell then has the same metric keys (MLflow stores and shows NaN).
    """
    number = finite(value)
    if number is None and isinstance(value, (int, float)) and math.isnan(value):
        return math.nan
    return number


def log_metrics(client: MlflowClient, run_id: str, metrics: dict[str, Any], *, step: int | None) -> None:
    """Log ``metrics`` at ``step`` (undefined values as NaN, non-numbers dropped), in batches."""
    timestamp = int(time.time() * 1000)
    entries = [Metric(key, number, timestamp, step or 0) for key, value in metrics.items()
               if (number := defined_or_nan(value)) is not None]
    write_batches(client, run_id, entries)


def write_batches(client: MlflowClient, run_id: str, entries: list[Metric]) -> None:
    """``log_batch`` in chunks MLflow accepts."""
    for start in range(0, len(entries), MLFLOW_BATCH):
        client.log_batch(run_id, metrics=entries[start:start + MLFLOW_BATCH])


def prefixed(prefix: str, metrics: dict[str, Any]) -> dict[str, Any]:
    """Keys with ``prefix`` (kept as they are when they have it already)."""
    return {key if key.startswith(prefix) else f"{prefix}{key}": value for key, value in metrics.items()}
