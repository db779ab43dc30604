"""Search specs: one cell (preset, framework, dataset, partition, head, overrides), a space over dotted
RunConfig keys, the sampler, ASHA, resources, storage and tracking; :func:`search_id` names a search."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from pydantic import Field, NonNegativeInt, PositiveInt, model_validator

from npsemiseg.config import RunConfig, compose, with_overrides
from npsemiseg.frameworks import framework_names
from npsemiseg.heads import head_names
from npsemiseg.presets import preset_names
from semiseg_platform.sweeps.spec_base import (
    DEFAULT_MAX_CELLS,
    Resources,
    Strict,
    describe_error,
    one_of,
    read_spec,
    validate_spec,
)
from semiseg_platform.tracking import mlflow_names

DEFAULT_EXPERIMENT = "npsemiseg-search"
DEFAULT_OPTUNA_FILE = "optuna.db"


Scalar = bool | int | float | str
#: ``int`` under another name: inside :class:`Distribution` the field ``int`` shadows the builtin
_Integer = int


class Distribution(Strict):
    """One searched key: exactly one of ``choice: [values]``, ``uniform: [low, high]``,
    ``loguniform: [low, high]`` (low > 0) or ``int: [low, high]`` (inclusive)."""

    choice: list[Scalar] | None = Field(None, min_length=1)
    uniform: tuple[float, float] | None = None
    loguniform: tuple[float, float] | None = None
    int: tuple[_Integer, _Integer] | None = None  # noqa: A003 - the YAML spelling

    @model_validator(mode="after")
    def _exactly_one(self) -> Distribution:
        given = [name for name in ("choice", "uniform", "loguniform", "int") if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError(f"expected exactly one of choice / uniform / loguniform / int, got {given or 'none'}")
        kind = given[0]
        if kind == "choice":
            if len(set(map(json.dumps, self.choice))) != len(self.choice):
                raise ValueError(f"choice: values must be distinct, got {self.choice}")
            return self
        low, high = getattr(self, kind)
        if not low < high:
            raise ValueError(f"{kind}: expected [low, high] with low < high, got [{low}, {high}]")
        if kind == "loguniform" and low <= 0:
            raise ValueError(f"loguniform: expected low > 0, got {low}")
        return self

    @property
    def kind(self) -> str:
        return next(name for name in ("choice", "uniform", "loguniform", "int") if getattr(self, name) is not None)

    def optuna(self) -> Any:
        """The Optuna distribution."""
        if self.choice is not None:
            return CategoricalDistribution(self.choice)
        if self.int is not None:
            return IntDistribution(*self.int)
        low, high = self.uniform or self.loguniform
        return FloatDistribution(low, high, log=self.loguniform is not None)

    def representatives(self) -> list[Any]:
        """Values checked when the spec is loaded: every choice, or both bounds."""
        return list(self.choice) if self.choice is not None else list(getattr(self, self.kind))


class Asha(Strict):
    """ASHA early stopping: rungs at ``grace_period x reduction_factor^k`` up to ``max_t``.

    ``time_attr``: ``evaluations`` (Tune reports, one per evaluation of the cell) or ``steps``
    (training iterations). ``max_t``: the length of a full trial in that unit.
    """

    time_attr: Literal["evaluations", "steps"] = "evaluations"
    grace_period: PositiveInt = 1
    reduction_factor: float = Field(2.0, gt=1.0)
    max_t: PositiveInt

    @model_validator(mode="after")
    def _grace_within_max_t(self) -> Asha:
        if self.grace_period > self.max_t:
            raise ValueError(f"grace_period: expected <= max_t ({self.max_t}), got {self.grace_period}")
        return self


class SearchSpec(Strict):
    """A search: one cell's preset and overrides, a space, the sampler, ASHA, storage and tracking.

    ``space``: dotted RunConfig key -> :class:`Distribution`. ``points_to_evaluate``: complete
    assignments of the space tried first (a known-good or known-bad configuration).
    ``trials``: Tune trials per submission (Ray Tune's ``num_samples``; not a head's T). ``seed``: the TPE
    sampler's seed (the cell's own seed is an override). ``optuna_storage``: Optuna RDB URL (None = ``sqlite:///<cwd>/optuna.db``;
    ``postgresql://...`` on a cluster). ``study_name``: None = ``<name>-<search_id>``.
    ``asha``: null = no early stopping. ``max_concurrent``: None = as many trials as the
    cluster's resources allow. ``max_cells``: the most configurations loading the spec builds to check it (one
    per choice and bound of the space and per point to evaluate), counted before any is built.
    """

    name: str = Field(min_length=1)
    experiment: str = DEFAULT_EXPERIMENT
    preset: str = "paper"
    framework: str
    dataset: str
    partition: str
    head: str = "np"
    overrides: dict[str, Any] = Field(default_factory=dict)
    space: dict[str, Distribution] = Field(min_length=1)
    points_to_evaluate: list[dict[str, Any]] = Field(default_factory=list)
    trials: PositiveInt = 8
    metric: str = "miou"
    mode: Literal["max", "min"] = "max"
    seed: NonNegativeInt = 0
    n_startup_trials: PositiveInt = 10
    asha: Asha | None = None
    resources: Resources = Field(default_factory=Resources)
    max_concurrent: PositiveInt | None = None
    optuna_storage: str | None = None
    study_name: str | None = None
    tracking_uri: str | None = None
    storage: str | None = None
    max_cells: PositiveInt = DEFAULT_MAX_CELLS

    @model_validator(mode="before")
    @classmethod
    def _trials_not_num_samples(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and "num_samples" in data:
            raise ValueError("num_samples: the number of Tune trials is called trials (num_samples would read as a "
                             "head's T); expected trials: N")
        return data

    @model_validator(mode="before")
    @classmethod
    def _partition_is_a_string(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and isinstance(data.get("partition"), int):
            data = {**data, "partition": str(data["partition"])}
        return data

    @model_validator(mode="after")
    def _known_names(self) -> SearchSpec:
        one_of("preset", self.preset, preset_names())
        one_of("framework", self.framework, framework_names())
        one_of("head", self.head, head_names())
        one_of("metric", self.metric, mlflow_names.FINAL_METRICS)
        checked = sum(len(d.representatives()) for d in self.space.values()) + len(self.points_to_evaluate)
        if checked > self.max_cells:
            raise ValueError(f"max_cells: the space and points_to_evaluate ask for {checked:,} configurations to check, "
                             f"more than max_cells ({self.max_cells:,}); refused before building any (raise max_cells)")
        for index, point in enumerate(self.points_to_evaluate):
            missing = sorted(set(self.space) - set(point))
            unknown = sorted(set(point) - set(self.space))
            if missing or unknown:
                raise ValueError(f"points_to_evaluate[{index}]: expected a value for every key of space; "
                                 f"missing {missing}, not in space {unknown}")
        return self

    def base_config(self) -> RunConfig:
        """The cell before any searched value is applied (the preset, then ``overrides``)."""
        return compose(self.preset, framework=self.framework, dataset=self.dataset, partition=self.partition,
                       head=self.head, overrides=self.overrides).config


def load_search_spec(source: str | Path | Mapping[str, Any], *, overrides: Mapping[str, Any] | None = None,
                     **changes: Any) -> SearchSpec:
    """A validated :class:`SearchSpec` from a YAML file or a mapping, with top-level ``changes``
    (e.g. ``dataset=``, ``partition=`` from the command line; None = keep the spec's) and
    ``overrides`` (dotted RunConfig keys, merged over the spec's) applied before validation.

    Also builds the base configuration and one configuration per choice / bound of every
    searched key and per point to evaluate, so a bad key or value fails here, by name.
    Raises ``ValueError`` naming the file and the offending keys.
    """
    data, where = read_spec(source, "search")
    data.update({key: value for key, value in changes.items() if value is not None})
    if overrides:
        data["overrides"] = {**dict(data.get("overrides") or {}), **dict(overrides)}
    spec = validate_spec(SearchSpec, data, where)
    try:
        base = spec.base_config()
    except (ValueError, TypeError) as error:
        raise ValueError(f"{where}: the cell is invalid: {describe_error(error)}") from None
    for key, distribution in spec.space.items():
        for value in distribution.representatives():
            try:
                with_overrides(base, {key: value})
            except (ValueError, TypeError) as error:
                raise ValueError(f"{where}: space.{key} = {value!r} is not a valid setting: {describe_error(error)}") from None
    for index, point in enumerate(spec.points_to_evaluate):
        try:
            with_overrides(base, point)
        except (ValueError, TypeError) as error:
            raise ValueError(f"{where}: points_to_evaluate[{index}] is not a valid setting: {describe_error(error)}") from None
    return spec


def search_id(spec: SearchSpec, base: RunConfig | None = None) -> str:
    """Stable id of a search: hash of the base cell, the space and the objective.

    Re-running a spec keeps it (and so its default study, its MLflow ``search_id`` and the
    trials' checkpoint names); changing the cell, the space or the metric starts another search.
    """
    base = base or spec.base_config()
    identity = {
        "cell": base.cell_id,
        "space": {k: v.model_dump(mode="json", exclude_none=True) for k, v in sorted(spec.space.items())},
        "metric": spec.metric,
        "mode": spec.mode,
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:12]


def default_optuna_storage() -> str:
    """``$NPSEMISEG_OPTUNA_STORAGE`` (the local stack exports its PostgreSQL URL there), else
    ``sqlite:///<cwd>/optuna.db`` (absolute)."""
    return os.environ.get("NPSEMISEG_OPTUNA_STORAGE") or f"sqlite:///{(Path.cwd() / DEFAULT_OPTUNA_FILE).resolve()}"
