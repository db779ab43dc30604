"""What every official run needs to run on a CPU in this process (:data:`CPU_PATCHES`, :func:`official_process`),
the patching and recording helpers, and the runner of UniMatch's and UniMatch V2's scripts (:func:`run_official`)."""

from __future__ import annotations

import contextlib
import importlib
import os
import random
import sys
import types
import unittest.mock
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from torch import Tensor, nn

from official_side_by_side import official_imports, one_process_group

#: the patches of a CPU run of any official script: (what is replaced, by what, why)
CPU_PATCHES = (
    ("torch.Tensor.cuda, torch.nn.Module.cuda", "return the object unchanged", "a CPU run"),
    ("torch.nn.parallel.DistributedDataParallel", "the same class with device_ids and output_device None",
     "DDP of a CPU module takes no device ids"),
    ("torch.nn.SyncBatchNorm.convert_sync_batchnorm", "return the module unchanged",
     "SyncBatchNorm needs CUDA; with one process it is BatchNorm over the same batch"),
)
#: UniMatch's and UniMatch V2's process group and tensorboard
ONE_RANK_PATCH = ("util.dist_helper.setup_distributed (as the script imported it)", "a one-rank gloo process group, rank 0",
                  "no GPU, no launcher: the script's collectives (DDP, evaluate's all_reduce) run in one CPU process")
TENSORBOARD_PATCH = ("torch.utils.tensorboard", "a SummaryWriter that discards",
                     "tensorboard is not installed; logging only")


class DiscardingWriter:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __getattr__(self, name: str) -> Callable[..., None]:
        return lambda *args, **kwargs: None


def _cpu_ddp(ddp: type) -> Callable[..., nn.Module]:
    def wrap(module: nn.Module, *args: Any, **kwargs: Any) -> nn.Module:
        kwargs.update(device_ids=None, output_device=None)
        return ddp(module, *args, **kwargs)
    return wrap


@contextlib.contextmanager
def patched(attributes: list[tuple[Any, str, Any]]) -> Iterator[None]:
    """``setattr(owner, name, value)`` for each, restored after (the names that were missing removed)."""
    missing = object()
    saved = [(owner, name, getattr(owner, name, missing)) for owner, name, _ in attributes]
    for owner, name, value in attributes:
        setattr(owner, name, value)
    try:
        yield
    finally:
        for owner, name, value in reversed(saved):
            if value is missing:
                delattr(owner, name)
            else:
                setattr(owner, name, value)


def one_rank_setup(*args: Any, **kwargs: Any) -> tuple[int, int]:
    """The official ``setup_distributed``'s result in this process: a one-rank gloo group (made here), rank 0 of 1."""
    one_process_group(torch.device("cpu"))
    return 0, 1


def recorded(function: Callable[..., Any], *curves: list[float], scale: float = 1.0) -> Callable[..., Any]:
    """``function`` (an official evaluation) unchanged, each result's mIoU (a tuple's first item, a dict's
    ``Mean_IoU``) x ``scale`` also appended to ``curves`` in turn (call ``i`` to ``curves[i % len(curves)]``: a loop
    that evaluates the model, then its EMA, every epoch)."""
    def call(*args: Any, **kwargs: Any) -> Any:
        result = function(*args, **kwargs)
        value = result[0] if isinstance(result, tuple) else result["Mean_IoU"] if isinstance(result, dict) else result
        curves[sum(map(len, curves)) % len(curves)].append(float(value) * scale)
        return result
    return call


def answered_load(path: str, state: dict[str, Tensor]) -> Callable[..., Any]:
    """``torch.load`` answering ``path`` (as the script spells it) with ``state``, any other file as itself."""
    load = torch.load

    def call(f: Any, *args: Any, **kwargs: Any) -> Any:
        return state if isinstance(f, str) and os.path.normpath(f) == os.path.normpath(path) else load(f, *args, **kwargs)
    return call


def in_process_loader(*args: Any, **kwargs: Any) -> torch.utils.data.DataLoader:
    """``DataLoader`` with ``num_workers`` 0, whatever the caller asks."""
    return torch.utils.data.DataLoader(*args, **{**kwargs, "num_workers": 0})


