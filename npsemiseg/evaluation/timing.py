"""Wall-clock timing of prediction with uncertainty: warm-up, repeats, medians, CUDA synchronisation.

Several cases timed for comparison are run interleaved (round-robin, the order
rotated every round), so a change in machine load during the measurement hits
all of them alike; on a shared CPU that matters more than the number of repeats.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from npsemiseg.evaluation.inference import predict


@dataclass
class Timing:
    """Wall-clock and process-CPU seconds of each timed repeat of one case (warm-up runs excluded).

    On a CPU shared with other work the process-CPU time (all threads of this process) is the
    steadier measure of the work done; on a GPU it counts only the host side.
    """

    name: str
    seconds: list[float] = field(default_factory=list)
    cpu_seconds: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    @property
    def cpu_median(self) -> float:
        return statistics.median(self.cpu_seconds)

    @property
    def minimum(self) -> float:
        return min(self.seconds)


def synchronize(device: torch.device | str | None) -> None:
    """Wait for queued CUDA work on ``device`` (a no-op elsewhere) so timings cover it."""
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def time_interleaved(
    cases: dict[str, Callable[[], Any]],
    *,
    repeats: int = 5,
    warmup: int = 1,
    device: torch.device | str | None = None,
    on_round: Callable[[int, dict[str, Timing]], None] | None = None,
) -> dict[str, Timing]:
    """Time each zero-argument callable ``repeats`` times, round-robin, after ``warmup`` untimed calls
    of each. The order of the cases is rotated by one every round; ``on_round(round_index, timings)``
    is called after each round (progress of long runs). Returns ``{name: Timing}``."""
    if repeats < 1 or warmup < 0:
        raise ValueError(f"repeats, warmup: expected >= 1 and >= 0, got {repeats}, {warmup}")
    if not cases:
        raise ValueError("cases: expected at least one case to time")
    for _ in range(warmup):
        for fn in cases.values():
            fn()
    synchronize(device)
    names = list(cases)
    timings = {name: Timing(name) for name in names}
    for round_index in range(repeats):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            start, cpu_start = time.perf_counter(), time.process_time()
            cases[name]()
            synchronize(device)
            timings[name].seconds.append(time.perf_counter() - start)
            timings[name].cpu_seconds.append(time.process_time() - cpu_start)
        if on_round is not None:
            on_round(round_index, timings)
    return timings


def time_prediction(
    model: nn.Module,
    images: Tensor,
    *,
    mode: str = "whole",
    num_samples: int | None = None,
    repeats: int = 5,
    warmup: int = 1,
    **predict_options: Any,
) -> Timing:
    """Seconds to ``predict`` (probabilities + entropy) ``images`` with ``mode`` and T = ``num_samples``,
    model in eval mode (restored afterwards)."""
    was_training = model.training
    model.eval()
    try:
        return time_interleaved(
            {mode: lambda: predict(model, images, mode=mode, num_samples=num_samples, **predict_options)},
            repeats=repeats,
            warmup=warmup,
            device=images.device,
        )[mode]
    finally:
        model.train(was_training)
