"""What the grid and search specs share: the strict model base, reading YAML, one-line error
descriptions, name checks and the per-cell resources (and what they reserve on the cluster)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, PositiveInt, ValidationError, model_validator

from npsemiseg.untrusted import load_yaml
from semiseg_platform.reservations import DRIVER_CPUS

SpecT = TypeVar("SpecT", bound=BaseModel)

#: the configurations a spec may ask to build (a grid's combinations of axes, a search's checked settings) unless
#: its ``max_cells`` says more, counted before any is built: the paper's grids have 54 to 384, and building one
#: takes about 10 ms (1,000: 10 s before anything starts)
DEFAULT_MAX_CELLS = 1000


class Strict(BaseModel):
    """A frozen model rejecting unknown keys (every spec section)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def one_of(field: str, value: str, valid: Iterable[str]) -> str:
    """``value`` when it is in ``valid``; else ``ValueError`` naming ``field`` and the valid values."""
    valid = tuple(valid)
    if value not in valid:
        raise ValueError(f"{field}: unknown value {value!r}; expected one of {list(valid)}")
    return value


def describe_error(error: Exception) -> str:
    """A validation error on one line: ``key.path: message; ...`` (a check of the whole model: its message alone)."""
    if isinstance(error, ValidationError):
        return "; ".join(".".join(str(p) for p in e["loc"]) + ": " * bool(e["loc"]) + e["msg"].removeprefix("Value error, ")
                         for e in error.errors())
    return " ".join(str(error).split())


def read_spec(source: str | Path | Mapping[str, Any], kind: str) -> tuple[dict[str, Any], str]:
    """The raw mapping of a ``kind`` spec ("grid", "search") from a YAML file path or a mapping, and
    how to name it in errors (``"grid spec jobs/specs/x.yaml"``). ``ValueError`` for a missing file,
    invalid YAML or a document that is not a mapping."""
    if isinstance(source, Mapping):
        return dict(source), f"{kind} spec"
    path = Path(source)
    where = f"{kind} spec {path}"
    if not path.is_file():
        raise ValueError(f"{where}: no such file")
    data = read_yaml(path, where)
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected a mapping of {kind} settings, got {type(data).__name__}")
    return data, where


def read_yaml(path: Path, where: str) -> Any:
    """The YAML document of ``path`` (:func:`npsemiseg.untrusted.load_yaml`: aliases and nesting within a budget);
    ``ValueError`` naming ``where``, the file, line and column of a syntax error (``grid spec x.yaml: not valid
    YAML at x.yaml:3:7: mapping values are not allowed here``)."""
    return load_yaml(path.read_text(), where=where, path=path)


def validate_spec(model: type[SpecT], data: Mapping[str, Any], where: str) -> SpecT:
    """``model`` validated from ``data``; ``ValueError`` naming ``where`` and every offending key/value."""
    try:
        return model.model_validate(data)
    except ValidationError as error:
        raise ValueError(f"{where} is invalid: {describe_error(error)}") from None


class Resources(Strict):
    """Per-cell resources: ``workers`` DDP workers of ``gpus_per_worker`` GPUs and ``cpus_per_worker`` CPUs.

    One worker (and at most one GPU) trains in-process in a reused Tune actor; several workers
    launch a ``TorchTrainer``. ``launcher`` forces one or the other (``auto``: by ``workers``).
    ``custom_per_worker``: Ray custom resources each worker reserves besides its CPUs and GPUs (e.g.
    ``{one_per_node: 1}`` on nodes started with ``--resources '{"one_per_node": 1}'`` puts every worker on
    a node of its own; a node type's stand-in resource on a fake autoscaling cluster). They do not cap how
    many cells run at once: Tune queues a cell that does not fit, and on an autoscaling cluster that queued
    demand is what adds nodes. ``min_workers`` (< ``workers``): elastic cells that start on as many workers as
    there is room for, down to ``min_workers``, and go on with fewer after losing a node, re-planned to the
    same global batch (``semiseg_platform.launch.run_cell``).
    """

    workers: PositiveInt = 1
    min_workers: PositiveInt | None = None
    gpus_per_worker: float = Field(0.0, ge=0.0)
    cpus_per_worker: PositiveFloat = 1.0
    custom_per_worker: dict[str, PositiveFloat] = Field(default_factory=dict)
    launcher: Literal["auto", "trainer", "in_process"] = "auto"

    @model_validator(mode="after")
    def _custom_names_are_custom(self) -> Resources:
        taken = sorted(set(self.custom_per_worker) & {"CPU", "GPU", "memory", "object_store_memory"})
        if taken:
            raise ValueError(f"resources.custom_per_worker: {taken} are Ray's own resources "
                             "(use cpus_per_worker / gpus_per_worker)")
        return self

    @model_validator(mode="after")
    def _in_process_is_one_device(self) -> Resources:
        if self.launcher == "in_process" and (self.workers > 1 or self.gpus_per_worker > 1):
            raise ValueError(f"resources.launcher: in_process runs one worker on at most one GPU, "
                             f"got workers={self.workers}, gpus_per_worker={self.gpus_per_worker:g}")
        return self

    @model_validator(mode="after")
    def _min_workers_at_most_workers(self) -> Resources:
        if self.min_workers is not None and self.min_workers > self.workers:
            raise ValueError(f"resources.min_workers: expected at most workers ({self.workers}), got {self.min_workers}")
        if self.min_workers is not None and self.min_workers < self.workers and self.launcher == "in_process":
            raise ValueError("resources.min_workers: elastic workers need the trainer launcher, not in_process")
        return self

    @property
    def in_process(self) -> bool:
        """Whether cells train in the Tune actor itself (no TorchTrainer)."""
        if self.launcher != "auto":
            return self.launcher == "in_process"
        return self.workers == 1 and self.gpus_per_worker <= 1


def trial_resources(resources: Resources) -> dict[str, float]:
    """What one cell's Tune trial reserves: the whole device for an in-process cell, a small
    driver for a TorchTrainer cell (whose workers reserve their own)."""
    if resources.in_process:
        return {"CPU": resources.cpus_per_worker, "GPU": resources.gpus_per_worker, **resources.custom_per_worker}
    return {"CPU": DRIVER_CPUS, "GPU": 0.0}


def cells_at_once(resources: Resources, cluster: Mapping[str, float], limit: int | None = None) -> int:
    """How many cells fit the cluster at once (at least 1), capped by ``limit``."""
    if resources.in_process:
        cpu, gpu = resources.cpus_per_worker, resources.gpus_per_worker
    else:
        cpu = DRIVER_CPUS + resources.workers * resources.cpus_per_worker
        gpu = resources.workers * resources.gpus_per_worker
    fits = [int(cluster.get("CPU", 0) // cpu + 1e-9)]
    if gpu:
        fits.append(int(cluster.get("GPU", 0) // gpu + 1e-9))
    count = max(1, min(fits))
    return min(count, limit) if limit else count
