"""U2PL's ``train_semi.py`` and ``train_sup.py`` (Haochen-Wang409/U2PL): their patches (:data:`U2PL_PATCHES`,
:data:`U2PL_SUP_PATCHES`), configs (:func:`u2pl_cfg`, :func:`u2pl_sup_cfg`) and runs (:func:`run_official_u2pl`,
:func:`official_u2pl_run`, :func:`official_u2pl_sup_run`); the NP-SemiSeg authors' U2PL (Jianf-Wang/NP-SemiSeg's
``U2PL/train_semi.py``: U2PL's with the NP head) run the same way (:data:`NP_U2PL_PATCHES`,
:func:`official_np_u2pl_run`)."""

from __future__ import annotations

import copy
import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from npsemiseg.config import RunConfig

from official.networks import U2PLInterface, initial_network
from official.np_network import NP_PATCHES, AuthorsModel, NPInterface, authors_model, np_script_patches
from official.patching import CPU_PATCHES, one_rank_setup, patched, recorded, seed_everything, written_config
from official.study import official_epochs, study_of, unlabeled_pool
from official.voc_semi import ITERABLE_PATCH, voc_semi_cfg, voc_semi_process
from official_side_by_side import NP_U2PL_CONFIG, U2PL_CONFIG

#: U2PL's supervised-only VOC 1464 configuration (what ``train_sup.py`` runs with)
U2PL_SUP_CONFIG = "experiments/pascal/1464/suponly/config.yaml"
#: ``train_semi.py``'s memory banks, which ``main`` makes (not ``train_sup.py``'s)
BANKS_PATCH = ("train (as main calls it): its memobank and queue_size",
               "memory banks of the representation's width and the cell's queue lengths (background first)",
               "main hard-codes banks 256 wide (the project's representation is narrower) and queues of 50000 / 30000 "
               "(the mini study's are scaled to the short run)")
#: every change made to U2PL's ``train_semi.py`` run, the only ones
U2PL_PATCHES = (
    ("u2pl.utils.dist_helper.setup_distributed (as the script imported it)",
     "a one-rank gloo process group, rank 0, world size 1",
     "no GPU, no launcher: the script's collectives (DDP, samplers, all_reduce, the memory bank's all_gather) run in "
     "one CPU process"),
    *CPU_PATCHES,
    ("ModelBuilder (as the script imported it: train_semi's student and teacher, train_sup's model)",
     "U2PLInterface: the project's U2PL network of the cell, outputs {'pred', 'rep'} at feature resolution",
     "the study's small network with the project's initial weights of the seed, pretrained backbone included (U2PL's "
     "decoder hard-codes 256 channels); the teacher built the same way, as U2PL builds both pretrained"),
    BANKS_PATCH,
    ("tensorboardX", "a module whose SummaryWriter discards", "tensorboardX is not installed; logging only"),
    ("skimage, skimage.measure (where not installed)", "stand-ins whose functions raise",
     "u2pl.utils.utils imports them at its top; the run never calls them"),
    ITERABLE_PATCH,
    ("the DataLoader iterator's next()", "its __next__", "train calls the name torch's iterator no longer has"),
    ("validate (as main calls it)", "the same function, its result also recorded (x 100)",
     "the per-epoch curve; nothing changed"),
)
#: every change made to U2PL's ``train_sup.py`` run, the only ones: ``train_semi.py``'s but the memory banks
U2PL_SUP_PATCHES = tuple(patch for patch in U2PL_PATCHES if patch is not BANKS_PATCH)


#: more patches of a run (``recording(module, train)``: the script's module and its ``train`` as patched so far)
Recording = Callable[[Any, Callable[..., Any]], list[tuple[Any, str, Any]]]
#: the NP-SemiSeg authors' U2PL (``U2PL/train_semi.py``): U2PL's, but for the network and its NP memories
NP_U2PL_PATCHES = (
    *(patch for patch in U2PL_PATCHES if not patch[0].startswith("ModelBuilder")),
    ("ModelBuilder (as train_semi imported it: the student and the teacher)",
     "NPInterface: the project's U2PL network of the cell (encoder, decoder, representation head) with the authors' "
     "NP_HEAD (imported from the checkout) holding the project's NP head weights, as the authors' ModelBuilder.forward "
     "calls them (AuthorsModel: encoder and decoder on the targets and on the context, the NP head, the "
     "representation); outputs {'pred' [T, B, K, h, w], 'rep', and in training the latent statistics and memories}",
     "the study's small network with the project's initial weights of the seed, pretrained backbone included, the NP "
     "head's mapped as the NP golden recorders map it (official.np_network.HEAD_MAP)"),
    *NP_PATCHES,
)


