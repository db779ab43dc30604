"""What a cell reserves on the cluster: its workers' CPUs and GPUs, plus a small driver for a TorchTrainer cell.

Free of Ray and MLflow, so that the specs (``sweeps.spec_base``) and the benchmarks can size cells without them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

#: Seconds a cell waits for a cluster's resources before it fails (``--resource-timeout``)
RESOURCE_TIMEOUT_S = 600.0
#: CPUs reserved for the Tune trial that drives a multi-worker cell's TorchTrainer (Ray rejects 0)
DRIVER_CPUS = 0.5


@dataclass(frozen=True)
class Needed:
    """What one cell reserves: CPUs and GPUs in all (its workers, plus a driver for a TorchTrainer cell),
    and the Ray custom resources of its workers (``custom``: name -> amount in all)."""

    cpus: float
    gpus: float
    custom: Mapping[str, float] = field(default_factory=dict)
    #: how many workers share ``cpus`` (less ``driver_cpus``), ``gpus`` and ``custom`` (one bundle each)
    workers: int = 1
    driver_cpus: float = 0.0

    @classmethod
    def of(cls, workers: int, gpus_per_worker: float, cpus_per_worker: float, *, in_process: bool,
           custom_per_worker: Mapping[str, float] | None = None) -> Needed:
        count = 1 if in_process else max(1, workers)
        custom = {name: count * amount for name, amount in (custom_per_worker or {}).items()}
        if in_process:
            return cls(cpus_per_worker, gpus_per_worker, custom)
        driver = DRIVER_CPUS if workers > 1 else 0.0
        return cls(driver + count * cpus_per_worker, count * gpus_per_worker, custom, count, driver)

    def describe(self) -> str:
        extra = "".join(f", {amount:g} {name}" for name, amount in self.custom.items())
        return f"{self.cpus:g} CPU(s) and {self.gpus:g} GPU(s){extra} per cell"

    def bundles(self) -> list[dict[str, float]]:
        """The cell as resource bundles, one per worker (and one for a TorchTrainer's driver): what
        ``ray.autoscaler.sdk.request_resources`` asks an autoscaler for."""
        count = max(1, self.workers)
        worker = {"CPU": (self.cpus - self.driver_cpus) / count, "GPU": self.gpus / count,
                  **{name: amount / count for name, amount in self.custom.items()}}
        worker = {name: amount for name, amount in worker.items() if amount}
        return ([{"CPU": self.driver_cpus}] if self.driver_cpus else []) + [dict(worker) for _ in range(count)]

    def missing(self, available: Mapping[str, float]) -> list[str]:
        """What does not fit ``available`` (``{"CPU": n, "GPU": m, ...}``), e.g. ``["1 GPU(s) (has 0)"]``."""
        short = []
        for name, amount in (("CPU", self.cpus), ("GPU", self.gpus)):
            has = float(available.get(name, 0.0))
            if amount > has + 1e-9:
                short.append(f"{amount:g} {name}(s) (has {has:g})")
        for name, amount in self.custom.items():
            has = float(available.get(name, 0.0))
            if amount > has + 1e-9:
                short.append(f"{amount:g} {name} (has {has:g})")
        return short
