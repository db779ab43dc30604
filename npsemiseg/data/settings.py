"""A dataset's paper settings: one object per dataset that the presets, the protocol and the frameworks ask.

``PaperSettings`` holds what a publication fixes for a dataset: the crop, the global batch and the processes
it is split over, the optimiser (LR, head LR multiple, momentum, weight decay, poly power), the epochs,
OHEM and the auxiliary head, the evaluation mode and window, and what individual frameworks published on it
(``Publication``: crop, batch, LR, epochs; framework options such as confidence thresholds). A dataset class
(``npsemiseg.data.base.DatasetDef``) carries one as ``settings``; ``settings.values()`` is the ``paper``
preset's nested values.

The values below are the shared ones (the NP-SemiSeg configs'); what each framework's publication sets on a
dataset lives in the dataset's class (``npsemiseg/data/sets/pascal.py``, ``cityscapes.py``, ``ade20k.py``, ``coco.py``),
so a dataset without an entry for a framework trains it at the shared settings. ``recipe`` (``"voc"`` /
``"cityscapes"``, the paper recipe a dataset follows) names the augmentation pipeline a dataset's frameworks use
(``augmentation_kind``) and labels the shared settings in ``config show --explain``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

#: a dataset's recipe (the paper recipe it follows: its augmentation pipeline): one of these
RECIPES = ("voc", "cityscapes")


@dataclass(frozen=True)
class Publication:
    """A framework's own publication on a dataset: crop, global labeled batch, LR and epochs (None: the shared);
    ``partition_epochs``: epochs of single partitions where they differ (PS-MT's Cityscapes 744: 450). What a
    framework that takes its whole configuration from the publication (UniMatch V2) reads beside them: ``ohem``
    ``(thresh, min_kept)`` or None (plain cross-entropy), ``eval_mode`` (None: the framework's default) and
    ``source``, the config file the values come from (``config show --explain`` cites it with its lines)."""

    crop_size: int
    batch: int
    lr: float | None = None
    epochs: int | None = None
    partition_epochs: Mapping[str, int] = field(default_factory=dict)
    ohem: tuple[float, int] | None = None
    eval_mode: str | None = None
    source: str = ""

    def epochs_for(self, partition: str | None = None) -> int | None:
        """The publication's epochs on canonical ``partition`` (its own where listed, else ``epochs``)."""
        return self.partition_epochs.get(str(partition), self.epochs)


#: the frameworks of LiheYoung/UniMatch-V2's repository (``unimatch_v2.py``, ``fixmatch.py``): both read the same
#: ``configs/<dataset>.yaml``, so a dataset's UniMatch V2 config is one entry for each
UNIMATCH_V2_FRAMEWORKS = ("unimatch_v2", "fixmatch_v2")
#: UniMatch V2's configs give the batch per GPU, for 4 GPUs (README.md 134-135) and lr 5e-6 (configs/*.yaml 10)
UNIMATCH_V2_GPUS, UNIMATCH_V2_LR = 4, 5e-6


def unimatch_v2_config(name: str, crop_size: int, epochs: int, batch_per_gpu: int,
                       ohem: tuple[float, int] | None = None, eval_mode: str = "whole") -> dict[str, Publication]:
    """``publications`` entries of UniMatch V2's ``configs/<name>.yaml`` (LiheYoung/UniMatch-V2@f6afb4d): crop
    (line 5), epochs (8), batch per GPU (9) x the README's 4 GPUs (README.md 134-135), lr 5e-6 (10), OHEM (12-17)
    or cross-entropy; ``eval_mode``: ``sliding`` (Cityscapes, unimatch_v2.py 239) or ``whole``."""
    publication = Publication(crop_size, batch_per_gpu * UNIMATCH_V2_GPUS, lr=UNIMATCH_V2_LR, epochs=epochs,
                              ohem=ohem, eval_mode=eval_mode, source=f"UniMatch-V2 configs/{name}.yaml")
    return dict.fromkeys(UNIMATCH_V2_FRAMEWORKS, publication)


@dataclass(frozen=True)
class PaperSettings:
    """The paper settings of one dataset (the ``paper`` preset's values, before a framework's and a head's own).

    batch: the global labeled batch (= unlabeled batch), split over ``processes`` processes; ohem: ``(threshold,
    min_kept)`` or None; aux_weight: the auxiliary layer-3 head's loss weight (None: no auxiliary head);
    eval_mode ``center_crop`` / ``sliding`` / ``whole`` with window ``eval_crop_size`` (None: whole images);
    augmentation: the ``dataset_kind`` of ``npsemiseg.data.transforms.paper_augmentation``.
    publications / np_configs / framework_epochs / framework_options: per framework name, what the dataset's
    publications set for it (``np_configs``: the NP-SemiSeg configs' ``(crop, batch)`` for the stochastic heads);
    partition_options: per framework and canonical partition, options over ``framework_options`` (PS-MT's
    unsupervised weight 0.06 on VOC classic 92).
    """

    recipe: str
    crop_size: int
    batch: int
    lr: float
    epochs: int
    head_lr_mult: float = 10.0
    momentum: float = 0.9
    weight_decay: float = 1e-4
    poly_power: float = 0.9
    processes: int = 4
    ohem: tuple[float, int] | None = None
    aux_weight: float | None = None
    eval_mode: str = "center_crop"
    eval_crop_size: int | None = None
    eval_samples: int = 5
    augmentation: str = ""
    publications: Mapping[str, Publication] = field(default_factory=dict)
    np_configs: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    framework_epochs: Mapping[str, int] = field(default_factory=dict)
    framework_options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    partition_options: Mapping[str, Mapping[str, Mapping[str, Any]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.recipe not in RECIPES:
            raise ValueError(f"PaperSettings.recipe: expected one of {RECIPES}, got {self.recipe!r}")
        if self.eval_mode not in ("center_crop", "sliding", "whole"):
            raise ValueError(f"PaperSettings.eval_mode: expected center_crop, sliding or whole, got {self.eval_mode!r}")
        if self.batch < 1 or self.processes < 1 or self.crop_size < 1 or self.epochs < 1:
            raise ValueError(f"PaperSettings: crop, batch, processes and epochs must be >= 1, got {self}")

    @property
    def per_process_batch(self) -> int:
        """Labeled (= unlabeled) images per process: the global batch over the processes (at least 1)."""
        return max(1, self.batch // self.processes)

    @property
    def augmentation_kind(self) -> str:
        """The ``dataset_kind`` of the frameworks' augmentation pipelines (default: the recipe)."""
        return self.augmentation or self.recipe

    def values(self) -> dict[str, Any]:
        """The nested values of the ``paper`` preset's step for a dataset with these settings (fresh dicts)."""
        per_process = self.per_process_batch
        loss: dict[str, Any] = {"ohem": self.ohem is not None}
        if self.ohem is not None:
            loss.update(ohem_thresh=self.ohem[0], ohem_min_kept=self.ohem[1])
        if self.aux_weight is not None:
            loss["aux_weight"] = self.aux_weight
        return {
            "optim": {"lr": self.lr, "head_lr_mult": self.head_lr_mult, "momentum": self.momentum,
                      "weight_decay": self.weight_decay, "reference_batch": self.batch},
            "schedule": {"epochs": self.epochs, "batch_size": per_process, "unlabeled_batch_size": per_process,
                         "crop_size": self.crop_size, "poly_power": self.poly_power, "epoch_length": "unlabeled",
                         "eval_every_epochs": 1},
            "loss": loss,
            "model": {"aux_head": self.aux_weight is not None},
            # no stride: the derived one follows a changed window
            "evaluation": {"mode": self.eval_mode, "crop_size": self.eval_crop_size, "num_samples": self.eval_samples},
        }

    def publication(self, framework: str) -> Publication | None:
        """Framework ``framework``'s own publication on this dataset (None: none, the shared settings)."""
        return self.publications.get(framework)

    def np_config(self, framework: str) -> tuple[int, int]:
        """``(crop, global batch)`` of the NP-SemiSeg configs for ``framework``'s stochastic heads (default: the
        shared crop and batch)."""
        return self.np_configs.get(framework, (self.crop_size, self.batch))

    def framework_schedule(self, framework: str) -> dict[str, Any]:
        """The framework's own changes to the shared schedule here (``{"epochs": 240}``; none: ``{}``)."""
        return {"epochs": self.framework_epochs[framework]} if framework in self.framework_epochs else {}

    def shared_epochs(self, framework: str) -> int:
        """The epochs of the shared schedule for ``framework`` (its own schedule change, else ``epochs``)."""
        return int(self.framework_schedule(framework).get("epochs", self.epochs))

    def options_for(self, framework: str, partition: str | None = None) -> dict[str, Any]:
        """Framework options this dataset's publications set for ``framework`` (thresholds and the like), with
        those of canonical ``partition`` over them."""
        by_partition = self.partition_options.get(framework, {}).get(str(partition), {})
        return {**self.framework_options.get(framework, {}), **by_partition}

    def scaled(self, **changes: Any) -> PaperSettings:
        """A copy with ``changes`` (a dataset derived from another: ``VOC.scaled(crop_size=321)``)."""
        return replace(self, **changes)


#: VOC (the shared values of classic and blender, whose classes add the frameworks' publications; the default of
#: datasets without settings of their own): the NP-SemiSeg authors' released U2PL VOC config
#: (``npsemiseg/presets_audit.md``): crop 480, 12 = 4 x 3, lr 1e-3 (head x10), weight decay 1e-4, 80 epochs,
#: evaluation on a 513 px center crop. Its one publication is UniMatch V2's Pascal config (UniMatch-V2
#: configs/pascal.yaml 5, 8-9: crop 518, 60 epochs, 4 per GPU), the one a VOC-like dataset without a UniMatch V2
#: config of its own (the study, folder and synthetic datasets) trains UniMatch V2 at
VOC_SETTINGS = PaperSettings(recipe="voc", crop_size=480, batch=12, lr=1e-3, epochs=80, head_lr_mult=10.0,
                             weight_decay=1e-4, eval_mode="center_crop", eval_crop_size=513,
                             publications=unimatch_v2_config("pascal", 518, 60, 4))

#: Cityscapes (shared values; the publications: ``npsemiseg/data/sets/cityscapes.py``): crop 580, 8 = 4 x 2, lr 5e-3
#: (head x1), weight decay 5e-4, 200 epochs (AugSeg 240, in ``framework_epochs``), OHEM 0.7 with at least 100,000 pixels,
#: 0.4 x the auxiliary head's loss, sliding windows of 769 px
CITYSCAPES_SETTINGS = PaperSettings(recipe="cityscapes", crop_size=580, batch=8, lr=5e-3, epochs=200,
                                    head_lr_mult=1.0, weight_decay=5e-4, ohem=(0.7, 100_000), aux_weight=0.4,
                                    eval_mode="sliding", eval_crop_size=769)
