"""What U2PL's and AugSeg's ``train_semi.py`` (and the NP-SemiSeg authors' versions of both) share: their VOC config
with the cell's settings (:func:`voc_semi_cfg`), their process (:func:`voc_semi_process`) and the ``collections``
alias their transforms need (:func:`iterable_alias`)."""

from __future__ import annotations

import collections
import collections.abc
import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import yaml

from npsemiseg.config import RunConfig

from official.patching import official_process, patched
from official.study import unlabeled_pool
from official_side_by_side import U2PL_UNUSED_MODULES, stand_ins

#: U2PL's ``voc_dset`` draws ``10582 - n_sup`` items of each training list (VOC's train_aug has 10582 images)
U2PL_VOC_TRAIN_SIZE = 10582
#: U2PL's and the NP-SemiSeg authors' transforms' ``isinstance(..., collections.Iterable)``
ITERABLE_PATCH = ("collections.Iterable", "collections.abc.Iterable", "gone from collections since Python 3.10; the "
                  "transforms' isinstance checks")


def iterable_alias() -> contextlib.AbstractContextManager[None]:
    """:data:`ITERABLE_PATCH`: ``collections.Iterable`` while the script runs."""
    return patched([(collections, "Iterable", collections.abc.Iterable)])


def voc_semi_cfg(config: RunConfig, official: Path, lists: dict[str, Path], epochs: int,
                 save_path: Path) -> dict[str, Any]:
    """The config file ``official`` (U2PL's or AugSeg's VOC ``pascal_semi`` config, from the checkout) with what the
    two share of the cell: its data (the U2PL layout of :func:`export_official_layout`; ``n_sup`` such that both
    training sets are drawn to the unlabeled pool's size, so that an epoch is ``N_u / B`` iterations as on VOC), the
    training crop and the validation's crop where the config has one (U2PL's and the NP-SemiSeg authors' AugSeg's
    center crop of 513 for VOC's 500 px images: the study's images would be padded into a canvas 8 times their
    size), epochs, LR, momentum, weight decay, classes and EMA decay (where the cell has one); data loaded in the process
    (``workers: 0``, as the project's cell); checkpoints under ``save_path``. Both scripts draw their labeled and
    unlabeled batches of one ``batch_size``."""
    schedule = config.schedule
    if schedule.batch_size != schedule.unlabeled_batch_size:
        raise ValueError(f"{config.framework}: the official loaders share one batch_size; the cell has "
                         f"schedule.batch_size {schedule.batch_size} and schedule.unlabeled_batch_size "
                         f"{schedule.unlabeled_batch_size}")
    cfg = yaml.safe_load(official.read_text())
    dataset, root = cfg["dataset"], str(lists["val"].parents[2])
    for split, data_list in (("train", lists["labeled"]), ("val", lists["val"])):
        dataset[split].update(data_root=root, data_list=str(data_list))
    dataset["train"]["crop"]["size"] = [schedule.crop_size, schedule.crop_size]
    if "crop" in dataset["val"]:  # U2PL's and the NP-SemiSeg authors' AugSeg's: 513 x 513 for VOC's 500 px images
        dataset["val"]["crop"]["size"] = [schedule.crop_size, schedule.crop_size]
    dataset.update(n_sup=U2PL_VOC_TRAIN_SIZE - unlabeled_pool(config), workers=0)
    cfg["trainer"]["epochs"] = epochs
    cfg["trainer"]["optimizer"]["kwargs"].update(lr=config.optim.lr, momentum=config.optim.momentum,
                                                 weight_decay=config.optim.weight_decay)
    cfg["net"]["num_classes"] = config.num_classes
    if "ema_decay" in config.framework_options:  # supervised (U2PL's train_sup.py) has none
        cfg["net"]["ema_decay"] = config.framework_options["ema_decay"]
    cfg["saver"]["snapshot_dir"] = str(save_path / "checkpoints")
    return cfg


@contextlib.contextmanager
def voc_semi_process(folder: Path, argv: list[str], writer: str, save_path: Path) -> Iterator[contextlib.ExitStack]:
    """:func:`official_process` for U2PL's and AugSeg's ``train_semi.py`` (whose helpers import ``skimage``, whose
    ``train`` calls the DataLoader iterator's ``next()`` and whose transforms (U2PL's, the NP-SemiSeg authors' AugSeg's)
    ``collections.Iterable``: :func:`iterable_alias`), the root logger's handlers left as they were (AugSeg's
    logging adds a file handler to it)."""
    iterator = torch.utils.data.dataloader._BaseDataLoaderIter
    handlers = list(logging.root.handlers)
    with official_process(folder, argv, writer, save_path) as stack:
        stack.callback(lambda: [logging.root.removeHandler(h) for h in list(logging.root.handlers) if h not in handlers])
        stack.enter_context(stand_ins(U2PL_UNUSED_MODULES))
        stack.enter_context(iterable_alias())
        stack.enter_context(patched([(iterator, "next", iterator.__next__)]))
        yield stack
