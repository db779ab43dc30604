"""What the two sides of ``--framework np_u2pl`` draw over a whole run, without training, compared as distributions
(``benchmarks/official_draws.py``): the lockstep (:mod:`official.lockstep`) injects one side's batches and draws into
the other, so it cannot see whether the two sides draw them from the same distributions.

The official side: the NP-SemiSeg authors' ``U2PL/train_semi.py``'s loaders built as its ``main`` builds them
(``get_loader(cfg, seed)`` of the checkout, after its ``set_random_seed``; the run's config, :func:`official.u2pl.u2pl_cfg`)
and iterated as its ``train`` iterates them (``set_epoch``, then labeled and unlabeled batches in turn), every epoch of
the run; its CutMix coin (``np.random.uniform(0, 1) < 0.5``, ``train_semi.py``) and boxes (``generate_cutout_mask``
of the checkout) drawn once per semi-supervised iteration from numpy's RNG seeded as ``main`` seeds it. The project's
side: its ``u2pl`` cell with the NP head (:func:`official.study.project_config`), its data streams built as a run
builds them (``npsemiseg.training.setup``) over the same epochs, its CutMix coin and boxes
(``npsemiseg.data.mixing.u2pl_cutmix``) from torch's RNG seeded as its training RNG.

Per item: the image id, the size after the random rescale, the flip, the crop offsets, the padded fraction, the
label's class fractions and ignored fraction. Per batch: the labeled and unlabeled ids, the CutMix coin and the pasted
boxes' area fractions. Compared (:func:`compare`): each quantity's mean and sd per side and a two-sample test (KS for
continuous ones, chi-square for counts); the ids: how often each image is seen per epoch, batches holding one image
twice, whether the unlabeled order and the labeled-unlabeled pairing repeat from one epoch to the next.

    python benchmarks/official_draws.py --official-root ROOT --data-seed 0 --seed 0 --out DIR   # DIR/draws.json
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import random
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from scipy import stats
from torch import Tensor

from npsemiseg.config import RunConfig, with_overrides
from npsemiseg.constants import IGNORE_INDEX
from npsemiseg.data import mixing
from npsemiseg.data import transforms as project_transforms
from npsemiseg.training import data_order
from npsemiseg.training.factories import build_datasets, train_transforms
from npsemiseg.training.plan import plan_run
from npsemiseg.training.setup import seed_training_rngs

from official.patching import one_rank_setup, patched
from official.report import provenance
from official.study import export_official_layout, official_epochs, project_config, project_run, study_of
from official.u2pl import u2pl_cfg
from official.voc_semi import voc_semi_process
from official_side_by_side import NP_U2PL_CONFIG, checkout

STREAMS = ("labeled", "unlabeled")
#: per-item quantities compared with a KS test (continuous or many-valued)
ITEM_KS = ("size", "top", "left", "padded", "ignored")
#: the item's class fractions are ``class_<k>``; flips and coins are compared as counts (chi-square)


class Items:
    """The items one side's loaders deliver, in order: each a dict (``id``, ``stream``, the transforms' draws and
    the label's statistics), the current one open while its transforms run."""

    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []
        self.current: dict[str, Any] = {}

    def open(self, item_id: str, stream: str) -> None:
        self.current = {"id": item_id, "stream": stream, "flip": False}
        self.items.append(self.current)

    def close(self, label: Tensor, num_classes: int) -> None:
        """The label the item's transforms delivered: its class fractions and its ignored fraction."""
        label = label.reshape(-1).long()
        counts = torch.bincount(label[label != IGNORE_INDEX], minlength=num_classes).double() / label.numel()
        self.current.update({f"class_{k}": float(c) for k, c in enumerate(counts[:num_classes])},
                            ignored=float((label == IGNORE_INDEX).double().mean()))


def crop_record(items: Items, height: int, width: int, top: int, left: int, crop: int) -> None:
    """The crop's input size (after the rescale), its offsets and the fraction of the crop that is padding."""
    items.current.update(size=height, top=top, left=left,
                         padded=1.0 - min(height, crop) * min(width, crop) / (crop * crop))