def seed_everything(seed: int) -> None:
    """Seed ``random``, numpy and torch (the official scripts seed nothing themselves)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def written_config(cfg: dict[str, Any], save_path: Path) -> Path:
    """``cfg`` as ``save_path/config.yaml`` (the folder made), the file the official script reads."""
    save_path.mkdir(parents=True, exist_ok=True)
    config_file = save_path / "config.yaml"
    config_file.write_text(yaml.safe_dump(cfg))
    return config_file


@contextlib.contextmanager
def official_process(folder: Path, argv: list[str], writer: str, workdir: Path) -> Iterator[contextlib.ExitStack]:
    """What every official run needs (:data:`CPU_PATCHES`): ``.cuda()`` a no-op, DDP without device ids, no SyncBN
    conversion, the module ``writer`` (``torch.utils.tensorboard``, ``tensorboardX``) a discarding ``SummaryWriter``,
    ``sys.argv`` = ``argv``, ``folder`` imported from, ``workdir`` the working directory, ``LOCAL_RANK`` 0, and after
    it the process group the script makes destroyed and ``cudnn.benchmark`` as it was (every official script sets it
    True); yields the stack for the script's own patches."""
    board = types.ModuleType(writer)
    board.SummaryWriter = DiscardingWriter  # type: ignore[attr-defined]
    parent, _, leaf = writer.rpartition(".")
    with contextlib.ExitStack() as stack:
        stack.enter_context(patched([(sys, "argv", argv), (torch.Tensor, "cuda", lambda self, *a, **k: self),
                                     (nn.Module, "cuda", lambda self, *a, **k: self),
                                     (nn.SyncBatchNorm, "convert_sync_batchnorm", staticmethod(lambda m, *a, **k: m)),
                                     (nn.parallel, "DistributedDataParallel",
                                      _cpu_ddp(nn.parallel.DistributedDataParallel)),
                                     (torch.backends.cudnn, "benchmark", torch.backends.cudnn.benchmark),
                                     *([(sys.modules[parent], leaf, board)] if parent else [])]))
        sys.modules[writer] = board
        stack.callback(sys.modules.pop, writer, None)
        stack.enter_context(official_imports(folder))
        stack.enter_context(contextlib.chdir(workdir))
        stack.callback(os.environ.pop, "LOCAL_RANK", None)
        os.environ["LOCAL_RANK"] = "0"
        stack.callback(lambda: torch.distributed.is_initialized() and torch.distributed.destroy_process_group())
        yield stack


def run_official(folder: Path, script: str, cfg: dict[str, Any], network: nn.Module, lists: dict[str, Path],
                 save_path: Path, seed: int, class_names: tuple[str, ...], model_class: str = "DeepLabV3Plus",
                 evaluations: int = 1, patches: tuple[tuple[Any, str, Any], ...] = (),
                 module_patches: dict[str, Any] | None = None) -> dict[str, Any]:
    """``main()`` of UniMatch's or UniMatch V2's ``folder/script`` on the exported data (``cfg``, ``lists``) with
    :data:`PATCHES` (``model_class`` the network's class name in the script; V2: :data:`V2_PATCHES`, its ``patches``
    and the script's ``module_patches``): its per-epoch mIoU (``curve``), the best (what it reports,
    ``previous_best``) and the last; with ``evaluations`` 2 per epoch (the model, then its EMA), the EMA's and the
    model's curve (``student_curve``). The official code seeds nothing; ``random``, numpy and torch are seeded with
    ``seed`` before it starts."""
    argv = [script, "--config", str(written_config(cfg, save_path)), "--labeled-id-path", str(lists["labeled"]),
            "--unlabeled-id-path", str(lists["unlabeled"]), "--save-path", str(save_path)]
    curves: list[list[float]] = [[] for _ in range(evaluations)]
    with official_process(folder, argv, "torch.utils.tensorboard", lists["val"].parents[2]) as stack:
        module = importlib.import_module(script.removesuffix(".py"))
        classes = importlib.import_module("util.classes").CLASSES
        stack.enter_context(patched([(module, "setup_distributed", one_rank_setup),
                                     (module, model_class, lambda *args, **kwargs: network),
                                     (module, "evaluate", recorded(module.evaluate, *curves)), *patches,
                                     *[(module, name, value) for name, value in (module_patches or {}).items()]]))
        stack.enter_context(unittest.mock.patch.dict(classes, {cfg["dataset"]: list(class_names)}))
        seed_everything(seed)
        module.main()
    result = {"curve": curves[-1], "best": max(curves[-1]), "last": curves[-1][-1]}
    return result if evaluations == 1 else {**result, "student_curve": curves[0]}
