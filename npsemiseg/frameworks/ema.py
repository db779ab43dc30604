"""Exponential moving average (EMA) teachers and the frameworks' decay schedules.

``teacher = decay * teacher + (1 - decay) * student`` after every optimiser step.
What the average covers differs between the frameworks (``docs/frameworks.md``):

- MT (shared trainer) and U2PL: parameters (U2PL's teacher gets its BN statistics from
  its own train-mode passes in the released code, ``buffers="none"`` under ``released``; the
  eval-mode teacher of ``corrected`` averages them, ``buffers="ema"``, see :mod:`npsemiseg.frameworks.u2pl`).
- AugSeg: parameters and BN buffers.
- PS-MT: the full ``state_dict`` (parameters and buffers).

Integer buffers (``num_batches_tracked``, memory write pointers and counts) cannot be
averaged and are copied. The NP head's class memories and centers are state the
student *writes* (FIFO banks, not weights): averaging bank rows written at different
times mixes unrelated pixels, so they are always copied verbatim
(:func:`memory_buffer_names`), and the teacher queries the student's current centers
(as in the authors' code, where the teacher uses the student's banks).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

import torch
from torch import nn

from npsemiseg.heads.base import ClassifierHead

BufferMode = Literal["ema", "copy", "none"]
BUFFER_MODES: tuple[str, ...] = ("ema", "copy", "none")


def unwrap(model: nn.Module) -> nn.Module:
    """The module inside a DistributedDataParallel / DataParallel wrapper (or the model)."""
    return getattr(model, "module", model) if isinstance(
        model, (nn.parallel.DistributedDataParallel, nn.DataParallel)
    ) else model


def memory_buffer_names(model: nn.Module) -> set[str]:
    """Names (in ``model.named_buffers()``) of every buffer owned by a head with memories (NP).

    Those hold class memories, pointers and centers, which a teacher copies rather than averages.
    """
    names: set[str] = set()
    for prefix, module in unwrap(model).named_modules():
        if isinstance(module, ClassifierHead) and module.has_memories:
            for name, _ in module.named_buffers():
                names.add(f"{prefix}.{name}" if prefix else name)
    return names


@torch.no_grad()
def ema_update(
    teacher: nn.Module,
    student: nn.Module,
    decay: float,
    *,
    buffers: BufferMode = "ema",
    copy_buffers: Iterable[str] = (),
) -> None:
    """In place: ``teacher <- decay * teacher + (1 - decay) * student``.

    ``buffers``: ``"ema"`` averages floating-point buffers like parameters, ``"copy"``
    copies every buffer from the student, ``"none"`` leaves the teacher's buffers alone.
    Integer buffers are copied under ``"ema"``. Buffers named in ``copy_buffers`` are copied
    whatever the mode (NP memories). ``decay`` in [0, 1]; 0 makes the teacher a copy.
    """
    if not 0.0 <= decay <= 1.0:
        raise ValueError(f"decay: expected a value in [0, 1], got {decay}")
    if buffers not in BUFFER_MODES:
        raise ValueError(f"buffers: expected one of {BUFFER_MODES}, got {buffers!r}")
    teacher, student = unwrap(teacher), unwrap(student)
    t_params = dict(teacher.named_parameters())
    s_params = dict(student.named_parameters())
    if t_params.keys() != s_params.keys():
        missing = sorted(set(t_params) ^ set(s_params))[:5]
        raise ValueError(f"teacher and student have different parameters, e.g. {missing}")
    names = list(t_params)
    t_list = [t_params[n].data for n in names]
    s_list = [s_params[n].data.to(t_params[n].dtype) for n in names]
    if t_list:
        # teacher + (1 - decay) * (student - teacher) == decay * teacher + (1 - decay) * student
        torch._foreach_lerp_(t_list, s_list, 1.0 - decay)

    always_copy = set(copy_buffers)
    s_buffers = dict(student.named_buffers())
    for name, t_buf in teacher.named_buffers():
        if name not in s_buffers:
            raise ValueError(f"buffer {name!r} of the teacher is missing from the student")
        s_buf = s_buffers[name]
        if name in always_copy or (buffers != "none" and not t_buf.is_floating_point()):
            t_buf.copy_(s_buf)
        elif buffers == "copy":
            t_buf.copy_(s_buf)
        elif buffers == "ema":
            t_buf.lerp_(s_buf.to(t_buf.dtype), 1.0 - decay)


@torch.no_grad()
def copy_model(teacher: nn.Module, student: nn.Module) -> None:
    """Make the teacher an exact copy of the student (parameters and buffers)."""
    unwrap(teacher).load_state_dict(unwrap(student).state_dict())


@torch.no_grad()
def copy_parameters(teacher: nn.Module, student: nn.Module) -> None:
    """The teacher's parameters <- the student's values; its buffers (BN statistics, memories) stay its own (U2PL's
    reset, whose teacher parameters share the student's storage, ``train_semi.py`` 309-315)."""
    for t, s in zip(unwrap(teacher).parameters(), unwrap(student).parameters(), strict=True):
        t.copy_(s)


def make_teacher(teacher: nn.Module, student: nn.Module) -> nn.Module:
    """Initialise ``teacher`` from ``student``, freeze it and put it in eval mode."""
    copy_model(teacher, student)
    for p in teacher.parameters():
        p.requires_grad_(False)
    return teacher.eval()


def warmup_decay(step: int, max_decay: float) -> float:
    """``min(1 - 1 / (step + 1), max_decay)``: 0 at step 0, 0.5 at step 1, ... capped.

    U2PL counts ``step`` from the first semi-supervised iteration; AugSeg from the first
    iteration of the run.
    """
    if step < 0:
        raise ValueError(f"step: expected >= 0, got {step}")
    return min(1.0 - 1.0 / (step + 1), max_decay)


def u2pl_decay(step: int, sup_only_steps: int, max_decay: float = 0.99) -> float:
    """U2PL's teacher decay at global iteration ``step`` (no EMA before ``sup_only_steps``)."""
    return warmup_decay(max(step - sup_only_steps, 0), max_decay)


def augseg_decay(step: int, epoch: int, max_decay: float) -> float:
    """AugSeg's decay: 0 throughout epoch 0 (teacher follows the student), then
    ``min(1 - 1/(step + 1), max_decay)`` with ``step`` the global iteration."""
    return 0.0 if epoch == 0 else warmup_decay(step, max_decay)