class DrawTap:
    """``random`` as a module sees it, each value drawn kept (the official ``Crop``'s offsets)."""

    def __init__(self) -> None:
        self.draws: list[Any] = []

    def __getattr__(self, name: str) -> Callable[..., Any]:
        function = getattr(random, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            value = function(*args, **kwargs)
            self.draws.append(value)
            return value
        return call


def official_item_patches(module: Any, dataset_class: Any, items: Items, crop: int, num_classes: int,
                          stream_of: Callable[[Any], str]) -> list[tuple[Any, str, Any]]:
    """Patches of the checkout's ``augmentation`` ``module`` and ``voc_dset`` recording every item: its id, the
    flip (the image changed by ``RandomHorizontalFlip``), the crop (``Crop``'s input size and its ``randint``
    offsets, drawn through a :class:`DrawTap`), the label's statistics."""
    getitem, flip, crop_call = dataset_class.__getitem__, module.RandomHorizontalFlip.__call__, module.Crop.__call__

    def recorded_getitem(dataset: Any, index: int) -> Any:
        items.open(Path(dataset.list_sample_new[index][0]).stem, stream_of(dataset))
        image, label = getitem(dataset, index)
        items.close(label, num_classes)
        return image, label

    def recorded_flip(transform: Any, image: Tensor, label: Tensor) -> Any:
        out = flip(transform, image, label)
        items.current["flip"] = not torch.equal(out[0], image)
        return out

    def recorded_crop(transform: Any, image: Tensor, label: Tensor) -> Any:
        tap, (height, width) = DrawTap(), image.shape[-2:]
        with patched([(module, "random", tap)]):
            out = crop_call(transform, image, label)
        top, left = tap.draws if tap.draws else (0, 0)
        crop_record(items, height, width, top, left, crop)
        return out

    return [(dataset_class, "__getitem__", recorded_getitem), (module.RandomHorizontalFlip, "__call__", recorded_flip),
            (module.Crop, "__call__", recorded_crop)]


@contextlib.contextmanager
def authors_loaders(folder: Path, config: RunConfig, lists: dict[str, Path], save_path: Path,
                    patches: Callable[[Any], list[tuple[Any, str, Any]]] = lambda modules: []) -> Iterator[Any]:
    """The authors' labeled and unlabeled loaders as ``main`` builds them (``set_random_seed``, then ``get_loader``),
    in their process; ``patches(modules)`` (given U2PL's ``augmentation`` and ``pascal_voc`` modules) are installed
    first. Yields ``(loaders, epochs, modules)``; iterate the epochs with :func:`authors_epochs`."""
    folder = folder / "U2PL"
    epochs = official_epochs("np_u2pl", config)
    cfg = u2pl_cfg(config, folder, lists, epochs, save_path, config_file=NP_U2PL_CONFIG)
    save_path.mkdir(parents=True, exist_ok=True)
    with voc_semi_process(folder, ["train_semi.py"], "tensorboardX", save_path) as stack:
        modules = {name: importlib.import_module(f"u2pl.dataset.{name}") for name in ("augmentation", "pascal_voc")}
        stack.enter_context(patched(patches(modules)))
        one_rank_setup()
        importlib.import_module("u2pl.utils.utils").set_random_seed(config.seed)
        loaders = importlib.import_module("u2pl.dataset.builder").get_loader(cfg, seed=config.seed)[:2]
        yield loaders, epochs, modules


def authors_epochs(loaders: tuple[Any, Any], epochs: int) -> Iterator[int]:
    """Each epoch of the run, after ``set_epoch`` on both samplers as ``train`` calls it."""
    for epoch in range(epochs):
        for loader in loaders:
            loader.sampler.set_epoch(epoch)
        yield epoch


def official_batches(folder: Path, config: RunConfig, lists: dict[str, Path], save_path: Path) -> dict[str, Any]:
    """The authors' loaders over the run's epochs (module docstring): the items and, per semi-supervised iteration,
    the CutMix coin and the boxes' area fractions."""
    items, crop, streams, mixes = Items(), config.schedule.crop_size, {}, []

    def patches(modules: dict[str, Any]) -> list[tuple[Any, str, Any]]:
        return official_item_patches(modules["augmentation"], modules["pascal_voc"].voc_dset, items, crop,
                                     config.num_classes, lambda dataset: streams[id(dataset)])

    with authors_loaders(folder, config, lists, save_path, patches) as (loaders, epochs, modules):
        streams.update({id(loader.dataset): stream for stream, loader in zip(STREAMS, loaders)})
        for epoch in authors_epochs(loaders, epochs):
            for _ in zip(*loaders):
                if epoch >= config.framework_options["sup_only_epochs"]:
                    mixes.append(official_mix(modules["augmentation"], config.schedule.batch_size, crop))
    return {"items": items.items, "mixes": mixes, "iterations_per_epoch": len(loaders[0])}


def official_mix(augmentation: Any, batch: int, crop: int) -> dict[str, Any]:
    """``train_semi.py``'s CutMix draws of one iteration: its coin and, when it mixes, each image's box
    (``generate_cutout_mask``: 0 inside) as a fraction of the image."""
    mixed = bool(np.random.uniform(0, 1) < 0.5)
    areas = [float((augmentation.generate_cutout_mask([crop, crop]) == 0).double().mean()) for _ in range(batch)] \
        if mixed else []
    return {"mixed": mixed, "areas": areas}


def official_order(folder: Path, config: RunConfig, lists: dict[str, Path], save_path: Path) -> dict[str, list[list[str]]]:
    """The ids the authors' loaders deliver per stream (``labeled``, ``unlabeled``) and epoch, in order: their
    samplers' indices (``set_epoch`` as ``train`` calls it, the last partial batch dropped) into their datasets' lists,
    built as ``main`` builds them; no item is loaded."""
    order: dict[str, list[list[str]]] = {stream: [] for stream in STREAMS}
    with authors_loaders(folder, config, lists, save_path) as (loaders, epochs, _):
        for _ in authors_epochs(loaders, epochs):
            for stream, loader in zip(STREAMS, loaders):
                indices = list(loader.sampler)[:len(loader) * loader.batch_size]
                order[stream].append([Path(loader.dataset.list_sample_new[i][0]).stem for i in indices])
    return order


def in_official_order(order: dict[str, list[list[str]]], datasets: dict[str, Any]) -> list[tuple[Any, str, Any]]:
    """A patch of the project's ``epoch_order`` and ``shared_epoch_order`` (``data.order``: ``passes`` or shared, switch
    ``official_data_order``): each stream's epoch in the authors' ``order`` (:func:`official_order`,
    ids mapped to the project's dataset positions); the augmentation stays the project's. ValueError where the
    project asks for an epoch of another length."""
    positions = {stream: {f"{d.stream}_{index:06d}": k for k, index in enumerate(d.indices)}
                 for stream, d in datasets.items()}

    def epoch_order(num_items: int, length: int, *, seed: int, stream: str, epoch: int) -> list[int]:
        ids = order[stream][epoch]
        if len(ids) != length:
            raise ValueError(f"{stream} epoch {epoch}: the project asks for {length} items, the authors' loader "
                             f"delivers {len(ids)}")
        return [positions[stream][item] for item in ids]

    def shared_epoch_order(lists: dict[str, list[int]], stream: str, length: int, *, epoch: int) -> list[int]:
        return epoch_order(len(lists[stream]), length, seed=0, stream=stream, epoch=epoch)

    return [(data_order, "epoch_order", epoch_order), (data_order, "shared_epoch_order", shared_epoch_order)]


def project_item_patches(items: Items, datasets: dict[str, Any], crop: int,
                         num_classes: int) -> list[tuple[Any, str, Any]]:
    """Patches of the project's ``SeededItems`` and transforms recording every item (as
    :func:`official_item_patches`): the rescale's size and the crop's offsets from their ``make_params``, the flip
    from ``RandomHorizontalFlip``'s transform (called only when it flips)."""
    getitem = data_order.SeededItems.__getitem__
    names = {id(dataset): stream for stream, dataset in datasets.items()}
    crop_params, flip = project_transforms.PadCrop.make_params, project_transforms.v2.RandomHorizontalFlip.transform

    def recorded_getitem(seeded: Any, key: tuple[int, int]) -> Any:
        dataset = seeded.dataset
        items.open(f"{dataset.stream}_{dataset.indices[key[0]]:06d}", names[id(dataset)])
        out = getitem(seeded, key)
        items.close(out["label"], num_classes)
        return out

    def recorded_crop(transform: Any, flat_inputs: list[Any]) -> dict[str, Any]:
        params = crop_params(transform, flat_inputs)
        height, width = project_transforms.query_size(flat_inputs)
        crop_record(items, height, width, params["top"], params["left"], crop)
        return params

    def recorded_flip(transform: Any, inpt: Any, params: dict[str, Any]) -> Any:
        items.current["flip"] = True
        return flip(transform, inpt, params)

    return [(data_order.SeededItems, "__getitem__", recorded_getitem),
            (project_transforms.PadCrop, "make_params", recorded_crop),
            (project_transforms.v2.RandomHorizontalFlip, "transform", recorded_flip)]


def project_batches(config: RunConfig, order: dict[str, list[list[str]]] | None = None) -> dict[str, Any]:
    """The project's data streams over the run's epochs (built as ``npsemiseg.training.setup`` builds them, in this
    process): the items and, per semi-supervised iteration, the CutMix coin and the boxes' area fractions
    (``u2pl_cutmix`` on the global RNG, seeded as the run's training RNG). ``order``: the epochs in the authors'
    order (:func:`in_official_order`)."""
    config = with_overrides(config, {"data.num_workers": 0})
    datasets, items, crop = build_datasets(config), Items(), config.schedule.crop_size
    plan = plan_run(config, num_labeled=len(datasets["labeled"]), num_unlabeled=len(datasets["unlabeled"]),
                    world_size=1)
    streams = data_order.Streams(config, datasets, train_transforms(config), plan, use_unlabeled=True, rank=0,
                                 world_size=1, pin_memory=False)
    batch, mixes = config.schedule.unlabeled_batch_size, []
    seed_training_rngs(config.seed, 0)
    streamed = {s: datasets[s] for s in STREAMS}
    ordered = in_official_order(order, streamed) if order is not None else []
    with patched([*project_item_patches(items, streamed, crop, config.num_classes), *ordered]):
        for epoch in range(plan.total_epochs):
            for _ in streams.epoch(epoch, 0):
                if epoch >= config.framework_options["sup_only_epochs"]:
                    mixes.append(project_mix(batch, crop, config.framework_options["cutmix_prob"]))
    return {"items": items.items, "mixes": mixes, "iterations_per_epoch": plan.iters_per_epoch}


def project_mix(batch: int, crop: int, probability: float) -> dict[str, Any]:
    """The project's CutMix draws of one iteration (``u2pl_cutmix`` on a batch of zeros): whether it mixed, and
    each image's pasted area as a fraction of the image."""
    mask = mixing.u2pl_cutmix(torch.zeros(batch, 1, crop, crop), torch.zeros(batch, crop, crop, dtype=torch.long),
                              p=probability).mask
    mixed = bool(mask.any())
    return {"mixed": mixed, "areas": mask.flatten(1).double().mean(1).tolist() if mixed else []}


def quantity(items: list[dict[str, Any]], stream: str, name: str) -> np.ndarray:
    """One per-item quantity of ``stream``'s items."""
    return np.array([float(item[name]) for item in items if item["stream"] == stream])


def summary(official: np.ndarray, project: np.ndarray, test: str) -> dict[str, float]:
    """Both sides' mean and sd of a quantity and the p-value of ``test``: ``ks`` (two-sample Kolmogorov-Smirnov) or
    ``chi2`` (the 2 x 2 table of a yes/no quantity's counts)."""
    if test == "ks":
        p = float(stats.ks_2samp(official, project).pvalue)
    else:
        table = [[official.sum(), len(official) - official.sum()], [project.sum(), len(project) - project.sum()]]
        p = float(stats.chi2_contingency(table).pvalue)
    return {"official_mean": float(official.mean()), "official_sd": float(official.std(ddof=1)),
            "project_mean": float(project.mean()), "project_sd": float(project.std(ddof=1)), "test": test, "p": p}


def item_summaries(official: list[dict[str, Any]], project: list[dict[str, Any]],
                   num_classes: int) -> dict[str, dict[str, Any]]:
    """:func:`summary` of every per-item quantity per stream; the label's only for the labeled stream (the
    unlabeled labels enter no loss, and the project's side hides them)."""
    label = [f"class_{k}" for k in range(num_classes)] + ["ignored"]
    out: dict[str, dict[str, Any]] = {}
    for stream in STREAMS:
        names = [*ITEM_KS, *(label if stream == "labeled" else [])]
        out[stream] = {name: summary(quantity(official, stream, name), quantity(project, stream, name),
                                     "ks" if name in ITEM_KS or name.startswith("class_") else "chi2")
                       for name in names if name != "ignored" or stream == "labeled"}
        out[stream]["flip"] = summary(quantity(official, stream, "flip"), quantity(project, stream, "flip"), "chi2")
    return out


def batches_of(items: list[dict[str, Any]], stream: str, batch: int) -> list[list[str]]:
    """``stream``'s ids in batches of ``batch``, in the order the loop took them."""
    ids = [item["id"] for item in items if item["stream"] == stream]
    return [ids[i:i + batch] for i in range(0, len(ids) - batch + 1, batch)]


def id_statistics(items: list[dict[str, Any]], batch: int, per_epoch: int) -> dict[str, Any]:
    """The samplers' structure: per stream how often each image is seen per epoch (the least and the most over
    images and epochs, and the number of distinct images), the fraction of batches holding an image twice, the
    rank correlation of the images' positions in consecutive epochs (0: a new order; 1: the same); and how often an
    unlabeled image meets the same labeled image (the same batch position) as in the epoch before."""
    out: dict[str, Any] = {}
    epochs: dict[str, list[list[str]]] = {}
    for stream in STREAMS:
        batches = batches_of(items, stream, batch)
        epochs[stream] = [sum(batches[e:e + per_epoch], []) for e in range(0, len(batches), per_epoch)]
        counts = [Counter(epoch) for epoch in epochs[stream]]
        correlations = [stats.spearmanr(*positions(a, b)).statistic
                        for a, b in zip(epochs[stream], epochs[stream][1:]) if len(set(a)) == len(a)]
        out[stream] = {"images": len(set().union(*counts)), "seen_min": min(min(c.values()) for c in counts),
                       "seen_max": max(max(c.values()) for c in counts),
                       "batches_with_a_repeat": float(np.mean([len(set(b)) < len(b) for b in batches])),
                       "order_correlation": float(np.mean(correlations)) if correlations else None}
    pairs = [dict(zip(unlabeled, labeled)) for labeled, unlabeled in zip(epochs["labeled"], epochs["unlabeled"])]
    out["same_partner_as_epoch_before"] = float(np.mean([
        np.mean([after[image] == before[image] for image in after]) for before, after in zip(pairs, pairs[1:])]))
    return out


def positions(first: list[str], second: list[str]) -> tuple[list[int], list[int]]:
    """Each id's position in ``first`` and in ``second`` (ids present once in each)."""
    where = {item: k for k, item in enumerate(second)}
    return list(range(len(first))), [where[item] for item in first]


def mix_summaries(official: list[dict[str, Any]], project: list[dict[str, Any]]) -> dict[str, Any]:
    """The CutMix coin (chi-square) and the pasted boxes' area fractions (KS) of both sides."""
    areas = [np.array([a for mix in mixes for a in mix["areas"]]) for mixes in (official, project)]
    coins = [np.array([mix["mixed"] for mix in mixes], dtype=float) for mixes in (official, project)]
    return {"mixed": summary(*coins, "chi2"), "box_area": summary(*areas, "ks")}


def compare(official: dict[str, Any], project: dict[str, Any], config: RunConfig) -> dict[str, Any]:
    """Both sides' draws compared (module docstring)."""
    batch = config.schedule.batch_size
    return {"iterations_per_epoch": {"official": official["iterations_per_epoch"],
                                     "project": project["iterations_per_epoch"]},
            "items": item_summaries(official["items"], project["items"], config.num_classes),
            "mix": mix_summaries(official["mixes"], project["mixes"]),
            "ids": {side: id_statistics(draws["items"], batch, draws["iterations_per_epoch"])
                    for side, draws in (("official", official), ("project", project))}}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--official-root", type=Path, required=True, help="folder of <owner>+<repo> checkouts")
    parser.add_argument("--data-seed", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=None, help="iterations (default: the mini study's)")
    parser.add_argument("--set", dest="settings", action="append", default=[], metavar="KEY=VALUE",
                        help="a setting of both sides (VALUE read as YAML), e.g. data.options.train_size=64")
    parser.add_argument("--in-official-order", action="store_true",
                        help="the project's epochs in the authors' order (what --project-run trains on)")
    parser.add_argument("--project-run", action="store_true",
                        help="train the project's side in the authors' order instead: --out/official_runs.json")
    parser.add_argument("--out", type=Path, required=True)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Draw both sides' run of ``np_u2pl`` (module docstring), write ``--out/draws.json`` and print the tests whose
    p-value is under 0.01 and the samplers' structure; ``--project-run``: :func:`ordered_project_run`."""

    args = parse_args(argv)
    torch.set_num_threads(1)
    overrides = {key: yaml.safe_load(value) for key, value in (s.split("=", 1) for s in args.settings)}
    config = project_config("np_u2pl", args.data_seed, args.seed, args.steps, overrides)
    lists = export_official_layout(study_of(config), args.out / "data_u2pl", layout="u2pl")
    folder = checkout(args.official_root, "Jianf-Wang/NP-SemiSeg")
    order = official_order(folder, config, lists, args.out / "official") \
        if args.in_official_order or args.project_run else None
    if args.project_run:
        return ordered_project_run(config, order, args, sys.argv[1:] if argv is None else argv)
    official = official_batches(folder, config, lists, args.out / "official")
    project = project_batches(config, order)
    report = {"data_seed": args.data_seed, "seed": args.seed, "steps": config.schedule.max_steps,
              "settings": args.settings, "project_in_official_order": order is not None,
              **compare(official, project, config)}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "draws.json").write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps({"differ (p < 0.01)": differing(report), "ids": report["ids"]}, indent=1))
    return report


