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

Distributed. When ``torch.distributed`` is initialised the loop is one rank: each rank takes
its share of every global batch, parameters and buffers start equal (broadcast from rank 0),
gradients are averaged with coalesced all-reduces after backward (the same update as
DistributedDataParallel's) and the student's buffers are broadcast from rank 0 after every
step (as DDP does before each forward). The student is *not* wrapped in
DistributedDataParallel: frameworks call it several times per step and call its
``extract``/``classify`` halves (PS-MT's T-VAT), which DDP's reducer does not support.
BatchNorm becomes SyncBatchNorm on GPU (``runtime.sync_bn``).
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import random
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset

from npsemiseg.callbacks import Callbacks
from npsemiseg.config import RunConfig
from npsemiseg.frameworks import build_framework
from npsemiseg.frameworks.base import Batch, Framework, StepContext

CHECKPOINT_FORMAT = 1
STATE_FILE = "state.pt"
LATEST_FILE = "latest"
#: figures the final evaluation reports through ``Callbacks.on_artifact`` (stable artifact names)
UNCERTAINTY_ARTIFACT = "figures/uncertainty_maps.png"
RELIABILITY_ARTIFACT = "figures/reliability.png"
#: validation images shown (one row each) in the uncertainty-map figure
FIGURE_IMAGES = 4


@dataclass
class RunResult:
    """What ``train`` returns.

    metrics: the final evaluation (``miou``, ``pavpu``, ``ece``, ``nll``, ``brier``, ``auroc``,
    ``pixel_acc``, ``iou/<class>``, ...); empty when the run stopped at ``runtime.stop_at_step``.
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


# --------------------------------------------------------------------------- seeds and data order
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
    """Run a block with torch's CPU, numpy's and python's global RNGs seeded by ``seed``, then restore them."""
    python_state, numpy_state = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        random.seed(seed)
        np.random.seed(seed % (1 << 32))
        try:
            yield
        finally:
            random.setstate(python_state)
            np.random.set_state(numpy_state)


@dataclass(frozen=True)
class Plan:
    """Iterations of the run: ``iters_per_epoch`` (the epoch convention), ``total_steps``, ``total_epochs``."""

    iters_per_epoch: int
    total_steps: int
    total_epochs: int


def plan_run(config: RunConfig, *, num_labeled: int, num_unlabeled: int, world_size: int) -> Plan:
    """Epoch length from the configured convention, total steps from epochs or ``max_steps``."""
    schedule = config.schedule
    if schedule.epoch_length == "unlabeled":
        iters = num_unlabeled // (schedule.unlabeled_batch_size * world_size)
    else:
        iters = num_labeled // (schedule.batch_size * world_size)
    iters = max(1, iters)
    total = schedule.max_steps if schedule.max_steps is not None else schedule.epochs * iters
    return Plan(iters, total, math.ceil(total / iters))


def poly_lr(base_lr: float, step: int, total_steps: int, power: float) -> float:
    """Poly schedule ``base_lr * (1 - step / total_steps) ** power``, stepped per iteration (0-based)."""
    return base_lr * (1.0 - step / total_steps) ** power


# --------------------------------------------------------------------------- model and data
def build_model(config: RunConfig) -> nn.Module:
    """One fresh segmentor (backbone + DeepLabv3+ + head) as ``config.model``/``config.head`` say."""
    from npsemiseg.models import build_segmentor
    from npsemiseg.pretrain import resolve_weights

    model = config.model
    return build_segmentor(
        num_classes=config.num_classes,
        head=config.head.name,
        head_options=dict(config.head.options),
        variant=model.variant,
        backbone=model.backbone,
        weights=resolve_weights(model.weights),  # pretrained:<name> -> the cached file
        deep_stem=model.deep_stem,
        aux_head=model.aux_head,
        representation_head=bool(model.representation_head),
        mc_dropout_scope=model.mc_dropout_scope,
        **dict(model.options),
    )


def build_datasets(config: RunConfig) -> dict[str, Dataset]:
    """The ``labeled``, ``unlabeled`` and ``val`` splits of the run's dataset (untransformed)."""
    from npsemiseg.data import build_dataset

    common = dict(root=config.data.root, list_variant=config.list_variant, **dict(config.data.options))
    return {
        "labeled": build_dataset(config.dataset, "labeled", partition=config.partition, **common),
        "unlabeled": build_dataset(config.dataset, "unlabeled", partition=config.partition, **common),
        "val": build_dataset(config.dataset, "val", **common),
    }


def train_transforms(config: RunConfig) -> dict[str, Any]:
    """The weak (+ strong) training transforms of the labeled and unlabeled streams."""
    from npsemiseg.data.transforms import train_transform

    augmentation = dict(config.data.augmentation)
    crop = config.schedule.crop_size
    labeled = dict(augmentation)
    if not config.data.labeled_strong_view:
        labeled["strong"] = None
    return {"labeled": train_transform(crop, **labeled), "unlabeled": train_transform(crop, **augmentation)}


# --------------------------------------------------------------------------- distributed helpers
def _rank_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _coalesced(tensors: list[Tensor], op: Any) -> None:
    """Apply a collective to tensors grouped by dtype and device, one flat buffer per group."""
    groups: dict[tuple[torch.dtype, torch.device], list[Tensor]] = {}
    for tensor in tensors:
        groups.setdefault((tensor.dtype, tensor.device), []).append(tensor)
    for group in groups.values():
        flat = torch.cat([t.reshape(-1) for t in group])
        op(flat)
        offset = 0
        for t in group:
            t.copy_(flat[offset : offset + t.numel()].view_as(t))
            offset += t.numel()


def broadcast_state(modules: list[nn.Module]) -> None:
    """Make every rank's parameters and buffers equal to rank 0's."""
    tensors = [t.data for m in modules for t in (*m.parameters(), *m.buffers())]
    _coalesced(tensors, lambda flat: dist.broadcast(flat, src=0))


def broadcast_buffers(module: nn.Module) -> None:
    tensors = [b.data for b in module.buffers()]
    if tensors:
        _coalesced(tensors, lambda flat: dist.broadcast(flat, src=0))


def average_gradients(parameters: list[nn.Parameter], world_size: int) -> None:
    """Mean of the gradients over ranks; a parameter that got no gradient on any rank keeps ``None``."""
    has_grad = torch.tensor([p.grad is not None for p in parameters], dtype=torch.float32,
                            device=parameters[0].device)
    dist.all_reduce(has_grad)
    grads = []
    for p, used in zip(parameters, has_grad.tolist()):
        if used and p.grad is None:
            p.grad = torch.zeros_like(p)
        if used:
            grads.append(p.grad)
    _coalesced(grads, lambda flat: (dist.all_reduce(flat), flat.div_(world_size)))


# --------------------------------------------------------------------------- checkpoints
def _rng_state() -> dict[str, Any]:
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def _unwrap(module: nn.Module) -> nn.Module:
    return module.module if isinstance(module, (nn.parallel.DistributedDataParallel, nn.DataParallel)) else module


def save_checkpoint(root: Path, *, step: int, state: dict[str, Any], config: RunConfig, keep: int) -> Path:
    """Write ``state`` under ``root/step_XXXXXXXX`` atomically (temporary directory + rename), point
    ``root/latest`` at it and keep only the newest ``keep`` checkpoints. Returns the directory."""
    root.mkdir(parents=True, exist_ok=True)
    name = f"step_{step:08d}"
    tmp = root / f".tmp-{name}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    torch.save(state, tmp / STATE_FILE)
    (tmp / "config.yaml").write_text(config.to_yaml())
    final = root / name
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    latest_tmp = root / f".{LATEST_FILE}-{uuid.uuid4().hex[:8]}"
    latest_tmp.write_text(name + "\n")
    os.replace(latest_tmp, root / LATEST_FILE)
    existing = sorted(p for p in root.glob("step_*") if p.is_dir())
    for old in existing[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def resolve_checkpoint(path: str | os.PathLike) -> Path:
    """A checkpoint directory from itself or from a checkpoint root: the one ``latest`` names, else
    (``latest`` missing or stale after an interruption) the newest complete ``step_*`` directory."""
    path = Path(path)
    if (path / STATE_FILE).is_file():
        return path
    if (path / LATEST_FILE).is_file():
        candidate = path / (path / LATEST_FILE).read_text().strip()
        if (candidate / STATE_FILE).is_file():
            return candidate
    complete = sorted(p for p in path.glob("step_*") if (p / STATE_FILE).is_file())
    if complete:
        return complete[-1]
    raise ValueError(f"resume_from: {path} is neither a checkpoint directory (with {STATE_FILE}) nor a "
                     f"checkpoint root with a valid '{LATEST_FILE}' file")


def load_checkpoint(path: Path) -> dict[str, Any]:
    # our own files: optimiser state and numpy/python RNG states need full unpickling
    return torch.load(path / STATE_FILE, map_location="cpu", weights_only=False)


# --------------------------------------------------------------------------- the loop
class _NullProgress:
    def update(self, n: int = 1) -> None:
        pass

    def set_postfix(self, **kwargs: Any) -> None:
        pass

    def close(self) -> None:
        pass


def _progress(config: RunConfig, callbacks: Callbacks, *, total: int, initial: int, rank: int) -> Any:
    wanted = config.runtime.progress == "on" or (config.runtime.progress == "auto" and callbacks.interactive)
    if not wanted or rank != 0:
        return _NullProgress()
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, desc=config.cell_name, dynamic_ncols=True)


def _resolve_device(config: RunConfig) -> torch.device:
    """``runtime.device``: CPU, or the *current* CUDA device (a DDP caller sets it per local rank)."""
    wanted = config.runtime.device
    if wanted == "cpu" or (wanted == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ValueError("runtime.device: 'cuda' requested but CUDA is not available")
    return torch.device("cuda", torch.cuda.current_device())


def _to_device(batch: dict[str, Tensor], device: torch.device) -> dict[str, Tensor]:
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


class _Streams:
    """The labeled and (when the framework uses it) unlabeled data loaders of one epoch, zipped."""

    def __init__(self, config: RunConfig, datasets: dict[str, Dataset], transforms: dict[str, Any], plan: Plan,
                 *, use_unlabeled: bool, rank: int, world_size: int, pin_memory: bool) -> None:
        self.config, self.plan = config, plan
        self.rank, self.world_size = rank, world_size
        self.pin_memory = pin_memory
        self.items = {"labeled": SeededItems(datasets["labeled"], transforms["labeled"])}
        self.batch_sizes = {"labeled": config.schedule.batch_size}
        if use_unlabeled:
            self.items["unlabeled"] = SeededItems(datasets["unlabeled"], transforms["unlabeled"])
            self.batch_sizes["unlabeled"] = config.schedule.unlabeled_batch_size  # type: ignore[assignment]

    def epoch(self, epoch: int, start_batch: int) -> Iterator[Batch]:
        loaders = []
        for stream, items in self.items.items():
            batch_size = self.batch_sizes[stream]
            length = self.plan.iters_per_epoch * batch_size * self.world_size
            order = epoch_order(len(items), length, seed=self.config.seed, stream=stream, epoch=epoch)
            batches = rank_batches(order, batch_size=batch_size, rank=self.rank, world_size=self.world_size,
                                   seed=self.config.seed, stream=stream, epoch=epoch, start_batch=start_batch)
            loaders.append(DataLoader(
                items, batch_sampler=batches, num_workers=self.config.data.num_workers,
                pin_memory=self.pin_memory,
                # a private generator: building a loader must not consume the global RNG (exact resume)
                generator=torch.Generator().manual_seed(derive_seed(self.config.seed, stream, "loader", epoch)),
            ))
        for parts in zip(*loaders):
            yield Batch(labeled=parts[0], unlabeled=parts[1] if len(parts) > 1 else None)


def _check_finite(step: int, names: list[str], values: list[float]) -> None:
    """FloatingPointError naming the first non-finite loss term of step ``step`` (1-based, as ``on_step``)."""
    bad = [(n, v) for n, v in zip(names, values) if not math.isfinite(v)]
    if bad:
        terms = ", ".join(f"{n}={v:.4g}" for n, v in zip(names, values))
        name, value = bad[0]
        raise FloatingPointError(
            f"non-finite loss at step {step}: term {name!r} is {value} (all terms: {terms}); "
            "lower optim.lr, set optim.grad_clip, or check the data"
        )


def _evaluate(framework: Framework, datasets: dict[str, Dataset], config: RunConfig, *, step: int,
              device: torch.device, figure_dir: Path | None = None) -> dict[str, float]:
    """Evaluate ``framework.eval_model()`` on the validation split under a forked, seeded RNG."""
    from npsemiseg.evaluation.evaluator import evaluate

    ev = config.evaluation
    model = framework.eval_model()
    # a deterministic head makes exactly one prediction; T applies to stochastic heads only
    num_samples = ev.num_samples if getattr(_unwrap(model).head, "stochastic", True) else None
    devices = [device.index if device.index is not None else torch.cuda.current_device()] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices), torch.no_grad():
        torch.manual_seed(derive_seed(config.seed, "evaluation", step))
        with _autocast(config, device):
            metrics = evaluate(
                model, datasets["val"], num_classes=config.num_classes, mode=ev.mode,
                num_samples=num_samples, crop_size=ev.crop_size, stride=ev.stride,
                class_names=config.dataset_info.class_names, max_images=ev.max_images,
                pavpu_window=ev.pavpu_window, pavpu_accuracy_threshold=ev.pavpu_accuracy_threshold,
                pavpu_uncertainty_threshold=ev.pavpu_uncertainty_threshold,
                figure_dir=figure_dir, num_figures=FIGURE_IMAGES if figure_dir is not None else 0,
            )
    return {k: float(v) for k, v in metrics.items()}


def _autocast(config: RunConfig, device: torch.device) -> Any:
    if device.type == "cuda" and config.runtime.amp:
        return torch.autocast(device_type="cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def train(config: RunConfig, callbacks: Callbacks | None = None, *,
          resume_from: str | os.PathLike | None = None) -> RunResult:
    """Train one cell; see the module docstring. ``resume_from`` (or ``callbacks.resume_from()``):
    a checkpoint directory, or a checkpoint root whose ``latest`` file names one."""
    device = _resolve_device(config)
    with _backend_flags(config, device):
        return _run(config, callbacks if callbacks is not None else Callbacks(), resume_from, device)


@contextlib.contextmanager
def _backend_flags(config: RunConfig, device: torch.device) -> Iterator[None]:
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


def _run(config: RunConfig, callbacks: Callbacks, resume_from: str | os.PathLike | None,
         device: torch.device) -> RunResult:
    started = time.perf_counter()
    rank, world_size = _rank_world()

    datasets = build_datasets(config)
    transforms = train_transforms(config)
    plan = plan_run(config, num_labeled=len(datasets["labeled"]), num_unlabeled=len(datasets["unlabeled"]),
                    world_size=world_size)

    # identical initial weights on every rank (then broadcast from rank 0 for good measure)
    torch.manual_seed(derive_seed(config.seed, "model"))
    with torch.device(device):
        framework = build_framework(config)
    modules = framework.modules()
    if world_size > 1 and _synced_batchnorm(config, device):
        from npsemiseg.models import convert_sync_batchnorm

        for module in modules.values():
            convert_sync_batchnorm(module)
    for module in modules.values():
        module.to(device)
    if world_size > 1:
        broadcast_state([_unwrap(m) for m in modules.values()])
    student = _unwrap(framework.student)
    student.train()

    groups = student.parameter_groups()
    optim = config.optim
    multipliers = [1.0 if g.get("name") == "backbone" else optim.head_lr_mult for g in groups]
    optimizer = torch.optim.SGD(
        [{"params": g["params"], "lr": optim.lr * m} for g, m in zip(groups, multipliers)],
        lr=optim.lr, momentum=optim.momentum, weight_decay=optim.weight_decay, nesterov=optim.nesterov,
    )
    parameters = [p for g in groups for p in g["params"]]

    # the per-rank training RNG (dropout, NP samples, mixing boxes)
    torch.manual_seed(derive_seed(config.seed, "train", rank))
    random.seed(derive_seed(config.seed, "python", rank))
    np.random.seed(derive_seed(config.seed, "numpy", rank) % (1 << 32))

    step, history = 0, []
    resume = resume_from if resume_from is not None else callbacks.resume_from()
    if resume is not None:
        step, history = _restore(resolve_checkpoint(resume), config, framework, optimizer, rank=rank)

    output_dir = Path(config.runtime.output_dir) if config.runtime.output_dir else None
    checkpoint_root = output_dir / "checkpoints" if output_dir is not None else None
    last_checkpoint: Path | None = None

    def checkpoint(at_step: int, metrics: dict[str, float]) -> None:
        nonlocal last_checkpoint
        if checkpoint_root is None:
            return
        rngs = [_rng_state()]
        if world_size > 1:
            rngs = [None] * world_size  # type: ignore[list-item]
            dist.all_gather_object(rngs, _rng_state())
        if rank == 0:
            state = {
                "format": CHECKPOINT_FORMAT, "cell_id": config.cell_id, "step": at_step,
                "modules": {name: _unwrap(m).state_dict() for name, m in modules.items()},
                "framework": framework.state_dict(), "optimizer": optimizer.state_dict(),
                "scheduler": {"step": at_step, "total_steps": plan.total_steps, "power": config.schedule.poly_power},
                "data": {"epoch": at_step // plan.iters_per_epoch, "batch": at_step % plan.iters_per_epoch},
                "rng": rngs, "world_size": world_size, "history": history,
            }
            last_checkpoint = save_checkpoint(checkpoint_root, step=at_step, state=state, config=config,
                                              keep=config.runtime.keep_checkpoints)
        if world_size > 1:
            dist.barrier()
        directory = last_checkpoint if last_checkpoint is not None else checkpoint_root / f"step_{at_step:08d}"
        callbacks.on_checkpoint(at_step, directory, metrics)

    callbacks.on_start(config, total_steps=plan.total_steps, start_step=step, rank=rank, world_size=world_size)
    progress = _progress(config, callbacks, total=plan.total_steps, initial=step, rank=rank)
    streams = _Streams(config, datasets, transforms, plan, use_unlabeled=framework.uses_unlabeled, rank=rank,
                       world_size=world_size, pin_memory=device.type == "cuda")
    images_per_step = (config.schedule.batch_size
                       + (config.schedule.unlabeled_batch_size if framework.uses_unlabeled else 0)) * world_size
    stop_at = config.runtime.stop_at_step
    train_seconds = 0.0
    interrupted = False
    try:
        while step < plan.total_steps and not interrupted:
            epoch, start_batch = divmod(step, plan.iters_per_epoch)
            tick = time.perf_counter()
            for batch in streams.epoch(epoch, start_batch):
                ctx = StepContext(step=step, total_steps=plan.total_steps, epoch=epoch,
                                  total_epochs=plan.total_epochs, iters_per_epoch=plan.iters_per_epoch)
                logs = _train_step(framework, batch, ctx, optimizer, parameters, multipliers, config, device, world_size)
                step += 1
                now = time.perf_counter()
                seconds = now - tick
                train_seconds += seconds
                tick = now
                logs["train/sec_per_iter"] = seconds
                logs["train/images_per_sec"] = images_per_step / seconds if seconds > 0 else float("inf")
                callbacks.on_step(step, plan.total_steps, logs)
                progress.update(1)
                progress.set_postfix(loss=f"{logs['train/loss']:.4f}")
                end_of_epoch = step % plan.iters_per_epoch == 0
                metrics: dict[str, float] = {}
                every = config.schedule.eval_every_epochs
                if end_of_epoch and every and (step // plan.iters_per_epoch) % every == 0 and step < plan.total_steps:
                    metrics = _evaluate(framework, datasets, config, step=step, device=device)
                    history.append({"step": float(step), "epoch": float(step // plan.iters_per_epoch), **metrics})
                    callbacks.on_evaluation(step, metrics)
                    tick = time.perf_counter()
                every_steps = config.schedule.checkpoint_every_steps
                if step < plan.total_steps and ((every_steps and step % every_steps == 0) or step == stop_at):
                    checkpoint(step, metrics)
                    tick = time.perf_counter()
                if step == stop_at and step < plan.total_steps:
                    interrupted = True
                if step >= plan.total_steps or interrupted:
                    break
    finally:
        progress.close()

    final: dict[str, float] = {}
    if not interrupted:
        final = _final_evaluation(framework, datasets, config, step=step, device=device, rank=rank,
                                  output_dir=output_dir, callbacks=callbacks)
        history.append({"step": float(step), "epoch": float(math.ceil(step / plan.iters_per_epoch)), **final})
        if rank == 0:
            _per_class_artifacts(final, output_dir, callbacks)
        checkpoint(step, final)
    result = RunResult(metrics=final, steps=step, checkpoint=last_checkpoint, history=history,
                       seconds=time.perf_counter() - started, train_seconds=train_seconds,
                       cell_id=config.cell_id, interrupted=interrupted, framework=framework)
    callbacks.on_end(result)
    return result


def _train_step(framework: Framework, batch: Batch, ctx: StepContext, optimizer: torch.optim.Optimizer,
                parameters: list[nn.Parameter], multipliers: list[float], config: RunConfig,
                device: torch.device, world_size: int) -> dict[str, float]:
    """One optimisation step; returns the ``train/...`` logs (losses averaged over ranks)."""
    lr = poly_lr(config.optim.lr, ctx.step, ctx.total_steps, config.schedule.poly_power)
    for group, multiplier in zip(optimizer.param_groups, multipliers):
        group["lr"] = lr * multiplier
    batch = Batch(labeled=_to_device(batch.labeled, device),
                  unlabeled=_to_device(batch.unlabeled, device) if batch.unlabeled is not None else None)
    with _autocast(config, device):
        result = framework.train_step(batch, ctx)
    if not result.losses:
        raise ValueError(f"{type(framework).__name__}.train_step returned no loss terms at step {ctx.step}")
    names = list(result.losses)
    values = torch.stack([result.losses[n].detach().float().reshape(()) for n in names])
    if world_size > 1:
        dist.all_reduce(values)  # a non-finite term on any rank reaches every rank: all stop together
        values /= world_size
    floats = values.tolist()
    _check_finite(ctx.step + 1, names, floats)
    total = result.total
    optimizer.zero_grad(set_to_none=True)
    total.backward()
    if world_size > 1:
        average_gradients(parameters, world_size)
    logs = {"train/loss": float(sum(floats)), "train/lr": lr}
    logs.update({f"train/{n}": v for n, v in zip(names, floats)})
    if config.optim.grad_clip is not None:
        norm = float(torch.nn.utils.clip_grad_norm_(parameters, config.optim.grad_clip))
        if not math.isfinite(norm):
            raise FloatingPointError(f"non-finite gradient norm at step {ctx.step + 1} (loss terms finite: "
                                     + ", ".join(f"{n}={v:.4g}" for n, v in zip(names, floats)) + ")")
        logs["train/grad_norm"] = norm
    optimizer.step()
    if world_size > 1 and not _synced_batchnorm(config, device):
        broadcast_buffers(_unwrap(framework.student))
    framework.after_optimizer_step(ctx)
    clash = set(result.logs) & set(names)
    if clash:
        raise ValueError(f"{type(framework).__name__}: step logs {sorted(clash)} reuse loss term names; "
                         "log them under another name (e.g. head/<name>)")
    logs.update({f"train/{k}": float(v) for k, v in result.logs.items()})
    return logs


def _synced_batchnorm(config: RunConfig, device: torch.device) -> bool:
    """True when SyncBatchNorm keeps BN statistics equal across ranks (GPU with ``runtime.sync_bn``);
    NP memories are synchronised by the head itself, so no buffer broadcast is needed then."""
    return device.type == "cuda" and config.runtime.sync_bn


def _restore(path: Path, config: RunConfig, framework: Framework, optimizer: torch.optim.Optimizer,
             *, rank: int) -> tuple[int, list[dict[str, float]]]:
    """Load a checkpoint into the framework, optimiser and this rank's RNGs; returns (step, history)."""
    state = load_checkpoint(path)
    if state.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"resume_from: {path} has checkpoint format {state.get('format')}, expected {CHECKPOINT_FORMAT}")
    if state["cell_id"] != config.cell_id:
        raise ValueError(f"resume_from: {path} belongs to cell {state['cell_id']}, this run is cell {config.cell_id}")
    modules = framework.modules()
    if set(state["modules"]) != set(modules):
        raise ValueError(f"resume_from: {path} holds modules {sorted(state['modules'])}, expected {sorted(modules)}")
    for name, module in modules.items():
        _unwrap(module).load_state_dict(state["modules"][name])
    framework.load_state_dict(state["framework"])
    optimizer.load_state_dict(state["optimizer"])
    rngs = state["rng"]
    if rank < len(rngs):
        _set_rng_state(rngs[rank])
    else:  # more ranks than when the checkpoint was written: a fresh, reproducible stream
        torch.manual_seed(derive_seed(config.seed, "train", rank, state["step"]))
    return int(state["step"]), list(state.get("history", []))


def _final_evaluation(framework: Framework, datasets: dict[str, Dataset], config: RunConfig, *, step: int,
                      device: torch.device, rank: int, output_dir: Path | None, callbacks: Callbacks) -> dict[str, float]:
    """The last evaluation, with the uncertainty-map figure and the reliability diagram when asked."""
    if not config.evaluation.figures:
        metrics = _evaluate(framework, datasets, config, step=step, device=device)
        callbacks.on_evaluation(step, metrics)
        return metrics
    with contextlib.ExitStack() as stack:
        if output_dir is not None:
            figure_dir = output_dir / "figures"
        else:  # the files live while the callbacks copy them
            figure_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="npsemiseg-figures-")))
        metrics = _evaluate(framework, datasets, config, step=step, device=device, figure_dir=figure_dir)
        callbacks.on_evaluation(step, metrics)
        if rank == 0:
            uncertainty = figure_dir / "uncertainty_maps.png"
            reliability = figure_dir / "reliability.png"
            if uncertainty.is_file():
                callbacks.on_artifact(UNCERTAINTY_ARTIFACT, uncertainty)
            if reliability.is_file():
                callbacks.on_artifact(RELIABILITY_ARTIFACT, reliability)
    return metrics


def _per_class_artifacts(metrics: dict[str, float], output_dir: Path | None, callbacks: Callbacks) -> None:
    """``tables/per_class_iou.csv`` and ``.json`` from the final metrics' ``iou/<class>`` entries."""
    import csv
    import json

    rows = [(k.split("/", 1)[1], v) for k, v in metrics.items() if k.startswith("iou/")]
    if not rows:
        return
    with contextlib.ExitStack() as stack:
        directory = (output_dir / "tables") if output_dir is not None else Path(
            stack.enter_context(tempfile.TemporaryDirectory(prefix="npsemiseg-tables-")))
        directory.mkdir(parents=True, exist_ok=True)
        with open(directory / "per_class_iou.csv", "w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["class", "iou"])
            writer.writerows(rows)
        (directory / "per_class_iou.json").write_text(json.dumps(dict(rows), indent=1, allow_nan=True))
        callbacks.on_artifact("tables/per_class_iou.csv", directory / "per_class_iou.csv")
        callbacks.on_artifact("tables/per_class_iou.json", directory / "per_class_iou.json")
