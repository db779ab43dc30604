"""A checkpoint of the NP-SemiSeg authors' U2PL run (``--framework np_u2pl``'s official side: ``ckpt_best.pth``,
``ckpt.pth``) evaluated both ways (``benchmarks/official_np_evaluation.py``): by the authors' ``validate`` of their
``U2PL/train_semi.py`` (imported from the checkout, on their validation loader of the export, the memories' zero
centers, the argmax of the mean of T = 5 logits) and through the project's evaluation path as the project's side
evaluates its own model (``npsemiseg.training.artifacts.evaluate_model``: the project's segmentor holding the same
weights, T = 5, the argmax of the mean of the softmaxes, on the project's validation images). Equal numbers say the
evaluation is not where the two sides' whole runs part.

    python benchmarks/official_np_evaluation.py --official-root ROOT --seed S --checkpoint CKPT [--key teacher_state]
"""

from __future__ import annotations

import argparse
import copy
import importlib
import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from npsemiseg.config import RunConfig
from npsemiseg.training.artifacts import evaluate_model
from npsemiseg.training.factories import build_datasets

from official.lockstep import as_ours, project_names
from official.networks import initial_network
from official.np_network import AuthorsModel, NPInterface, authors_model
from official.patching import one_rank_setup
from official.study import export_official_layout, official_epochs, project_config, study_of
from official.u2pl import u2pl_cfg
from official.voc_semi import voc_semi_process
from official_side_by_side import NP_U2PL_CONFIG, checkout, official_imports


def authors_network(module: Any, student: nn.Module, config: RunConfig,
                    state: dict[str, torch.Tensor] | None = None) -> NPInterface:
    """The official side's network (:class:`NPInterface` around a copy of ``student``, the project's network of
    ``config``, with the authors' ``NP_HEAD`` of ``module``), holding ``state`` (a checkpoint's ``teacher_state`` or
    ``model_state``, DDP's ``module.`` prefix dropped) where given; in eval mode."""
    network = NPInterface(authors_model(AuthorsModel, module, copy.deepcopy(student), config))
    if state is not None:
        network.load_state_dict({key.removeprefix("module."): value for key, value in state.items()})
    return network.eval()


def project_segmentor(network: NPInterface, config: RunConfig) -> nn.Module:
    """The project's segmentor of ``config`` holding ``network``'s weights: its parameters by their project names
    (:func:`official.lockstep.project_names`, the NP decoder's input reordered), its BN buffers; in eval mode."""
    segmentor, authors = initial_network(config), network.authors
    names = project_names(authors)
    state = {names[id(p)][0]: as_ours(authors, p, names[id(p)][1]) for p in authors.parameters()}
    state.update({name: b.detach().clone() for name, b in authors.segmentor.named_buffers()})
    with torch.no_grad():
        for kind in (dict(segmentor.named_parameters()), dict(segmentor.named_buffers())):
            for name, value in kind.items():
                if name in state:
                    value.copy_(state[name])
    return segmentor.eval()


def authors_validation(folder: Path, config: RunConfig, lists: dict[str, Path], save_path: Path,
                       state: dict[str, torch.Tensor] | None) -> float:
    """mIoU x 100 of the authors' ``validate`` (``train_semi.py``, the config of the run, :func:`official.u2pl.u2pl_cfg`)
    of :func:`authors_network` holding ``state``, on their validation loader, with the zero centers ``main`` hands it
    (deviation N2)."""
    folder = folder / "U2PL"
    cfg = u2pl_cfg(config, folder, lists, official_epochs("np_u2pl", config), save_path, config_file=NP_U2PL_CONFIG)
    save_path.mkdir(parents=True, exist_ok=True)
    student = initial_network(config)  # built before the official process replaces DDP
    with voc_semi_process(folder, ["train_semi.py"], "tensorboardX", save_path):
        script = importlib.import_module("train_semi")
        network = authors_network(importlib.import_module("u2pl.models.np_head"), student, config, state)
        one_rank_setup()
        script.cfg = cfg  # validate reads main's global config
        val_loader = importlib.import_module("u2pl.dataset.builder").get_loader(cfg, seed=config.seed)[2]
        centers = torch.zeros(config.num_classes, config.head.options["latent_dim"])
        return 100.0 * float(script.validate(network, centers, centers, val_loader, 0, logging.getLogger("global")))


def project_validation(folder: Path, config: RunConfig, state: dict[str, torch.Tensor] | None,
                       step: int) -> float:
    """mIoU x 100 of the project's evaluation path (``evaluate_model`` as the project's side calls it, the RNG seeded
    by ``step``) of :func:`project_segmentor` holding ``state`` (the authors' ``NP_HEAD`` of the checkout ``folder``
    mapped back)."""
    student = initial_network(config)
    with official_imports(folder / "U2PL"):
        network = authors_network(importlib.import_module("u2pl.models.np_head"), student, config, state)
    segmentor = project_segmentor(network, config)
    metrics = evaluate_model(segmentor, build_datasets(config)["val"], config, step=step, device=torch.device("cpu"))
    return 100.0 * metrics["miou"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--official-root", type=Path, required=True, help="folder of <owner>+<repo> checkouts")
    parser.add_argument("--data-seed", type=int, default=0)
    parser.add_argument("--seed", type=int, required=True, help="the run's seed (its initial network, its config)")
    parser.add_argument("--checkpoint", type=Path, required=True, help="the official run's ckpt_best.pth or ckpt.pth")
    parser.add_argument("--key", default="teacher_state", choices=("teacher_state", "model_state"))
    parser.add_argument("--out", type=Path, required=True)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Evaluate ``--checkpoint``'s ``--key`` both ways, write ``--out/np_evaluation.json`` and print it."""
    args = parse_args(argv)
    torch.set_num_threads(1)
    if not args.checkpoint.is_file():
        raise SystemExit(f"--checkpoint: no file {args.checkpoint}")
    # U2PL's checkpoint: state dicts, the epoch and the best mIoU as a NumPy float64 scalar
    with torch.serialization.safe_globals([np._core.multiarray.scalar, np.dtype, np.dtypes.Float64DType]):
        saved = torch.load(args.checkpoint, map_location="cpu", weights_only=True)
    config = project_config("np_u2pl", args.data_seed, args.seed)
    lists = export_official_layout(study_of(config), args.out / "data_u2pl", layout="u2pl")
    folder = checkout(args.official_root, "Jianf-Wang/NP-SemiSeg")
    report = {"checkpoint": str(args.checkpoint), "key": args.key, "epoch": saved["epoch"], "seed": args.seed,
              "authors_validate": authors_validation(folder, config, lists, args.out / "official", saved[args.key]),
              "project_evaluation": project_validation(folder, config, saved[args.key], config.schedule.max_steps)}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "np_evaluation.json").write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report))
    return report
