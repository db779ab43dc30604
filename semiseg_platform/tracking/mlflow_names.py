"""The MLflow tracking schema as code: every tag, param, artifact and metric name the platform writes.

``docs/CONTRACTS.md`` ("Tracking schema") describes it; the grid, the search, the tables and the
UI read these names from here only. A cell's parameters are its configuration flattened by
``npsemiseg.config.config_params`` (the same key set for every cell, so MLflow's compare view lines cells
up) plus :data:`EFFECTIVE_GLOBAL_BATCH`, :data:`EFFECTIVE_ACCUMULATION` and :data:`EFFECTIVE_LR`.

Submissions: a grid's parent and cell runs carry :data:`GRID_ID`; a search's carry
:data:`SEARCH_ID`. Stores written before searches had their own tag tagged search runs
``grid_id`` too; :func:`submission_of` (and ``tracking.store.submission_runs``) read both.
"""

from __future__ import annotations

from typing import Any

from npsemiseg.renames import RENAMED_KEYS, current_value


# ----------------------------------------------------------------------------- tags
#: What a run is: ``cell`` | ``grid`` | ``search`` | ``benchmark`` | ``pretrain``
KIND = "npsemiseg.kind"
KIND_CELL, KIND_GRID, KIND_SEARCH, KIND_BENCHMARK = "cell", "grid", "search", "benchmark"
KIND_PRETRAIN = "pretrain"
#: A pretraining run's cache key (the hash of its configuration)
PRETRAIN_KEY = "pretrain_key"
#: A re-evaluation of a cell's checkpoint (``npsemiseg evaluate``): a nested run of the cell's run
KIND_EVALUATION = "evaluation"
#: The cell's axes (tags, also the tables' keys): ``framework`` and ``head`` are the labels, ``framework_name``
#: and ``head_name`` the registered classes
FRAMEWORK, DATASET, PARTITION, HEAD, HEAD_NAME, SEED, CELL_ID = (
    "framework", "dataset", "partition", "head", "head_name", "seed", "cell_id")
FRAMEWORK_NAME = "framework_name"
CELL_KEYS = (DATASET, FRAMEWORK, HEAD, PARTITION)
#: The cell's protocol (``released`` | ``corrected``, ``npsemiseg.protocol``): tables never mix two
PROTOCOL = "protocol"
GIT_COMMIT = "git_commit"
VERSION = "npsemiseg_version"
#: The grid a run belongs to (grid parent and cell runs; search runs of old stores too)
GRID_ID = "grid_id"
#: The search a run belongs to (search parent and trial runs)
SEARCH_ID = "search_id"
SUBMISSION_ID = "submission_id"
SPEC_NAME = "spec_name"
STUDY_NAME = "study_name"
BEST_CELL_ID = "best_cell_id"
#: MLflow's own tags
NOTE = "mlflow.note.content"
PARENT_RUN_ID = "mlflow.parentRunId"
#: MLflow's experiment tags: the experiment's kind (``custom_model_development``: model training, not GenAI)
#: and its saved views of the runs table (``mlflow.sharedViewState.<view id>``; :mod:`.experiment_page`)
EXPERIMENT_KIND, EXPERIMENT_KIND_TRAINING = "mlflow.experimentKind", "custom_model_development"
SAVED_VIEW_PREFIX = "mlflow.sharedViewState."
#: Who owns a RUNNING run (for the orphan sweep)
OWNER_HOST = "npsemiseg.owner_host"
OWNER_PID = "npsemiseg.owner_pid"
OWNER_START = "npsemiseg.owner_start"
#: When the owner of a RUNNING run last said it is alive (epoch seconds; ``tracking.store.Heartbeat``)
HEARTBEAT = "npsemiseg.heartbeat"
ATTEMPTS = "npsemiseg.attempts"
PARAMS_CHANGED = "npsemiseg.params_changed"
WORLD_SIZE = "world_size"
ERROR = "error"
CHECKPOINT_URI = "checkpoint_uri"
#: The cell's best checkpoint, when the run keeps one (``npsemiseg evaluate --select best``)
BEST_CHECKPOINT_URI = "best_checkpoint_uri"
#: A search trial's tags: ``search.<key>`` per searched key, the Optuna trial, an ASHA stop
SEARCH_PREFIX = "search."
SEARCH_TRIAL = "search.trial"
SEARCH_STOPPED = "search.stopped"
SEARCH_STOPPED_AFTER = "search.stopped_after_evaluation"
#: The uncertainty-time benchmark runs
BENCHMARK = "benchmark"
EVAL_MODE = "eval_mode"
UNCERTAINTY_TIME_BENCHMARK = "uncertainty_time"

# ----------------------------------------------------------------------------- artifacts
CONFIG_ARTIFACT = "config/config.yaml"
#: Where each key of the cell's configuration comes from (``npsemiseg.config.explain``), beside its YAML
PROVENANCE_ARTIFACT = "config/config_provenance.json"
CHECKPOINT_URI_ARTIFACT = "checkpoint_uri.txt"
TRACEBACK_ARTIFACT = "error/traceback.txt"
PER_CLASS_IOU_TABLE = "tables/per_class_iou.json"
PER_CLASS_IOU_FIGURE = "figures/per_class_iou.png"
CELL_FIGURES = ("figures/uncertainty_maps.png", "figures/reliability.png", "figures/risk_coverage.png",
                PER_CLASS_IOU_FIGURE)
