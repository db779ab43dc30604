"""A cell's kept checkpoints as MLflow 3 LoggedModels (each with the evaluation metrics of its step, under
``checkpoint/...``), and the best of them registered in the model registry under the alias ``best``."""

from __future__ import annotations

import math
import time

from mlflow import MlflowClient
from mlflow.entities import Metric
from mlflow.entities.model_registry import ModelVersion
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import RESOURCE_ALREADY_EXISTS, ErrorCode

#: the prefix of a checkpoint model's metrics (on the model and the run), and the one the best is chosen by
CHECKPOINT_METRIC_PREFIX = "checkpoint/"
BEST_BY = "checkpoint/miou"
BEST_ALIAS = "best"
CHECKPOINT_STEP_TAG = "npsemiseg.checkpoint_step"
#: a registered version's tag naming its LoggedModel
MODEL_ID_TAG = "npsemiseg.model_id"


def registered_name(cell_id: str) -> str:
    """The registered model of a cell: ``npsemiseg-<cell_id>``."""
    return f"npsemiseg-{cell_id}"


def log_checkpoint_model(client: MlflowClient, run_id: str, step: int, metrics: dict[str, float],
                         checkpoint_uri: str | None = None) -> str:
    """A READY LoggedModel ``checkpoint-<step>`` of ``run_id`` with ``metrics`` on the run, the finite ones linked to
    the model; returns its id. Undefined metrics go to the run as NaN, as the evaluation logs them, so that every
    cell has the same keys, but not to the model: MLflow's model metrics would store NaN as 0."""
    run = client.get_run(run_id)
    tags = {CHECKPOINT_STEP_TAG: str(step), **({"checkpoint_uri": checkpoint_uri} if checkpoint_uri else {})}
    model = client.create_logged_model(run.info.experiment_id, name=f"checkpoint-{step:08d}", source_run_id=run_id,
                                       tags=tags)
    now = int(time.time() * 1000)
    logged = [Metric(f"{CHECKPOINT_METRIC_PREFIX}{key}", float(value), now, step,
                     model_id=model.model_id if math.isfinite(float(value)) else None)
              for key, value in metrics.items()]
    if logged:
        client.log_batch(run_id, metrics=logged)
    client.finalize_logged_model(model.model_id, "READY")
    return model.model_id


def register_best(client: MlflowClient, run_id: str, name: str) -> ModelVersion | None:
    """Register the checkpoint model of ``run_id`` with the highest :data:`BEST_BY` as a version of ``name`` and
    point the alias :data:`BEST_ALIAS` at it; None when no checkpoint model has that metric."""
    run = client.get_run(run_id)
    models = client.search_logged_models([run.info.experiment_id], filter_string=f"source_run_id = '{run_id}'")
    scored = [(metric.value, model) for model in models for metric in (model.metrics or []) if metric.key == BEST_BY]
    if not scored:
        return None
    _, best = max(scored, key=lambda pair: pair[0])
    try:
        client.create_registered_model(name)
    except MlflowException as error:
        if error.error_code != ErrorCode.Name(RESOURCE_ALREADY_EXISTS):
            raise
    # the model's artifact location as the source: a models:/ URI is resolved against the default tracking store
    version = client.create_model_version(name, source=best.artifact_location, run_id=run_id,
                                          model_id=best.model_id, tags={MODEL_ID_TAG: best.model_id})
    client.set_registered_model_alias(name, BEST_ALIAS, version.version)
    return version
