"""The run configuration as a record: one frozen pydantic model per section and :class:`RunConfig`.

The record checks types, ranges and registered names (frameworks, heads, datasets, decoders,
backbones, their options) and nothing else: how its values are chosen (presets, the protocol's switches,
the head schedule, fields that follow others, the user's overrides) is :mod:`npsemiseg.config.compose`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    ValidationInfo,
    field_validator,
    model_validator,
)

from npsemiseg.constants import CORRUPTION_SEVERITIES, CORRUPTIONS, DataOrder, SampleCE
from npsemiseg.data import augmentation_keys, dataset_info, unknown_augmentation_values
from npsemiseg.data.info import DATASETS, dataset_root
from npsemiseg.frameworks import FRAMEWORKS
from npsemiseg.heads import HEADS, head_spec
from npsemiseg.config.overrides import FREE_FORM
from npsemiseg.models import BACKBONES, DECODERS, SEGMENTOR_OPTIONS, ViTSpec
from npsemiseg.renames import earlier_names, read_renamed
from npsemiseg.untrusted import load_yaml

#: What a cell id covers, by version. Version 1: the record's values (JSON) minus :data:`IDENTITY_EXCLUDED`
#: and minus each field of :data:`IDENTITY_OMITTED` while it has no effect, plus each field of
#: :data:`IDENTITY_RESTORED` where it applies. A field added to the record later joins the omitted ones at the
#: value every earlier cell ran with, so adding it keeps every id; a field removed from the record where it had
#: no effect joins the restored ones at the value every earlier cell had, so removing it keeps every id. A
#: change that must give cells new ids bumps the version, which then enters the hash, and says why here. A cell
#: whose record changes gets a new id without a new version: ``tests/golden/cell_ids.json`` says which and why.
IDENTITY_VERSION = 1
#: fields that never change what a run computes: how it executes, where the data is, how it was composed
IDENTITY_EXCLUDED: tuple[str, ...] = ("runtime", "data.root", "data.num_workers", "inputs",
                                      # the evaluation under shift: metrics added after training, which it never changes
                                      "evaluation.corruptions", "evaluation.corruption_severities",
                                      "evaluation.corruption_images",
                                      # the student's evaluation beside the teacher's: metrics only, never training
                                      "evaluation.also_student")


def _pools_nothing(feature_pool: object, model: dict[str, Any]) -> bool:
    """Whether the NP head's ``feature_pool`` leaves its map as it is: 1, or ``coarse`` on a ResNet (resolved to 1)."""
    backbone = model["backbone"]
    return feature_pool == 1 or (feature_pool == "coarse" and backbone in BACKBONES
                                 and not isinstance(BACKBONES.get(backbone), ViTSpec))


