"""PS-MT's ``VocCode/main.py`` (yyliu01/PS-MT): its patches (:data:`PSMT_PATCHES`), config (:func:`psmt_cfg`,
:func:`psmt_args`), the project's networks behind its ``EntireModel`` (:func:`psmt_entire_model`) and its run
(:func:`run_official_psmt`)."""

from __future__ import annotations

import argparse
import copy
import importlib
import json
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from npsemiseg.config import RunConfig
from npsemiseg.data.study import partition_counts

from official.networks import initial_networks
from official.patching import CPU_PATCHES, DiscardingWriter, official_process, patched, recorded, seed_everything
from official.psmt_network import PARTS, entire_model
from official.study import LAYOUT_FOLDER, PARTITION, official_epochs, study_of
from official_side_by_side import stand_ins

#: PS-MT's VOC config (``main.py`` reads it as the dict the Trainer takes)
PSMT_CONFIG = "VocCode/configs/config_deeplab_v3+.json"
#: the classes PS-MT's ``semi_ce_loss`` pads its one-hot to (VOC's)
PSMT_LOSS_CLASSES = 21
#: every change made to PS-MT's ``VocCode/main.py`` ``main(-1, 1, config, args)`` run (no DDP: the script's own
#: one-process path, ``args.ddp`` False, ``DataParallel`` without devices), the only ones; the settings that are not
#: patches but the cell's are :func:`psmt_cfg`'s and :func:`psmt_args`'
PSMT_PATCHES = (
    *CPU_PATCHES,
    ("model_deep (EntireModel, as main imported it)",
     "an EntireModel whose encoder1/2/_s and decoder1/2/_s hold the project's PS-MT networks of the cell (student, "
     "teacher 1, teacher 2), split as the PS-MT golden recorder splits them (benchmarks/official/psmt_network.py "
     "Encoder, Upsample, which the recorder imports: backbone + decoder, classifier head upsampled with "
     "align_corners=True); its forward, "
     "warm_up_forward, T-VAT decoder and losses the official ones, its ConsistencyWeight main's",
     "the study's small network with the project's initial weights of the seed (the student's pretrained backbone, "
     "the teachers' own initialisation and scratch backbones as the released cell's); the official encoder is a "
     "ResNet-50 of fixed widths"),
    ("EntireModel.unsuper_loss (semi_ce_loss)", "semi_ce_loss on the logits padded to 21 classes with a logit "
     "1e4 below the least (softmax 0)", "semi_ce_loss pads its one-hot to VOC's 21 classes (losses.py 72-76) and "
     "multiplies it with the student's K; padded, its softmaxes, argmax, weights and positive loss are those of the K "
     "classes; its negative loss (which the padding changes) enters only with semi_n_th > 0, and the scripts set 0"),
    ("VOCDataset.__init__", "the same, then num_classes the study's K", "VOCDataset hard-codes VOC's 21 (voc.py 31), "
     "which the Trainer takes for its assist mask and its mIoU (the mean over 21 classes, 16 of them absent)"),
    ("Trainer.assist_mask_calculate", "the same with topk min(topk, num_classes)",
     "_train_epoch asks the assist teacher's top 7 of VOC's 21 classes; of the study's K < 7 classes torch.topk "
     "raises, and the top 7 hold them all (what the project's assist_combine does)"),
    ("Trainer.update_teachers", "the same with keep_rate the cell's ema_keep_rate",
     "_train_epoch calls it with its default 0.996; the mini study's time rule scales it to the short run (0.9)"),
    ("numpy.int", "int", "removed in NumPy 1.24; cut_mix's rand_bbox_1 casts with it"),
    ("Utils.tensor_board.Tensorboard (as main imported it)", "a board that discards",
     "wandb logging only; wandb and seaborn are not installed: empty stand-ins for the module's imports, never "
     "called"),
    ("Trainer._valid_epoch", "the same function, its Mean_IoU also recorded (x 100)",
     "the per-epoch curve; nothing changed"),
)


