"""The training loop of one run (one cell), for every framework and head, in one process or one DDP rank.

``train(config, callbacks)`` sets the run up (:mod:`~npsemiseg.training.setup`), restores a checkpoint
when asked, runs the epoch loop (:class:`EpochLoop`: one :func:`~npsemiseg.training.step.deferred_train_step`
per optimiser step, over ``schedule.accumulation_steps`` micro-batches; its logs read back in one transfer every
``runtime.read_every_steps`` steps and handed to ``on_step`` then, each with its own step, with the share of wall
time spent waiting for data at those reads
(:mod:`~npsemiseg.training.data_wait`: a warning once per run when the loader is the bottleneck), evaluation every
``schedule.eval_every_epochs`` epochs, checkpoints every ``schedule.checkpoint_every_steps`` through the
:class:`~npsemiseg.training.checkpoint.Checkpointer`)
and ends with the final evaluation and its artifacts. ``evaluation.select`` chooses the reported weights
(:mod:`~npsemiseg.training.selection`: the last epoch's, or the best validation mIoU's, restored at the end).
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import resource
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from npsemiseg.callbacks import Callbacks
from npsemiseg.config import RunConfig
from npsemiseg.frameworks import Batch, Framework, StepContext
from npsemiseg.training.artifacts import evaluate_run, final_evaluation, per_class_artifacts
from npsemiseg.training.checkpoint import Checkpointer, resolve_checkpoint, restore
from npsemiseg.training.data_wait import DATA_WAIT_FRACTION, DataWait
from npsemiseg.training.selection import BestWeights, student_summary
from npsemiseg.training.plan import batch_scaling
from npsemiseg.training.shift import evaluate_under_shift
from npsemiseg.training.setup import Run, backend_flags, progress_bar, resolve_device, setup_run
from npsemiseg.training.step import PendingLogs, deferred_train_step, read_logs

logger = logging.getLogger(__name__)

#: The per-epoch metrics of ``on_step``'s logs at the last step of each epoch
EPOCH_IMAGES_PER_SEC, PEAK_MEMORY_MB = "train/epoch_images_per_sec", "train/peak_memory_mb"


@dataclass
class RunResult:
    """What ``train`` returns.

    metrics: the final evaluation of the selected weights (``miou``, ``pavpu``, ``ece``, ``nll``, ``brier``,
    ``auroc``, ``pixel_acc``, ``iou/<class>``, ...) with ``last/<metric>``, ``best/<metric>``, ``best/step``,
    ``best/epoch`` (``evaluation.select``), and with ``evaluation.also_student`` ``student/<metric>`` (the last
    evaluation's student), ``best_student/<metric>``, ``best_student/step``, ``best_student/epoch``; empty when the
    run stopped at ``runtime.stop_at_step``.
    history: one dict per evaluation (``step``, ``epoch`` and the metrics).
    checkpoint: the last checkpoint directory written (None when ``runtime.output_dir`` is unset).
    seconds: wall time of ``train``; train_seconds: time spent in training steps only.
    framework: the trained framework (``framework.eval_model()`` predicts, ``modules()`` holds the
    student and teachers), for in-process use; not pickled with the result.
    """

    metrics: dict[str, float]
    steps: int
    checkpoint: Path | None
    history: list[dict[str, float]] = field(default_factory=list)
    seconds: float = 0.0
    train_seconds: float = 0.0
    cell_id: str = ""
    interrupted: bool = False
    framework: Framework | None = field(default=None, repr=False, compare=False)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "framework": None}


def train(config: RunConfig, callbacks: Callbacks | None = None, *,
          resume_from: str | os.PathLike | None = None) -> RunResult:
    """Train one cell; see the package docstring. ``resume_from`` (or ``callbacks.resume_from()``):
    a checkpoint directory, or a checkpoint root whose ``latest`` file names one."""
    device = resolve_device(config)
    with backend_flags(config, device):
        return _run(config, callbacks if callbacks is not None else Callbacks(), resume_from, device)


def _run(config: RunConfig, callbacks: Callbacks, resume_from: str | os.PathLike | None, device: Any) -> RunResult:
    started = time.perf_counter()
    run = setup_run(config, device)
    if run.rank == 0:
        scaling = batch_scaling(config, run.world_size)
        logger.info("cell %s: %s", config.cell_name, scaling.describe())
        if scaling.warning():
            logger.warning("cell %s: %s", config.cell_name, scaling.warning())
    step, history = 0, []
    best = BestWeights(run.framework, keep_weights=config.evaluation.select == "best",
                       from_epoch=config.evaluation.select_from_epoch)
    resume = resume_from if resume_from is not None else callbacks.resume_from()
    if resume is not None:
        step, history = restore(resolve_checkpoint(resume), config, run.framework, run.optimizer.torch_optimizer, rank=run.rank,
                                best=best)
    checkpointer = Checkpointer(config, run.framework, run.optimizer.torch_optimizer, run.plan, callbacks,
                                rank=run.rank, world_size=run.world_size, best=best)
    callbacks.on_start(config, total_steps=run.plan.total_steps, start_step=step, rank=run.rank,
                       world_size=run.world_size)
    loop = EpochLoop(run, callbacks, checkpointer, step=step, history=history, best=best)
    loop.run()
    final: dict[str, float] = {}
    if not loop.interrupted:
        final = _finish(run, callbacks, checkpointer, loop)
    result = RunResult(metrics=final, steps=loop.step, checkpoint=checkpointer.last, history=loop.history,
                       seconds=time.perf_counter() - started, train_seconds=loop.train_seconds,
                       cell_id=config.cell_id, interrupted=loop.interrupted, framework=run.framework)
    callbacks.on_end(result)
    return result


def _finish(run: Run, callbacks: Callbacks, checkpointer: Checkpointer, loop: EpochLoop) -> dict[str, float]:
    """The final evaluation (of the last weights), the selection (``evaluation.select``: restores the best
    evaluation's weights when asked; the student's last and best with ``evaluation.also_student``), the evaluation
    under shift of the selected weights (``evaluation.corruptions``), its artifacts and the last checkpoint."""
    config, step = run.config, loop.step
    output_dir = Path(config.runtime.output_dir) if config.runtime.output_dir else None
    last = final_evaluation(run.framework, run.datasets, config, step=step, device=run.device, rank=run.rank,
                            output_dir=output_dir, callbacks=callbacks)
    epoch = float(math.ceil(step / run.plan.iters_per_epoch))
    loop.history.append({"step": float(step), "epoch": epoch, **last})
    final = {**loop.best.select(last, step=step, epoch=epoch),
             **student_summary(loop.history, from_epoch=config.evaluation.select_from_epoch)}
    final = {**final, **evaluate_under_shift(run.framework.eval_model(), run.datasets["val"], config, step=step,
                                             device=run.device)}
    if run.rank == 0:
        per_class_artifacts(final, output_dir, callbacks)
    checkpointer.save(step, final, loop.history)
    return final


class EpochLoop:
    """The steps of a run from ``step`` on: training, periodic evaluation and checkpoints, the stop at
    ``runtime.stop_at_step`` (``interrupted``, as if pre-empted)."""

    def __init__(self, run: Run, callbacks: Callbacks, checkpointer: Checkpointer, *, step: int,
                 history: list[dict[str, float]], best: BestWeights) -> None:
        self.run_, self.callbacks, self.checkpointer, self.best = run, callbacks, checkpointer, best
        self.step, self.history = step, history
        self.pending: list[tuple[PendingLogs, dict[str, float]]] = []
        self.train_seconds = 0.0
        self.interrupted = False
        schedule = run.config.schedule
        unlabeled = schedule.unlabeled_batch_size if run.framework.uses_unlabeled else 0
        self.images_per_step = (schedule.batch_size + unlabeled) * run.world_size * schedule.accumulation_steps
        self.data_wait = DataWait(workers=run.config.data.num_workers, cell=run.config.cell_name, warn=run.rank == 0)

    def run(self) -> None:
        """Train until the plan's last step or the stop step."""
        run = self.run_
        progress = progress_bar(run.config, self.callbacks, total=run.plan.total_steps, initial=self.step, rank=run.rank)
        try:
            while self.step < run.plan.total_steps and not self.interrupted:
                self._epoch(progress)
        finally:
            progress.close()

    def _epoch(self, progress: Any) -> None:
        run, plan = self.run_, self.run_.plan
        epoch, start_step = divmod(self.step, plan.iters_per_epoch)
        self.tick = time.perf_counter()
        self.epoch_seconds, self.epoch_steps = 0.0, 0
        micro = run.config.schedule.accumulation_steps
        batches = self.data_wait.timed(run.streams.epoch(epoch, start_step * micro))
        for step_batches in _groups(batches, micro):
            ctx = StepContext(step=self.step, total_steps=plan.total_steps, epoch=epoch,
                              total_epochs=plan.total_epochs, iters_per_epoch=plan.iters_per_epoch)
            try:
                pending = deferred_train_step(run.framework, step_batches[0] if micro == 1 else step_batches, ctx,
                                              run.optimizer, run.config, run.device, run.world_size)
            except Exception:
                self._report_pending(progress)  # a non-finite value of an earlier step explains the failure first
                raise
            self.step += 1
            self._queue_step(pending)
            if self._read_due():
                self._report_pending(progress)
            self._after_step()
            if self.step >= plan.total_steps or self.interrupted:
                break

    def _queue_step(self, pending: PendingLogs) -> None:
        """Keep the step's device values and its host logs (times, and at an epoch's end its throughput and peak
        memory) for the next read."""
        now = time.perf_counter()
        seconds = now - self.tick
        self.train_seconds += seconds
        self.tick = now
        self.data_wait.step(seconds)
        logs = {"train/sec_per_iter": seconds,
                "train/images_per_sec": self.images_per_step / seconds if seconds > 0 else float("inf")}
        self.epoch_seconds += seconds
        self.epoch_steps += 1
        plan = self.run_.plan
        if self.step % plan.iters_per_epoch == 0 or self.step >= plan.total_steps:
            images = self.epoch_steps * self.images_per_step
            logs[EPOCH_IMAGES_PER_SEC] = images / self.epoch_seconds if self.epoch_seconds > 0 else float("inf")
            logs[PEAK_MEMORY_MB] = peak_memory_mb(self.run_.device)
        self.pending.append((pending, logs))

    def _read_due(self) -> bool:
        """Every ``runtime.read_every_steps`` steps, and before anything that must see checked values: an epoch's
        end (evaluation, throughput), a checkpoint, the stop step, the last step."""
        step, config, plan = self.step, self.run_.config, self.run_.plan
        every_checkpoint = config.schedule.checkpoint_every_steps
        return (step % config.runtime.read_every_steps == 0 or step % plan.iters_per_epoch == 0
                or step >= plan.total_steps or step == config.runtime.stop_at_step
                or bool(every_checkpoint and step % every_checkpoint == 0))

    def _report_pending(self, progress: Any) -> None:
        """Read the queued steps' values in one transfer and hand each step's logs to ``on_step``, in order."""
        queued, self.pending = self.pending, []
        total = self.run_.plan.total_steps
        read = read_logs([p for p, _ in queued])
        wait = self.data_wait.read(self.step)
        if read and wait is not None:
            read[-1][DATA_WAIT_FRACTION] = wait
        for logs, (pending, host) in zip(read, queued):
            logs.update(host)
            self.callbacks.on_step(pending.step, total, logs)
        if queued:
            progress.update(len(queued))
            progress.set_postfix(loss=f"{logs['train/loss']:.4f}")

    def _after_step(self) -> None:
        """Evaluation at the end of every ``eval_every_epochs``-th epoch, checkpoints, the stop step."""
        run, step = self.run_, self.step
        plan, schedule = run.plan, run.config.schedule
        stop_at = run.config.runtime.stop_at_step
        metrics: dict[str, float] = {}
        every = schedule.eval_every_epochs
        end_of_epoch = step % plan.iters_per_epoch == 0
        if end_of_epoch and every and (step // plan.iters_per_epoch) % every == 0 and step < plan.total_steps:
            metrics = evaluate_run(run.framework, run.datasets, run.config, step=step, device=run.device)
            self.history.append({"step": float(step), "epoch": float(step // plan.iters_per_epoch), **metrics})
            self.best.offer(step, step // plan.iters_per_epoch, metrics)
            self.callbacks.on_evaluation(step, metrics)
            self.tick = time.perf_counter()
        every_steps = schedule.checkpoint_every_steps
        if step < plan.total_steps and ((every_steps and step % every_steps == 0) or step == stop_at):
            self.checkpointer.save(step, metrics, self.history)
            self.tick = time.perf_counter()
        if step == stop_at and step < plan.total_steps:
            self.interrupted = True


def _groups(items: Iterable[Batch], size: int) -> Iterator[list[Batch]]:
    """``items`` in consecutive lists of ``size`` (the micro-batches of one optimiser step; a shorter last list only
    if ``items`` runs out)."""
    iterator = iter(items)
    while group := list(itertools.islice(iterator, size)):
        yield group


def peak_memory_mb(device: Any) -> float:
    """Peak memory of this process so far, in MiB: allocated on the accelerator (CUDA), else peak RSS."""
    if getattr(device, "type", "cpu") == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kilobytes on Linux
