"""The order of the training data: a function of ``(seed, epoch)`` only, whatever the workers or resume point.

Every sample's augmentation draws from a generator seeded by ``(seed, stream, epoch, position)``, so data
and augmentation do not depend on ``num_workers`` or on where a run was resumed.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import random
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from npsemiseg.constants import DataOrder
from npsemiseg.frameworks.base import Batch


def derive_seed(*keys: Any) -> int:
    """A 63-bit seed from any tuple of keys (stable across processes and Python versions)."""
    digest = hashlib.sha256(repr(keys).encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def epoch_order(num_items: int, length: int, *, seed: int, stream: str, epoch: int) -> list[int]:
    """``length`` dataset indices for one epoch: shuffled passes over ``range(num_items)``
    concatenated and truncated (the labeled list "repeated to N_u", U2PL/AugSeg)."""
    if num_items < 1:
        raise ValueError(f"{stream} dataset is empty: nothing to train on")
    generator = torch.Generator().manual_seed(derive_seed(seed, stream, epoch))
    passes = math.ceil(length / num_items)
    order = torch.cat([torch.randperm(num_items, generator=generator) for _ in range(passes)])
    return order[:length].tolist()


#: the orders in which both streams read their run lists in one permutation per epoch (the official samplers')
SHARED_ORDERS: tuple[DataOrder, ...] = ("shared_repeated", "shared_sampled", "shared_repeated_frozen")


def run_lists(order: DataOrder, num_labeled: int, num_unlabeled: int, *, seed: int) -> dict[str, list[int]]:
    """The two streams' lists of one run under a shared ``order`` (:data:`npsemiseg.constants.DataOrder`): dataset
    indices, both ``num_unlabeled`` long (position ``p`` of an epoch's permutation picks ``lists[stream][p]``)."""
    if num_labeled < 1 or num_unlabeled < 1:
        raise ValueError(f"data.order {order!r}: needs labeled and unlabeled images, got {num_labeled} and "
                         f"{num_unlabeled}")
    repeated = list(range(num_labeled)) * math.ceil(num_unlabeled / num_labeled)
    if order in ("shared_repeated", "shared_repeated_frozen"):
        return {"labeled": repeated[:num_unlabeled], "unlabeled": list(range(num_unlabeled))}
    if order == "shared_sampled":  # voc_dset: random.seed(seed), then random.sample, once per list
        return {"labeled": random.Random(seed).sample(repeated, num_unlabeled),
                "unlabeled": random.Random(seed).sample(range(num_unlabeled), num_unlabeled)}
    raise ValueError(f"data.order: expected a shared order of {list(SHARED_ORDERS)}, got {order!r}")


def shared_epoch_order(lists: dict[str, list[int]], stream: str, length: int, *, epoch: int) -> list[int]:
    """``length`` dataset indices of ``stream`` for one epoch: its run list read in the permutation both streams
    share, ``torch.randperm`` seeded by the epoch alone (``DistributedSampler``'s seed 0 + epoch, whatever the run's
    seed). An epoch longer than the lists (never in the official scripts) takes further permutations."""
    size = len(lists[stream])
    positions = torch.randperm(size, generator=torch.Generator().manual_seed(epoch))
    for extra in range(1, math.ceil(length / size)):
        generator = torch.Generator().manual_seed(derive_seed("shared", epoch, extra))
        positions = torch.cat([positions, torch.randperm(size, generator=generator)])
    return [lists[stream][p] for p in positions[:length].tolist()]


def sampler_epoch(order: DataOrder, stream: str, epoch: int) -> int:
    """The epoch a shared ``order``'s sampler of ``stream`` is given: ``epoch``, but 0 for the unlabeled stream under
    ``shared_repeated_frozen`` (TorchSemiSeg's ``train.py`` calls ``set_epoch`` on the labeled sampler only, so its
    unlabeled images come in epoch 0's permutation in every epoch)."""
    return 0 if order == "shared_repeated_frozen" and stream == "unlabeled" else epoch


def rank_batches(order: list[int], *, batch_size: int, rank: int, world_size: int, seed: int, stream: str,
                 epoch: int, start_batch: int = 0) -> list[list[tuple[int, int]]]:
    """This rank's batches of one epoch, from ``start_batch`` on: lists of ``(index, augmentation seed)``.

    Global batch ``i`` is ``order[i * B * W : (i + 1) * B * W]``; rank ``r`` takes the ``r``-th slice
    of ``B``. A sample's augmentation seed depends on ``(seed, stream, epoch, position in order)``.
    """
    global_batch = batch_size * world_size
    batches = []
    for i in range(start_batch, len(order) // global_batch):
        first = i * global_batch + rank * batch_size
        batches.append([(order[p], derive_seed(seed, stream, "augment", epoch, p)) for p in range(first, first + batch_size)])
    return batches


class SeededItems(Dataset):
    """``dataset[(index, seed)]``: item ``index`` passed through ``transform`` with every RNG
    (torch, numpy, python) seeded by ``seed`` and restored afterwards."""

    def __init__(self, dataset: Dataset, transform: Any) -> None:
        self.dataset = dataset
        self.transform = transform

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, key: tuple[int, int]) -> dict[str, Tensor]:
        index, seed = key
        item = self.dataset[index]
        if self.transform is not None:
            with seeded_rngs(seed):
                item = self.transform(item)
        return {k: v for k, v in item.items() if isinstance(v, Tensor)}


@contextlib.contextmanager
def seeded_rngs(seed: int) -> Iterator[None]:
    """Run a block with torch's CPU, numpy's and python's global RNGs seeded by ``seed``, then restore them.

    Only the CPU generator is touched (``torch.default_generator``): ``torch.manual_seed`` would also reseed
    every CUDA device on each item (a GPU run's RNG reset by its data path) and costs ~0.2 ms an item, which
    on the study's 64 px images is a tenth of a training step.
    """
    python_state, numpy_state = random.getstate(), np.random.get_state(legacy=False)
    torch_state = torch.default_generator.get_state()
    torch.default_generator.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed % (1 << 32))
    try:
        yield
    finally:
        torch.default_generator.set_state(torch_state)
        random.setstate(python_state)
        np.random.set_state(numpy_state)


