"""The training loop: one run (one cell) for every framework and head, in one process or one DDP rank.

``train(config, callbacks)`` builds the datasets, the framework (student and teachers), the
SGD optimiser with per-group learning rates and a per-iteration poly schedule, then runs
``framework.train_step`` -> checks every loss term is finite -> backward -> gradient
all-reduce (under torch.distributed) -> optional clipping -> SGD step ->
``framework.after_optimizer_step`` (EMA), evaluating the framework's evaluation model
every ``schedule.eval_every_epochs`` epochs and at the end, and writing checkpoints that
let a run resume exactly.

Reproducibility. The order of the data is a function of ``(seed, epoch)`` and every
sample's augmentation draws from a generator seeded by ``(seed, stream, epoch, position)``,
so data and augmentation do not depend on ``num_workers`` or on where a run was resumed.
The global torch RNG (dropout, NP latent samples, CutMix boxes) is seeded per rank and
saved in checkpoints; evaluation runs under a forked RNG, so evaluating never changes the
training trajectory. On CPU, N steps + checkpoint + restore + N steps gives bit-identical
weights and losses to 2N straight steps (tested).

Distributed: see :mod:`~npsemiseg.training.distributed`. BatchNorm becomes SyncBatchNorm on GPU
(``runtime.sync_bn``).

Layout: ``data_order`` (seeds, epoch order, rank batches, the data streams), ``plan`` (epochs, steps,
poly LR), ``factories`` (model, datasets, transforms, framework, optimiser), ``distributed``,
``checkpoint`` (I/O, restore, the Checkpointer), ``setup``, ``step`` (one optimisation step),
``loop`` (``train``, the epoch loop), ``artifacts`` (evaluation, figures, tables).
"""

from npsemiseg.training.artifacts import FIGURE_IMAGES, RELIABILITY_ARTIFACT, UNCERTAINTY_ARTIFACT
from npsemiseg.training.checkpoint import (
    CHECKPOINT_FORMAT,
    LATEST_FILE,
    STATE_FILE,
    Checkpointer,
    load_checkpoint,
    resolve_checkpoint,
    save_checkpoint,
)
from npsemiseg.training.data_order import SeededItems, Streams, derive_seed, epoch_order, rank_batches, seeded_rngs
from npsemiseg.training.distributed import average_gradients, broadcast_buffers, broadcast_state
from npsemiseg.training.factories import build_datasets, build_framework, build_model, loss_settings, train_transforms
from npsemiseg.training.loop import RunResult, train
from npsemiseg.training.plan import BatchScaling, Plan, batch_scaling, plan_run, poly_lr

__all__ = [
    "CHECKPOINT_FORMAT", "FIGURE_IMAGES", "LATEST_FILE", "RELIABILITY_ARTIFACT", "STATE_FILE", "UNCERTAINTY_ARTIFACT",
    "Checkpointer", "Plan", "RunResult", "SeededItems", "Streams", "average_gradients", "broadcast_buffers",
    "broadcast_state", "build_datasets", "build_framework", "build_model", "derive_seed", "epoch_order",
    "load_checkpoint", "loss_settings", "plan_run", "poly_lr", "BatchScaling", "batch_scaling", "rank_batches",
    "resolve_checkpoint", "save_checkpoint", "seeded_rngs", "train", "train_transforms",
]
