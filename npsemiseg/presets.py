"""The presets a cell's configuration is composed from: ``paper`` and ``smoke``.

A preset gives two steps of :func:`npsemiseg.config.compose` (which lists the whole order):
``values`` (step ``preset``: the cell's dataset's paper settings, ``dataset_info(name).settings``
(``npsemiseg.data.settings.PaperSettings``), before the framework's and the head's own) and ``scale`` (step
``scale``, after the protocol's switches: the crop, batches, learning rate and epochs of the cell, and for
``smoke`` everything else that makes a run take seconds).

``paper``, VOC's settings (``pascal_classic``, ``pascal_blender``, their synthetic stand-ins, ``synthetic``,
the study datasets): crop 480, 3 labeled + 3 unlabeled images per process (x 4 GPUs = the paper's batch
of 12), lr 1e-3 with the head at 10x, momentum 0.9, weight decay 1e-4, 80 epochs; evaluation on a
513 px center crop (U2PL's), and under shift on every corruption (``evaluation.corruptions``); a teacher's student is
evaluated too at every evaluation (``evaluation.also_student``).
Cityscapes' settings: crop 580, 2 + 2 per process (x 4 = 8), lr 5e-3, head at
1x, weight decay 5e-4, 200 epochs (AugSeg 240), OHEM (0.7, at least 100,000 pixels) plus 0.4 x the
auxiliary layer-3 head's loss, sliding-window evaluation at 769 px. These are the NP-SemiSeg authors'
released U2PL and AugSeg configurations (``npsemiseg/presets_audit.md`` gives each value's file and line;
``docs/frameworks.md`` the configurations);
MT and PS-MT run in the same shared trainer for comparability. ResNet-50 with ImageNet weights.

The ``paper`` scale follows ``schedule.head_settings`` (switch ``head_settings``): ``shared`` trains
every head of a framework at the settings above; ``per_head`` trains the baseline head at its framework's
own publication crop, batch, LR and epochs (the paper copied its baseline rows from those publications)
and the MC-dropout and NP heads at the NP configurations' (AugSeg VOC: 8 images in all).

``smoke``: the paper preset shrunk to seconds on one CPU core: the ``resnet_small`` backbone with narrow
decoder widths and random init, 32 px crops of a small synthetic dataset, 2 + 2 images per step, 3 steps,
T = 2 at evaluation on 2 whole images (none corrupted, no student), no supervised-only or warm-up phase (so the few steps run the
semi-supervised path), the frameworks' and heads' ``smoke_options`` (small memories and queues). Its
scale wins over the protocol's switches where they meet (T at evaluation, PS-MT's warm-up and epochs).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from npsemiseg._registry import Registry
from npsemiseg.constants import CORRUPTIONS
from npsemiseg.data import dataset_info
from npsemiseg.data.info import DatasetInfo
from npsemiseg.frameworks import framework_spec
from npsemiseg.heads import head_spec
from npsemiseg.protocol import protocol_overrides

#: one setting a step writes: (dotted key, value, why)
Setting = tuple[str, Any, str]


@dataclass(frozen=True)
class Cell:
    """What a composition starts from: the preset and the cell's coordinates under a protocol.

    ``framework`` is the class the cell runs; ``asked_framework`` the name it was asked for ("" = ``framework``),
    its label, where a protocol switch chose another class (``npsemiseg.protocol.protocol_framework``)."""

    preset: str
    framework: str
    dataset: str
    partition: str
    head: str
    protocol: str = "corrected"
    asked_framework: str = ""

    @property
    def label(self) -> str:
        """The framework's name as asked for: the cell's label (``framework_label`` where none is given)."""
        return self.asked_framework or self.framework

    @property
    def info(self) -> DatasetInfo:
        """The dataset's description (without data options)."""
        return dataset_info(self.dataset)