def u2pl_cfg(config: RunConfig, folder: Path, lists: dict[str, Path], epochs: int, save_path: Path,
             config_file: str = U2PL_CONFIG) -> dict[str, Any]:
    """U2PL's config for ``train_semi.py``: its VOC 1464 ``experiments/pascal/1464/ours/config.yaml`` from the checkout
    (what the cell shares with it: the transforms, drop_percent, CutMix, the contrastive loss's thresholds, ranks,
    temperature, queries and negatives, loss weights 1, poly power, the criterion) with the cell's settings
    (:func:`voc_semi_cfg`, the validation's ``center`` crop of the crop size included), its batch and
    ``sup_only_epoch``.
    ``config_file``: another config of ``folder`` (the NP-SemiSeg authors' ``experiments/pascal/1323/np``, the same
    keys)."""
    cfg = voc_semi_cfg(config, folder / config_file, lists, epochs, save_path)
    cfg["dataset"]["batch_size"] = config.schedule.batch_size
    cfg["trainer"]["sup_only_epoch"] = config.framework_options["sup_only_epochs"]
    return cfg


def u2pl_sup_cfg(config: RunConfig, folder: Path, lists: dict[str, Path], epochs: int, save_path: Path) -> dict[str, Any]:
    """U2PL's config for ``train_sup.py``: its VOC 1464 ``experiments/pascal/1464/suponly/config.yaml`` from the
    checkout (the transforms, the criterion, the poly power) with the cell's settings (:func:`voc_semi_cfg`), its batch,
    the validation's ``center`` crop of the crop size, and ``n_sup`` the labeled images (as the config's 1464; its
    ``build_vocloader`` leaves ``voc_dset``'s split at ``val``, which takes the list as it is: an epoch is the labeled
    list once, ``n_l / B`` iterations, each epoch evaluated)."""
    cfg = voc_semi_cfg(config, folder / U2PL_SUP_CONFIG, lists, epochs, save_path)
    cfg["dataset"].update(batch_size=config.schedule.batch_size,
                          n_sup=study_of(config).train_size - unlabeled_pool(config))
    return cfg


def with_banks(train_function: Callable[..., Any], width: int, queue_sizes: list[int]) -> Callable[..., Any]:
    """U2PL's ``train`` given memory banks ``width`` wide (``main`` makes them 256 wide, before any key is queued)
    and ``queue_sizes`` (per class, background first; ``main``'s 50000 / 30000), in place of ``main``'s own lists,
    which ``main`` hands to every epoch: the banks are replaced once, the queue lengths set every call."""
    def train(*args: Any) -> Any:
        memobank, queue_size = args[-3], args[-1]
        if memobank[0][0].shape[1] != width:
            memobank[:] = [[torch.zeros(0, width)] for _ in memobank]
        queue_size[:] = queue_sizes
        return train_function(*args)
    return train


