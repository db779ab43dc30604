"""What the training loop hands to a launcher: checkpoints (the reporters) and progress lines.

- :class:`TrainReporter`: Ray Train workers (every rank reports; rank 0 with the checkpoint);
- :class:`StoreReporter`: one process (Ray Train's local mode, or in-process), checkpoints
  copied to the storage;
- :class:`TuneReporter`: an in-process cell inside a Ray Tune trial (Tune checkpoints);
- :class:`ProgressLogger`: rank 0 logs one progress line every few seconds.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import ray.train
import ray.tune

from npsemiseg.callbacks import Callbacks
from semiseg_platform.logs import PROGRESS
from semiseg_platform.storage import CheckpointStore, Storage, checkpoint_dir_name, download_checkpoint, mark_complete

#: The logger of the cells' progress lines (the CLI shows it unless ``--quiet``)
progress_logger = logging.getLogger(PROGRESS)


class ProgressLogger(Callbacks):
    """Rank 0 logs one line per ``every_s`` seconds of training, per evaluation and at the end."""

    def __init__(self, every_s: float = 5.0, prefix: str = "") -> None:
        self.every_s = every_s
        self.prefix = prefix
        self.rank = 0
        self._last = 0.0

    def _log(self, text: str) -> None:
        if self.rank == 0:
            progress_logger.info("%s%s", self.prefix, text)

    def on_start(self, config, *, total_steps, start_step, rank, world_size) -> None:
        self.rank = rank
        resumed = f", resumed at step {start_step}" if start_step else ""
        self._log(f"{config.cell_name}: {total_steps} steps on {world_size} process(es){resumed}")
        self._last = time.monotonic()

    def on_step(self, step, total_steps, logs) -> None:
        if time.monotonic() - self._last >= self.every_s or step == total_steps:
            self._last = time.monotonic()
            self._log(f"step {step}/{total_steps} loss {logs.get('train/loss', float('nan')):.4f} "
                      f"({logs.get('train/sec_per_iter', float('nan')):.2f} s/it)")

    def on_evaluation(self, step, metrics) -> None:
        shown = ", ".join(f"{k} {metrics[k]:.4f}" for k in ("miou", "pavpu", "ece") if k in metrics)
        self._log(f"evaluation at step {step}: {shown}")


class CheckpointReporter(Callbacks):
    """Hands the loop's checkpoints to a launcher and finds the one to resume from.

    The run's last checkpoint (at ``total_steps``, or at ``runtime.stop_at_step``) is reported
    from ``on_end``, so that report carries the loop's outcome with its metrics: ``step``,
    ``seconds``, ``train_seconds`` and ``interrupted`` (1.0 when stopped early).
    Subclasses implement :meth:`report` and :meth:`resume_from`.
    """

    def __init__(self) -> None:
        self.rank = 0
        self.total_steps = 0
        self.stop_at_step: int | None = None
        self.last_uri: str | None = None
        self._last: tuple[int, Path, dict[str, float]] | None = None
        self._temporary: list[Path] = []

    def on_start(self, config, *, total_steps, start_step, rank, world_size) -> None:
        self.rank = rank
        self.total_steps = total_steps
        self.stop_at_step = config.runtime.stop_at_step

    def on_checkpoint(self, step: int, directory: Path, metrics: dict[str, float]) -> None:
        if step >= self.total_steps or step == self.stop_at_step:
            self._last = (step, Path(directory), dict(metrics))
        else:
            self.report(step, Path(directory), {**metrics, "step": step})

    def on_end(self, result: Any) -> None:
        if self._last is not None:
            step, directory, metrics = self._last
            self._last = None
            self.report(step, directory, {**metrics, "step": step, "seconds": result.seconds,
                                          "train_seconds": result.train_seconds,
                                          "interrupted": float(bool(result.interrupted))})

    def report(self, step: int, directory: Path, metrics: dict[str, float]) -> None:
        raise NotImplementedError

    def temporary_dir(self) -> Path:
        """A local directory for a downloaded checkpoint, removed by :meth:`close`."""
        path = Path(tempfile.mkdtemp(prefix="npsemiseg-resume-"))
        self._temporary.append(path)
        return path

    def download(self, checkpoint: ray.train.Checkpoint) -> Path:
        """A checkpoint Ray or Tune registered, downloaded as every checkpoint is (its own files only:
        :func:`~semiseg_platform.storage.download_checkpoint`) into a temporary directory."""
        where = Storage(uri=checkpoint.path, root=checkpoint.path, filesystem=checkpoint.filesystem)
        return download_checkpoint(where, self.temporary_dir())

    def latest_in(self, store: CheckpointStore) -> Path | None:
        """``store``'s newest complete checkpoint as a local directory (downloaded when remote), or None."""
        latest = store.latest()
        if latest is None:
            return None
        return store.local_copy(latest[0], None if store.storage.is_local else self.temporary_dir())

    def close(self) -> None:
        """Remove downloaded checkpoints (after the loop has restored from them)."""
        for path in self._temporary:
            shutil.rmtree(path, ignore_errors=True)
        self._temporary.clear()


