"""How much of a run's wall time its steps spend waiting for data: the loader as the bottleneck, measured on the host.

:class:`DataWait` times each ``next(batch)`` of the epoch loop (``time.perf_counter`` around the iterator, host time
only) and adds each step's wall time as the loop counts it (``train/sec_per_iter``: from one step's queueing to the
next, the wait for its batch, its host work and any read of device values in between; evaluation and checkpoints
excluded). After ``warmup_steps`` steps (workers starting, first batches), it closes a window of ``window_steps``
steps at the loop's next read of device values and reports the window's share of wall time spent waiting
(``train/data_wait_fraction``), logging one warning per run when the share exceeds ``warn_fraction``.

Why host time is fair, and needs no synchronisation of its own: the loop reads device values every
``runtime.read_every_steps`` steps, and each read waits for the device to finish what was queued, so over a window
of reads the steps' wall times add up to the time the device and the host together took. When the device sets the
pace, the host blocks at those reads while the loader's workers fill their prefetch queue, and the next batches
arrive at once: the wait share stays near 0. A wait is time in which the host queued no work; a share well above 0
says the loader delivers slower than the step consumes. Nothing here reads a device value.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator
from typing import TypeVar

logger = logging.getLogger(__name__)

#: the metric logged with the step that closes a window
DATA_WAIT_FRACTION = "train/data_wait_fraction"
#: steps of a run (or of its resumption) not counted: loader workers starting, the first batches
WARMUP_STEPS = 5
#: steps per measured window (closed at the next read of device values)
WINDOW_STEPS = 20
#: a window whose wait share exceeds this warns (once per run)
WARN_FRACTION = 0.2

T = TypeVar("T")


class DataWait:
    """The wait-for-data share of the steps' wall time, per window (see the module docstring)."""

    def __init__(self, *, workers: int, cell: str = "", warmup_steps: int = WARMUP_STEPS,
                 window_steps: int = WINDOW_STEPS, warn_fraction: float = WARN_FRACTION, warn: bool = True) -> None:
        if window_steps < 1 or warmup_steps < 0:
            raise ValueError(f"DataWait: window_steps must be >= 1 and warmup_steps >= 0, got {window_steps}, {warmup_steps}")
        self.workers, self.cell, self.warn = workers, cell, warn
        self.warmup_steps, self.window_steps, self.warn_fraction = warmup_steps, window_steps, warn_fraction
        self.seen = 0
        self.last_wait = 0.0
        self.waited, self.wall, self.steps = 0.0, 0.0, 0
        self.warned = False

    def timed(self, batches: Iterable[T]) -> Iterator[T]:
        """``batches``, each ``next`` timed (host clock); the wait is counted with the step that follows (the waits
        of all its micro-batches under gradient accumulation)."""
        iterator = iter(batches)
        while True:
            tick = time.perf_counter()
            try:
                batch = next(iterator)
            except StopIteration:
                return
            self.last_wait += time.perf_counter() - tick
            yield batch

    def step(self, seconds: float) -> None:
        """One step done, ``seconds`` of wall time (its wait for data included); the first ``warmup_steps`` are not
        counted."""
        self.seen += 1
        if self.seen > self.warmup_steps:
            self.waited += min(self.last_wait, seconds)
            self.wall += seconds
            self.steps += 1
        self.last_wait = 0.0

    def read(self, step: int) -> float | None:
        """At a read of device values after step ``step``: the window's wait share once it holds ``window_steps``
        steps (a new window starts), else None. The first share over ``warn_fraction`` logs one warning."""
        if self.steps < self.window_steps:
            return None
        share = self.waited / self.wall if self.wall > 0 else 0.0
        first = step - self.steps + 1
        if share > self.warn_fraction and not self.warned:
            self.warned = True
            if self.warn:
                logger.warning(
                    "cell %s: the training step waited for data %.0f%% of its wall time over steps %d-%d "
                    "(data.num_workers=%d): the data loader is the bottleneck; raise data.num_workers (one per free "
                    "CPU core), or put the dataset on faster storage (a local disk rather than a network mount)",
                    self.cell, 100 * share, first, step, self.workers)
        self.waited, self.wall, self.steps = 0.0, 0.0, 0
        return share
