"""TorchSemiSeg's MeanTeacher for VOC (charlesCXK/TorchSemiSeg ``exp.voc/voc8.res50v3+.MeanTeacher``): its patches
(:data:`MT_CPS_PATCHES`), config (:func:`mt_cps_cfg`), the stand-ins of what a CPU process lacks (apex, easydict) and
its run: ``train.py``, then ``eval.py`` on the checkpoints it saved (:func:`run_official_mt_cps`,
:func:`official_mt_cps_run`).

The checkout: ``git clone https://github.com/charlesCXK/TorchSemiSeg ROOT/charlesCXK+TorchSemiSeg`` and ``git
checkout 5e0c29c`` in it (a folder whose path holds ``TorchSemiSeg``: config.py finds ``furnace`` by that name in the
working directory's real path)."""

from __future__ import annotations

import collections
import collections.abc
import contextlib
import copy
import importlib
import math
import os
import runpy
import sys
import types
import unittest.mock
from collections.abc import Callable, Iterator
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from typing import Any

import torch
from torch import nn

from npsemiseg.config import RunConfig
from npsemiseg.data.study import partition_counts

from official.mt_cps_network import mean_teacher_network
from official.networks import initial_networks
from official.patching import CPU_PATCHES, official_process, patched, seed_everything
from official.study import PARTITION, mt_cps_evaluated_from, official_epochs, study_of
from official_side_by_side import official_imports, one_process_group

#: the MeanTeacher's folder in the checkout
MT_CPS_DIR = "exp.voc/voc8.res50v3+.MeanTeacher"
#: script.sh's checkpoint interval (``snapshot_iter=1``: every epoch after the first half)
SNAPSHOT_ITER = 1
#: every change made to TorchSemiSeg's MeanTeacher ``train.py`` and ``eval.py`` run, the only ones; the settings that
#: are not patches but the cell's are :func:`mt_cps_cfg`'s
MT_CPS_PATCHES = (
    *CPU_PATCHES,
    ("apex.parallel (DistributedDataParallel, SyncBatchNorm; train.py raises without apex)",
     "DistributedDataParallel: a module calling the network it wraps (as .module); SyncBatchNorm: torch.nn.BatchNorm2d",
     "apex is not installed and needs CUDA; in one process DDP's gradient all-reduce over one rank is the identity "
     "and SyncBatchNorm is BatchNorm over the same batch (train.py passes it as the norm layer group_weight groups by)"),
    ("Engine's distributed set-up: WORLD_SIZE, torch.cuda.set_device, torch.distributed.init_process_group",
     "WORLD_SIZE=1 (what the launcher sets), set_device a no-op, a one-rank gloo process group made before train.py",
     "no GPU, no launcher: train.py's distributed path (its only runnable one: the other calls an undefined "
     "DataParallelModel), its DistributedSampler and all_reduce, in one CPU process"),
    ("easydict (where not installed)", "a module whose EasyDict is a dict with attribute access",
     "config.py builds its config with it"),
    ("tensorboardX", "a module whose SummaryWriter discards", "logging only"),
    ("network.Network (as train.py and eval.py import it)",
     "mean_teacher_network (benchmarks/official/mt_cps_network.py, which the MT-CPS golden recorder imports): the "
     "official Network whose branch1 / branch2 are copies of the project's student and teacher of the cell behind "
     "SingleNetwork's interface; its forward and _update_ema_variables the official ones",
     "the study's small network with the project's initial weights of the seed, pretrained backbone included (the "
     "official SingleNetwork is a ResNet-50 DeepLabv3+ of fixed widths)"),
    ("utils.init_func.init_weight (as train.py imports it)", "a no-op",
     "it re-initialises the official network's head and classifier (kaiming); the project's network keeps the "
     "project's initial weights of the seed"),
    ("the DataLoader iterator's next()", "its __next__", "train.py calls the name torch's iterator no longer has"),
    ("collections.Iterable", "collections.abc.Iterable", "gone from collections since Python 3.10; furnace's "
     "img_utils.get_2dshape (the crop) checks with it"),
    ("torch.cuda.device_count (while eval.py runs)", "1", "eval.py's parse_devices checks its -d 0 against the GPUs"),
    ("Network.to", "the model unchanged for a negative device index",
     "eval.py's val_func_process moves the model to input.get_device(), -1 for a CPU tensor"),
    ("torch.utils.data.dataloader.default_collate, ForkingPickler's storage reducers",
     "restored after eval.py, which replaces them when imported", "the project's side runs in the same process"),
    ("engine.evaluator.load_model, seg_opr.metric.compute_score", "the same functions, the checkpoint's epoch and its "
     "mIoU also recorded (x 100); the checkpoint's keys checked to be the network's",
     "the curve of the evaluated epochs; load_model loads with strict=False, which would pass a mismatch silently"),
)


