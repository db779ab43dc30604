"""Peak memory of one training step, predicted without a GPU: the run's real step on fake tensors.

The framework and its optimiser are built under ``torch``'s ``FakeTensorMode`` (tensors with shapes, dtypes and
devices but no storage), one real batch from the run's data streams goes through the loop's own step
(:func:`npsemiseg.training.step.deferred_train_step`), and ``torch.distributed._tools.mem_tracker.MemTracker``
counts the bytes of the tensors alive at each point: parameters, buffers (EMA teachers, queues, the NP head's
memories), gradients, optimiser state and activations. No arithmetic is done, so a step of a paper-scale cell
takes seconds of CPU whatever its crop.

What it cannot see, and a GPU's ``max_memory_allocated`` does: cuDNN's workspaces, the caching allocator's
rounding and fragmentation, and kernels whose CUDA path keeps other intermediates than the CPU path (fake tensors
run the CPU path: bf16 autocast is CPU's, whose lists of bf16 and float32 operators are close to CUDA's but not
equal). ``docs/performance.md`` compares these predictions with the GPU runs.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.utils
from torch._subclasses.fake_tensor import DynamicOutputShapeException, FakeTensorMode
from torch.distributed._tools.mem_tracker import MemTracker

from npsemiseg.config import RunConfig
from npsemiseg.frameworks import StepContext
from npsemiseg.training.data_order import Streams
from npsemiseg.training.factories import build_datasets, build_framework, build_optimizer, train_transforms
from npsemiseg.training.plan import Plan, plan_run
from npsemiseg.training.step import deferred_train_step

MIB = 2 ** 20


@dataclass(frozen=True)
class StepMemory:
    """One step's peak, split: ``static_mib`` (parameters, buffers, gradients, optimiser state: what a run holds
    whatever its batch) and ``activation_mib`` (the rest of the peak: what the batch adds)."""

    static_mib: float
    activation_mib: float

    @property
    def peak_mib(self) -> float:
        return self.static_mib + self.activation_mib


class _AssumingFakeMode(FakeTensorMode):
    """A fake mode that answers reads of device values instead of refusing them: 1 (integers, e.g. a memory's
    filled rows), 1.0 (floats) and True, so the step takes its common path (memories filled, some pixels above
    the threshold); ops whose output size follows the data (``nonzero``, boolean selections) get the largest
    size they could have, an upper bound of their memory."""

    def dispatch(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is torch.ops.aten._local_scalar_dense.default:
            dtype = args[0].dtype
            return True if dtype == torch.bool else 1.0 if dtype.is_floating_point or dtype.is_complex else 1
        try:
            return super().dispatch(func, types, args, kwargs or {})
        except DynamicOutputShapeException:
            return self._largest_output(func, args)

    def _largest_output(self, func: Any, args: Any) -> Any:
        source = args[0]
        if func in (torch.ops.aten.nonzero.default, torch.ops.aten.argwhere.default):
            return torch.empty((source.numel(), source.dim()), dtype=torch.int64, device=source.device)
        if func is torch.ops.aten.masked_select.default:
            return torch.empty((torch.broadcast_shapes(source.shape, args[1].shape).numel(),), dtype=source.dtype,
                               device=source.device)
        raise NotImplementedError(f"fake memory: {func} has an output size that follows the data")


@contextlib.contextmanager
def _plain_skip_init() -> Iterator[None]:
    """``torch.nn.utils.skip_init`` builds on the meta device and moves with ``to_empty``, a parameter swap that fake
    tensors refuse; under ``FakeTensorMode`` initialising costs nothing, so the module is built plainly."""
    saved = torch.nn.utils.skip_init
    torch.nn.utils.skip_init = lambda module_cls, *args, **kwargs: module_cls(*args, **kwargs)
    try:
        yield
    finally:
        torch.nn.utils.skip_init = saved


def first_batch(config: RunConfig, *, use_unlabeled: bool) -> tuple[Any, Plan]:
    """One batch of the run's data streams (real tensors; the step moves them into the fake mode) and its plan."""
    datasets = build_datasets(config)
    plan = plan_run(config, num_labeled=len(datasets["labeled"]), num_unlabeled=len(datasets["unlabeled"]),
                    world_size=1)
    streams = Streams(config, datasets, train_transforms(config), plan, use_unlabeled=use_unlabeled, rank=0,
                      world_size=1, pin_memory=False)
    return next(itertools.islice(streams.epoch(0, 0), 1)), plan


