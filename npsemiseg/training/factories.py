"""What a run is built from: the segmentor, the dataset splits, the training transforms, the framework
(wired to a model factory, the class count and the loss settings) and the SGD optimiser."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from npsemiseg.config import RunConfig
from npsemiseg.data import build_dataset
from npsemiseg.data.transforms import train_transform
from npsemiseg.frameworks import Framework, LossSettings, get_framework
from npsemiseg.models import build_segmentor, compile_segmentor, set_activation_checkpointing
from npsemiseg.pretrain import resolve_weights
from npsemiseg.training.plan import batch_scaling


def build_model(config: RunConfig) -> nn.Module:
    """One fresh segmentor (backbone + DeepLabv3+ + head) as ``config.model``/``config.head`` say; with
    ``model.freeze_backbone`` its backbone's parameters take no gradient (UniMatch V2's ``lock_backbone``); its
    networks compiled in place as ``runtime.compile`` says (``npsemiseg.models.compile``), its encoder checkpointed
    as ``runtime.activation_checkpointing`` says (``npsemiseg.models.checkpointing``)."""
    model = config.model
    segmentor = build_segmentor(
        num_classes=config.num_classes,
        head=config.head.name,
        head_options=dict(config.head.options),
        variant=model.decoder,
        backbone=model.backbone,
        weights=resolve_weights(model.weights),  # pretrained:<name> -> the cached file
        deep_stem=model.deep_stem,
        aux_head=model.aux_head,
        representation_head=bool(model.representation_head),
        mc_dropout_scope=model.mc_dropout_scope,
        align_corners=model.align_corners,
        **dict(model.options),
    )
    if model.freeze_backbone:
        segmentor.backbone.requires_grad_(False)
    set_activation_checkpointing(segmentor, config.runtime.activation_checkpointing)
    return compile_segmentor(segmentor, config.runtime.compile)


def build_datasets(config: RunConfig) -> dict[str, Dataset]:
    """The ``labeled`` and ``unlabeled`` splits of the run's dataset (the unlabeled one with its labels under
    ``data.unlabeled_truth`` measured / oracle) and, as ``val``, the split it is evaluated on
    (``evaluation.split``: val, or the study dataset's tune split); untransformed."""
    common = dict(root=config.data.root, partition_lists=config.partition_lists, **dict(config.data.options))
    reveal = config.data.unlabeled_truth != "hidden"  # the pseudo-label diagnostics need the unlabeled labels
    return {
        "labeled": build_dataset(config.dataset, "labeled", partition=config.partition, **common),
        "unlabeled": build_dataset(config.dataset, "unlabeled", partition=config.partition, reveal_labels=reveal,
                                   **common),
        "val": build_dataset(config.dataset, config.evaluation.split, **common),
    }


def train_transforms(config: RunConfig) -> dict[str, Any]:
    """The weak (+ strong) training transforms of the labeled and unlabeled streams (the unlabeled one with the
    views its framework asks for: ``Framework.unlabeled_views``)."""
    augmentation = dict(config.data.augmentation)
    crop = config.schedule.crop_size
    labeled = dict(augmentation)
    if not config.data.labeled_strong_view:
        labeled["strong"] = None
    unlabeled = {**augmentation, **get_framework(config.framework).unlabeled_views(config.framework_options)}
    return {"labeled": train_transform(crop, **labeled), "unlabeled": train_transform(crop, **unlabeled)}


def loss_settings(config: RunConfig) -> LossSettings:
    """The supervised-loss settings a framework needs: ``head.sample_ce`` and the ``loss`` section."""
    loss = config.loss
    return LossSettings(sample_ce=config.head.sample_ce, ohem=loss.ohem, ohem_thresh=loss.ohem_thresh,
                        ohem_min_kept=loss.ohem_min_kept, aux_weight=loss.aux_weight)


def build_framework(config: RunConfig, build_model_fn: Callable[[], nn.Module] | None = None) -> Framework:
    """The framework of ``config`` with its validated options, a model factory (by default
    :func:`build_model` of ``config``, one fresh segmentor per call), the class count, loss settings and the
    run's optimizer for another model (:func:`build_optimizer` at the base LR of one process)."""
    cls = get_framework(config.framework)
    options = cls.Options.model_validate(config.framework_options)
    factory = build_model_fn if build_model_fn is not None else (lambda: build_model(config))
    return cls(options, factory, num_classes=config.num_classes, loss=loss_settings(config),
               build_optimizer=lambda module: build_optimizer(config, module).torch_optimizer,
               unlabeled_truth=config.data.unlabeled_truth)


#: modules whose parameters PS-MT's ``group_weight`` exempts from weight decay (with every bias)
NORM_LAYERS = (nn.modules.batchnorm._NormBase, nn.GroupNorm, nn.LayerNorm)


@dataclass
class Optimizer:
    """``optim.name`` (SGD or AdamW) over the student's parameter groups: the backbone at ``lr``, the rest at
    ``lr x head_lr_mult`` (``optim.parameter_groups=backbone_head``), or every parameter at ``lr`` (``single_lr``)."""

    torch_optimizer: torch.optim.Optimizer
    parameters: list[nn.Parameter]
    multipliers: list[float]
    #: the backbone's base learning rate (``optim.lr``, scaled by ``optim.lr_scaling``; poly-decayed per step)
    base_lr: float


def single_lr_groups(module: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """PS-MT's groups (helpers.py ``group_weight``): every parameter at one LR, weight decay on the weights of
    convolutions and linear layers only (none on biases and normalisation layers); trainable parameters only."""
    decay, no_decay = [], []
    for layer in module.modules():
        for name, parameter in layer.named_parameters(recurse=False):
            if not parameter.requires_grad:
                continue
            exempt = name == "bias" or isinstance(layer, NORM_LAYERS)
            (no_decay if exempt else decay).append(parameter)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def build_optimizer(config: RunConfig, student: nn.Module, *, world_size: int = 1) -> Optimizer:
    """``optim.name`` at the base learning rate of :func:`~npsemiseg.training.plan.batch_scaling` on ``world_size``
    processes, over the groups ``optim.parameter_groups`` names (switch ``psmt_single_lr``)."""
    optim = config.optim
    base_lr = batch_scaling(config, world_size).lr
    if optim.parameter_groups == "single_lr":
        groups = single_lr_groups(student, optim.weight_decay)
        multipliers = [1.0] * len(groups)
    else:
        groups = student.parameter_groups()
        multipliers = [1.0 if g.get("name") == "backbone" else optim.head_lr_mult for g in groups]
    torch_groups = [{**{k: v for k, v in g.items() if k != "name"}, "lr": base_lr * m} for g, m in zip(groups, multipliers)]
    if optim.name == "adamw":
        torch_optimizer: torch.optim.Optimizer = torch.optim.AdamW(torch_groups, lr=base_lr, weight_decay=optim.weight_decay)
    else:
        torch_optimizer = torch.optim.SGD(torch_groups, lr=base_lr, momentum=optim.momentum,
                                          weight_decay=optim.weight_decay, nesterov=optim.nesterov)
    return Optimizer(torch_optimizer, [p for g in groups for p in g["params"]], multipliers, base_lr)
