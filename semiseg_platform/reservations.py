"""What a cell reserves on the cluster: its workers' CPUs and GPUs, plus a small driver for a TorchTrainer cell.

Free of Ray and MLflow, so that the specs (``sweeps.spec_base``) and the benchmarks can size cells without them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

#: CPUs reserved for the Tune trial that drives a multi-worker cell's TorchTrainer (Ray rejects 0)
DRIVER_CPUS = 0.5


@dataclass(frozen=True)
class Needed:
    """What one cell reserves: CPUs and GPUs in all (its workers, plus a driver for a TorchTrainer cell)."""

    cpus: float
    gpus: float

    @classmethod
    def of(cls, workers: int, gpus_per_worker: float, cpus_per_worker: float, *, in_process: bool) -> Needed:
        if in_process:
            return cls(cpus_per_worker, gpus_per_worker)
        driver = DRIVER_CPUS if workers > 1 else 0.0
        return cls(driver + max(1, workers) * cpus_per_worker, max(1, workers) * gpus_per_worker)

    def describe(self) -> str:
        return f"{self.cpus:g} CPU(s) and {self.gpus:g} GPU(s) per cell"

    def missing(self, available: Mapping[str, float]) -> list[str]:
        """What does not fit ``available`` (``{"CPU": n, "GPU": m}``), e.g. ``["1 GPU(s) (has 0)"]``."""
        short = []
        for name, amount in (("CPU", self.cpus), ("GPU", self.gpus)):
            has = float(available.get(name, 0.0))
            if amount > has + 1e-9:
                short.append(f"{amount:g} {name}(s) (has {has:g})")
        return short