def ordered_project_run(config: RunConfig, order: dict[str, list[list[str]]], args: argparse.Namespace,
                        argv: list[str]) -> dict[str, Any]:
    """The project's side of ``np_u2pl`` (:func:`official.study.project_run`) trained on its epochs in the authors'
    ``order`` (:func:`in_official_order`), written as ``--out/official_runs.json`` with the project's side only (what
    ``benchmarks/official_runs.py --combine`` joins to the official sides; ``data_order`` says whose order)."""
    datasets = build_datasets(config)
    with patched(in_official_order(order, {stream: datasets[stream] for stream in STREAMS})):
        result = project_run(config)
    row = {"seed": config.seed, "official_miou": None, "official_last_miou": None, "official_curve": None,
           "official_seconds": None, "project_miou": result["best"], "project_last_miou": result["last"],
           "project_curve": result["curve"], "project_seconds": round(result["seconds"], 1)}
    report = {"framework": "np_u2pl", "data_seed": args.data_seed, "regime": {}, "data_order": "the authors'",
              "runs": [row], "supervised": [], **provenance("official_draws.py", argv), "seconds": row["project_seconds"]}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "official_runs.json").write_text(json.dumps(report, indent=1) + "\n")
    print(f"np_u2pl seed {config.seed}: project in the authors' order {result['best']:.2f} "
          f"(last {result['last']:.2f}, {result['seconds']:.0f} s)", flush=True)
    return report


def differing(report: dict[str, Any], alpha: float = 0.01) -> dict[str, dict[str, float]]:
    """The quantities whose test rejects at ``alpha``: ``stream/name`` -> their summary."""
    found = {f"{stream}/{name}": s for stream, table in report["items"].items() for name, s in table.items()
             if s["p"] < alpha}
    return {**found, **{f"mix/{name}": s for name, s in report["mix"].items() if s["p"] < alpha}}