#: a cell's reliability-diagram and risk-coverage data (``npsemiseg.training.artifacts.CURVES_ARTIFACT``), written
#: whether or not the cell draws figures; the reports' per-grid reliability figures read it
CELL_CURVES = "figures/reliability_curves.json"
#: A grid's or search's parent run: ``<kind>/spec.yaml``, ``<kind>/summary.txt``, ``grid/cells.csv``,
#: ``search/trials.csv``, ``search/best_config.yaml`` (:func:`sweep_artifact`); the grid's tables under ``tables/``
SPEC_FILE, SUMMARY_FILE, GRID_CELLS_FILE, TRIALS_FILE, BEST_CONFIG_FILE = (
    "spec.yaml", "summary.txt", "cells.csv", "trials.csv", "best_config.yaml")
GRID_TABLES_DIR = "tables"
#: the claims report (claims.md, claims.json, the forest plot claims_forest.png) of a grid's parent run
GRID_CLAIMS_DIR = "claims"
SEARCH_DIR = "search"
FIGURES_DIR = "figures"
#: Where files reported through ``on_artifact`` go, by suffix
ARTIFACT_DIRS = {".png": "figures", ".jpg": "figures", ".jpeg": "figures", ".pdf": "figures", ".svg": "figures",
                 ".csv": "tables", ".json": "tables", ".parquet": "tables", ".md": "tables", ".tex": "tables"}

# ----------------------------------------------------------------------------- metrics
#: Final metrics logged without prefix (the tables read these)
FINAL_METRICS = ("miou", "pavpu", "ece", "nll", "brier", "auroc", "pixel_acc", "ece_adaptive", "aupr", "aurc",
                 "pavpu_balanced")
#: The metrics a sweep's trial hands back to its driver
TRIAL_METRICS = ("miou", "pavpu")
TRAIN_PREFIX, EVAL_PREFIX, TIME_PREFIX = "train/", "eval/", "time/"
TOTAL_STEPS = "train/total_steps"
#: At the last step of every epoch: images per second over the epoch's steps, peak accelerator memory
#: (CPU: peak RSS) in MiB (``npsemiseg.training.loop``'s names)
EPOCH_IMAGES_PER_SEC, PEAK_MEMORY_MB = "train/epoch_images_per_sec", "train/peak_memory_mb"
CELL_WALL_SECONDS = "time/cell_wall_seconds"
ORCHESTRATION_SECONDS = "time/orchestration_seconds"
UNCERTAINTY_TIME_METRIC = "uncertainty_seconds"


# ----------------------------------------------------------------------------- submissions
def sweep_artifact(kind: str, name: str) -> str:
    """Where a grid's or search's parent run keeps ``name``: ``grid/spec.yaml``, ``search/summary.txt`` ..."""
    return f"{kind}/{name}"


def submission_tags(kind: str, submission_id: str) -> dict[str, str]:
    """The tag naming a run's grid or search: ``{grid_id: id}`` or ``{search_id: id}``."""
    return {SEARCH_ID if kind == KIND_SEARCH else GRID_ID: submission_id}


def submission_of(tags: dict[str, str]) -> str | None:
    """The grid or search a run belongs to: ``search_id``, else ``grid_id`` (old stores), else None."""
    return tags.get(SEARCH_ID) or tags.get(GRID_ID) or None


# ----------------------------------------------------------------------------- params
#: What a cell trained with: the global labeled batch (per process x processes x accumulation steps), the
#: micro-batches per optimiser step and the base learning rate after ``optim.lr_scaling`` (params of every cell,
#: beside ``npsemiseg.config.config_params``)
EFFECTIVE_GLOBAL_BATCH, EFFECTIVE_LR = "effective.global_batch", "effective.lr"
EFFECTIVE_ACCUMULATION = "effective.accumulation_steps"


def param_value(params: dict[str, str], key: str) -> str | None:
    """A run's parameter ``key``, read under its earlier name and value for runs logged before a rename
    (``npsemiseg.renames``: ``model.decoder`` from ``model.variant`` ...)."""
    if key in params:
        return params[key]
    earlier = RENAMED_KEYS.get(key)
    return current_value(earlier, params[earlier]) if earlier in params else None


#: the prefix of a cell's plan params (``npsemiseg.hardware_plan.run_record``: processes, batches, accumulation
#: steps, global batch against the publication's, predicted peak memory per GPU)
PLAN_PREFIX = "plan."
#: an elastic cell: the fewest workers it runs on (a param), each attempt's world size (a metric at the attempt's
#: start step) and the plan re-made for it (tags, the latest attempt's: ``npsemiseg.hardware_plan.Replan.record``)
PLAN_MIN_PROCESSES = "plan.min_processes"
PLAN_WORLD_SIZE = "plan/world_size"
PLAN_OBTAINED_PREFIX = "plan.obtained."


def plan_params(record: dict[str, str]) -> dict[str, str]:
    """A ``hardware_plan.run_record`` as the cell's ``plan.*`` params."""
    return {f"{PLAN_PREFIX}{key}": value for key, value in record.items()}


def effective_params(scaling: Any) -> dict[str, str]:
    """An ``npsemiseg.training.BatchScaling`` as the cell's :data:`EFFECTIVE_GLOBAL_BATCH`,
    :data:`EFFECTIVE_ACCUMULATION` and :data:`EFFECTIVE_LR` params."""
    return {EFFECTIVE_GLOBAL_BATCH: str(scaling.global_batch), EFFECTIVE_ACCUMULATION: str(scaling.accumulation_steps),
            EFFECTIVE_LR: f"{scaling.lr:.6g}"}