#: ``(field, when it is left out)``: fields added after version 1, left out while they change nothing
IDENTITY_OMITTED: tuple[tuple[str, Callable[[dict[str, Any]], bool]], ...] = (
    ("data.order", lambda v: v["data"]["order"] == "passes"),
    ("optim.lr_scaling", lambda v: v["optim"]["lr_scaling"] == "none"),
    # UniMatch's released LR timing and CutMix source, at their corrected values
    ("schedule.lr_timing", lambda v: v["schedule"]["lr_timing"] == "before_step"),
    ("framework_options.cutmix_source", lambda v: v["framework_options"].get("cutmix_source") == "batch_shift"),
    ("head.options.dropout", lambda v: v["framework"] in ("fixmatch", "unimatch")
     and v["head"]["options"].get("dropout") == 0.1),
    ("optim.reference_batch", lambda v: v["optim"]["lr_scaling"] == "none"),  # read only by linear scaling
    ("framework_label", lambda v: v["framework_label"] == v["framework"]),  # a label, as the framework
    ("data.unlabeled_truth", lambda v: v["data"]["unlabeled_truth"] == "hidden"),  # the diagnostics off
    # the NP head's released memories and U2PL's KL in its supervised-only epochs, at their corrected values
    ("head.options.memory_zero_row", lambda v: v["head"]["options"].get("memory_zero_row") is False),
    ("head.options.enqueue_order", lambda v: v["head"]["options"].get("enqueue_order") == "random"),
    ("head.options.memory_resolution", lambda v: v["head"]["options"].get("memory_resolution") == "features"),
    ("framework_options.sup_only_kl", lambda v: v["framework_options"].get("sup_only_kl") is True),
    # AugSeg's NP targets (U2PL's option of the same name was in the record from the start) and CPS's
    # MeanTeacher's released step, at their corrected values
    ("framework_options.np_targets",
     lambda v: v["framework"] == "augseg" and v["framework_options"].get("np_targets") == "filtered"),
    ("framework_options.passes", lambda v: v["framework_options"].get("passes") == "joint"),
    ("framework_options.ema_timing", lambda v: v["framework_options"].get("ema_timing") == "after_step"),
    ("framework_options.train_dropout", lambda v: v["framework_options"].get("train_dropout") is True),
    # PS-MT's warm-up teachers' backbones, at the corrected value
    ("framework_options.warmup_teacher_backbones",
     lambda v: v["framework_options"].get("warmup_teacher_backbones") == "pretrained"),
    # U2PL's released label_onehot with ignored pixels, at its corrected value
    ("framework_options.label_onehot_ignored_bug",
     lambda v: v["framework_options"].get("label_onehot_ignored_bug") is False),
    # PS-MT's released T-VAT search per batch, at its corrected value
    ("framework_options.tvat_per_batch", lambda v: v["framework_options"].get("tvat_per_batch") is False),
    # PS-MT's released student passes (one per part), at the corrected value
    ("framework_options.student_passes", lambda v: v["framework_options"].get("student_passes") == "joint"),
    # U2PL's and AugSeg's released teacher, NP context, entropy, memories and supervised-only terms, at their
    # corrected values (switches u2pl_teacher_reset, np_context_pass, u2pl_entropy_mean_logits, augseg_np_memories,
    # u2pl_sup_only_zero_terms)
    ("framework_options.teacher_reset", lambda v: v["framework_options"].get("teacher_reset") == "copy"),
    ("framework_options.np_context", lambda v: v["framework_options"].get("np_context") == "slice"),
    ("framework_options.teacher_entropy", lambda v: v["framework_options"].get("teacher_entropy") == "mean_probs"),
    ("framework_options.np_memories", lambda v: v["framework_options"].get("np_memories") == "head"),
    ("framework_options.sup_only_zero_terms", lambda v: v["framework_options"].get("sup_only_zero_terms") is False),
    # PS-MT's released VOC evaluation: images resized to multiples of 8, at its corrected value
    ("evaluation.resize_multiple", lambda v: v["evaluation"].get("resize_multiple") is None),
    # AugSeg's and UniMatch's released sliding windows (cut at the border, probabilities summed), at the corrected
    # value
    ("evaluation.sliding_scheme", lambda v: v["evaluation"].get("sliding_scheme") == "u2pl"),
    # UniMatch V2's whole images resized to the nearest multiple, at the value every earlier cell ran with
    ("evaluation.resize_rounding", lambda v: v["evaluation"].get("resize_rounding") == "up"),
    # UniMatch V2's frozen ADE20K backbone, at the value every earlier cell ran with
    ("model.freeze_backbone", lambda v: v["model"].get("freeze_backbone") is False),
    # gradient accumulation off: one micro-batch per optimiser step, as every earlier cell ran
    ("schedule.accumulation_steps", lambda v: v["schedule"].get("accumulation_steps") == 1),
    # U2PL's and AugSeg's entropy log at the value every earlier cell ran with (released cells now run the authors'
    # offset and have new ids)
    ("framework_options.entropy_log", lambda v: v["framework_options"].get("entropy_log") == "clamp"),
    # the baseline head's block at the value every earlier cell ran with (released UniMatch V2 cells: the projection)
    ("head.options.block", lambda v: v["head"]["options"].get("block") == "u2pl"),
    # the NP head on the whole map, as every earlier cell ran; ``coarse`` is that too on DeepLabv3+ (pool 1), so only
    # the ViT cells it pools have new ids
    ("head.options.feature_pool", lambda v: _pools_nothing(v["head"]["options"].get("feature_pool"), v["model"])),
    # the crop's image fill at the value every earlier cell ran with (released UniMatch-family cells: black), and
    # UniMatch V2's crop padding at the placement every earlier V2 cell ran with (released V2 cells: bottom and right)
    ("data.augmentation.crop_fill", lambda v: v["data"]["augmentation"].get("crop_fill") == "mean"),
    ("data.augmentation.crop_padding", lambda v: v["framework"] in ("unimatch_v2", "fixmatch_v2")
     and v["data"]["augmentation"].get("crop_padding") == "centered"),
    # the rescale's resampling at the value every earlier cell ran with (released U2PL cells: U2PL's RandResize)
    ("data.augmentation.resize_resample",
     lambda v: v["data"]["augmentation"].get("resize_resample") == "antialiased"),
    # the rescale's draw from its range, as every earlier cell ran (released MT cells: TorchSemiSeg's six scales)
    ("data.augmentation.scale_choices",
     lambda v: v["data"]["augmentation"].get("scale_choices", False) is None),
)
#: ``(field, value, where it is put back)``: fields removed after version 1 that every cell having them ran at
#: ``value`` without effect, put back at it: MT's options ``variant`` and ``mse_weight``, which only its CPS
#: variant read (now framework ``mt_cps``)
IDENTITY_RESTORED: tuple[tuple[str, Any, Callable[[dict[str, Any]], bool]], ...] = (
    ("framework_options.variant", "shared", lambda v: v["framework"] == "mt"),
    ("framework_options.mse_weight", 100.0, lambda v: v["framework"] == "mt"),
)
# Renamed keys (``npsemiseg.renames.RENAMED_KEYS``, the one map old -> new) are hashed under their version-1 names
# and values rather than mapped to new ids: a name says what a value is, not what the cell computes, so the cell
# keeps its id, its MLflow run and its resumable checkpoints; the map is kept anyway to read old records and runs.