def cycled(first_pass: list[list[tuple[int, int]]], count: int, start_batch: int = 0) -> list[list[tuple[int, int]]]:
    """Batches ``start_batch .. count - 1`` of ``first_pass`` replayed in turn (``itertools.cycle`` of a loader: the
    same indices with the same augmentation seeds, so the same augmented images)."""
    return [first_pass[i % len(first_pass)] for i in range(start_batch, count)]


class Streams:
    """The labeled and (when the framework uses it) unlabeled data loaders of one epoch, zipped. ``warmup_epochs``:
    the framework's (:attr:`~npsemiseg.frameworks.base.Framework.warmup_epochs`), after which ``cycled_labeled``
    cycles."""

    def __init__(self, config: Any, datasets: dict[str, Dataset], transforms: dict[str, Any], plan: Any,
                 *, use_unlabeled: bool, rank: int, world_size: int, pin_memory: bool, warmup_epochs: int = 0) -> None:
        self.config, self.plan = config, plan
        self.rank, self.world_size = rank, world_size
        self.pin_memory = pin_memory
        self.warmup_epochs = warmup_epochs
        self.lists: dict[str, list[int]] | None = None
        self.items = {"labeled": SeededItems(datasets["labeled"], transforms["labeled"])}
        self.batch_sizes = {"labeled": config.schedule.batch_size}
        if use_unlabeled:
            self.items["unlabeled"] = SeededItems(datasets["unlabeled"], transforms["unlabeled"])
            self.batch_sizes["unlabeled"] = config.schedule.unlabeled_batch_size
            if config.data.order in SHARED_ORDERS:
                self.lists = run_lists(config.data.order, len(self.items["labeled"]), len(self.items["unlabeled"]),
                                       seed=config.seed)

    def epoch(self, epoch: int, start_batch: int) -> Iterator[Batch]:
        """The micro-batches of ``epoch`` from micro-batch ``start_batch`` on (``schedule.accumulation_steps`` per
        optimiser step: step ``s`` takes micro-batches ``s k .. s k + k - 1``, global batches of the order in turn)."""
        loaders = [self._loader(stream, items, epoch, start_batch) for stream, items in self.items.items()]
        for parts in zip(*loaders):
            yield Batch(labeled=parts[0], unlabeled=parts[1] if len(parts) > 1 else None)

    def _loader(self, stream: str, items: SeededItems, epoch: int, start_batch: int) -> DataLoader:
        return DataLoader(
            items, batch_sampler=self._batches(stream, len(items), epoch, start_batch),
            num_workers=self.config.data.num_workers, pin_memory=self.pin_memory,
            # a private generator: building a loader must not consume the global RNG (exact resume)
            generator=torch.Generator().manual_seed(derive_seed(self.config.seed, stream, "loader", epoch)),
        )

    def _batches(self, stream: str, num_items: int, epoch: int, start_batch: int) -> list[list[tuple[int, int]]]:
        """This rank's batches of ``stream`` in ``epoch`` from ``start_batch`` on, in the order ``data.order`` says."""
        seed, order_name = self.config.seed, self.config.data.order
        batch_size = self.batch_sizes[stream]
        length = self.plan.iters_per_epoch * batch_size * self.world_size * self.config.schedule.accumulation_steps
        split = dict(batch_size=batch_size, rank=self.rank, world_size=self.world_size, seed=seed, stream=stream,
                     epoch=epoch)
        if order_name == "cycled_labeled" and stream == "labeled" and epoch >= self.warmup_epochs:
            global_batch = batch_size * self.world_size
            one_pass = max(num_items // global_batch, 1) * global_batch  # whole batches (DistributedSampler's drop_last)
            first_pass = rank_batches(epoch_order(num_items, one_pass, seed=seed, stream=stream, epoch=epoch), **split)
            return cycled(first_pass, length // global_batch, start_batch)
        if self.lists is None:
            order = epoch_order(num_items, length, seed=seed, stream=stream, epoch=epoch)
        else:
            order = shared_epoch_order(self.lists, stream, length, epoch=sampler_epoch(order_name, stream, epoch))
        return rank_batches(order, start_batch=start_batch, **split)
