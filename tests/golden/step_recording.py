"""What the whole-step golden recorders of U2PL and AugSeg (and their NP-SemiSeg versions) share with their tests.

Both sides run the project's tiny smoke segmentor of a cell, with deterministic pattern parameters *and* BN buffers
(:func:`load_pattern`, so that a teacher's own running statistics differ from the student's and a step that copies
or averages them shows). Dropout is the one random draw inside the networks: every ``nn.Dropout2d`` is replaced by a
:class:`TapeDropout` that draws its channel mask from torch's generator while recording (as ``F.dropout2d`` does:
Bernoulli(1 - p) / (1 - p) per channel) and replays the recorded masks, per module and in call order, in the test.
:func:`digest` summarises every parameter, gradient and buffer as its sum, its sum of |x| and sampled entries.
"""

from __future__ import annotations

import hashlib
import importlib
import sys
import types
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from record_mt_cps_golden import sample_indices as mt_sample_indices
from recording import default_dtype, official_commit, recorder_arguments, save_golden, sine_pattern  # noqa: F401


def pattern(shape: tuple[int, ...], salt: int, bound: float | None = None,
            dtype: torch.dtype = torch.float32) -> Tensor:
    """``bound * sin(1 + 0.7 i + salt)`` over the flat index i; ``bound`` default: the Xavier-uniform bound of the
    shape (1-d tensors: 0.1), i.e. ``record_mt_cps_golden.pattern_weights``. Computed in float64, returned as
    ``dtype`` (float32: ``pattern_weights``' values)."""
    if bound is None:
        values = sine_pattern(shape, salt)
    else:
        values = bound * np.sin(1.0 + 0.7 * np.arange(int(np.prod(shape)), dtype=np.float64) + float(salt))
    return torch.from_numpy(values.reshape(shape)).to(dtype)


@torch.no_grad()
def load_pattern(model: nn.Module, salt: int) -> None:
    """Parameter ``i`` <- :func:`pattern` with salt ``salt + i``; BN running means <- 0.1 x pattern, running variances
    <- 1 + 0.5 |pattern| (salt ``salt + 500 + j`` for buffer ``j``); integer buffers left alone. Each tensor gets
    the pattern in its own dtype (a float64 model: float64 values, not float32 ones widened)."""
    for i, (_, p) in enumerate(model.named_parameters()):
        p.copy_(pattern(tuple(p.shape), salt + i, dtype=p.dtype))
    for j, (name, b) in enumerate(model.named_buffers()):
        if not b.is_floating_point():
            continue
        values = pattern(tuple(b.shape), salt + 500 + j, bound=1.0, dtype=b.dtype)
        if name.endswith("running_mean"):
            b.copy_(0.1 * values)
        elif name.endswith("running_var"):
            b.copy_(1.0 + 0.5 * values.abs())


class DropoutTape:
    """Channel masks of every :class:`TapeDropout`, per module name in call order: drawn and kept (``record``) or
    taken from a recording (``replay``). A drawn mask is Bernoulli(1 - p) drawn in float32 (the same draws whatever
    ``dtype`` and the default dtype), then scaled by ``1 / (1 - p)`` in ``dtype`` (float64 for a float64 network, as
    ``F.dropout2d`` scales in the input's dtype)."""

    def __init__(self, recorded: dict[str, list[np.ndarray]] | None = None, dtype: torch.dtype = torch.float32) -> None:
        self.replaying, self.dtype = recorded is not None, dtype
        self.masks: dict[str, list[np.ndarray]] = defaultdict(list)
        if recorded is not None:
            self.masks.update({k: list(v) for k, v in recorded.items()})

    def mask(self, name: str, shape: tuple[int, ...], p: float) -> Tensor:
        if self.replaying:
            assert self.masks[name], f"{name}: ours runs this dropout more often than the recording"
            return torch.from_numpy(self.masks[name].pop(0))
        mask = torch.empty(shape, dtype=torch.float32).bernoulli_(1.0 - p).to(self.dtype).div_(1.0 - p)
        self.masks[name].append(mask.numpy().copy())
        return mask

    def arrays(self, prefix: str) -> dict[str, np.ndarray]:
        return {f"{prefix}/{name}/{k:02d}": m for name, masks in self.masks.items() for k, m in enumerate(masks)}

    def unused(self) -> list[str]:
        return [name for name, masks in self.masks.items() if masks]

    @classmethod
    def from_arrays(cls, data: dict[str, np.ndarray], prefix: str) -> DropoutTape:
        recorded: dict[str, list[np.ndarray]] = defaultdict(list)
        for key in sorted(k for k in data if k.startswith(prefix + "/")):
            recorded[key[len(prefix) + 1:].rsplit("/", 1)[0]].append(data[key])
        return cls(recorded)


