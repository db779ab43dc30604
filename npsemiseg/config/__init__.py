"""The run configuration: the record of one cell of the study and how it is composed.

``schema`` is the record (:class:`RunConfig`, frozen, one section per concern; it checks types, ranges and
registered names); ``compose`` builds it in one visible order with the provenance of every key
(:func:`compose`, :func:`with_overrides`, :func:`explain`); ``overrides`` applies dotted keys; ``params``
flattens a record into MLflow parameters. ``runtime`` says *how* a run executes, not *what* it computes,
and is left out of :attr:`RunConfig.cell_id`.
"""

from npsemiseg.config.compose import (
    Composition,
    Setting,
    cell_config,
    compose,
    compose_record,
    explain,
    read_config,
    recompose,
    with_overrides,
)
from npsemiseg.config.overrides import apply_overrides, parse_scalar
from npsemiseg.config.params import config_params, switches
from npsemiseg.config.schema import (
    CELL_ID_LENGTH,
    IDENTITY_EXCLUDED,
    IDENTITY_VERSION,
    CellInputs,
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

__all__ = [
    "CELL_ID_LENGTH", "IDENTITY_EXCLUDED", "IDENTITY_VERSION", "CellInputs", "Composition", "DataConfig",
    "EvaluationConfig", "HeadConfig", "LossConfig", "ModelConfig", "OptimConfig", "RunConfig", "RuntimeConfig",
    "ScheduleConfig", "Section", "Setting", "apply_overrides", "cell_config", "compose", "compose_record", "config_params",
    "explain", "parse_scalar", "read_config", "recompose", "switches", "with_overrides",
]