def measure_step_memory(config: RunConfig, *, bf16: bool, batch: tuple[Any, Plan] | None = None) -> StepMemory:
    """The peak of one training step of ``config`` on one process (``bf16``: under bf16 autocast, as
    ``runtime.amp`` on a GPU), with what a later step holds besides: the optimiser state (created by the step's
    ``step()``) and the previous step's gradients. ``batch``: reuse a batch of the same data
    settings (:func:`first_batch`'s), else one is drawn from the run's streams."""
    device = torch.device("cpu")
    mode = _AssumingFakeMode(allow_non_fake_inputs=True)
    torch.manual_seed(config.seed)
    with _plain_skip_init(), mode, torch.device(device):
        framework = build_framework(config)
        for module in framework.modules().values():
            module.train()
        optimizer = build_optimizer(config, framework.student, world_size=1)
    batch, plan = batch if batch is not None else first_batch(config, use_unlabeled=framework.uses_unlabeled)
    tracker = MemTracker()
    tracker.track_external(*framework.modules().values(), optimizer.torch_optimizer)
    ctx = StepContext(step=0, total_steps=plan.total_steps, epoch=0, total_epochs=plan.total_epochs,
                      iters_per_epoch=plan.iters_per_epoch)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
    with mode, tracker, autocast:
        deferred_train_step(framework, batch, ctx, optimizer, config, device, 1)
    peak = tracker.get_tracker_snapshot("peak")[device]
    kinds = {str(kind).rsplit(".", 1)[-1]: size for kind, size in peak.items() if kind != "Total"}
    state = sum(t.numel() * t.element_size() for s in optimizer.torch_optimizer.state.values()
                for t in s.values() if isinstance(t, torch.Tensor) and t.dim() > 0)
    # the peak lies in the forward pass, where a later step still holds the previous step's gradients (the loop sets
    # them to None just before backward): the tracked first step had none yet
    trainable = sum(p.numel() * p.element_size() for p in framework.student.parameters() if p.requires_grad)
    static = kinds.get("PARAM", 0) + kinds.get("BUFFER", 0) + max(kinds.get("GRAD", 0), trainable) + state
    activation = peak["Total"] - kinds.get("PARAM", 0) - kinds.get("BUFFER", 0) - kinds.get("GRAD", 0) \
        - kinds.get("OPT", 0)
    return StepMemory(static / MIB, max(activation, 0) / MIB)


def model_state_mib(config: RunConfig) -> tuple[float, float]:
    """``(held, trainable)`` MiB of ``config``'s framework, built on fake tensors: every network's parameters and
    buffers (students, EMA teachers, queues, memories) and the student's trainable parameters (each adds a
    gradient and the optimiser's slots)."""
    torch.manual_seed(config.seed)
    with _plain_skip_init(), _AssumingFakeMode(allow_non_fake_inputs=True), torch.device("cpu"):
        framework = build_framework(config)
    seen: set[int] = set()
    held = 0
    for module in framework.modules().values():
        for tensor in itertools.chain(module.parameters(), module.buffers()):
            if id(tensor) not in seen:
                seen.add(id(tensor))
                held += tensor.numel() * tensor.element_size()
    trainable = sum(p.numel() * p.element_size() for p in framework.student.parameters() if p.requires_grad)
    return held / MIB, trainable / MIB