class TapeDropout(nn.Module):
    """``nn.Dropout2d(p)`` whose masks ``[N, C, 1, 1]`` come from a :class:`DropoutTape`; identity in eval mode."""

    def __init__(self, name: str, p: float, tape: DropoutTape) -> None:
        super().__init__()
        self.name, self.p, self.tape = name, p, tape

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0.0:
            return x
        return x * self.tape.mask(f"{self.name}", (x.shape[0], x.shape[1], 1, 1), self.p).to(x.dtype)


def tape_dropout(model: nn.Module, tape: DropoutTape, role: str) -> None:
    """Replace every ``nn.Dropout2d`` of ``model`` by a :class:`TapeDropout` named ``role:<module path>``."""
    for prefix, module in list(model.named_modules()):
        for name, child in list(module.named_children()):
            if type(child) is nn.Dropout2d:
                path = f"{prefix}.{name}" if prefix else name
                setattr(module, name, TapeDropout(f"{role}:{path}", child.p, tape))


def sample_indices(model: nn.Module) -> dict[str, np.ndarray]:
    """32 flat indices per parameter and buffer (all of them for smaller tensors), as the MT step golden."""
    return mt_sample_indices(model)


def stub_missing(names: tuple[str, ...], attributes: dict[str, tuple[str, ...]]) -> None:
    """An empty module for each of ``names`` that does not import (an official file imports it, the recorded path
    does not use it), with ``attributes[name]`` set to None where the module lacks them."""
    for name in names:
        if name not in sys.modules:
            try:
                importlib.import_module(name)
            except ImportError:
                sys.modules[name] = types.ModuleType(name)
    for name, attrs in attributes.items():
        for attr in attrs:
            setattr(sys.modules[name], attr, getattr(sys.modules[name], attr, None))


def tensors(model: nn.Module, what: str) -> list[tuple[str, Tensor]]:
    """``params``, ``grads`` (parameters with a gradient) or ``buffers`` of ``model``, by name."""
    if what == "params":
        return list(model.named_parameters())
    if what == "grads":
        return [(n, p.grad) for n, p in model.named_parameters() if p.grad is not None]
    return list(model.named_buffers())