@dataclass(frozen=True)
class Preset:
    """A preset: ``values(cell)`` (nested values of step ``preset``) and ``scale(cell, view)`` (the settings of
    step ``scale``; ``view`` is the nested values as the user's overrides will leave them)."""

    name: str
    values: Callable[[Cell], dict[str, Any]]
    scale: Callable[[Cell, Mapping[str, Any]], list[Setting]]


#: every preset by name
PRESETS: Registry[Preset] = Registry("preset")


def preset_names() -> tuple[str, ...]:
    """Every preset name."""
    return PRESETS.names()


SMOKE_DATA_OPTIONS: dict[str, Any] = {"train_size": 512, "val_size": 4, "image_size": 32}
#: the keys :func:`head_schedule` sets: the crop and batches, then the LR and epochs of a framework's publication
HEAD_SCHEDULE_KEYS = ("schedule.crop_size", "schedule.batch_size", "schedule.unlabeled_batch_size",
                      "optim.reference_batch", "optim.lr", "schedule.epochs")


def shared_epochs(cell: Cell) -> int:
    """The shared schedule's epochs of the cell's dataset for its framework (the dataset's settings, with the
    framework's own schedule change where it has one)."""
    return framework_spec(cell.framework).shared_epochs(cell.info.settings)


def _protocol_epochs(cell: Cell) -> int:
    """The cell's epochs without a publication's own: a switch's (``psmt_epochs``) where one sets them, else the
    shared schedule's (:func:`shared_epochs`)."""
    values = {"framework": cell.framework, "dataset": cell.dataset, "partition": cell.partition,
              "head": {"name": cell.head}}
    return protocol_overrides(cell.protocol, framework=cell.framework, dataset=cell.dataset, head=cell.head,
                              values=values).get("schedule.epochs", shared_epochs(cell))


