"""AugSeg's ``train_semi.py`` (ZhenZHAO/AugSeg): its patches (:data:`AUGSEG_PATCHES`), config (:func:`augseg_cfg`)
and run (:func:`run_official_augseg`, :func:`official_augseg_run`); the NP-SemiSeg authors' AugSeg (Jianf-Wang/NP-SemiSeg's
``AugSeg/train_semi.py``: AugSeg's with the NP head) run the same way (:data:`NP_AUGSEG_PATCHES`,
:func:`official_np_augseg_run`)."""

from __future__ import annotations

import argparse
import copy
import importlib
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from torch import nn

from npsemiseg.config import RunConfig

from official.networks import AugSegInterface, initial_network
from official.np_network import NP_PATCHES, AugSegAuthorsModel, NPInterface, authors_model, np_script_patches
from official.patching import CPU_PATCHES, one_rank_setup, patched, recorded, seed_everything, written_config
from official.study import official_epochs
from official.voc_semi import ITERABLE_PATCH, voc_semi_cfg, voc_semi_process

#: AugSeg's VOC 1/16 configuration (662 labeled images)
AUGSEG_CONFIG = "exps/zrun_vocs/r50_voc_semi662/config_semi.yaml"
#: the NP-SemiSeg authors' AugSeg VOC configuration (732 labeled images: their only VOC one)
NP_AUGSEG_CONFIG = "exps/zrun_vocs/r50_voc_semi732/config_semi.yaml"
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
    ITERABLE_PATCH,
    ("numpy.uint8 as augseg.dataset.augs_TIBA calls it", "NumPy 1's cast of a Python number: wrapped modulo 256",
     "NumPy 2 raises on the hue operation's negative shift, np.uint8(hue_factor * 255), which AugSeg's NumPy 1 "
     "wrapped, as its comment says ('uint8 addition take cares of rotation across boundaries')"),
    ("validate (as main calls it)", "the same function, its result also recorded (x 100)",
     "the per-epoch curve; nothing changed"),
)


#: the NP-SemiSeg authors' AugSeg (``AugSeg/train_semi.py``): AugSeg's, but for the network and its NP memories
NP_AUGSEG_PATCHES = (
    *(patch for patch in AUGSEG_PATCHES if not patch[0].startswith("ModelBuilder")),
    ("ModelBuilder (as train_semi imported it: the student and the teacher)",
     "NPInterface: the project's AugSeg network of the cell (encoder, decoder) with the authors' NP_HEAD (imported "
     "from the checkout) holding the project's NP head weights, as the authors' ModelBuilder.forward calls them "
     "(AugSegAuthorsModel: encoder and decoder on the targets and on the context, the NP head, the T logits upsampled "
     "to the image); outputs (logits [T, B, K, H, W], None, and in training the latent statistics and memories)",
     "the study's small network with the project's initial weights of the seed, pretrained backbone included, the NP "
     "head's mapped as the NP golden recorders map it (official.np_network.HEAD_MAP)"),
    *NP_PATCHES,
)


def augseg_cfg(config: RunConfig, folder: Path, lists: dict[str, Path], epochs: int,
               save_path: Path, config_file: str = AUGSEG_CONFIG) -> dict[str, Any]:
    """AugSeg's config for ``train_semi.py``: its VOC 1/16 ``exps/zrun_vocs/r50_voc_semi662/config_semi.yaml`` from
    the checkout (the resize range, flip, its strong views' settings, adaptive CutMix, no supervised-only epoch, poly
    power, the criterion) with the cell's settings (:func:`voc_semi_cfg`), its batch, the resize's base size (the
    cell's ``base_size``, the study's image size, as VOC's 500), the confidence threshold and the unsupervised
    weight; the teacher alone evaluated (``evaluate_student: False``, as the project's side: what both report).
    ``config_file``: another config of ``folder`` (the NP-SemiSeg authors' ``r50_voc_semi732``, the same keys)."""
    cfg = voc_semi_cfg(config, folder / config_file, lists, epochs, save_path)
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


def run_official_augseg(folder: Path, cfg: dict[str, Any], network: Callable[[], nn.Module], save_path: Path,
                        seed: int, np_latent: int | None = None) -> dict[str, Any]:
    """``main(args)`` of ``train_semi.py`` in ``folder`` (AugSeg's, or the NP-SemiSeg authors' ``AugSeg`` folder) with
    ``cfg`` (:func:`augseg_cfg`), ``--seed`` ``seed`` (``main`` seeds ``random``, numpy and torch with it) and
    :data:`AUGSEG_PATCHES`: the student and the teacher ``network()`` (each call a new network with the initial
    weights, built while the checkout is importable); ``np_latent``: the NP-SemiSeg authors' script, its memories of
    that latent width (:func:`official.np_network.np_script_patches`); its per-epoch teacher mIoU x 100
    (``curve``), the best (what it reports, ``Best-EMA``) and the last."""
    args = argparse.Namespace(config=str(written_config(cfg, save_path)), local_rank=0, seed=seed, port=None)
    curve: list[float] = []
    with voc_semi_process(folder, ["train_semi.py"], "torch.utils.tensorboard", save_path) as stack:
        module = importlib.import_module("train_semi")
        stack.enter_context(patched([(module, "setup_distributed", one_rank_setup),
                                     (sys.modules["augseg.dataset.augs_TIBA"], "np", numpy1_uint8()),
                                     (module, "ModelBuilder", lambda net_cfg: network()),
                                     (module, "validate", recorded(module.validate, curve, scale=100.0)),
                                     *([] if np_latent is None else np_script_patches(module, module.train, np_latent))]))
        seed_everything(seed)
        module.main(args)
    return {"curve": curve, "best": max(curve), "last": curve[-1]}


def official_augseg_run(folder: Path, config: RunConfig, lists: dict[str, Path], save_path: Path) -> dict[str, Any]:
    """:func:`run_official_augseg` on the export ``lists`` with ``config``'s settings (:func:`augseg_cfg`, epochs of
    ``N_u / B`` iterations) and initial network."""
    cfg = augseg_cfg(config, folder, lists, official_epochs("augseg", config), save_path)
    student = initial_network(config)
    return run_official_augseg(folder, cfg, lambda: AugSegInterface(copy.deepcopy(student)), save_path, config.seed)


def official_np_augseg_run(folder: Path, config: RunConfig, lists: dict[str, Path],
                           save_path: Path) -> dict[str, Any]:
    """The NP-SemiSeg authors' ``AugSeg/train_semi.py`` of the checkout ``folder`` as :func:`official_augseg_run` (its
    config ``exps/zrun_vocs/r50_voc_semi732``) with :data:`NP_AUGSEG_PATCHES`: the student and the teacher
    :class:`NPInterface` of copies of the project's NP network of ``config`` (its initial weights of the seed), the
    authors' ``NP_HEAD`` at the cell's sizes holding the project's head weights; memories of the cell's latent width."""
    folder = folder / "AugSeg"
    cfg = augseg_cfg(config, folder, lists, official_epochs("np_augseg", config), save_path,
                     config_file=NP_AUGSEG_CONFIG)
    student = initial_network(config)

    def network() -> nn.Module:
        return NPInterface(authors_model(AugSegAuthorsModel, importlib.import_module("augseg.models.np_head"),
                                         copy.deepcopy(student), config))

    return run_official_augseg(folder, cfg, network, save_path, config.seed,
                               np_latent=config.head.options["latent_dim"])