def psmt_warm_up_epochs(config: RunConfig) -> int:
    """PS-MT's ``--warm_up`` (``config['model']['warm_up_epoch']``) for the cell's warm-up: its warm-up epochs are
    passes over the labeled loader (``len(supervised_loader)``, ``ceil(n_l / B)`` iterations, for each of the three
    networks), the cell's of ``N_u / B`` iterations; as many of them as make the cell's iterations. ValueError where
    they do not divide."""
    data = study_of(config)
    labeled = partition_counts(data.train_size)[PARTITION]
    batch, warm_up = config.schedule.batch_size, config.framework_options["warmup_epochs"]
    iterations, labeled_epoch = warm_up * ((data.train_size - labeled) // batch), -(-labeled // batch)
    if iterations % labeled_epoch:
        raise ValueError(f"psmt: the cell's {warm_up} warm-up epochs ({iterations} iterations) are not a whole number "
                         f"of PS-MT's labeled epochs of {labeled_epoch} iterations")
    return iterations // labeled_epoch


def psmt_cfg(config: RunConfig, folder: Path, data_root: Path, save_path: Path) -> dict[str, Any]:
    """PS-MT's config as ``main.py`` hands it to ``main``: its ``configs/config_deeplab_v3+.json`` from the checkout
    (the ramp-up type, the unsupervised loss, SGD, the Poly schedule, ``gamma`` 0.5, per-epoch validation of the
    whole image) with what ``main.py``'s arguments set (the batch of both loaders, ``warm_up``, the labeled count,
    the LR, the unsupervised weight, the epochs) and the cell's values: crop, base size (600 / 500 of the image, as
    on VOC), momentum, weight decay, ramp-up epochs, the data (``data_dir`` the export, whose ``VOCdevkit/VOC2012``
    holds it) and checkpoints under ``save_path``; data loaded in the process (``num_workers`` 0, as the cell).
    ValueError where the cell's labeled and unlabeled batches differ (``main.py`` sets both from ``--batch_size``)."""
    schedule, options = config.schedule, config.framework_options
    if schedule.batch_size != schedule.unlabeled_batch_size:
        raise ValueError(f"psmt: main.py gives both loaders --batch_size; the cell has schedule.batch_size "
                         f"{schedule.batch_size} and schedule.unlabeled_batch_size {schedule.unlabeled_batch_size}")
    cfg = json.loads((folder / PSMT_CONFIG).read_text())
    data = study_of(config)
    cfg.update(experim_name="psmt", n_labeled_examples=partition_counts(data.train_size)[PARTITION],
               ramp_up=options["rampup_epochs"], unsupervised_w=options["unsup_weight"], n_gpu=1)
    cfg["model"].update(warm_up_epoch=psmt_warm_up_epochs(config), resnet=50)
    cfg["optimizer"]["args"].update(lr=config.optim.lr, momentum=config.optim.momentum,
                                    weight_decay=config.optim.weight_decay)
    for loader in ("train_supervised", "train_unsupervised"):
        cfg[loader].update(data_dir=str(data_root), batch_size=schedule.batch_size, crop_size=schedule.crop_size,
                           base_size=config.data.augmentation["base_size"], num_workers=0)
    cfg["val_loader"].update(data_dir=str(data_root), num_workers=0)
    cfg["trainer"].update(epochs=official_epochs("psmt", config), save_dir=str(save_path))
    return cfg


def psmt_args(config: RunConfig, cfg: dict[str, Any]) -> argparse.Namespace:
    """``main.py``'s arguments as its ``__main__`` leaves them for one process (``--gpus 1``: ``ddp`` False) and its
    scripts set them (``semi_n_th`` 0: no negative learning; ``semi_p_th`` the cell's confidence threshold)."""
    options = config.framework_options
    return argparse.Namespace(nodes=1, batch_size=config.schedule.batch_size, epochs=cfg["trainer"]["epochs"],
                              warm_up=cfg["model"]["warm_up_epoch"], labeled_examples=cfg["n_labeled_examples"],
                              learning_rate=config.optim.lr, gpus=1, gcloud=False, local_rank=-1,
                              architecture="deeplabv3+", backbone=50, ddp=False, dgx=False,
                              semi_p_th=options["confidence_threshold"], semi_n_th=0.0,
                              unsup_weight=options["unsup_weight"], world_size=1)


def psmt_entire_model(networks: dict[str, nn.Module], crop: list[int], entire_model_class: type,
                      encoder_decoder: types.ModuleType, semi_ce_loss: Callable[..., Any]) -> Callable[..., nn.Module]:
    """PS-MT's ``EntireModel(num_classes, config, sup_loss, cons_w_unsup, ignore_index, ...)`` (as ``main`` calls
    it) holding copies of ``networks`` (``student``, ``teacher1``, ``teacher2``, trainable as the official ones are
    built), split as the golden recorder splits them (:func:`official.psmt_network.entire_model`): each an
    ``Encoder`` (backbone + decoder: ``business_layer`` the decoder, what ``BaseTrainer`` groups with the backbone)
    and an official ``DecoderNetwork`` (``VATDecoderNetwork`` for the student) whose ``upsample`` is an ``Upsample``
    of the classifier head (``business_layer``); the official ``forward``, losses (``unsuper_loss``
    :func:`padded_classes` of ``semi_ce_loss``) and ``cons_w_unsup``."""

    def build(num_classes: int, config: dict[str, Any], sup_loss: Callable[..., Any] | None = None,
              cons_w_unsup: Any = None, ignore_index: int | None = None, **_: Any) -> nn.Module:
        copies = {name: copy.deepcopy(network).requires_grad_(True) for name, network in networks.items()}
        model = entire_model(entire_model_class, encoder_decoder, copies, crop)
        for suffix, _, _ in PARTS:
            encoder, head = getattr(model, f"encoder{suffix}"), getattr(model, f"decoder{suffix}")
            encoder.business_layer, head.business_layer = [encoder.decoder], [head.upsample.head]
        model.mode = "semi" if config["semi"] else "sup"
        model.sup_loss, model.ignore_index, model.unsup_loss_w = sup_loss, ignore_index, cons_w_unsup
        model.unsuper_loss = padded_classes(semi_ce_loss, PSMT_LOSS_CLASSES)
        return model
    return build


def padded_classes(loss: Callable[..., Any], classes: int) -> Callable[..., Any]:
    """``loss(inputs=..., targets=..., **kw)`` on logits ``[B, K, H, W]`` padded to ``classes`` channels, each padded
    logit 1e4 below the tensor's least (its softmax exactly 0: softmaxes, argmax and cross-entropy of the K classes
    unchanged)."""
    def call(inputs: Tensor, targets: Tensor, **kwargs: Any) -> Any:
        def pad(logits: Tensor) -> Tensor:
            shape = (logits.shape[0], classes - logits.shape[1], *logits.shape[2:])
            return torch.cat([logits, logits.new_full(shape, float(logits.detach().min()) - 1e4)], dim=1)
        return loss(inputs=pad(inputs), targets=pad(targets), **kwargs)
    return call


def with_classes(init: Callable[..., None], classes: int) -> Callable[..., None]:
    """A dataset's ``__init__`` that sets ``num_classes`` to ``classes`` after ``init``."""
    def call(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self.num_classes = classes
    return call


def capped_topk(assist: Callable[..., Tensor]) -> Callable[..., Tensor]:
    """PS-MT's ``Trainer.assist_mask_calculate`` with ``topk`` at most the trainer's ``num_classes``."""
    def call(self: Any, core_predict: Tensor, assist_predict: Tensor, topk: int = 1) -> Tensor:
        return assist(self, core_predict, assist_predict, topk=min(topk, self.num_classes))
    return call


def with_keep_rate(update: Callable[..., None], keep_rate: float) -> Callable[..., None]:
    """PS-MT's ``Trainer.update_teachers`` with ``keep_rate`` (its call site leaves the default 0.996)."""
    def call(self: Any, teacher_encoder: nn.Module, teacher_decoder: nn.Module, **_: Any) -> None:
        update(self, teacher_encoder, teacher_decoder, keep_rate=keep_rate)
    return call


def run_official_psmt(folder: Path, config: RunConfig, data_root: Path, save_path: Path) -> dict[str, Any]:
    """``main(-1, 1, config, args)`` of PS-MT's ``VocCode/main.py`` (what its ``__main__`` calls with one GPU: no
    DDP) with :func:`psmt_cfg`, :func:`psmt_args` and :data:`PSMT_PATCHES`, in the export's ``VOCdevkit/VOC2012``
    (``data_root``'s; its lists are read from there): its warm-up, then its semi-supervised epochs, each evaluated;
    its per-epoch mIoU x 100 (``curve``), the best and the last. ``main`` seeds ``random`` and torch with 42 itself
    (numpy, which CutMix draws from, is seeded here with the seed)."""
    networks = initial_networks(config)
    cfg = psmt_cfg(config, folder, data_root, save_path)
    args, curve = psmt_args(config, cfg), []
    with official_process(folder / "VocCode", ["main.py"], "wandb", data_root / LAYOUT_FOLDER["psmt"]) as stack:
        stack.enter_context(stand_ins({"seaborn": ()}))
        module = importlib.import_module("main")
        trainer, voc = sys.modules["train"].Trainer, sys.modules["DataLoader.voc"].VOCDataset
        build = psmt_entire_model(networks, [config.schedule.crop_size] * 2, module.model_deep,
                                  sys.modules["Model.Deeplabv3_plus.encoder_decoder"],
                                  sys.modules["Utils.losses"].semi_ce_loss)
        stack.enter_context(patched([
            (module, "model_deep", build), (module, "Tensorboard", DiscardingWriter), (np, "int", int),
            (voc, "__init__", with_classes(voc.__init__, config.num_classes)),
            (trainer, "assist_mask_calculate", capped_topk(trainer.assist_mask_calculate)),
            (trainer, "update_teachers", with_keep_rate(trainer.update_teachers,
                                                        config.framework_options["ema_keep_rate"])),
            (trainer, "_valid_epoch", recorded(trainer._valid_epoch, curve, scale=100.0))]))
        seed_everything(config.seed)
        module.main(-1, 1, cfg, args)
    return {"curve": curve, "best": max(curve), "last": curve[-1]}