def digest(prefix: str, items: list[tuple[str, Tensor]], indices: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Sum, sum of |values| and the sampled entries of each named tensor, as float64."""
    out = {}
    for name, t in items:
        flat = t.detach().double().flatten()
        out[f"{prefix}/sum/{name}"] = np.array(float(flat.sum()))
        out[f"{prefix}/abs/{name}"] = np.array(float(flat.abs().sum()))
        out[f"{prefix}/at/{name}"] = flat[torch.from_numpy(indices[name]).long()].numpy()
    return out


def compare_digest(data: dict[str, np.ndarray], prefix: str, items: list[tuple[str, Tensor]], rtol: float,
                   floor: float = 1.0) -> float:
    """Max relative |ours - recorded| (:func:`close`) over the digest of ``items`` under ``prefix`` (the recorded
    names must be those of ``items``); asserts each within ``rtol`` of its scale, at least ``floor`` (1: relative to
    max(1, scale); a smaller floor makes small tensors, gradients say, relative to their own scale)."""
    ours = dict(items)
    head = f"{prefix}/sum/"
    recorded_names = {k[len(head):] for k in data if k.startswith(head)}
    assert recorded_names == set(ours), f"{prefix}: names differ: {sorted(recorded_names ^ set(ours))[:5]}"
    worst = 0.0
    for name, t in items:
        flat = t.detach().double().flatten()
        index = torch.from_numpy(data[f"index/{name}"]).long()
        # a sum is as exact as the sum of |x| it cancels from: its bound scales with that
        scale = float(data[f"{prefix}/abs/{name}"])
        for kind, value in (("sum", flat.sum().numpy()), ("abs", flat.abs().sum().numpy()), ("at", flat[index].numpy())):
            worst = max(worst, close(value, data[f"{prefix}/{kind}/{name}"], rtol, f"{prefix} {kind} {name}",
                                     scale=scale if kind == "sum" else None, floor=floor))
    return worst


def close(ours, theirs, rtol: float, what: str, scale: float | None = None, floor: float = 1.0) -> float:
    """Max |ours - theirs| / max(floor, scale), asserted <= ``rtol``; ``scale`` default ``max |theirs|``."""
    ours, theirs = np.asarray(ours, dtype=np.float64), np.asarray(theirs, dtype=np.float64)
    assert ours.shape == theirs.shape, f"{what}: shape {ours.shape} != recorded {theirs.shape}"
    if not theirs.size:
        return 0.0
    diff = float(np.max(np.abs(ours - theirs)))
    bound = rtol * max(floor, float(np.max(np.abs(theirs))) if scale is None else scale)
    assert diff <= bound, f"{what}: max |difference| {diff:.3g} > {bound:.3g}"
    return diff * rtol / bound


def record_and_save(argv: list[str] | None, doc: str, stem: str, record: Callable[[Path], dict[str, np.ndarray]],
                    official_files: tuple[str, ...], **fields: Any) -> dict[str, np.ndarray]:
    """A step recorder's command line: record from CHECKOUT, write ``<stem>.npz`` and its sidecar (``fields``:
    about, repository, sources, compared, sizes; the commit, the official files' hashes, the command and torch's
    version added)."""
    args = recorder_arguments(doc, f"a checkout of {fields['repository'].removeprefix('https://github.com/')}", argv)
    commit = args.commit or official_commit(args.checkout)
    arrays = record(args.checkout)
    sidecar = {"about": fields.pop("about"), "repository": fields.pop("repository"), "commit": commit,
               "official_file_sha256": {f: hashlib.sha256((args.checkout / f).read_bytes()).hexdigest()
                                        for f in official_files},
               **fields,
               "command": f"PYTHONPATH=$PWD python tests/golden/record_{stem.removesuffix('_released')}_golden.py "
                          f"CHECKOUT --commit {commit}",
               "torch": torch.__version__}
    save_golden(args.out, stem, arrays, sidecar)
    return arrays


def official_optimizer(package: str, smoke, cfg: dict, backbone: nn.Module, model: nn.Module, epoch: int, iters: int):
    """U2PL's and AugSeg's ``train_semi.py`` optimiser (U2PL 82-99, AugSeg 86-106) through ``<package>.utils.lr_helper``:
    SGD over the backbone at lr and the rest of ``model`` at ``head_lr_mult`` x lr (``get_optimizer``), the poly
    schedule from the epoch's first iteration (``get_scheduler``)."""
    lr_helper = sys.modules[f"{package}.utils.lr_helper"]
    ids = {id(p) for p in backbone.parameters()}
    lr = smoke.optim.lr
    params_list = [dict(params=list(backbone.parameters()), lr=lr),
                   dict(params=[p for p in model.parameters() if id(p) not in ids], lr=lr * smoke.optim.head_lr_mult)]
    optimizer = lr_helper.get_optimizer(params_list, cfg["trainer"]["optimizer"])
    return optimizer, lr_helper.get_scheduler(cfg["trainer"], iters, optimizer, start_epoch=epoch)
