"""The MLflow tracking schema as code: every tag, param, artifact and metric name the platform writes.

``docs/CONTRACTS.md`` ("Tracking schema") describes it; the grid, the search, the tables and the
UI read these names from here only. :func:`config_params` is the parameter layout of a cell
(``RunConfig`` -> ``{"optim.lr": "0.001", ...}``), the same key set for every cell so MLflow's
compare view lines cells up.

Submissions: a grid's parent and cell runs carry :data:`GRID_ID`; a search's carry
:data:`SEARCH_ID`. Stores written before searches had their own tag tagged search runs
``grid_id`` too; :func:`submission_of` (and ``tracking.store.submission_runs``) read both.
"""

from __future__ import annotations

import functools
import inspect
import json
from typing import Any

from npsemiseg.data.transforms import train_transform
from npsemiseg.frameworks import framework_names, get_framework
from npsemiseg.heads import head_names
from npsemiseg.heads.factory import head_options
from npsemiseg.protocol import switch_values

# ----------------------------------------------------------------------------- tags
#: What a run is: ``cell`` | ``grid`` | ``search`` | ``benchmark`` | ``pretrain``
KIND = "npsemiseg.kind"
KIND_CELL, KIND_GRID, KIND_SEARCH, KIND_BENCHMARK = "cell", "grid", "search", "benchmark"
KIND_PRETRAIN = "pretrain"
#: A pretraining run's cache key (the hash of its configuration)
PRETRAIN_KEY = "pretrain_key"
#: A re-evaluation of a cell's checkpoint (``npsemiseg evaluate``): a nested run of the cell's run
KIND_EVALUATION = "evaluation"
#: The cell's axes (tags, also the tables' keys): ``framework`` and ``head`` are the variant labels, ``framework_name``
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
CHECKPOINT_URI_ARTIFACT = "checkpoint_uri.txt"
TRACEBACK_ARTIFACT = "error/traceback.txt"
PER_CLASS_IOU_TABLE = "tables/per_class_iou.json"
PER_CLASS_IOU_FIGURE = "figures/per_class_iou.png"
CELL_FIGURES = ("figures/uncertainty_maps.png", "figures/reliability.png", PER_CLASS_IOU_FIGURE)
#: A grid's or search's parent run: ``<kind>/spec.yaml``, ``<kind>/summary.txt``, ``grid/cells.csv``,
#: ``search/trials.csv``, ``search/best_config.yaml`` (:func:`sweep_artifact`); the grid's tables under ``tables/``
SPEC_FILE, SUMMARY_FILE, GRID_CELLS_FILE, TRIALS_FILE, BEST_CONFIG_FILE = (
    "spec.yaml", "summary.txt", "cells.csv", "trials.csv", "best_config.yaml")
GRID_TABLES_DIR = "tables"
#: the claims report (claims.md, claims.json) of a grid's parent run
GRID_CLAIMS_DIR = "claims"
SEARCH_DIR = "search"
FIGURES_DIR = "figures"
#: Where files reported through ``on_artifact`` go, by suffix
ARTIFACT_DIRS = {".png": "figures", ".jpg": "figures", ".jpeg": "figures", ".pdf": "figures", ".svg": "figures",
                 ".csv": "tables", ".json": "tables", ".parquet": "tables", ".md": "tables", ".tex": "tables"}

# ----------------------------------------------------------------------------- metrics
#: Final metrics logged without prefix (the tables read these)
FINAL_METRICS = ("miou", "pavpu", "ece", "nll", "brier", "auroc", "pixel_acc")
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
#: What a cell trained with: the global labeled batch (per process x processes) and the base learning
#: rate after ``optim.lr_scaling`` (params of every cell, beside :func:`config_params`)
EFFECTIVE_GLOBAL_BATCH, EFFECTIVE_LR = "effective.global_batch", "effective.lr"


def effective_params(scaling: Any) -> dict[str, str]:
    """An ``npsemiseg.training.BatchScaling`` as the cell's :data:`EFFECTIVE_GLOBAL_BATCH` / :data:`EFFECTIVE_LR` params."""
    return {EFFECTIVE_GLOBAL_BATCH: str(scaling.global_batch), EFFECTIVE_LR: f"{scaling.lr:.6g}"}

#: The parameter value of an option that the cell's framework or head does not take
NOT_APPLICABLE = "n/a"
#: The params of the protocol's switches: ``switches.<name>``
SWITCH_PARAM_PREFIX = "switches"


def config_params(config: Any) -> dict[str, str]:
    """A ``RunConfig`` as MLflow params: ``{"optim.lr": "0.001", ...}`` (dotted keys, string values).

    The key set is the same for every cell, whatever its framework and head: ``framework_options.*``
    lists the options of *every* framework, ``head.options.*`` those of every head and
    ``data.augmentation.*`` every ``train_transform`` keyword; each holds the cell's value, else the
    default of the cell's framework/head/transform, else :data:`NOT_APPLICABLE`. Free-form dicts
    (``model.options``, ``data.options``) are as given. ``protocol`` is a param (and a tag) and every switch
    of ``npsemiseg.protocol`` is ``switches.<name>`` (its value in the cell, ``n/a`` where it does not apply).
    """
    data = config.model_dump(mode="json")
    data["framework_options"] = {**dict.fromkeys(_framework_option_keys(), NOT_APPLICABLE), **data["framework_options"]}
    data["head"]["options"] = {**_head_option_defaults(config.head.name), **data["head"]["options"]}
    data["data"]["augmentation"] = {**_augmentation_defaults(), **data["data"]["augmentation"]}
    data[SWITCH_PARAM_PREFIX] = switch_values(data)
    return dict(_flatten("", data))


def _flatten(prefix: str, value: Any):
    if isinstance(value, dict) and value:
        for key, item in value.items():
            yield from _flatten(f"{prefix}.{key}" if prefix else str(key), item)
    else:
        yield prefix, value if isinstance(value, str) else json.dumps(value)


@functools.lru_cache(maxsize=1)
def _framework_option_keys() -> tuple[str, ...]:
    return tuple(sorted({key for name in framework_names() for key in get_framework(name).Options.model_fields}))


@functools.cache
def _head_option_defaults(name: str) -> dict[str, Any]:
    keys = sorted({key for head in head_names() for key in head_options(head)})
    own = {key: value for key, value in head_options(name).items() if value is not inspect.Parameter.empty}
    return {key: _json_value(own[key]) if key in own else NOT_APPLICABLE for key in keys}


@functools.lru_cache(maxsize=1)
def _augmentation_defaults() -> dict[str, Any]:
    parameters = inspect.signature(train_transform).parameters.values()
    return {p.name: _json_value(p.default) for p in parameters if p.name != "crop_size"}


def _json_value(value: Any) -> Any:
    return json.loads(json.dumps(value))
