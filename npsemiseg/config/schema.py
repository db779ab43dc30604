"""The schema of the run configuration: one frozen pydantic model per section and :class:`RunConfig`.

Names of frameworks, heads, datasets, model variants and backbones are checked against their
registries (the same unknown-name error everywhere); fields that depend on others are resolved by
:mod:`npsemiseg.config.resolve` while validating.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    ValidationInfo,
    field_validator,
    model_validator,
)

from npsemiseg.config.overrides import apply_overrides
from npsemiseg.config.resolve import (
    NOT_APPLICABLE,
    augmentation_defaults,
    framework_option_keys,
    head_option_defaults,
    resolved_values,
)
from npsemiseg.constants import SampleCE
from npsemiseg.data import dataset_info
from npsemiseg.data.info import DATASETS
from npsemiseg.frameworks import FRAMEWORKS
from npsemiseg.heads import HEADS
from npsemiseg.models import BACKBONES, MODEL_VARIANTS
from npsemiseg.presets import follow_head_settings, preset_values
from npsemiseg.protocol import SWITCH_PREFIX, apply_protocol, switch_overrides, switch_values

#: Sections whose fields never change what a run computes (left out of ``cell_id``).
IDENTITY_EXCLUDED: tuple[str, ...] = ("runtime", "data.root", "data.num_workers")

CELL_ID_LENGTH = 12

# libyaml's safe loader/dumper when available (10x faster than the pure-Python ones, same output)
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_YAML_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


class Section(BaseModel):
    """Base of every configuration section: unknown keys rejected, immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True, coerce_numbers_to_str=True)


