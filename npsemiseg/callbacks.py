"""How the platform observes a training run without npsemiseg knowing about Ray or MLflow.

``npsemiseg.training.train`` calls these hooks; the default implementation does
nothing. The platform subclasses ``Callbacks`` to report to Ray Train / Tune,
log to MLflow and upload checkpoints.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


class Callbacks:
    """Hooks called by the training loop, all optional. Only rank 0's hooks should log."""

    #: True when run by a person (progress bar); the platform's workers set False
    interactive: bool = False

    def on_start(self, config: Any, *, total_steps: int, start_step: int, rank: int, world_size: int) -> None:
        """Before the first step (``start_step`` > 0 when resumed from a checkpoint)."""

    def on_step(self, step: int, total_steps: int, logs: dict[str, float]) -> None:
        """After each optimisation step: losses, learning rate, timing."""

    def on_evaluation(self, step: int, metrics: dict[str, float]) -> None:
        """After each evaluation: mIoU, per-class IoU, PAvPU, calibration."""

    def on_checkpoint(self, step: int, directory: Path, metrics: dict[str, float]) -> None:
        """A complete checkpoint was written to ``directory`` (on every rank; rank 0's holds the files)."""

    def resume_from(self) -> Path | None:
        """A checkpoint directory to resume from, or None to start fresh."""
        return None

    def on_artifact(self, name: str, path: Path) -> None:
        """A file produced by the run (figure, table) that should be kept with it."""

    def on_end(self, result: Any) -> None:
        """After the last step and the final evaluation."""


class CallbackList(Callbacks):
    """Fans every hook out to several callbacks; ``resume_from`` returns the first non-None."""

    def __init__(self, callbacks: list[Callbacks]) -> None:
        self.callbacks = list(callbacks)
        self.interactive = any(c.interactive for c in self.callbacks)

    def on_start(self, config, **kwargs) -> None:
        for c in self.callbacks:
            c.on_start(config, **kwargs)

    def on_step(self, step, total_steps, logs) -> None:
        for c in self.callbacks:
            c.on_step(step, total_steps, logs)

    def on_evaluation(self, step, metrics) -> None:
        for c in self.callbacks:
            c.on_evaluation(step, metrics)

    def on_checkpoint(self, step, directory, metrics) -> None:
        for c in self.callbacks:
            c.on_checkpoint(step, directory, metrics)

    def resume_from(self):
        for c in self.callbacks:
            path = c.resume_from()
            if path is not None:
                return path
        return None

    def on_artifact(self, name, path) -> None:
        for c in self.callbacks:
            c.on_artifact(name, path)

    def on_end(self, result) -> None:
        for c in self.callbacks:
            c.on_end(result)
