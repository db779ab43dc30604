"""Everything a run is set up with before its first step: device, backend flags, datasets and plan,
the framework on the device (equal on every rank), the optimiser, the per-rank RNGs, the data streams."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset
from tqdm.auto import tqdm

from npsemiseg.callbacks import Callbacks
from npsemiseg.config import RunConfig
from npsemiseg.frameworks import Framework
from npsemiseg.frameworks.ema import unwrap
from npsemiseg.models import check_compile_device, convert_sync_batchnorm, to_channels_last
from npsemiseg.training.data_order import Streams, derive_seed
from npsemiseg.training.distributed import broadcast_state, rank_world, synced_batchnorm
from npsemiseg.training.factories import Optimizer, build_datasets, build_framework, build_optimizer, train_transforms
from npsemiseg.training.plan import Plan, plan_run


def resolve_device(config: RunConfig) -> torch.device:
    """``runtime.device``: CPU, or the *current* CUDA device (a DDP caller sets it per local rank)."""
    wanted = config.runtime.device
    if wanted == "cpu" or (wanted == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ValueError("runtime.device: 'cuda' requested but CUDA is not available")
    return torch.device("cuda", torch.cuda.current_device())


@contextlib.contextmanager
def backend_flags(config: RunConfig, device: torch.device) -> Iterator[None]:
    """``runtime.deterministic`` (deterministic algorithms, no cuDNN autotuning) or cuDNN autotuning
    on GPU, for the duration of the run; the caller's settings are restored afterwards."""
    deterministic = torch.are_deterministic_algorithms_enabled()
    benchmark = torch.backends.cudnn.benchmark
    if config.runtime.deterministic:
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False
    elif device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(deterministic)
        torch.backends.cudnn.benchmark = benchmark


@dataclass
class Run:
    """One run's parts: what the epoch loop, the checkpointer and the final evaluation work on."""

    config: RunConfig
    device: torch.device
    rank: int
    world_size: int
    datasets: dict[str, Dataset]
    plan: Plan
    framework: Framework
    optimizer: Optimizer
    streams: Streams


def setup_run(config: RunConfig, device: torch.device) -> Run:
    """Build the run's parts; the global RNGs are left seeded for this rank's training stream."""
    rank, world_size = rank_world()
    datasets = build_datasets(config)
    transforms = train_transforms(config)
    plan = plan_run(config, num_labeled=len(datasets["labeled"]), num_unlabeled=len(datasets["unlabeled"]),
                    world_size=world_size)
    framework = _framework_on_device(config, device, world_size)
    student = unwrap(framework.student)
    student.train()
    optimizer = build_optimizer(config, student, world_size=world_size)
    seed_training_rngs(config.seed, rank)
    streams = Streams(config, datasets, transforms, plan, use_unlabeled=framework.uses_unlabeled, rank=rank,
                      world_size=world_size, pin_memory=device.type == "cuda", warmup_epochs=framework.warmup_epochs)
    return Run(config, device, rank, world_size, datasets, plan, framework, optimizer, streams)


def _framework_on_device(config: RunConfig, device: torch.device, world_size: int) -> Framework:
    """The framework with identical initial weights on every rank (then broadcast from rank 0 for good measure);
    its networks in ``channels_last`` memory format when ``runtime.channels_last`` (``to_channels_last``)."""
    check_compile_device(config.runtime.compile, device)
    torch.manual_seed(derive_seed(config.seed, "model"))
    with torch.device(device):
        framework = build_framework(config)
    modules = framework.modules()
    if world_size > 1 and synced_batchnorm(config.runtime.sync_bn, device):
        for module in modules.values():
            convert_sync_batchnorm(module)
    for module in modules.values():
        module.to(device)
        if config.runtime.channels_last:
            to_channels_last(module)
    if world_size > 1:
        broadcast_state(list(modules.values()))
    return framework


def seed_training_rngs(seed: int, rank: int) -> None:
    """The per-rank training RNG (dropout, NP samples, mixing boxes): torch, python and numpy."""
    torch.manual_seed(derive_seed(seed, "train", rank))
    random.seed(derive_seed(seed, "python", rank))
    np.random.seed(derive_seed(seed, "numpy", rank) % (1 << 32))


class _NullProgress:
    def update(self, n: int = 1) -> None:
        pass

    def set_postfix(self, **kwargs: Any) -> None:
        pass

    def close(self) -> None:
        pass


def progress_bar(config: RunConfig, callbacks: Callbacks, *, total: int, initial: int, rank: int) -> Any:
    """A tqdm bar on rank 0 when ``runtime.progress`` asks (``auto``: when the callbacks are interactive)."""
    wanted = config.runtime.progress == "on" or (config.runtime.progress == "auto" and callbacks.interactive)
    if not wanted or rank != 0:
        return _NullProgress()
    return tqdm(total=total, initial=initial, desc=config.cell_name, dynamic_ncols=True)
