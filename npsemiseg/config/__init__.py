"""The run configuration: the single, validated description of one cell of the study.

A :class:`RunConfig` names the framework, dataset, partition and classifier head and
fixes everything else a run depends on (model, optimisation, schedule, supervised
loss, evaluation, data, seed). Every section forbids unknown keys and the whole
object is frozen; changes go through :meth:`RunConfig.with_overrides`, which
re-validates. The ``runtime`` section (device, AMP, SyncBN, progress, where
checkpoints go) says *how* a run is executed, not *what* it computes, and is left
out of :attr:`RunConfig.cell_id`.

Presets (:meth:`RunConfig.from_preset`): ``paper`` holds the paper's settings per
dataset family and framework (sources cited next to each value in
``npsemiseg/presets.py`` and on the framework and head classes); ``smoke`` is a tiny
model on tiny synthetic images that trains in seconds on one CPU core.

Layout: ``schema`` (the sections and ``RunConfig``), ``overrides`` (dotted keys), ``resolve``
(fields that depend on other fields, head-option checks, the defaults ``flat()`` fills in).
"""

from npsemiseg.config.overrides import apply_overrides, parse_scalar
from npsemiseg.config.resolve import NOT_APPLICABLE
from npsemiseg.config.schema import (
    CELL_ID_LENGTH,
    IDENTITY_EXCLUDED,
    DataConfig,
    EvaluationConfig,
    HeadConfig,
    LossConfig,
    ModelConfig,
    OptimConfig,
    RunConfig,
    RuntimeConfig,
    ScheduleConfig,
    Section,
)
from npsemiseg.heads import head_names

#: kept for callers that read the old name table; ``npsemiseg.heads.head_names()`` is the accessor
HEAD_NAMES: tuple[str, ...] = head_names()

__all__ = [
    "CELL_ID_LENGTH", "HEAD_NAMES", "IDENTITY_EXCLUDED", "NOT_APPLICABLE", "DataConfig", "EvaluationConfig",
    "HeadConfig", "LossConfig", "ModelConfig", "OptimConfig", "RunConfig", "RuntimeConfig", "ScheduleConfig",
    "Section", "apply_overrides", "parse_scalar",
]