class AttributeDict(dict):
    """easydict's ``EasyDict`` as config.py uses it: a dict whose items are attributes too."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name: str, value: Any) -> None:
        self[name] = value


class OneRankDistributedDataParallel(nn.Module):
    """apex's ``DistributedDataParallel`` in one process: the wrapped network (``.module``) called as it is."""

    def __init__(self, module: nn.Module, *args: Any, **kwargs: Any) -> None:
        super().__init__()
        self.module = module

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)


def stand_in_modules() -> dict[str, types.ModuleType]:
    """``apex`` and ``apex.parallel`` (:class:`OneRankDistributedDataParallel`, ``SyncBatchNorm`` BatchNorm2d), and
    ``easydict`` (:class:`AttributeDict`) where it is not installed."""
    apex, parallel = types.ModuleType("apex"), types.ModuleType("apex.parallel")
    parallel.DistributedDataParallel, parallel.SyncBatchNorm = OneRankDistributedDataParallel, nn.BatchNorm2d
    apex.parallel = parallel
    modules = {"apex": apex, "apex.parallel": parallel}
    try:
        importlib.import_module("easydict")
    except ImportError:
        modules["easydict"] = types.ModuleType("easydict")
        modules["easydict"].EasyDict = AttributeDict
    return modules


def mt_cps_cfg(config: RunConfig, lists: dict[str, Path], epochs: int, save_path: Path) -> dict[str, Any]:
    """What :func:`run_official_mt_cps` sets in config.py's ``config`` (the rest is the checkout's: the scales,
    ImageNet mean and std, ``warm_up_epoch`` 0, the sliding evaluation's stride, one scale, no flip): the export's
    folders and lists, the classes, the cell's crop (training and evaluation: the whole 64 px image), batch, LR, poly
    power, momentum, weight decay, EMA decay, MSE weight and epochs; ``max_samples`` and ``niters_per_epoch`` by
    config.py's own formulas (an epoch is ``N_u / B`` iterations, as on VOC); script.sh's ``snapshot_iter`` 1; data
    loaded in the process; logs and checkpoints under ``save_path``. ValueError where the cell's labeled and
    unlabeled batches differ (config.py has one ``batch_size``)."""
    schedule, options = config.schedule, config.framework_options
    if schedule.batch_size != schedule.unlabeled_batch_size:
        raise ValueError(f"mt_cps: config.py has one batch_size; the cell has schedule.batch_size "
                         f"{schedule.batch_size} and schedule.unlabeled_batch_size {schedule.unlabeled_batch_size}")
    data = study_of(config)
    labeled = partition_counts(data.train_size)[PARTITION]
    max_samples, root, log = max(labeled, data.train_size - labeled), str(lists["val"].parent), save_path / "log"
    return {"dataset_path": root, "img_root_folder": root, "gt_root_folder": root,
            "train_source": str(lists["labeled"]), "unsup_source": str(lists["unlabeled"]),
            "eval_source": str(lists["val"]), "num_classes": config.num_classes,
            "image_height": schedule.crop_size, "image_width": schedule.crop_size,
            "num_train_imgs": labeled, "num_unsup_imgs": data.train_size - labeled,
            "max_samples": max_samples, "niters_per_epoch": int(math.ceil(max_samples * 1.0 // schedule.batch_size)),
            "nepochs": epochs, "lr": config.optim.lr, "batch_size": schedule.batch_size,
            "lr_power": schedule.poly_power, "momentum": config.optim.momentum,
            "weight_decay": config.optim.weight_decay, "ema_decay": options["ema_decay"],
            "unsup_weight": options["mse_weight"], "num_workers": 0, "snapshot_iter": SNAPSHOT_ITER,
            "eval_crop_size": schedule.crop_size, "eval_base_size": schedule.crop_size,
            "pretrained_model": None, "snapshot_dir": str(save_path / "snapshot"), "log_dir": str(log),
            "tb_dir": str(log / "tb"), "log_dir_link": str(save_path / "log_link"), "log_file": str(log / "train.log"),
            "link_log_file": str(log / "train_last.log"), "val_log_file": str(log / "val.log"),
            "link_val_log_file": str(log / "val_last.log")}


def lenient_to(to: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
    """``Module.to`` that leaves the module where it is for a negative device index (a CPU tensor's
    ``get_device()``)."""
    def call(self: nn.Module, *args: Any, **kwargs: Any) -> nn.Module:
        if args and isinstance(args[0], int) and args[0] < 0:
            return self
        return to(self, *args, **kwargs)
    return call


def recording_evaluation(load_model: Callable[..., nn.Module], compute_score: Callable[..., Any],
                         curve: dict[int, float]) -> tuple[Callable[..., nn.Module], Callable[..., Any]]:
    """``load_model`` and ``compute_score`` unchanged, the mIoU x 100 of each checkpoint ``epoch-<e>.pth`` evaluated
    recorded as ``curve[e]``; ValueError where a checkpoint's keys are not the network's."""
    loaded: list[int] = []

    def load(model: nn.Module, model_file: Any, *args: Any, **kwargs: Any) -> nn.Module:
        state = torch.load(model_file, map_location="cpu", weights_only=True)["model"]
        if set(state) != set(model.state_dict()):
            raise ValueError(f"mt_cps: {model_file}'s keys are not the network's: "
                             f"{sorted(set(state) ^ set(model.state_dict()))[:5]}")
        loaded.append(int(Path(model_file).stem.split("-")[1]))
        return load_model(model, model_file, *args, **kwargs)

    def score(*args: Any, **kwargs: Any) -> Any:
        result = compute_score(*args, **kwargs)
        curve[loaded[-1]] = 100.0 * float(result[1])
        return result
    return load, score


@contextlib.contextmanager
def in_sys_modules(modules: dict[str, types.ModuleType]) -> Iterator[None]:
    """``modules`` in ``sys.modules`` under their names, the names' earlier modules (or none) back after."""
    saved = {name: sys.modules.get(name) for name in modules}
    sys.modules.update(modules)
    try:
        yield
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


@contextlib.contextmanager
def mt_cps_process(folder: Path) -> Iterator[contextlib.ExitStack]:
    """:func:`official_process` in the MeanTeacher's folder (config.py's working directory) with ``furnace``
    imported from and :func:`stand_in_modules`, ``WORLD_SIZE`` 1, ``set_device`` a no-op and a one-rank gloo group
    made (``init_process_group`` a no-op), ``sys.path``, the environment and cuDNN's benchmark flag restored after."""
    folder = folder.resolve()  # config.py adds <its real root>/furnace to sys.path unless there
    with official_process(folder / MT_CPS_DIR, ["train.py"], "tensorboardX", folder / MT_CPS_DIR) as stack:
        stack.callback(sys.path.__setitem__, slice(None), list(sys.path))
        stack.enter_context(official_imports(folder / "furnace"))
        stack.enter_context(unittest.mock.patch.dict(os.environ, {"WORLD_SIZE": "1"}))
        stack.enter_context(in_sys_modules(stand_in_modules()))
        one_process_group(torch.device("cpu"))
        stack.enter_context(patched([(torch.cuda, "set_device", lambda *args, **kwargs: None),
                                     (torch.distributed, "init_process_group", lambda *args, **kwargs: None)]))
        yield stack


def run_official_mt_cps(folder: Path, cfg: dict[str, Any], networks: dict[str, nn.Module], evaluated_from: int,
                        seed: int) -> dict[str, Any]:
    """TorchSemiSeg MeanTeacher's ``train.py`` run (imported: a script without ``main``) with config.py's ``config``
    updated by ``cfg`` (:func:`mt_cps_cfg`) and :data:`MT_CPS_PATCHES`, the network copies of ``networks``
    (``student``, ``teacher``); then ``eval.py`` run as its ``__main__`` (``-e <evaluated_from>-``: the checkpoints of
    those epochs, ``-d 0``: one process) on the checkpoints train.py saved. Returns the mIoU x 100 of each evaluated
    epoch (``curve``), the best and the last. train.py seeds torch with the rank, 0, whatever the seed;
    ``random`` (its transforms' draws) is seeded here with ``seed``."""
    curve: dict[int, float] = {}
    with mt_cps_process(folder) as stack:
        importlib.import_module("config").config.update(cfg)
        network = importlib.import_module("network")
        official_network = network.Network
        iterator = torch.utils.data.dataloader._BaseDataLoaderIter
        load, score = recording_evaluation(importlib.import_module("engine.evaluator").load_model,
                                           importlib.import_module("seg_opr.metric").compute_score, curve)
        stack.enter_context(patched([
            (network, "Network", lambda *args, **kwargs: mean_teacher_network(
                official_network, copy.deepcopy(networks["student"]), copy.deepcopy(networks["teacher"]),
                normalised=True)),
            (official_network, "to", lenient_to(nn.Module.to)), (iterator, "next", iterator.__next__),
            (collections, "Iterable", collections.abc.Iterable),
            (importlib.import_module("utils.init_func"), "init_weight", lambda *args, **kwargs: None),
            (sys.modules["engine.evaluator"], "load_model", load), (sys.modules["seg_opr.metric"], "compute_score", score),
            (torch.utils.data.dataloader, "default_collate", torch.utils.data.dataloader.default_collate),
            (ForkingPickler, "_extra_reducers", dict(ForkingPickler._extra_reducers))]))
        seed_everything(seed)
        importlib.import_module("train")
        stack.enter_context(patched([(sys, "argv", ["eval.py", "-e", f"{evaluated_from}-", "-d", "0"]),
                                     (torch.cuda, "device_count", lambda: 1)]))
        runpy.run_path(str(Path(network.__file__).with_name("eval.py")), run_name="__main__")
    values = [curve[epoch] for epoch in sorted(curve)]
    return {"curve": values, "best": max(values), "last": values[-1], "epochs": sorted(curve)}


def official_mt_cps_run(folder: Path, config: RunConfig, lists: dict[str, Path], save_path: Path) -> dict[str, Any]:
    """:func:`run_official_mt_cps` on the export ``lists`` with ``config``'s settings (:func:`mt_cps_cfg`, epochs of
    ``N_u / B`` iterations), initial networks and seed, the epochs the official evaluates
    (:func:`official.study.mt_cps_evaluated_from`) evaluated."""
    epochs = official_epochs("mt_cps", config)
    cfg = mt_cps_cfg(config, lists, epochs, save_path)
    return run_official_mt_cps(folder, cfg, initial_networks(config), mt_cps_evaluated_from(epochs), config.seed)