class TrainReporter(CheckpointReporter):
    """Ray Train workers: every rank reports, rank 0 with the checkpoint (persisted by Ray).

    Resumes from ``ray.train.get_checkpoint()`` (the last one Ray registered, after a worker
    failure or when the same name runs again), else from the storage's newest complete
    checkpoint (a lineage started by another launcher).
    """

    def __init__(self, store: CheckpointStore) -> None:
        super().__init__()
        self.store = store

    def on_evaluation(self, step, metrics) -> None:
        """Evaluations before the end are reported too (every rank, no checkpoint), so a Train callback
        such as a search's (``run_cell(train_callbacks=...)``) can pass them on to a Tune scheduler."""
        if step < self.total_steps:
            ray.train.report({**metrics, "step": step})

    def report(self, step, directory, metrics) -> None:
        checkpoint = None
        if self.rank == 0:
            mark_complete(directory, step)
            checkpoint = ray.train.Checkpoint.from_directory(str(directory))
            self.last_uri = self.store.storage.uri_of(self.store.name, checkpoint_dir_name(step))
        ray.train.report(metrics, checkpoint=checkpoint, checkpoint_dir_name=checkpoint_dir_name(step))

    def resume_from(self) -> Path | None:
        checkpoint = ray.train.get_checkpoint()
        if checkpoint is None:
            return self.latest_in(self.store)
        if self.store.storage.is_local:
            return Path(checkpoint.path)
        return self.download(checkpoint)


class StoreReporter(CheckpointReporter):
    """One process (Ray Train's local mode, or in-process): checkpoints copied to the storage.

    ``also_ray_train``: also ``ray.train.report`` the metrics (Ray Train's local mode does not
    persist checkpoints; the report gives its ``Result`` the final metrics).
    """

    def __init__(self, store: CheckpointStore, *, also_ray_train: bool = False, keep: int = 2) -> None:
        super().__init__()
        self.store = store
        self.also_ray_train = also_ray_train
        self.keep = keep

    def report(self, step, directory, metrics) -> None:
        self.last_uri = self.store.save(step, directory)
        self.store.prune(self.keep)
        if self.also_ray_train:
            ray.train.report(metrics)

    def resume_from(self) -> Path | None:
        return self.latest_in(self.store)


class TuneReporter(CheckpointReporter):
    """In-process cell inside a Ray Tune trial: ``ray.tune.report`` with Tune checkpoints.

    Evaluations before the end are reported too (without a checkpoint) so schedulers such as
    ASHA see them; resumes from ``ray.tune.get_checkpoint()`` (Tune restores it after a trial
    failure or when the experiment is resumed).
    """

    def on_evaluation(self, step, metrics) -> None:
        if step < self.total_steps:
            ray.tune.report({**metrics, "step": step})

    def report(self, step, directory, metrics) -> None:
        mark_complete(directory, step)
        ray.tune.report(metrics, checkpoint=ray.tune.Checkpoint.from_directory(str(directory)))
        self.last_uri = None  # Tune persists it under the trial's directory; its path is Tune's

    def resume_from(self) -> Path | None:
        checkpoint = ray.tune.get_checkpoint()
        return None if checkpoint is None else self.download(checkpoint)