def run_official_u2pl(folder: Path, cfg: dict[str, Any], network: Callable[[], nn.Module], save_path: Path, seed: int,
                      banks: tuple[list[int], int] | None = None, script: str = "train_semi.py",
                      np_latent: int | None = None, recording: Recording | None = None) -> dict[str, Any]:
    """``main()`` of ``script`` in ``folder`` (U2PL's ``train_semi.py``: ``cfg`` :func:`u2pl_cfg`,
    :data:`U2PL_PATCHES`; its ``train_sup.py``: :func:`u2pl_sup_cfg`, :data:`U2PL_SUP_PATCHES`; or the NP-SemiSeg
    authors' ``U2PL/train_semi.py``): its models (train_semi's student and teacher, train_sup's model) ``network()``
    (each call a new network with the initial weights, built while the checkout is importable); ``banks``:
    train_semi's memory banks (queue sizes, width); ``np_latent``: the NP-SemiSeg authors' script, its memories of that
    latent width (:func:`official.np_network.np_script_patches`); ``recording``: more patches, given the script's
    module and its ``train`` as patched so far, applied last (:mod:`official.lockstep`'s recorder); its per-epoch
    mIoU x 100 (``curve``), the best (what it reports) and the last. ``--seed`` is ``seed`` (``main`` seeds
    ``random``, numpy and torch with it, and its datasets draw their items with it)."""
    argv = [script, "--config", str(written_config(cfg, save_path)), "--seed", str(seed)]
    curve: list[float] = []
    with voc_semi_process(folder, argv, "tensorboardX", save_path) as stack:
        module = importlib.import_module(script.removesuffix(".py"))
        train = with_banks(module.train, banks[1], banks[0]) if banks else module.train
        patches = [(module, "setup_distributed", one_rank_setup), (module, "ModelBuilder", lambda net_cfg: network()),
                   (module, "train", train), (module, "validate", recorded(module.validate, curve, scale=100.0)),
                   *([] if np_latent is None else np_script_patches(module, train, np_latent))]
        if recording is not None:
            patches += recording(module, [value for owner, name, value in patches if name == "train"][-1])
        stack.enter_context(patched(patches))
        seed_everything(seed)
        module.main()
    return {"curve": curve, "best": max(curve), "last": curve[-1]}


def official_u2pl_run(folder: Path, config: RunConfig, lists: dict[str, Path], save_path: Path) -> dict[str, Any]:
    """:func:`run_official_u2pl` on the export ``lists`` with ``config``'s settings (:func:`u2pl_cfg`, epochs of
    ``N_u / B`` iterations), initial network, queues (background first) and representation width."""
    cfg = u2pl_cfg(config, folder, lists, official_epochs("u2pl", config), save_path)
    student = initial_network(config)
    return run_official_u2pl(folder, cfg, lambda: U2PLInterface(copy.deepcopy(student)), save_path, config.seed,
                             banks=(queues_of(config), representation_width(config)))


def official_u2pl_sup_run(folder: Path, config: RunConfig, lists: dict[str, Path], save_path: Path) -> dict[str, Any]:
    """:func:`run_official_u2pl` of ``train_sup.py`` on the export ``lists`` with ``config``'s settings
    (:func:`u2pl_sup_cfg`, epochs of ``N_u / B`` iterations) and initial network."""
    cfg = u2pl_sup_cfg(config, folder, lists, official_epochs("supervised_u2pl", config), save_path)
    student = initial_network(config)
    return run_official_u2pl(folder, cfg, lambda: U2PLInterface(copy.deepcopy(student)), save_path, config.seed,
                             script="train_sup.py")


def official_np_u2pl_run(folder: Path, config: RunConfig, lists: dict[str, Path], save_path: Path,
                         network: Callable[[], nn.Module] | None = None,
                         recording: Recording | None = None) -> dict[str, Any]:
    """The NP-SemiSeg authors' ``U2PL/train_semi.py`` of the checkout ``folder`` as :func:`official_u2pl_run` (its
    config ``experiments/pascal/1323/np/config.yaml``) with :data:`NP_U2PL_PATCHES`: the student and the teacher
    :class:`NPInterface` of copies of the project's NP network of ``config`` (its initial weights of the seed), the
    authors' ``NP_HEAD`` at the cell's sizes holding the project's head weights; memories of the cell's latent width.
    ``network``, ``recording``: another network factory and more patches (:mod:`official.lockstep`)."""
    folder = folder / "U2PL"
    cfg = u2pl_cfg(config, folder, lists, official_epochs("np_u2pl", config), save_path, config_file=NP_U2PL_CONFIG)
    student = initial_network(config)

    def authors_network() -> nn.Module:
        return NPInterface(authors_model(AuthorsModel, importlib.import_module("u2pl.models.np_head"),
                                         copy.deepcopy(student), config))

    return run_official_u2pl(folder, cfg, network or authors_network, save_path, config.seed,
                             banks=(queues_of(config), representation_width(config)),
                             np_latent=config.head.options["latent_dim"], recording=recording)


def queues_of(config: RunConfig) -> list[int]:
    """The cell's U2PL queue lengths per class, background first."""
    options = config.framework_options
    return [options["background_queue_size"]] + [options["queue_size"]] * (config.num_classes - 1)


def representation_width(config: RunConfig) -> int:
    """The width of the cell's representation (U2PL's memory bank keys)."""
    return config.model.options.get("representation_dim", 256)
