"""The loop's wait-for-data share (``npsemiseg.training.data_wait``): a slow loader warns once and logs its share, a
fast one does not warn; the share is host time around ``next(batch)`` against the steps' wall time."""

from __future__ import annotations

import functools
import itertools
import logging
import time

import pytest
from torch.utils.data import Dataset

from npsemiseg.callbacks import Callbacks
from npsemiseg.training import data_wait, loop, setup
from npsemiseg.training.data_order import Streams
from npsemiseg.training.data_wait import DATA_WAIT_FRACTION, DataWait

#: a run of 8 smoke steps read every 2: one warm-up step, windows of 3 steps closed at the reads after steps 4 and 8
STEPS, WARMUP, WINDOW = 8, 1, 3
LOGGER = data_wait.__name__


class _Slow(Dataset):
    """``dataset`` with ``seconds`` of sleep in each ``__getitem__`` (a loader on slow storage)."""

    def __init__(self, dataset: Dataset, seconds: float) -> None:
        self.dataset, self.seconds = dataset, seconds

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i):
        time.sleep(self.seconds)
        return self.dataset[i]


class _Logs(Callbacks):
    def __init__(self) -> None:
        self.steps: list[tuple[int, dict[str, float]]] = []

    def on_step(self, step, total_steps, logs) -> None:
        self.steps.append((step, dict(logs)))


def _train(smoke_config, monkeypatch, sleep_s: float | None) -> list[tuple[int, dict[str, float]]]:
    build = setup.build_datasets

    def slow_datasets(config):
        datasets = dict(build(config))
        datasets["labeled"] = _Slow(datasets["labeled"], sleep_s)
        return datasets

    epoch = Streams.epoch

    def drawn_before(self, epoch_index, start_batch):
        return list(itertools.islice(epoch(self, epoch_index, start_batch), STEPS))

    if sleep_s is None:  # every batch drawn when the epoch starts (a warm-up step's time): next(batch) waits for nothing
        monkeypatch.setattr(Streams, "epoch", drawn_before)
    else:
        monkeypatch.setattr(setup, "build_datasets", slow_datasets)
    monkeypatch.setattr(loop, "DataWait", functools.partial(DataWait, warmup_steps=WARMUP, window_steps=WINDOW))
    logs = _Logs()
    config = smoke_config(**{"schedule.max_steps": STEPS, "schedule.eval_every_epochs": 0, "runtime.read_every_steps": 2,
                             "runtime.device": "cpu", "data.num_workers": 0})
    loop.train(config, logs)
    return logs.steps


def _shares(steps) -> dict[int, float]:
    return {step: logs[DATA_WAIT_FRACTION] for step, logs in steps if DATA_WAIT_FRACTION in logs}


def test_a_slow_loader_warns_once_and_logs_its_wait_share(smoke_config, monkeypatch, caplog):
    """0.25 s of sleep per labeled item (2 per batch): each window's share is at least its 3 steps' sleeps over their
    wall times as the same run logged them (``train/sec_per_iter``), a ratio that holds however loaded the machine
    is; the two windows both log their share, the warning comes once, naming the share and the workers. The warning
    needs a share over 20 %: the sleeps (0.5 s a step) outweigh a smoke step (tens of ms on a quiet machine) until
    the step takes 2 s, about 30 times its quiet time. (With the wait counted nowhere, e.g. ``DataWait.step`` adding
    0, the share is 0 and this fails.)"""
    sleep_s, per_batch = 0.25, 2
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        steps = _train(smoke_config, monkeypatch, sleep_s)
    shares = _shares(steps)
    assert sorted(shares) == [4, 8]  # windows of 3 steps after 1 warm-up, closed at the reads
    walls = {step: logs["train/sec_per_iter"] for step, logs in steps}
    for last, share in shares.items():
        window_wall = sum(walls[step] for step in range(last - WINDOW + 1, last + 1))
        assert WINDOW * per_batch * sleep_s / window_wall <= share <= 1.0, (shares, walls)
    warnings = [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "data.num_workers=0" in warnings[0] and "waited for data" in warnings[0] and "steps 2-4" in warnings[0]


def test_a_loader_that_keeps_up_does_not_warn(smoke_config, monkeypatch, caplog):
    """Batches ready before they are asked for: the share is logged, near 0, and no warning. (The smoke data made
    inside ``next(batch)`` with ``data.num_workers`` 0 costs 10-25 % of a smoke step's wall time on a loaded 2-core
    machine, one worker about as much there: too near the threshold for a test of "no warning".)"""
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        steps = _train(smoke_config, monkeypatch, None)
    shares = _shares(steps)
    assert sorted(shares) == [4, 8]
    assert all(0 <= share < 0.05 for share in shares.values()), shares
    assert not [r for r in caplog.records if r.name == LOGGER]


def test_windows_skip_the_warm_up_and_wait_for_a_full_window():
    """Host arithmetic only: the warm-up steps are not counted, a window reports at the first read with enough steps,
    its share is the waits over the wall times, and the next window starts empty."""
    wait = DataWait(workers=2, warmup_steps=2, window_steps=3, warn=False)
    for seconds, waited in [(10.0, 9.0), (10.0, 9.0), (1.0, 0.5), (1.0, 0.0)]:
        wait.last_wait = waited
        wait.step(seconds)
    assert wait.read(4) is None  # 2 counted steps < 3
    wait.last_wait = 0.5
    wait.step(2.0)
    assert wait.read(5) == pytest.approx(1.0 / 4.0)
    assert wait.read(5) is None and wait.steps == 0
    with pytest.raises(ValueError, match="window_steps"):
        DataWait(workers=0, window_steps=0)