CELL_ID_LENGTH = 12

# libyaml's safe dumper when available (10x faster than the pure-Python one, same output); reading goes through
# npsemiseg.untrusted.load_yaml (configurations come from others too)
_YAML_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def segmentor_options() -> list[str]:
    """The keys ``model.options`` takes: ``build_segmentor``'s other keyword arguments
    (:data:`npsemiseg.models.SEGMENTOR_OPTIONS`)."""
    return sorted(SEGMENTOR_OPTIONS)


def _free_form_names(values: dict[str, Any]) -> None:
    """``ValueError`` naming a key of a free-form option dict (:data:`FREE_FORM`) that is no option name: not a
    Python identifier, or a dunder (``__class__``): those go to constructors as keyword arguments."""
    for dotted in sorted(FREE_FORM):
        node: Any = values
        for part in dotted.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        for key in node if isinstance(node, dict) else ():
            if not isinstance(key, str) or not key.isidentifier() or key.startswith("__"):
                raise ValueError(f"{dotted}: {key!r} is not an option name (expected a Python identifier not "
                                 "starting with '__')")


class Section(BaseModel):
    """Base of every configuration section: unknown keys rejected, immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True, coerce_numbers_to_str=True)


class HeadConfig(Section):
    """The classifier head: which class (``name``), its label in tables (``label``), its options.

    ``name``: a registered head (``npsemiseg.heads.head_names()``). ``options`` are keyword arguments of
    ``npsemiseg.heads.build_head(name, ...)``, checked against the head class. ``sample_ce``:
    cross-entropy over the S predictions, ``elbo`` (mean of
    per-sample CEs, the paper) or ``mean_logits`` (CE of the mean logits, the authors' code).
    """

    name: str = "baseline"
    #: the head's label in tables and run names ("" = ``name``; composition sets it)
    label: str = ""
    options: dict[str, Any] = Field(default_factory=dict)
    sample_ce: SampleCE = "elbo"

    @field_validator("name", mode="after")
    @classmethod
    def _registered_head(cls, value: str) -> str:
        return HEADS.check(value)


class ModelConfig(Section):
    """The segmentor: DeepLabv3+ decoder, backbone and optional heads (``build_segmentor`` arguments).

    ``weights``: None = random init, ``"imagenet"`` = torchvision's ImageNet weights, or a file path.
    ``representation_head``: None = as the framework needs (U2PL's contrastive loss needs it).
    ``options``: further ``build_segmentor`` keyword arguments (widths, output stride, ...).
    """

    #: the DeepLabv3+ decoder (``npsemiseg.models.DECODERS``: ``u2pl``, ``augseg``, ``psmt``; a ViT backbone has its
    #: own DPT and ignores it)
    decoder: str = "u2pl"
    backbone: str = "resnet50"
    weights: str | None = "imagenet"
    deep_stem: bool = False
    aux_head: bool = False
    representation_head: bool | None = None
    mc_dropout_scope: Literal["decoder", "head"] = "decoder"
    #: bilinear upsampling of logits to label size (losses, pseudo-labels, evaluation) with align_corners=True
    #: (every official model) or False; switch ``align_corners``
    align_corners: bool = False
    #: the backbone's parameters frozen (no gradient, not in the optimiser; UniMatch V2's ``lock_backbone``)
    freeze_backbone: bool = False
    options: dict[str, Any] = Field(default_factory=dict)

    @field_validator("decoder", mode="after")
    @classmethod
    def _registered_decoder(cls, value: str) -> str:
        return DECODERS.check(value)

    @field_validator("options", mode="after")
    @classmethod
    def _segmentor_options(cls, value: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(value) - set(segmentor_options()))
        if unknown:
            raise ValueError(f"model.options: unknown option(s) {unknown}, expected some of {segmentor_options()} "
                             "(build_segmentor's arguments that model's own fields do not set)")
        return value

    @field_validator("backbone", mode="after")
    @classmethod
    def _registered_backbone(cls, value: str) -> str:
        return BACKBONES.check(value)


class OptimConfig(Section):
    """SGD with momentum (``name: sgd``, every preset's) or AdamW (``adamw``: decoupled ``weight_decay``;
    ``momentum`` and ``nesterov`` unused); the head (everything but the backbone) at ``lr x head_lr_mult``.

    ``parameter_groups``: ``backbone_head`` (the backbone at ``lr``, the rest at ``lr x head_lr_mult``, weight
    decay on every parameter) or ``single_lr`` (PS-MT's: every parameter at ``lr``, no weight decay on biases and
    normalisation layers; ``head_lr_mult`` unused); switch ``psmt_single_lr``.
    """

    name: Literal["sgd", "adamw"] = "sgd"
    lr: PositiveFloat = 1e-3
    head_lr_mult: PositiveFloat = 10.0
    momentum: float = Field(0.9, ge=0.0, lt=1.0)
    weight_decay: float = Field(1e-4, ge=0.0)
    nesterov: bool = False
    parameter_groups: Literal["backbone_head", "single_lr"] = "backbone_head"
    #: max global gradient norm (None = no clipping)
    grad_clip: PositiveFloat | None = None
    #: ``linear``: lr x global batch / ``reference_batch`` (the global batch ``lr`` was tuned for);
    #: ``none``: ``lr`` as it is, whatever the number of devices
    lr_scaling: Literal["none", "linear"] = "none"
    #: the preset's global labeled batch (paper: 3 x 4 GPUs = 12 on VOC, 2 x 4 = 8 on Cityscapes)
    reference_batch: PositiveInt | None = None

    @model_validator(mode="after")
    def _linear_needs_a_reference(self) -> OptimConfig:
        if self.lr_scaling == "linear" and self.reference_batch is None:
            raise ValueError("optim.reference_batch: expected the global batch optim.lr was tuned for "
                             "(optim.lr_scaling=linear scales lr by global batch / reference_batch), got null")
        return self


class ScheduleConfig(Section):
    """How long and on what: epochs (or a step cap), per-process batch sizes, crop, poly LR.

    Epoch convention ``epoch_length``: ``"unlabeled"`` = N_u / global unlabeled batch iterations,
    the labeled list repeated to N_u (U2PL, AugSeg; also used for ``supervised`` so it trains as
    many iterations as the SSL frameworks); ``"labeled"`` = n_labeled / global labeled batch.
    ``max_steps`` caps the run (the poly schedule then spans ``max_steps``).
    ``eval_every_epochs`` / ``checkpoint_every_steps``: 0 = only at the end.
    """

    epochs: PositiveInt = 80
    max_steps: PositiveInt | None = None
    batch_size: PositiveInt = 3
    #: None = ``batch_size`` (composition sets it)
    unlabeled_batch_size: PositiveInt | None = None
    #: micro-batches per optimiser step (global batch = batch_size x processes x accumulation_steps)
    accumulation_steps: PositiveInt = 1
    crop_size: PositiveInt = 480
    poly_power: float = Field(0.9, ge=0.0)
    epoch_length: Literal["unlabeled", "labeled"] = "unlabeled"
    #: ``shared`` (one crop and batch for every head of a framework) or ``per_head`` (the baseline head at the
    #: framework's own publication settings); the preset derives ``crop_size`` and the batches from it
    #: (step ``scale`` of ``npsemiseg.config.compose``); switch ``head_settings``
    head_settings: Literal["per_head", "shared"] = "shared"
    #: when iteration k's poly LR is set: ``before_step`` = lr(k), set before the step; ``after_step`` = lr(k - 1), as
    #: UniMatch's loop sets lr(k) after its optimiser step (unimatch.py 205-208; lr(0) at iteration 0); switch
    #: ``unimatch_lr_timing``
    lr_timing: Literal["before_step", "after_step"] = "before_step"
    eval_every_epochs: NonNegativeInt = 0
    checkpoint_every_steps: NonNegativeInt = 0


class LossConfig(Section):
    """The supervised loss every framework uses: CE, or OHEM CE (Cityscapes), plus the aux head.

    OHEM keeps pixels whose label probability is <= ``ohem_thresh`` (at least ``ohem_min_kept``
    per process). ``aux_weight`` scales the layer-3 auxiliary head's CE when ``model.aux_head``.
    """

    ohem: bool = False
    ohem_thresh: float = Field(0.7, gt=0.0, le=1.0)
    ohem_min_kept: NonNegativeInt = 100_000
    aux_weight: float = Field(0.4, ge=0.0)


class EvaluationConfig(Section):
    """Evaluation with the framework's evaluation model (the teacher).

    ``mode``/``crop_size``: None = the dataset's convention (``dataset_info``); ``stride``: None =
    ceil(2/3 x crop) for sliding modes (U2PL). ``sliding_scheme``: how sliding windows are placed and
    combined (``npsemiseg.evaluation.inference.SLIDING_SCHEMES``): ``u2pl``, the last window shifted back
    inside the image and per-sample logits averaged; ``augseg``, windows at every multiple of the stride cut
    at the border and predictive probabilities summed, as AugSeg's and UniMatch's released evaluations.
    ``unimatch_v2``: the last window shifted back as ``u2pl``'s, probabilities summed (UniMatch V2's).
    ``num_samples`` = T predictions per pixel.
    PAvPU follows Mukhoti & Gal: ``pavpu_window`` patches, accurate if accuracy >=
    ``pavpu_accuracy_threshold``, uncertain if mean entropy >= ``pavpu_uncertainty_threshold``.
    ``max_images`` evaluates only the first images of the validation set (None = all).
    ``select``: the weights a run reports, ``last`` (the last epoch's) or ``best`` (the evaluation with the
    best validation mIoU among those every ``schedule.eval_every_epochs`` epochs and the final one, restored
    at the end); both the last and the best metrics are logged whatever the selection. ``select_from_epoch``: the
    evaluations after fewer completed epochs are not candidates for ``best`` (CPS's MeanTeacher: epochs 20-34).
    ``split``: the images evaluated, ``val`` (what the tables report) or ``tune`` (the study dataset's
    held-out tuning split, where settings are chosen: never on val).
    ``corruptions``: the evaluation under shift (``docs/shift.md``) also evaluates the final weights on a corrupted
    copy of the evaluated images per corruption (``npsemiseg.constants.CORRUPTIONS``; empty: none) and severity
    (``corruption_severities``), on the first ``corruption_images`` images (None: those ``max_images`` says).
    ``also_student``: every evaluation also evaluates the student where the framework reports a teacher (one more
    evaluation each; where the student is the evaluated model its metrics are reused), logged as
    ``student/<metric>`` (``eval/student/<metric>`` per evaluation) with ``best_student/<metric>``,
    ``best_student/step`` and ``best_student/epoch`` (``npsemiseg.training.selection``).
    """

    split: Literal["val", "tune"] = "val"
    mode: Literal["whole", "center_crop", "sliding", "sliding_global"] | None = None
    crop_size: PositiveInt | None = None
    stride: PositiveInt | None = None
    sliding_scheme: Literal["u2pl", "augseg", "unimatch_v2"] = "u2pl"
    num_samples: PositiveInt = 5
    batch_size: PositiveInt = 1
    pavpu_window: PositiveInt = 64
    pavpu_accuracy_threshold: float = Field(0.5, ge=0.0, le=1.0)
    pavpu_uncertainty_threshold: float = Field(0.4, ge=0.0)
    max_images: PositiveInt | None = None
    figures: bool = True
    select: Literal["last", "best"] = "last"
    select_from_epoch: NonNegativeInt = 0
    #: mode ``whole``: images resized to multiples of it and the logits back (PS-MT's released VOC evaluation,
    #: switch ``psmt_eval_resize``); None: evaluated at their size. Read by mode ``whole`` only
    resize_multiple: PositiveInt | None = None
    #: how ``resize_multiple`` rounds a side: ``up`` (PS-MT's ceil) or ``nearest`` (UniMatch V2's, supervised.py 75)
    resize_rounding: Literal["up", "nearest"] = "up"
    corruptions: tuple[str, ...] = ()
    corruption_severities: tuple[PositiveInt, ...] = CORRUPTION_SEVERITIES
    corruption_images: PositiveInt | None = None
    also_student: bool = False

    @field_validator("corruptions", mode="after")
    @classmethod
    def _known_corruptions(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        unknown = [name for name in value if name not in CORRUPTIONS]
        if unknown:
            raise ValueError(f"evaluation.corruptions: unknown corruption(s) {unknown}, expected some of "
                             f"{list(CORRUPTIONS)}")
        return value

    @field_validator("corruption_severities", mode="after")
    @classmethod
    def _known_severities(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        if not value or any(severity not in CORRUPTION_SEVERITIES for severity in value):
            raise ValueError(f"evaluation.corruption_severities: expected some of {list(CORRUPTION_SEVERITIES)}, "
                             f"got {list(value)}")
        return value

    def predict_options(self, mode: str) -> dict[str, Any]:
        """What ``npsemiseg.evaluation.predict`` takes of this section besides the mode and T, for ``mode``
        (the loop's evaluation and an exported model predict alike)."""
        options: dict[str, Any] = {"crop_size": self.crop_size, "stride": self.stride, "scheme": self.sliding_scheme}
        if mode == "whole" and self.resize_multiple is not None:
            options.update(resize_multiple=self.resize_multiple, resize_rounding=self.resize_rounding)
        return options

    @model_validator(mode="after")
    def _windows_cover_the_image(self) -> EvaluationConfig:
        sliding = self.mode in ("sliding", "sliding_global")
        if sliding and None not in (self.stride, self.crop_size) and self.stride > self.crop_size:
            raise ValueError(f"evaluation.stride: expected at most evaluation.crop_size={self.crop_size} so windows "
                             f"cover the image, got {self.stride}")
        return self


class DataConfig(Section):
    """Where the data is and how it is read and augmented.

    ``options`` go to ``dataset_info``/``build_dataset`` (synthetic generator settings such as
    ``train_size``, ``image_size``). ``augmentation``: keyword arguments of
    ``npsemiseg.data.transforms.train_transform`` besides the crop (``resize``, ``scale_range``,
    ``base_size``, ``strong``, ``flip``, ``label_pad_value``); empty = the framework's pipeline
    (``paper_augmentation(framework.augmentation, dataset family)``). ``labeled_strong_view``: labeled images
    also get the strong view (None = when the framework's ``strong_labeled`` option asks: PS-MT,
    whose student sees labeled images strongly augmented).
    ``unlabeled_truth``: a diagnostic of the frameworks' pseudo-labels:
    ``hidden`` (every real run), ``measured`` (the unlabeled images keep their labels and each step logs how
    often the teacher's pseudo-labels are right, ``train/pseudo_label_accuracy``, and per class
    ``train/pseudo_label_recall/<c>`` and ``train/pseudo_label_precision/<c>``) or ``oracle`` (the teacher's
    prediction on the unlabeled images is replaced by their ground truth: a teacher always right and always
    confident; an SSL framework that does not beat supervised with it cannot with any teacher).
    ``order``: how the labeled and unlabeled streams are ordered (:data:`npsemiseg.constants.DataOrder`):
    ``passes`` (each shuffled on its own per seed and epoch) or one permutation both share per epoch, the official
    scripts' samplers (``shared_repeated``: UniMatch's; ``shared_sampled``: U2PL's and AugSeg's;
    ``shared_repeated_frozen``: TorchSemiSeg's, the unlabeled permutation epoch 0's in every epoch), or
    ``cycled_labeled`` (PS-MT's: after the warm-up the labeled stream replays its epoch's first pass); without an
    unlabeled stream, ``passes`` whatever the value.
    """

    root: str | None = None
    num_workers: NonNegativeInt = 4
    options: dict[str, Any] = Field(default_factory=dict)
    augmentation: dict[str, Any] = Field(default_factory=dict)
    labeled_strong_view: bool | None = None
    unlabeled_truth: Literal["hidden", "measured", "oracle"] = "hidden"
    order: DataOrder = "passes"

    @field_validator("augmentation", mode="after")
    @classmethod
    def _known_augmentation_keys(cls, value: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(value) - set(augmentation_keys()))
        if unknown:
            raise ValueError(f"data.augmentation: unknown key(s) {unknown}, expected some of {sorted(augmentation_keys())}")
        if bad := unknown_augmentation_values(value):
            raise ValueError(f"data.augmentation: {'; '.join(bad)}")
        return value


class RuntimeConfig(Section):
    """How a run executes (not part of ``cell_id``).

    ``device``: ``auto`` = CUDA when available. ``amp``: bf16 autocast (GPU only). ``sync_bn``:
    SyncBatchNorm under DDP on GPU. ``deterministic``: ``torch.use_deterministic_algorithms``.
    ``progress``: a tqdm bar; ``auto`` = when the callbacks are interactive.
    ``output_dir``: where the run writes ``checkpoints/``, ``figures/`` and ``tables/`` (None = no
    checkpoints; figures and tables go to a temporary directory that lives while the callbacks'
    ``on_artifact`` copies them). ``keep_checkpoints``: how many of the newest checkpoints stay.
    ``stop_at_step``: end after this many steps with a checkpoint, as if pre-empted (resume tests,
    time-sliced workers). ``read_every_steps``: the loop reads the steps' logged values (loss terms, gradient
    norm, the NP head's label checks) back from the device in one transfer every this many steps and at every
    epoch end, evaluation, checkpoint and stop (each read waits for the device); a non-finite loss or norm then
    stops the run at that read, up to ``read_every_steps - 1`` steps after it happened (1: every step, before the
    optimiser writes it). Logged values are exact either way.
    ``compile``: ``torch.compile`` (inductor) of the networks (``npsemiseg.models.compile_segmentor``: encoder,
    decoder, aux / representation heads and the classifier head's networks, each module in place, so checkpoints
    keep their keys); the step around them (losses, U2PL's anchor sampling, the NP memories, per-sample loops)
    stays eager. ``off`` (default), ``default``, ``max-autotune`` (on CUDA with CUDA graphs, as
    ``torch.compile``'s mode), ``reduce-overhead`` (CUDA graphs: CUDA only, a clear error on CPU, where it
    could only mean ``default``). Random ops run as eager's (inductor ``fallback_random``): compiled and eager
    steps draw the same dropout masks and NP samples from the same seed (``tests/test_compile.py``).
    ``channels_last``: the encoder's and decoder's weights and the step's images in ``torch.channels_last`` format
    (meant for CUDA convolutions; on CPU it runs too, as the tests check).
    ``activation_checkpointing``: each ResNet stage / ViT block of the encoder keeps only its input and runs again in
    the backward pass (``npsemiseg.models.checkpointing``): less activation memory for about one more encoder
    forward per training pass, the same gradients and BN statistics.
    ``system_metrics``: MLflow's system metrics (CPU, memory, disk, network, GPU) of every node into the cell's run
    (``semiseg_platform.tracking.system_metrics``): ``auto`` = when the tracking URI is an MLflow server (http/https,
    a cluster's), not for a local file or SQLite store; ``on``; ``off``.
    ``planned_schedule``: ``schedule.batch_size``, ``unlabeled_batch_size`` and ``accumulation_steps`` as the cell
    was planned, set when a run re-plans them for the world size it got (an elastic run that lost workers:
    ``npsemiseg.hardware_plan.replan_for_world_size`` keeps the global batch); the cell id covers these, so a
    re-planned run is the same cell and resumes its checkpoints.
    """

    device: Literal["auto", "cpu", "cuda"] = "auto"
    amp: bool = True
    sync_bn: bool = True
    deterministic: bool = False
    progress: Literal["auto", "on", "off"] = "auto"
    output_dir: str | None = None
    keep_checkpoints: PositiveInt = 2
    stop_at_step: PositiveInt | None = None
    read_every_steps: PositiveInt = 10
    compile: Literal["off", "default", "reduce-overhead", "max-autotune"] = "off"
    channels_last: bool = False
    activation_checkpointing: bool = False
    system_metrics: Literal["auto", "on", "off"] = "auto"
    planned_schedule: dict[Literal["batch_size", "unlabeled_batch_size", "accumulation_steps"],
                           PositiveInt | None] | None = None


class CellInputs(Section):
    """What a record was composed from (:func:`npsemiseg.config.compose`): the preset, the cell as asked for
    and the user's overrides in order. Composing them again gives the record; ``with_overrides`` composes
    them with more overrides."""

    preset: str
    framework: str
    dataset: str
    partition: str
    head: str
    protocol: Literal["released", "corrected"] = "corrected"
    overrides: dict[str, Any] = Field(default_factory=dict)


class RunConfig(Section):
    """One cell: framework x dataset x partition x head, and every setting the run depends on.

    A record: build it with :func:`npsemiseg.config.compose` (which says where each value comes from),
    change it with :func:`npsemiseg.config.with_overrides`, read it back with :meth:`from_yaml`.
    ``inputs`` is what it was composed from (None for a record written by hand).
    """

    framework: str = "supervised"
    #: the framework's label in tables, run names and tags ("" = ``framework``); a grid's labelled frameworks
    #: (e.g. ``supervised_psmt``: the supervised reference trained on PS-MT's network) give it
    framework_label: str = ""
    #: ``released`` (the code behind the paper's numbers) or ``corrected`` (the paper done right): the switches
    #: of ``npsemiseg.protocol`` that composition applied
    protocol: Literal["released", "corrected"] = "corrected"
    framework_options: dict[str, Any] = Field(default_factory=dict)
    dataset: str = "synthetic"
    #: a canonical partition of the dataset (``"92"``; composition resolves aliases such as ``"1/16"``)
    partition: str = "1/16"
    partition_lists: Literal["u2pl", "cps"] = "u2pl"
    head: HeadConfig = Field(default_factory=HeadConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    schedule: ScheduleConfig = Field(default_factory=ScheduleConfig)
    loss: LossConfig = Field(default_factory=LossConfig)
    evaluation: EvaluationConfig = Field(default_factory=EvaluationConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    seed: NonNegativeInt = 0
    runtime: RuntimeConfig = Field(default_factory=RuntimeConfig)
    inputs: CellInputs | None = None

    # ----------------------------------------------------------------- checks
    @field_validator("framework", mode="after")
    @classmethod
    def _registered_framework(cls, value: str) -> str:
        return FRAMEWORKS.check(value)

    @model_validator(mode="before")
    @classmethod
    def _read_renamed_keys(cls, values: Any) -> Any:
        """A record written before a rename (a file, a checkpoint's configuration): its keys under their current
        names (:data:`npsemiseg.renames.RENAMED_KEYS`)."""
        return read_renamed(values) if isinstance(values, dict) else values

    @model_validator(mode="before")
    @classmethod
    def _option_names(cls, values: Any) -> Any:
        """Every free-form option dict's keys are option names (a file or ``--set`` may say anything)."""
        if isinstance(values, dict):
            _free_form_names(values)
        return values

    @model_validator(mode="wrap")
    @classmethod
    def _under_its_data_root(cls, values: Any, handler: ModelWrapValidatorHandler[RunConfig]) -> RunConfig:
        """Checked under the record's ``data.root``: a folder dataset of one's own found there is known to the
        checks, and registered nowhere (:func:`npsemiseg.data.info.dataset_root`)."""
        data = values.get("data") if isinstance(values, dict) else None
        with dataset_root(data.get("root") if isinstance(data, dict) else None):
            return handler(values)

    @field_validator("dataset", mode="after")
    @classmethod
    def _registered_dataset(cls, value: str) -> str:
        return DATASETS.check(value)

    @field_validator("framework_options", mode="after")
    @classmethod
    def _validate_framework_options(cls, value: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        """The framework's options, checked by its ``Options`` model and completed with its defaults."""
        name = info.data.get("framework")
        if name is None:  # the framework name itself failed validation
            return value
        try:
            return FRAMEWORKS.get(name).Options.model_validate(value).model_dump(mode="json")
        except ValueError as error:
            raise ValueError(f"options of framework {name!r}: {error}") from None

    @model_validator(mode="after")
    def _cell_belongs_to_its_dataset(self) -> RunConfig:
        """The partition is one of the dataset's (by its canonical name), the partition-list source one it has, and the head
        takes the options given (checked on the head class, without building it)."""
        info = self.dataset_info
        if info.resolve_partition(self.partition) != self.partition:
            raise ValueError(f"partition: expected the canonical name {info.resolve_partition(self.partition)!r} of "
                             f"{self.partition!r} (composition resolves aliases)")
        if self.partition_lists not in info.partition_list_sources:
            raise ValueError(f"partition_lists: {self.dataset} has lists {list(info.partition_list_sources)}, "
                             f"got {self.partition_lists!r}")
        try:
            head_spec(self.head.name).check_options(self.head.options)
        except (TypeError, ValueError) as error:
            raise ValueError(f"head.options for head {self.head.name!r}: {error}") from None
        return self

    def __eq__(self, other: object) -> bool:
        """Equal when every value is (``inputs``, how a record was composed, does not count)."""
        if not isinstance(other, RunConfig):
            return NotImplemented
        return self.model_dump(exclude={"inputs"}) == other.model_dump(exclude={"inputs"})

    __hash__ = None  # type: ignore[assignment]

    # ----------------------------------------------------------------- derived values
    @property
    def dataset_info(self):
        """``npsemiseg.data.dataset_info`` of this run's dataset (with its data options; a folder dataset found
        under ``data.root``)."""
        with dataset_root(self.data.root):
            return dataset_info(self.dataset, **dict(self.data.options))

    @property
    def num_classes(self) -> int:
        return self.dataset_info.num_classes

    @property
    def cell_name(self) -> str:
        """``{framework label}/{dataset}/{partition}/{head label}``: the cell's coordinates (progress lines,
        lineages)."""
        return (f"{self.framework_label or self.framework}/{self.dataset}/{self.partition}/"
                f"{self.head.label or self.head.name}")

    @property
    def run_name(self) -> str:
        """``{cell_name}/{protocol}``: the MLflow run name (one cell under both protocols is two runs, two names)."""
        return f"{self.cell_name}/{self.protocol}"

    def identity(self) -> dict[str, Any]:
        """What the cell id covers (version :data:`IDENTITY_VERSION`): the values minus
        :data:`IDENTITY_EXCLUDED` and the :data:`IDENTITY_OMITTED` fields that change nothing, plus the
        :data:`IDENTITY_RESTORED` fields where they apply, renamed keys under their version-1 names and values
        (:data:`npsemiseg.renames.RENAMED_KEYS`) (JSON types)."""
        data = self.model_dump(mode="json")
        data["schedule"].update(data["runtime"]["planned_schedule"] or {})  # an execution's re-plan: the cell's own
        omitted = [dotted for dotted, unused in IDENTITY_OMITTED if unused(data)]
        restored = [(dotted, value) for dotted, value, where in IDENTITY_RESTORED if where(data)]
        for dotted in (*omitted, *IDENTITY_EXCLUDED):
            node, leaf = _parent(data, dotted)
            node.pop(leaf)
        earlier_names(data)  # renamed keys hashed under their version-1 names: a rename keeps every id
        for dotted, value in restored:
            node, leaf = _parent(data, dotted)
            node[leaf] = value
        if IDENTITY_VERSION > 1:
            data["identity_version"] = IDENTITY_VERSION
        return data

    @property
    def cell_id(self) -> str:
        """Stable short hash: sha256 of the canonical JSON of :meth:`identity`, first 12 hex digits."""
        canonical = json.dumps(self.identity(), sort_keys=True, separators=(",", ":"), ensure_ascii=True)
        return hashlib.sha256(canonical.encode()).hexdigest()[:CELL_ID_LENGTH]

    # ----------------------------------------------------------------- YAML
    def to_yaml(self) -> str:
        """The configuration as YAML (``from_yaml(to_yaml())`` gives an equal config, its ``inputs`` too)."""
        return yaml.dump(self.model_dump(mode="json"), Dumper=_YAML_DUMPER, sort_keys=False)

    @classmethod
    def from_yaml(cls, source: str | Path, *, where: str | None = None) -> RunConfig:
        """A config from YAML text or a ``.yaml``/``.yml`` file path (read within a budget:
        :func:`npsemiseg.untrusted.load_yaml`); ``where`` names the text in errors (default: the file, if any)."""
        path = None
        if isinstance(source, Path) or (isinstance(source, str) and "\n" not in source and source.endswith((".yaml", ".yml"))):
            path = Path(source)
            if not path.is_file():
                raise ValueError(f"source: configuration file {path} does not exist")
            source = path.read_text()
        data = load_yaml(source, where=where or (f"configuration {path}" if path else "configuration"), path=path)
        if not isinstance(data, dict):
            raise ValueError(f"source: expected a YAML mapping of configuration sections, got {type(data).__name__}")
        return cls.model_validate(data)


def _parent(data: dict[str, Any], dotted: str) -> tuple[dict[str, Any], str]:
    """The dict that holds dotted key ``dotted`` of nested ``data``, and the key's last part."""
    *parents, leaf = dotted.split(".")
    for key in parents:
        data = data[key]
    return data, leaf