def head_schedule(cell: Cell, head_settings: str) -> list[Setting]:
    """The crop, per-process labeled / unlabeled batch, global batch (``optim.reference_batch``), LR and epochs
    of ``cell`` under ``head_settings`` (keys :data:`HEAD_SCHEDULE_KEYS`), each with why.

    ``shared``: every head at the reduced setting the paper trained its MC-dropout and NP rows with (the dataset's
    settings: VOC crop 480, batch 12; Cityscapes 580, 8), the shared LR and the protocol's epochs. ``per_head``:
    a deterministic head (the baseline) at its framework's publication on the dataset
    (``PaperSettings.publication``: crop, batch, LR, epochs) where it has one; the stochastic heads at the NP
    configurations' crop and batch (``PaperSettings.np_config``)."""
    if head_settings not in ("per_head", "shared"):
        raise ValueError(f"schedule.head_settings: expected 'per_head' or 'shared', got {head_settings!r}")
    settings = cell.info.settings
    recipe = settings.recipe
    crop, batch, lr = settings.crop_size, settings.batch, settings.lr
    epochs = _protocol_epochs(cell)
    framework_cls = framework_spec(cell.framework)
    why = f"head_settings shared: every head of {cell.framework} at the NP configs' {recipe} crop and batch"
    epochs_why = "the protocol's epochs" if epochs != settings.epochs else f"the shared {recipe} epochs"
    if head_settings == "per_head" and head_spec(cell.head).stochastic:
        crop, batch = settings.np_config(cell.framework)
        why = f"head_settings per_head: the {cell.head} head at the NP configs' crop and batch for {cell.framework}"
    elif head_settings == "per_head":
        publication = framework_cls.publication_on(settings)
        if publication is not None:
            crop, batch, lr = publication.crop_size, publication.batch, publication.lr or lr
        own = framework_cls.own_epochs(cell.info, cell.info.resolve_partition(cell.partition))
        epochs, epochs_why = (own, f"head_settings per_head: {cell.framework}'s publication epochs") \
            if own is not None else (epochs, epochs_why)
        why = f"head_settings per_head: {cell.framework}'s publication settings ({recipe})"
    processes = settings.processes
    per_process = max(1, batch // processes)
    values = (crop, per_process, per_process, batch, lr, epochs)
    reasons = (why, f"{why}, / {processes} processes", f"{why}, / {processes} processes", why, why, epochs_why)
    return list(zip(HEAD_SCHEDULE_KEYS, values, reasons))


def _paper_values(cell: Cell) -> dict[str, Any]:
    """The paper settings of the cell's dataset (``PaperSettings.values``), ResNet-50 with ImageNet weights."""
    values = cell.info.settings.values()
    values["model"].update(backbone="resnet50", weights="imagenet")
    values["data"] = {"num_workers": 4}
    values["evaluation"]["corruptions"] = list(CORRUPTIONS)  # the evaluation under shift (docs/shift.md)
    # the student beside the teacher at every evaluation (docs/uncertainty.md): best EMA, best student, last epoch
    values["evaluation"]["also_student"] = True
    return values


def _paper_scale(cell: Cell, view: Mapping[str, Any]) -> list[Setting]:
    """The head schedule, then the whole publication of a framework that has one of its own for every head
    (``publication_values(the dataset's settings)``: UniMatch V2's DINOv2 configs), which wins over it."""
    settings = head_schedule(cell, view["schedule"].get("head_settings", "shared"))
    return settings + framework_spec(cell.framework).publication_values(cell.info.settings)


PRESETS.add("paper", Preset("paper", _paper_values, _paper_scale))


def _smoke_values(cell: Cell) -> dict[str, Any]:
    """The paper's values with a tiny random-init model, no data-loader workers and (on generated data) small
    synthetic images; real datasets are read as they are."""
    values = _paper_values(cell)
    values["model"].update(backbone="resnet_small", weights=None, deep_stem=False,
                           options={"aspp_channels": 16, "low_level_channels": 8, "representation_dim": 16})
    values["loss"]["ohem_min_kept"] = 64
    values["evaluation"]["corruptions"] = []  # no evaluation under shift: seconds
    values["evaluation"]["also_student"] = False  # one evaluation per evaluation: seconds
    values["data"] = {"num_workers": 0, "options": dict(SMOKE_DATA_OPTIONS) if cell.info.synthetic else {}}
    return values


def _smoke_scale(cell: Cell, view: Mapping[str, Any]) -> list[Setting]:
    """Seconds on a CPU: one process of 2 + 2 crops of 32 px for 3 steps, T = 2 on 2 whole images, no
    supervised-only or warm-up phase, the framework's and the head's ``smoke_options``."""
    why = "smoke: seconds on one CPU core"
    settings: list[Setting] = [
        ("optim.lr", 0.01, why), ("optim.reference_batch", 2, "smoke: one process of 2 labeled images"),
        ("schedule.epochs", 1, why), ("schedule.max_steps", 3, why), ("schedule.batch_size", 2, why),
        ("schedule.unlabeled_batch_size", 2, why), ("schedule.crop_size", 32, why),
        ("schedule.eval_every_epochs", 0, why), ("schedule.checkpoint_every_steps", 0, why),
        ("evaluation.mode", "whole", why), ("evaluation.num_samples", 2, why), ("evaluation.max_images", 2, why),
        ("evaluation.pavpu_window", 8, why), ("evaluation.figures", False, why),
        ("evaluation.crop_size", None, "smoke: the dataset's convention"),
        ("evaluation.stride", None, "smoke: the dataset's convention"),
    ]
    options = view.get("framework_options", {})
    settings += [(f"framework_options.{phase}", 0, "smoke: a few steps start semi-supervised at once")
                 for phase in ("sup_only_epochs", "warmup_epochs") if phase in options]
    framework, head = framework_spec(cell.framework), head_spec(cell.head)
    settings += [(f"framework_options.{k}", v, f"smoke: {cell.framework}'s smoke_options")
                 for k, v in framework.smoke_options.items()]
    settings += [(f"head.options.{k}", v, f"smoke: the {cell.head} head's smoke_options")
                 for k, v in head.smoke_options.items()]
    return settings


PRESETS.add("smoke", Preset("smoke", _smoke_values, _smoke_scale))