class HeadConfig(Section):
    """The classifier head: which class (``name``), its label in tables (``variant``), its options.

    ``name``: a registered head (``npsemiseg.heads.head_names()``). ``options`` are keyword arguments of
    ``npsemiseg.heads.build_head(name, ...)``, checked against the head class. ``sample_ce``:
    cross-entropy over the S predictions, ``elbo`` (mean of
    per-sample CEs, the paper) or ``mean_logits`` (CE of the mean logits, the authors' code).
    """

    name: str = "baseline"
    variant: str = ""
    options: dict[str, Any] = Field(default_factory=dict)
    sample_ce: SampleCE = "elbo"

    @field_validator("name", mode="after")
    @classmethod
    def _registered_head(cls, value: str) -> str:
        return HEADS.check(value)

    @model_validator(mode="before")
    @classmethod
    def _variant_defaults_to_name(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and not data.get("variant"):
            data = {**data, "variant": data.get("name", "baseline")}
        return data


class ModelConfig(Section):
    """The segmentor: DeepLabv3+ variant, backbone and optional heads (``build_segmentor`` arguments).

    ``weights``: None = random init, ``"imagenet"`` = torchvision's ImageNet weights, or a file path.
    ``representation_head``: None = as the framework needs (U2PL's contrastive loss needs it).
    ``options``: further ``build_segmentor`` keyword arguments (widths, output stride, ...).
    """

    variant: str = "u2pl"
    backbone: str = "resnet50"
    weights: str | None = "imagenet"
    deep_stem: bool = False
    aux_head: bool = False
    representation_head: bool | None = None
    mc_dropout_scope: Literal["decoder", "head"] = "decoder"
    #: bilinear upsampling of logits to label size (losses, pseudo-labels, evaluation) with align_corners=True
    #: (every official model) or False; switch ``align_corners``
    align_corners: bool = False
    options: dict[str, Any] = Field(default_factory=dict)

    @field_validator("variant", mode="after")
    @classmethod
    def _registered_variant(cls, value: str) -> str:
        return MODEL_VARIANTS.check(value)

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
    unlabeled_batch_size: PositiveInt | None = None
    crop_size: PositiveInt = 480
    poly_power: float = Field(0.9, ge=0.0)
    epoch_length: Literal["unlabeled", "labeled"] = "unlabeled"
    #: ``shared`` (one crop and batch for every head of a framework) or ``per_head`` (the baseline head at the
    #: framework's own publication settings); the preset derives ``crop_size`` and the batches from it
    #: (``npsemiseg.presets.head_schedule``); switch ``head_settings``
    head_settings: Literal["per_head", "shared"] = "shared"
    eval_every_epochs: NonNegativeInt = 0
    checkpoint_every_steps: NonNegativeInt = 0

    @model_validator(mode="before")
    @classmethod
    def _unlabeled_batch_defaults_to_labeled(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and data.get("unlabeled_batch_size") is None:
            data = {**data, "unlabeled_batch_size": data.get("batch_size", 3)}
        return data


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
    ceil(2/3 x crop) for sliding modes (U2PL). ``num_samples`` = T predictions per pixel.
    PAvPU follows Mukhoti & Gal: ``pavpu_window`` patches, accurate if accuracy >=
    ``pavpu_accuracy_threshold``, uncertain if mean entropy >= ``pavpu_uncertainty_threshold``.
    ``max_images`` evaluates only the first images of the validation set (None = all).
    ``select``: the weights a run reports, ``last`` (the last epoch's) or ``best`` (the evaluation with the
    best validation mIoU among those every ``schedule.eval_every_epochs`` epochs and the final one, restored
    at the end); both the last and the best metrics are logged whatever the selection. ``select_from_epoch``: the
    evaluations after fewer completed epochs are not candidates for ``best`` (CPS's MeanTeacher: epochs 20-34).
    ``split``: the images evaluated, ``val`` (what the tables report) or ``tune`` (the study dataset's
    held-out tuning split, where settings are chosen: never on val).
    """

    split: Literal["val", "tune"] = "val"
    mode: Literal["whole", "center_crop", "sliding", "sliding_global"] | None = None
    crop_size: PositiveInt | None = None
    stride: PositiveInt | None = None
    num_samples: PositiveInt = 5
    batch_size: PositiveInt = 1
    pavpu_window: PositiveInt = 64
    pavpu_accuracy_threshold: float = Field(0.5, ge=0.0, le=1.0)
    pavpu_uncertainty_threshold: float = Field(0.4, ge=0.0)
    max_images: PositiveInt | None = None
    figures: bool = True
    select: Literal["last", "best"] = "last"
    select_from_epoch: NonNegativeInt = 0


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
    """

    root: str | None = None
    num_workers: NonNegativeInt = 4
    options: dict[str, Any] = Field(default_factory=dict)
    augmentation: dict[str, Any] = Field(default_factory=dict)
    labeled_strong_view: bool | None = None
    unlabeled_truth: Literal["hidden", "measured", "oracle"] = "hidden"


class RuntimeConfig(Section):
    """How a run executes (not part of ``cell_id``).

    ``device``: ``auto`` = CUDA when available. ``amp``: bf16 autocast (GPU only). ``sync_bn``:
    SyncBatchNorm under DDP on GPU. ``deterministic``: ``torch.use_deterministic_algorithms``.
    ``progress``: a tqdm bar; ``auto`` = when the callbacks are interactive.
    ``output_dir``: where the run writes ``checkpoints/``, ``figures/`` and ``tables/`` (None = no
    checkpoints; figures and tables go to a temporary directory that lives while the callbacks'
    ``on_artifact`` copies them). ``keep_checkpoints``: how many of the newest checkpoints stay.
    ``stop_at_step``: end after this many steps with a checkpoint, as if pre-empted (resume tests,
    time-sliced workers).
    """

    device: Literal["auto", "cpu", "cuda"] = "auto"
    amp: bool = True
    sync_bn: bool = True
    deterministic: bool = False
    progress: Literal["auto", "on", "off"] = "auto"
    output_dir: str | None = None
    keep_checkpoints: PositiveInt = 2
    stop_at_step: PositiveInt | None = None


class RunConfig(Section):
    """One cell: framework x dataset x partition x head, and every setting the run depends on.

    Construct with :meth:`from_preset`; change with :meth:`with_overrides` (dotted keys).
    Validation resolves defaults that depend on other fields (partition aliases such as
    ``"1/16"``, the head variant label, the framework's option defaults, the evaluation
    convention of the dataset), so two configs that run the same cell compare and hash equal.
    """

    framework: str = "supervised"
    #: the framework's label in tables, run names and tags (default: ``framework``); a grid's framework variants
    #: (e.g. ``supervised_psmt``: the supervised reference trained on PS-MT's network) give it
    framework_variant: str = ""
    #: ``released`` (the code behind the paper's numbers) or ``corrected`` (the paper done right); sets the
    #: switches of ``npsemiseg.protocol`` in :meth:`from_preset` and :meth:`with_overrides`
    protocol: Literal["released", "corrected"] = "corrected"
    framework_options: dict[str, Any] = Field(default_factory=dict)
    dataset: str = "synthetic"
    partition: str = "1/16"
    list_variant: Literal["u2pl", "cps"] = "u2pl"
    head: HeadConfig = Field(default_factory=HeadConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    schedule: ScheduleConfig = Field(default_factory=ScheduleConfig)
    loss: LossConfig = Field(default_factory=LossConfig)
    evaluation: EvaluationConfig = Field(default_factory=EvaluationConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    seed: NonNegativeInt = 0
    runtime: RuntimeConfig = Field(default_factory=RuntimeConfig)

    # ----------------------------------------------------------------- validation
    @model_validator(mode="before")
    @classmethod
    def _framework_variant_defaults_to_framework(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and not data.get("framework_variant"):
            data = {**data, "framework_variant": data.get("framework", "supervised")}
        return data

    @field_validator("framework", mode="after")
    @classmethod
    def _registered_framework(cls, value: str) -> str:
        return FRAMEWORKS.check(value)

    @field_validator("dataset", mode="after")
    @classmethod
    def _registered_dataset(cls, value: str) -> str:
        return DATASETS.check(value)

    @field_validator("framework_options", mode="after")
    @classmethod
    def _validate_framework_options(cls, value: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        name = info.data.get("framework")
        if name is None:  # the framework name itself failed validation
            return value
        try:
            return FRAMEWORKS.get(name).Options.model_validate(value).model_dump(mode="json")
        except ValueError as error:
            raise ValueError(f"options of framework {name!r}: {error}") from None

    @model_validator(mode="wrap")
    @classmethod
    def _resolve_dependent_fields(cls, data: Any, handler: Any) -> RunConfig:
        """Validate, then (when a dependent field was unresolved) validate the resolved values once more:
        the object anyone sees is built with its resolved values, never changed afterwards."""
        config = handler(data)
        values = resolved_values(config)
        if values == config.model_dump(mode="json"):
            return config
        return handler(values)

    # ----------------------------------------------------------------- derived values
    @property
    def dataset_info(self):
        """``npsemiseg.data.dataset_info`` of this run's dataset (with its data options)."""
        return dataset_info(self.dataset, **dict(self.data.options))

    @property
    def num_classes(self) -> int:
        return self.dataset_info.num_classes

    @property
    def cell_name(self) -> str:
        """``{framework variant}/{dataset}/{partition}/{head variant}``: the cell's coordinates (progress lines,
        lineages)."""
        return f"{self.framework_variant}/{self.dataset}/{self.partition}/{self.head.variant}"

    @property
    def run_name(self) -> str:
        """``{cell_name}/{protocol}``: the MLflow run name (one cell under both protocols is two runs, two names)."""
        return f"{self.cell_name}/{self.protocol}"

    def identity(self) -> dict[str, Any]:
        """The resolved configuration minus the fields in ``IDENTITY_EXCLUDED`` (JSON types)."""
        data = self.model_dump(mode="json")
        if data["optim"]["lr_scaling"] == "none":  # no effect on training: cells keep the ids they had before
            del data["optim"]["lr_scaling"], data["optim"]["reference_batch"]
        if data["framework_variant"] == data["framework"]:  # cells without a variant keep the ids they had before
            del data["framework_variant"]
        if data["data"]["unlabeled_truth"] == "hidden":  # likewise every cell of a study (the diagnostics are new)
            del data["data"]["unlabeled_truth"]
        for dotted in IDENTITY_EXCLUDED:
            *parents, leaf = dotted.split(".")
            node = data
            for key in parents:
                node = node[key]
            node.pop(leaf)
        return data

    @property
    def cell_id(self) -> str:
        """Stable short hash: sha256 of the canonical JSON of :meth:`identity`, first 12 hex digits."""
        canonical = json.dumps(self.identity(), sort_keys=True, separators=(",", ":"), ensure_ascii=True)
        return hashlib.sha256(canonical.encode()).hexdigest()[:CELL_ID_LENGTH]

    def flat(self) -> dict[str, str]:
        """Every setting as ``{"optim.lr": "0.001", ...}`` (dotted keys, string values; MLflow params).

        The key set is the same for every cell, whatever its framework and head, so MLflow's
        compare view lines cells up: ``framework_options.*`` lists the options of *every*
        framework, ``head.options.*`` those of every head and ``data.augmentation.*`` every
        ``train_transform`` keyword; each holds the cell's value, else the default of the cell's
        framework/head/transform, else :data:`NOT_APPLICABLE` (an option the cell's framework or
        head does not take). Free-form dicts (``model.options``, ``data.options``) are as given.
        """
        data = self.model_dump(mode="json")
        framework_defaults = dict.fromkeys(framework_option_keys(), NOT_APPLICABLE)
        data["framework_options"] = {**framework_defaults, **data["framework_options"]}
        data["head"]["options"] = {**head_option_defaults(self.head.name), **data["head"]["options"]}
        data["data"]["augmentation"] = {**augmentation_defaults(), **data["data"]["augmentation"]}
        out: dict[str, str] = {}
        _flatten("", data, out)
        _flatten(SWITCH_PREFIX.rstrip("."), self.switches(), out)
        return out

    def switches(self) -> dict[str, Any]:
        """Every switch of ``npsemiseg.protocol`` -> its value in this config (``n/a`` where it does not apply)."""
        return switch_values(self.model_dump(mode="json"))

    # ----------------------------------------------------------------- construction
    @classmethod
    def from_preset(
        cls,
        preset: str,
        *,
        framework: str = "supervised",
        dataset: str = "synthetic",
        partition: str | int = "1/16",
        head: str = "baseline",
        protocol: str = "corrected",
        **overrides: Any,
    ) -> RunConfig:
        """A preset (``"paper"`` or ``"smoke"``) for one cell under ``protocol``, then ``overrides``.

        ``overrides``: dotted keys (``**{"optim.lr": 0.01}``) or sections (``optim={"lr": 0.01}``),
        applied as by :meth:`with_overrides`; a dict given for an option dict (``framework_options``,
        ``head.options``, ``model.options``, ``data.options``, ``data.augmentation``) is merged into
        the preset's. ``switches.<name>`` keys set one switch of ``npsemiseg.protocol`` (they win over the protocol).
        """
        values = preset_values(preset, framework=framework, dataset=dataset, partition=str(partition), head=head,
                               protocol=protocol)
        changes = switch_overrides(overrides)
        merged = follow_head_settings(values, apply_overrides(cls, values, changes), changes)
        return cls.model_validate(merged)

    def with_overrides(self, overrides: Mapping[str, Any] | None = None, **kwargs: Any) -> RunConfig:
        """A new config with dotted-key overrides applied and everything re-validated.

        String values are parsed as YAML scalars (``"0.01"`` -> 0.01, ``"null"`` -> None) so
        command-line ``key=value`` pairs work. Unknown keys -> ``ValueError`` naming the key.
        Changing ``framework`` (``head.name``) starts that framework's (head's) options afresh. Changing
        ``protocol``, ``framework``, ``dataset`` or ``head.name`` writes the protocol's switches for the new
        cell before the other changes; ``switches.<name>`` keys set one switch (they win over the protocol).
        """
        changes = switch_overrides({**dict(overrides or {}), **kwargs})
        values = self.model_dump(mode="json")
        if "framework" in changes and changes["framework"] != self.framework:
            if self.framework_variant == self.framework:
                values["framework_variant"] = ""
            values["framework_options"] = {}
            values["data"]["augmentation"] = {}
            values["data"]["labeled_strong_view"] = None
        new_head = changes.get(
            "head.name", (changes.get("head") or {}).get("name") if isinstance(changes.get("head"), Mapping) else None
        )
        if new_head is not None and new_head != self.head.name:
            values["head"]["options"] = {}
            if self.head.variant == self.head.name:
                values["head"]["variant"] = ""
        if "evaluation.crop_size" in changes and "evaluation.stride" not in changes and self._derived_stride():
            values["evaluation"]["stride"] = None  # the derived stride follows the new crop
        after = apply_overrides(type(self), _reapply_protocol(type(self), values, changes), changes)
        return type(self).model_validate(follow_head_settings(self.model_dump(mode="json"), after, changes))

    def _derived_stride(self) -> bool:
        """Whether the evaluation stride is the one derived from the crop (ceil(2/3 x crop))."""
        evaluation = self.evaluation
        return evaluation.stride is not None and evaluation.stride == math.ceil(evaluation.crop_size * 2 / 3)

    # ----------------------------------------------------------------- YAML
    def to_yaml(self) -> str:
        """The resolved configuration as YAML (``from_yaml(to_yaml())`` gives an equal config)."""
        return yaml.dump(self.model_dump(mode="json"), Dumper=_YAML_DUMPER, sort_keys=False)

    @classmethod
    def from_yaml(cls, source: str | Path) -> RunConfig:
        """A config from YAML text or a ``.yaml``/``.yml`` file path."""
        if isinstance(source, Path) or (isinstance(source, str) and "\n" not in source and source.endswith((".yaml", ".yml"))):
            path = Path(source)
            if not path.is_file():
                raise ValueError(f"source: configuration file {path} does not exist")
            source = path.read_text()
        data = yaml.load(source, Loader=_YAML_LOADER)
        if not isinstance(data, dict):
            raise ValueError(f"source: expected a YAML mapping of configuration sections, got {type(data).__name__}")
        return cls.model_validate(data)


def _reapply_protocol(root: type[RunConfig], values: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """``values`` with the protocol's switches written for the cell ``changes`` make, when they change the
    protocol or the cell (framework, dataset, head); the explicit ``changes`` are applied afterwards."""
    cell_keys = ("protocol", "framework", "dataset", "head.name", "head")
    if not any(key in changes for key in cell_keys):
        return values
    cell = apply_overrides(root, values, {k: v for k, v in changes.items() if k in cell_keys})
    return apply_protocol(cell, cell.get("protocol", "corrected"))


def _flatten(prefix: str, value: Any, out: dict[str, str]) -> None:
    """``out[dotted key] = string value`` for every leaf of a nested dict (empty dicts are leaves)."""
    if isinstance(value, dict) and value:
        for key, item in value.items():
            _flatten(f"{prefix}.{key}" if prefix else str(key), item, out)
    else:
        out[prefix] = value if isinstance(value, str) else json.dumps(value)
