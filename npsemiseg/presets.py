"""The ``paper`` and ``smoke`` presets of :class:`npsemiseg.config.RunConfig`.

Sources (``../shared/notes``; "NP configs" = the NP-SemiSeg authors' released U2PL/AugSeg
configs, ``np_head_reference.md`` section 3; "conventions" = ``ssl_frameworks.md`` section 2):

VOC family (``pascal_classic``, ``pascal_blender``, their synthetic stand-ins, ``synthetic``):
  crop 480, 3 labeled + 3 unlabeled images per process (x 4 GPUs = 12 + 12; the paper's
  batch 12), lr 1e-3 with the head at 10x, momentum 0.9, weight decay 1e-4, 80 epochs
  (NP configs; conventions); evaluation center crop 513 (U2PL). ``optim.reference_batch`` is that
  global batch (12; Cityscapes 8): ``optim.lr_scaling=linear`` scales the lr to another one.
Cityscapes family: crop 580, 2 + 2 per process (x 4 = 8 + 8), lr 5e-3, head 1x, weight
  decay 5e-4, 200 epochs (240 for AugSeg), OHEM (0.7, min_kept 100000) + 0.4 x auxiliary
  layer-3 head loss, sliding-window evaluation 769 / stride 513 (NP configs; U2PL).
Every framework shares these crops, batches, learning rates and epochs: MT and PS-MT have
  no public NP integration, so they run in the shared trainer for comparability
  (``ssl_frameworks.md`` section 7, quirks 4-5). AugSeg's NP config uses 2 images per GPU
  (8 in all) where the paper says 12: the paper's 12 under ``corrected``, the config's 8 under ``released``.
  PS-MT's 80-550 epoch schedules are switch ``psmt_epochs``.
Head settings (switch ``head_settings``, ``head_schedule``): under ``released`` the baseline head trains at its
  framework's own publication crop and batch (``Framework.publication_settings``), LR (``publication_lr``: PS-MT
  0.01 at 32 on VOC = 2.5e-3 x 4 GPUs, 4.5e-3 on Cityscapes) and epochs (``publication_epochs``: CPS's MeanTeacher
  34 on VOC), as the paper's baseline rows were copied from the frameworks' papers; the MC-dropout and NP heads
  at the NP configs' crop and batch (``np_config_settings``: AugSeg VOC 8 in all, otherwise the shared reduced
  ones above); every head under ``corrected`` at the shared ones.
Model variant per framework (``ssl_frameworks.md`` section 1): U2PL's DeepLabv3+ (output
  stride 8, 512-channel features) for supervised, MT and U2PL; AugSeg's for AugSeg, PS-MT's
  for PS-MT. ImageNet ResNet-50 backbone (torchvision weights; the v1c deep stem is an option).
Heads: each head class's ``paper_options`` and ``paper_grad_clip`` (NP: lambda_kl = 0.005, memory
  length Q = 2560 and gradient clipping at norm 5.0, NP configs, ``np_head_reference.md``
  section 2); T = 5 predictions at evaluation for MC dropout and NP (the paper; the authors'
  Cityscapes script uses 20). The baseline and MC dropout runs are not clipped (the original
  frameworks do not clip).
Framework options (EMA decays, loss weights, ramp-ups, thresholds): each framework's
  ``paper_options(dataset, partition)``, which cites its own sources; its model variant is the
  class's ``model_variant``.

``smoke``: ``resnet_small`` backbone with narrow decoder widths, random init, 32 x 32 crops
of a small synthetic dataset, 2 + 2 images per step, a handful of steps, T = 2, evaluation of
a few whole images; one cell trains in a few seconds on one CPU core. Supervised-only and
warm-up phases (U2PL's ``sup_only_epochs``, PS-MT's ``warmup_epochs``) are set to 0 so the
few smoke steps exercise the semi-supervised path. Heads and frameworks add their own
``smoke_options`` (small NP memories; U2PL's contrastive loss on fewer anchors and keys).

Protocol (``npsemiseg.protocol``): ``paper`` writes every switch of the cell's protocol into its values
(``released`` = the code behind the paper's numbers, ``corrected`` = the paper done right); ``smoke``
keeps them, except its own scale settings (T = 2 at evaluation under both protocols).

Presets are registered in :data:`PRESETS` (name -> function of the cell giving the nested values).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from npsemiseg._registry import Registry
from npsemiseg.data import dataset_info
from npsemiseg.frameworks import get_framework
from npsemiseg.frameworks.schedules import SHARED_EPOCHS
from npsemiseg.heads import head_class
from npsemiseg.protocol import apply_protocol, protocol_overrides

#: every preset by name: a function ``(framework=, dataset=, partition=, head=, protocol=) -> nested values``
PRESETS: Registry[Callable[..., dict[str, Any]]] = Registry("preset")


def preset_names() -> tuple[str, ...]:
    """Every preset name."""
    return PRESETS.names()


_VOC: dict[str, Any] = {
    "optim": {"lr": 1e-3, "head_lr_mult": 10.0, "momentum": 0.9, "weight_decay": 1e-4, "reference_batch": 12},
    "schedule": {"epochs": SHARED_EPOCHS["voc"], "batch_size": 3, "unlabeled_batch_size": 3, "crop_size": 480,
                 "poly_power": 0.9, "epoch_length": "unlabeled", "eval_every_epochs": 1},
    "loss": {"ohem": False},
    "model": {"aux_head": False},
    "evaluation": {"mode": "center_crop", "crop_size": 513, "num_samples": 5},
}

_CITYSCAPES: dict[str, Any] = {
    "optim": {"lr": 5e-3, "head_lr_mult": 1.0, "momentum": 0.9, "weight_decay": 5e-4, "reference_batch": 8},
    "schedule": {"epochs": SHARED_EPOCHS["cityscapes"], "batch_size": 2, "unlabeled_batch_size": 2, "crop_size": 580,
                 "poly_power": 0.9, "epoch_length": "unlabeled", "eval_every_epochs": 1},
    "loss": {"ohem": True, "ohem_thresh": 0.7, "ohem_min_kept": 100_000, "aux_weight": 0.4},
    "model": {"aux_head": True},
    # stride None = ceil(2/3 x crop): 513 at 769, and it follows a changed crop
    "evaluation": {"mode": "sliding", "crop_size": 769, "num_samples": 5},
}

SMOKE_DATA_OPTIONS: dict[str, Any] = {"train_size": 512, "val_size": 4, "image_size": 32}
#: processes of the paper's setting (4 GPUs): the per-process batch is the global batch / 4
PAPER_PROCESSES = 4
#: the keys :func:`head_schedule` sets: the crop and batches, then the LR and epochs of a framework's publication
HEAD_SCHEDULE_KEYS = ("schedule.crop_size", "schedule.batch_size", "schedule.unlabeled_batch_size",
                      "optim.reference_batch", "optim.lr", "schedule.epochs")


def _paper_dataset(dataset: str) -> str:
    """The dataset whose paper settings apply (a synthetic stand-in's real dataset)."""
    return dataset_info(dataset).real_dataset or dataset


def dataset_family(dataset: str) -> str:
    """``"cityscapes"`` for Cityscapes and its stand-in, else ``"voc"`` (VOC, blender, synthetic)."""
    return "cityscapes" if _paper_dataset(dataset) == "cityscapes" else "voc"


def _protocol_epochs(*, framework: str, dataset: str, partition: str, head: str, protocol: str) -> int:
    """The cell's epochs without a publication's own: a switch's (``psmt_epochs``) where one sets them, else the
    shared schedule's (with the framework's ``paper_schedule``)."""
    family = dataset_family(dataset)
    cell = {"framework": framework, "dataset": dataset, "partition": partition}
    shared = get_framework(framework).paper_schedule(family).get("epochs", SHARED_EPOCHS[family])
    return protocol_overrides(protocol, framework=framework, dataset=dataset, head=head,
                              values=cell).get("schedule.epochs", shared)


def head_schedule(*, framework: str, dataset: str, partition: str, head: str, head_settings: str,
                  protocol: str = "corrected") -> dict[str, Any]:
    """The crop, per-process labeled / unlabeled batch, global batch (``optim.reference_batch``), LR and epochs
    of a cell (keys :data:`HEAD_SCHEDULE_KEYS`).

    ``shared`` (switch ``head_settings``, corrected): every head of a framework at the reduced setting the paper
    trained its MC-dropout and NP rows with (VOC crop 480, batch 12; Cityscapes 580, 8), the shared LR and the
    protocol's epochs. ``per_head`` (released): each head at the settings of the code behind its rows
    (``protocol_deviations.md``, Provenance): a deterministic head (the baseline, whose rows the paper copied
    from each framework's publication) at the framework's ``publication_settings``, ``publication_lr`` and
    ``publication_epochs`` where it has them; the stochastic heads at the NP-SemiSeg configs' crop and batch
    (``np_config_settings`` where they differ from the shared ones: AugSeg VOC 8)."""
    family = dataset_family(dataset)
    base = _CITYSCAPES if family == "cityscapes" else _VOC
    crop, batch = base["schedule"]["crop_size"], base["optim"]["reference_batch"]
    lr = base["optim"]["lr"]
    epochs = _protocol_epochs(framework=framework, dataset=dataset, partition=partition, head=head, protocol=protocol)
    if head_settings not in ("per_head", "shared"):
        raise ValueError(f"schedule.head_settings: expected 'per_head' or 'shared', got {head_settings!r}")
    framework_cls = get_framework(framework)
    if head_settings == "per_head" and head_class(head).stochastic:
        crop, batch = framework_cls.np_config_settings.get(family, (crop, batch))
    elif head_settings == "per_head":
        crop, batch = framework_cls.publication_settings[family]
        lr = framework_cls.publication_lr.get(family, lr)
        info = dataset_info(dataset)
        own = framework_cls.publication_epochs(_paper_dataset(dataset), info.resolve_partition(str(partition)))
        epochs = own if own is not None else epochs
    per_process = max(1, batch // PAPER_PROCESSES)
    return dict(zip(HEAD_SCHEDULE_KEYS, (crop, per_process, per_process, batch, lr, epochs)))


def _cell_schedule(values: dict[str, Any]) -> dict[str, Any]:
    """:func:`head_schedule` of the cell in nested configuration ``values``."""
    return head_schedule(framework=values["framework"], dataset=values["dataset"], partition=str(values["partition"]),
                         head=values["head"]["name"], head_settings=values["schedule"].get("head_settings", "shared"),
                         protocol=values.get("protocol", "corrected"))


def follow_head_settings(before: dict[str, Any], after: dict[str, Any], explicit: Any = ()) -> dict[str, Any]:
    """``after`` (nested values) with its crop, batches, LR and epochs moved to its cell's :func:`head_schedule`
    where they still hold ``before``'s derived ones and no key of ``explicit`` set them: a change of
    ``head_settings``, head, framework or protocol keeps the schedule derived. Only where one side is ``per_head``
    (``shared`` cells keep today's behaviour) and only while one of the crop and batches is still derived: a
    shrunk schedule (smoke) never matches and stays, its LR and epochs too. ``after`` is changed in place."""
    settings = {before["schedule"].get("head_settings"), after["schedule"].get("head_settings")}
    if "per_head" not in settings:
        return after
    old, new = _cell_schedule(before), _cell_schedule(after)

    def derived(key: str) -> bool:
        section, leaf = key.split(".")
        return key not in explicit and section not in explicit and after[section].get(leaf) == old[key]

    if not any(derived(key) for key in HEAD_SCHEDULE_KEYS[:4]):
        return after
    for key, value in new.items():
        if derived(key):
            section, leaf = key.split(".")
            after[section][leaf] = value
    return after


def preset_values(preset: str, *, framework: str, dataset: str, partition: str, head: str,
                  protocol: str = "corrected") -> dict[str, Any]:
    """The nested dict of configuration values of ``preset`` for one cell under ``protocol`` (validated by RunConfig)."""
    return PRESETS.get(preset)(framework=framework, dataset=dataset, partition=partition, head=head, protocol=protocol)


@PRESETS.register("paper")
def paper(*, framework: str, dataset: str, partition: str, head: str, protocol: str = "corrected") -> dict[str, Any]:
    """The paper's settings for one cell under ``protocol`` (sources in the module docstring and on the classes)."""
    head_cls = head_class(head)
    framework_cls = get_framework(framework)
    family = dataset_family(dataset)
    base = _CITYSCAPES if family == "cityscapes" else _VOC
    values: dict[str, Any] = {key: dict(section) for key, section in base.items()}
    values.update(framework=framework, dataset=dataset, partition=partition)
    values["framework_options"] = framework_cls.paper_options(_paper_dataset(dataset), partition)
    values["model"].update(variant=framework_cls.model_variant, backbone="resnet50", weights="imagenet")
    values["schedule"].update(framework_cls.paper_schedule(family))
    values["optim"]["grad_clip"] = head_cls.paper_grad_clip
    values["head"] = {"name": head, "options": dict(head_cls.paper_options)}
    values["data"] = {"num_workers": 4}
    apply_protocol(values, protocol)
    for key, value in _cell_schedule(values).items():  # the crop and batches the protocol's head settings give
        section, leaf = key.split(".")
        values[section][leaf] = value
    return values


@PRESETS.register("smoke")
def smoke(*, framework: str, dataset: str, partition: str, head: str, protocol: str = "corrected") -> dict[str, Any]:
    """Shrink the paper preset to seconds on a CPU: tiny model, images, steps and evaluation.

    On a real dataset the files are read as they are (no synthetic generator options). The protocol's
    switches stay (head options are merged with the head's ``smoke_options``), T at evaluation is 2."""
    values = paper(framework=framework, dataset=dataset, partition=partition, head=head, protocol=protocol)
    values["model"].update(backbone="resnet_small", weights=None, deep_stem=False,
                           options={"aspp_channels": 16, "low_level_channels": 8, "representation_dim": 16})
    values["optim"].update(lr=0.01, reference_batch=2)  # one process of 2 labeled images
    values["schedule"].update(epochs=1, max_steps=3, batch_size=2, unlabeled_batch_size=2, crop_size=32,
                              eval_every_epochs=0, checkpoint_every_steps=0)
    values["loss"].update(ohem_min_kept=64)
    values["evaluation"] = {"mode": "whole", "num_samples": 2, "max_images": 2, "pavpu_window": 8, "figures": False,
                            "select": values["evaluation"].get("select", "last"),
                            "select_from_epoch": values["evaluation"].get("select_from_epoch", 0)}
    synthetic = dataset_info(dataset).synthetic
    values["data"] = {**values["data"], "num_workers": 0, "options": dict(SMOKE_DATA_OPTIONS) if synthetic else {}}
    values["head"]["options"] = {**values["head"]["options"], **head_class(head).smoke_options}
    # a handful of steps never leaves a supervised-only phase: start semi-supervised at once
    for phase in ("sup_only_epochs", "warmup_epochs"):
        if phase in values["framework_options"]:
            values["framework_options"][phase] = 0
    values["framework_options"].update(get_framework(framework).smoke_options)
    return values


#: kept for callers that read the old name table; :func:`preset_names` is the accessor
PRESET_NAMES: tuple[str, ...] = preset_names()
