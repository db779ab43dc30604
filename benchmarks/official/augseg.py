"""AugSeg's ``train_semi.py`` (zhenzhao/AugSeg): its patches (:data:`AUGSEG_PATCHES`), config (:func:`augseg_cfg`)
and run (:func:`run_official_augseg`, :func:`official_augseg_run`)."""

from __future__ import annotations

import argparse
import copy
import importlib
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
from torch import nn

from npsemiseg.config import RunConfig

from official.networks import AugSegInterface, initial_network
from official.patching import CPU_PATCHES, one_rank_setup, patched, recorded, seed_everything, written_config
from official.study import official_epochs
from official.voc_semi import voc_semi_cfg, voc_semi_process

#: AugSeg's VOC 1/16 configuration (662 labeled images)
AUGSEG_CONFIG = "exps/zrun_vocs/r50_voc_semi662/config_semi.yaml"
#: every change made to AugSeg's ``train_semi.py`` run, the only ones
AUGSEG_PATCHES = (
    ("augseg.utils.dist_helper.setup_distributed (as train_semi imported it)",
     "a one-rank gloo process group, rank 0, world size 1",
     "no GPU, no launcher: the script's collectives (DDP, barrier, samplers, all_reduce) run in one CPU process"),
    *CPU_PATCHES,
    ("ModelBuilder (as train_semi imported it: the student and the teacher)",
     "AugSegInterface: the project's AugSeg network of the cell, outputs (logits at image size, None)",
     "the study's small network with the project's initial weights of the seed, pretrained backbone included (AugSeg's "
     "decoder hard-codes 256 channels); the teacher built the same way, as AugSeg builds both pretrained"),
    ("torch.utils.tensorboard", "a SummaryWriter that discards", "tensorboard is not installed; logging only"),
    ("skimage, skimage.measure (where not installed)", "stand-ins whose functions raise",
     "augseg.utils.utils imports them at its top; the run never calls them"),
    ("the DataLoader iterator's next()", "its __next__", "train calls the name torch's iterator no longer has"),
    ("numpy.uint8 as augseg.dataset.augs_TIBA calls it", "NumPy 1's cast of a Python number: wrapped modulo 256",
     "NumPy 2 raises on the hue operation's negative shift, np.uint8(hue_factor * 255), which AugSeg's NumPy 1 "
     "wrapped, as its comment says ('uint8 addition take cares of rotation across boundaries')"),
    ("validate (as main calls it)", "the same function, its result also recorded (x 100)",
     "the per-epoch curve; nothing changed"),
)


def augseg_cfg(config: RunConfig, folder: Path, lists: dict[str, Path], epochs: int,
               save_path: Path) -> dict[str, Any]:
    """AugSeg's config for ``train_semi.py``: its VOC 1/16 ``exps/zrun_vocs/r50_voc_semi662/config_semi.yaml`` from
    the checkout (the resize range, flip, its strong views' settings, adaptive CutMix, no supervised-only epoch, poly
    power, the criterion) with the cell's settings (:func:`voc_semi_cfg`), its batch, the resize's base size (the
    cell's ``base_size``, the study's image size, as VOC's 500), the confidence threshold and the unsupervised
    weight; the teacher alone evaluated (``evaluate_student: False``, as the project's side: what both report)."""
    cfg = voc_semi_cfg(config, folder / AUGSEG_CONFIG, lists, epochs, save_path)
    cfg["dataset"]["train"].update(batch_size=config.schedule.batch_size,
                                   resize_base_size=config.data.augmentation["base_size"])
    options = config.framework_options
    cfg["trainer"]["evaluate_student"] = False
    cfg["trainer"]["unsupervised"].update(threshold=options["confidence_threshold"], loss_weight=options["unsup_weight"])
    cfg["saver"]["use_tb"] = False
    return cfg


class Numpy1Uint8(np.uint8):
    """``np.uint8(x)`` as NumPy 1 computes it for a Python number out of range: wrapped modulo 256 (a C cast of its
    integer part), where NumPy 2 raises; anything else as ``np.uint8``."""

    def __new__(cls, value: Any = 0) -> np.uint8:
        if isinstance(value, int | float):
            value = int(value) % 256
        return np.uint8(value)


def numpy1_uint8() -> types.ModuleType:
    """numpy with :class:`Numpy1Uint8` as ``uint8`` (what AugSeg's ``augs_TIBA`` gets as ``np``)."""
    compat = types.ModuleType("numpy")
    compat.__dict__.update(np.__dict__)
    compat.uint8 = Numpy1Uint8  # type: ignore[attr-defined]
    return compat


def run_official_augseg(folder: Path, cfg: dict[str, Any], student: nn.Module, save_path: Path,
                        seed: int) -> dict[str, Any]:
    """``main(args)`` of AugSeg's ``train_semi.py`` with ``cfg`` (:func:`augseg_cfg`), ``--seed`` ``seed`` (``main``
    seeds ``random``, numpy and torch with it) and :data:`AUGSEG_PATCHES`: the student and the teacher
    :class:`AugSegInterface` of copies of ``student``; its per-epoch teacher mIoU x 100 (``curve``), the best (what it
    reports, ``Best-EMA``) and the last."""
    args = argparse.Namespace(config=str(written_config(cfg, save_path)), local_rank=0, seed=seed, port=None)
    curve: list[float] = []
    with voc_semi_process(folder, ["train_semi.py"], "torch.utils.tensorboard", save_path) as stack:
        module = importlib.import_module("train_semi")
        stack.enter_context(patched([(module, "setup_distributed", one_rank_setup),
                                     (sys.modules["augseg.dataset.augs_TIBA"], "np", numpy1_uint8()),
                                     (module, "ModelBuilder", lambda net_cfg: AugSegInterface(copy.deepcopy(student))),
                                     (module, "validate", recorded(module.validate, curve, scale=100.0))]))
        seed_everything(seed)
        module.main(args)
    return {"curve": curve, "best": max(curve), "last": curve[-1]}


def official_augseg_run(folder: Path, config: RunConfig, lists: dict[str, Path], save_path: Path) -> dict[str, Any]:
    """:func:`run_official_augseg` on the export ``lists`` with ``config``'s settings (:func:`augseg_cfg`, epochs of
    ``N_u / B`` iterations) and initial network."""
    cfg = augseg_cfg(config, folder, lists, official_epochs("augseg", config), save_path)
    return run_official_augseg(folder, cfg, initial_network(config), save_path, config.seed)
