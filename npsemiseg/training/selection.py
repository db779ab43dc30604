"""Checkpoint selection (``evaluation.select``): the last epoch's weights, or the best validation mIoU's.

U2PL, AugSeg and NP-SemiSeg report the epoch with the best validation mIoU (``ckpt_best.pth``); the
paper done right reports the last epoch. Whatever the selection, a run logs both: ``last/<metric>`` and
``best/<metric>`` beside the selected metrics, plus ``best/step`` and ``best/epoch``, so a table can say
how much selecting on the validation set adds.

With ``evaluation.also_student`` every evaluation holds the student's metrics too (``student/<metric>``, where the
framework reports a teacher); the run then logs the last evaluation's as ``student/<metric>`` and the one with the
student's best validation mIoU as ``best_student/<metric>`` (with ``best_student/step`` and ``best_student/epoch``),
chosen from the evaluation history, so a resumed run finds it too.
"""

from __future__ import annotations

from typing import Any

import torch

from npsemiseg.frameworks import Framework
from npsemiseg.frameworks.ema import unwrap

#: the metric the selection maximises
SELECT_METRIC = "miou"
#: evaluation entries that time the evaluation rather than measure the weights (not repeated as last/best)
TIMING_METRICS = frozenset({"seconds_per_image"})
#: the student's metrics in an evaluation (``evaluation.also_student``), and its best evaluation's in a run's
STUDENT_PREFIX, BEST_STUDENT_PREFIX = "student/", "best_student/"


def scalar_metrics(metrics: dict[str, float]) -> dict[str, float]:
    """The run-level metrics (``miou``, ``pavpu``, ...) without per-class entries (``iou/<class>``) and timings."""
    return {k: v for k, v in metrics.items() if "/" not in k and k not in TIMING_METRICS}


def student_summary(history: list[dict[str, float]], *, from_epoch: int = 0) -> dict[str, float]:
    """``student/<metric>`` of the last evaluation in ``history`` and ``best_student/<metric>``, ``best_student/step``,
    ``best_student/epoch`` of the one whose student has the best mIoU (among those after ``from_epoch`` completed
    epochs, as :class:`BestWeights`; the last one if none is a candidate); empty when no evaluation holds the
    student's."""
    key = STUDENT_PREFIX + SELECT_METRIC
    evaluated = [entry for entry in history if key in entry]
    if not evaluated:
        return {}
    candidates = [entry for entry in evaluated if entry.get("epoch", 0.0) >= from_epoch] or evaluated[-1:]
    best = max(candidates, key=lambda entry: entry[key])  # the first of equals, as BestWeights keeps it

    def student(entry: dict[str, float]) -> dict[str, float]:
        return {k[len(STUDENT_PREFIX):]: v for k, v in entry.items() if k.startswith(STUDENT_PREFIX)}

    summary = {f"{STUDENT_PREFIX}{k}": v for k, v in student(evaluated[-1]).items()}
    summary.update({f"{BEST_STUDENT_PREFIX}{k}": v for k, v in student(best).items()})
    summary.update({f"{BEST_STUDENT_PREFIX}step": best["step"], f"{BEST_STUDENT_PREFIX}epoch": best["epoch"]})
    return summary


class BestWeights:
    """The evaluation with the best validation mIoU so far and, when ``keep_weights``, a CPU copy of every
    module's weights at that evaluation (in the checkpoint too, so a resumed run can still restore it)."""

    def __init__(self, framework: Framework, *, keep_weights: bool, from_epoch: int = 0) -> None:
        self.framework, self.keep_weights, self.from_epoch = framework, keep_weights, from_epoch
        self.step: int | None = None
        self.epoch = 0.0
        self.metrics: dict[str, float] = {}
        self.modules: dict[str, Any] | None = None

    @property
    def miou(self) -> float:
        return self.metrics.get(SELECT_METRIC, float("-inf"))

    def offer(self, step: int, epoch: float, metrics: dict[str, float]) -> bool:
        """Keep this evaluation (and the weights) if it is a candidate (``epoch`` completed epochs >= ``from_epoch``)
        and its mIoU beats the best so far; True when it does."""
        if epoch < self.from_epoch or SELECT_METRIC not in metrics or not metrics[SELECT_METRIC] > self.miou:
            return False
        self.step, self.epoch, self.metrics = step, float(epoch), dict(metrics)
        if self.keep_weights:
            self.modules = {name: {k: v.detach().to("cpu", copy=True) for k, v in unwrap(m).state_dict().items()}
                            for name, m in self.framework.modules().items()}
        return True

    def restore(self) -> None:
        """Load the kept weights into the framework's modules (select = best)."""
        if self.modules is None:
            raise ValueError("evaluation.select=best: no weights were kept (no evaluation reported a miou)")
        for name, module in self.framework.modules().items():
            target = unwrap(module)
            device = next(iter(target.state_dict().values()), torch.empty(0)).device
            target.load_state_dict({k: v.to(device) for k, v in self.modules[name].items()})

    def select(self, last: dict[str, float], *, step: int, epoch: float) -> dict[str, float]:
        """The run's final metrics: the selected evaluation's (restoring its weights when it is not the last)
        plus ``last/*``, ``best/*``, ``best/step`` and ``best/epoch``."""
        is_best = self.offer(step, epoch, last) or self.step in (step, None)  # None: no candidate, the last stays
        chosen = last
        if self.keep_weights and not is_best:
            self.restore()
            chosen = self.metrics
        summary = {f"last/{k}": v for k, v in scalar_metrics(last).items()}
        summary.update({f"best/{k}": v for k, v in scalar_metrics(self.metrics or last).items()})
        summary.update({"best/step": float(self.step if self.step is not None else step),
                        "best/epoch": float(self.epoch if self.step is not None else epoch)})
        return {**chosen, **summary}

    def state(self) -> dict[str, Any]:
        """For checkpoints: the best evaluation and (when kept) its weights."""
        return {"step": self.step, "epoch": self.epoch, "metrics": self.metrics, "modules": self.modules}

    def load(self, state: dict[str, Any] | None) -> None:
        """Restore :meth:`state` (None: a checkpoint written before selection existed)."""
        if state:
            self.step, self.epoch = state["step"], float(state["epoch"])
            self.metrics, self.modules = dict(state["metrics"]), state["modules"]
