"""The run configuration: the single, validated description of one cell of the study.

A :class:`RunConfig` names the framework, dataset, partition and classifier head and
fixes everything else a run depends on (model, optimisation, schedule, supervised
loss, evaluation, data, seed). Every section forbids unknown keys and the whole
object is frozen; changes go through :meth:`RunConfig.with_overrides`, which
re-validates. The ``runtime`` section (device, AMP, SyncBN, progress, where
checkpoints go) says *how* a run is executed, not *what* it computes, and is left
out of :attr:`RunConfig.cell_id`.

Presets (:meth:`RunConfig.from_preset`): ``paper`` holds the paper's settings per
dataset family and framework (sources cited next to each value in
``npsemiseg/presets.py``); ``smoke`` is a tiny model on tiny synthetic images that
trains in seconds on one CPU core.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
from pathlib import Path
from typing import Any, Literal, Mapping

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

from npsemiseg.frameworks.losses import SampleCE

#: Sections whose fields never change what a run computes (left out of ``cell_id``).
IDENTITY_EXCLUDED: tuple[str, ...] = ("runtime", "data.root", "data.num_workers")

CELL_ID_LENGTH = 12

# libyaml's safe loader/dumper when available (10x faster than the pure-Python ones, same output)
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_YAML_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)

HEAD_NAMES: tuple[str, ...] = ("baseline", "mc_dropout", "np")


class Section(BaseModel):
    """Base of every configuration section: unknown keys rejected, immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True, coerce_numbers_to_str=True)


class HeadConfig(Section):
    """The classifier head: which class (``name``), its label in tables (``variant``), its options.

    ``options`` are keyword arguments of ``npsemiseg.heads.build_head(name, ...)``, checked by
    building the head once. ``sample_ce``: cross-entropy over the S predictions, ``elbo`` (mean of
    per-sample CEs, the paper) or ``mean_logits`` (CE of the mean logits, the authors' code).
    """

    name: Literal["baseline", "mc_dropout", "np"] = "baseline"
    variant: str = ""
    options: dict[str, Any] = Field(default_factory=dict)
    sample_ce: SampleCE = "elbo"

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

    variant: Literal["u2pl", "augseg", "psmt"] = "u2pl"
    backbone: Literal["resnet50", "resnet101", "resnet_small"] = "resnet50"
    weights: str | None = "imagenet"
    deep_stem: bool = False
    aux_head: bool = False
    representation_head: bool | None = None
    mc_dropout_scope: Literal["decoder", "head"] = "decoder"
    options: dict[str, Any] = Field(default_factory=dict)


class OptimConfig(Section):
    """SGD with momentum; the head (everything but the backbone) at ``lr x head_lr_mult``."""

    lr: PositiveFloat = 1e-3
    head_lr_mult: PositiveFloat = 10.0
    momentum: float = Field(0.9, ge=0.0, lt=1.0)
    weight_decay: float = Field(1e-4, ge=0.0)
    nesterov: bool = False
    #: max global gradient norm (None = no clipping)
    grad_clip: PositiveFloat | None = None


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
    """

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


class DataConfig(Section):
    """Where the data is and how it is read and augmented.

    ``options`` go to ``dataset_info``/``build_dataset`` (synthetic generator settings such as
    ``train_size``, ``image_size``). ``augmentation``: keyword arguments of
    ``npsemiseg.data.transforms.train_transform`` besides the crop (``resize``, ``scale_range``,
    ``base_size``, ``strong``, ``flip``, ``label_pad_value``); empty = the framework's pipeline
    from ``paper_augmentation(framework, dataset family)``. ``labeled_strong_view``: labeled images
    also get the strong view (None = when the framework's ``strong_labeled`` option asks: PS-MT,
    whose student sees labeled images strongly augmented).
    """

    root: str | None = None
    num_workers: NonNegativeInt = 4
    options: dict[str, Any] = Field(default_factory=dict)
    augmentation: dict[str, Any] = Field(default_factory=dict)
    labeled_strong_view: bool | None = None


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


def _dataset_info(dataset: str, options: Mapping[str, Any] | None = None):
    from npsemiseg.data import dataset_info

    return dataset_info(dataset, **dict(options or {}))


class RunConfig(Section):
    """One cell: framework x dataset x partition x head, and every setting the run depends on.

    Construct with :meth:`from_preset`; change with :meth:`with_overrides` (dotted keys).
    Validation resolves defaults that depend on other fields (partition aliases such as
    ``"1/16"``, the head variant label, the framework's option defaults, the evaluation
    convention of the dataset), so two configs that run the same cell compare and hash equal.
    """

    framework: str = "supervised"
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
    @field_validator("framework_options", mode="after")
    @classmethod
    def _validate_framework_options(cls, value: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        name = info.data.get("framework")
        if name is None:  # the framework name itself failed validation
            return value
        from npsemiseg.frameworks import get_framework

        options_cls = get_framework(name).Options
        try:
            return options_cls.model_validate(value).model_dump(mode="json")
        except ValueError as error:
            raise ValueError(f"options of framework {name!r}: {error}") from None

    @field_validator("framework", mode="after")
    @classmethod
    def _known_framework(cls, value: str) -> str:
        from npsemiseg.frameworks import FRAMEWORK_MODULES

        if value not in FRAMEWORK_MODULES:
            raise ValueError(f"expected one of {list(FRAMEWORK_MODULES)}, got {value!r}")
        return value

    @model_validator(mode="after")
    def _resolve_dependent_fields(self) -> RunConfig:
        info = _dataset_info(self.dataset, self.data.options)
        partition = info.resolve_partition(self.partition)
        if self.list_variant not in info.list_variants:
            raise ValueError(f"list_variant: {self.dataset} has lists {list(info.list_variants)}, got {self.list_variant!r}")
        evaluation = self.evaluation
        mode = evaluation.mode or info.eval_mode
        crop = evaluation.crop_size or info.eval_crop_size
        stride = evaluation.stride
        if stride is None and mode in ("sliding", "sliding_global"):
            stride = math.ceil(crop * 2 / 3)
        model = self.model
        if model.representation_head is None:
            model = model.model_copy(update={"representation_head": self.framework == "u2pl"})
        _check_head_options(self.head, info.num_classes)
        data = self.data.model_copy(update={
            "augmentation": _resolve_augmentation(self.framework, info, self.data.augmentation),
            # None: as the framework asks (PS-MT's ``strong_labeled`` option; no other framework uses it)
            "labeled_strong_view": bool(self.framework_options.get("strong_labeled", False))
            if self.data.labeled_strong_view is None else self.data.labeled_strong_view,
        })
        # frozen model: the resolved values are written once, here, before anyone sees the object
        object.__setattr__(self, "partition", partition)
        object.__setattr__(self, "model", model)
        object.__setattr__(self, "data", data)
        object.__setattr__(self, "evaluation", evaluation.model_copy(update={"mode": mode, "crop_size": crop, "stride": stride}))
        return self

    # ----------------------------------------------------------------- derived values
    @property
    def dataset_info(self):
        """``npsemiseg.data.dataset_info`` of this run's dataset (with its data options)."""
        return _dataset_info(self.dataset, self.data.options)

    @property
    def num_classes(self) -> int:
        return self.dataset_info.num_classes

    @property
    def cell_name(self) -> str:
        """``{framework}/{dataset}/{partition}/{head variant}``: the MLflow run name."""
        return f"{self.framework}/{self.dataset}/{self.partition}/{self.head.variant}"

    def identity(self) -> dict[str, Any]:
        """The resolved configuration minus the fields in ``IDENTITY_EXCLUDED`` (JSON types)."""
        data = self.model_dump(mode="json")
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
        framework_defaults = dict.fromkeys(_framework_option_keys(), NOT_APPLICABLE)
        data["framework_options"] = {**framework_defaults, **data["framework_options"]}
        data["head"]["options"] = {**_head_option_defaults(self.head.name), **data["head"]["options"]}
        data["data"]["augmentation"] = {**_augmentation_defaults(), **data["data"]["augmentation"]}
        out: dict[str, str] = {}

        def walk(prefix: str, value: Any) -> None:
            if isinstance(value, dict) and value:
                for key, item in value.items():
                    walk(f"{prefix}.{key}" if prefix else str(key), item)
            else:
                out[prefix] = value if isinstance(value, str) else json.dumps(value)

        walk("", data)
        return out

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
        **overrides: Any,
    ) -> RunConfig:
        """A preset (``"paper"`` or ``"smoke"``) for one cell, then ``overrides``.

        ``overrides``: dotted keys (``**{"optim.lr": 0.01}``) or sections (``optim={"lr": 0.01}``),
        applied as by :meth:`with_overrides`; a dict given for an option dict (``framework_options``,
        ``head.options``, ``model.options``, ``data.options``, ``data.augmentation``) is merged into
        the preset's.
        """
        from npsemiseg.presets import preset_values

        values = preset_values(preset, framework=framework, dataset=dataset, partition=str(partition), head=head)
        merged = _apply_overrides(values, overrides)
        return cls.model_validate(merged)

    def with_overrides(self, overrides: Mapping[str, Any] | None = None, **kwargs: Any) -> RunConfig:
        """A new config with dotted-key overrides applied and everything re-validated.

        String values are parsed as YAML scalars (``"0.01"`` -> 0.01, ``"null"`` -> None) so
        command-line ``key=value`` pairs work. Unknown keys -> ``ValueError`` naming the key.
        Changing ``framework`` (``head.name``) starts that framework's (head's) options afresh.
        """
        changes = {**dict(overrides or {}), **kwargs}
        values = self.model_dump(mode="json")
        if "framework" in changes and changes["framework"] != self.framework:
            values["framework_options"] = {}
            values["data"]["augmentation"] = {}
            values["data"]["labeled_strong_view"] = None
        new_head = changes.get("head.name", (changes.get("head") or {}).get("name") if isinstance(changes.get("head"), Mapping) else None)
        if new_head is not None and new_head != self.head.name:
            values["head"]["options"] = {}
            if self.head.variant == self.head.name:
                values["head"]["variant"] = ""
        return type(self).model_validate(_apply_overrides(values, changes))

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


def _resolve_augmentation(framework: str, info: Any, given: Mapping[str, Any]) -> dict[str, Any]:
    """The training augmentation: the framework's paper pipeline updated with ``given``, checked
    against ``train_transform``'s keywords (unknown keys -> ValueError naming them).

    On synthetic data a long-side resize is relative to the synthetic image size, not VOC's 500 px.
    """
    import inspect

    from npsemiseg.data.transforms import paper_augmentation, train_transform
    from npsemiseg.presets import dataset_family

    allowed = set(inspect.signature(train_transform).parameters) - {"crop_size"}
    unknown = sorted(set(given) - allowed)
    if unknown:
        raise ValueError(f"data.augmentation: unknown key(s) {unknown}, expected some of {sorted(allowed)}")
    paper = paper_augmentation(framework, dataset_family(info.name))
    if info.synthetic and paper.get("base_size") is not None:
        size = info.options.get("image_size", 64)
        paper["base_size"] = int(max(size) if isinstance(size, (tuple, list)) else size)
    resolved = {**paper, **dict(given)}
    if "scale_range" in resolved and resolved["scale_range"] is not None:
        resolved["scale_range"] = [float(v) for v in resolved["scale_range"]]
    return resolved


#: ``flat()``'s value of an option that the cell's framework or head does not take
NOT_APPLICABLE = "n/a"


@functools.lru_cache(maxsize=1)
def _framework_option_keys() -> tuple[str, ...]:
    """Every option name of every framework (sorted)."""
    from npsemiseg.frameworks import framework_names, get_framework

    return tuple(sorted({key for name in framework_names() for key in get_framework(name).Options.model_fields}))


@functools.lru_cache(maxsize=len(HEAD_NAMES))
def _head_option_defaults(name: str) -> dict[str, Any]:
    """Every option name of every head -> head ``name``'s default (JSON types), or ``NOT_APPLICABLE``."""
    import inspect

    from npsemiseg.heads.factory import head_options

    keys = sorted({key for head in HEAD_NAMES for key in head_options(head)})
    own = {key: value for key, value in head_options(name).items() if value is not inspect.Parameter.empty}
    return {key: _json_value(own[key]) if key in own else NOT_APPLICABLE for key in keys}


@functools.lru_cache(maxsize=1)
def _augmentation_defaults() -> dict[str, Any]:
    """``train_transform``'s keywords besides the crop -> their defaults (JSON types)."""
    import inspect

    from npsemiseg.data.transforms import train_transform

    parameters = inspect.signature(train_transform).parameters.values()
    return {p.name: _json_value(p.default) for p in parameters if p.name != "crop_size"}


def _json_value(value: Any) -> Any:
    """A default as it reads after a JSON round trip (tuples become lists)."""
    return json.loads(json.dumps(value))


def _check_head_options(head: HeadConfig, num_classes: int) -> None:
    """Build the head once on a tiny input width so unknown or invalid options fail here, by name."""
    error = _head_options_error(head.name, json.dumps(head.options, sort_keys=True), num_classes)
    if error is not None:
        raise ValueError(f"head.options for head {head.name!r}: {error}")


@functools.lru_cache(maxsize=256)
def _head_options_error(name: str, options_json: str, num_classes: int) -> str | None:
    """The error building head ``name`` with these options gives, or None (cached: grids repeat them).

    Under a forked RNG: creating a config must not move torch's global random state."""
    import torch

    from npsemiseg.heads import build_head

    try:
        with torch.random.fork_rng(devices=[]):
            build_head(name, 16, num_classes, **json.loads(options_json))
    except (TypeError, ValueError) as error:
        return str(error)
    return None


def _parse_scalar(value: Any) -> Any:
    """A command-line string as the value it spells: ``"null"`` -> None, ``"true"`` -> True,
    ``"3"`` -> 3, ``"1e-3"`` -> 0.001, ``"[1, 2]"`` -> [1, 2]; anything else stays a string
    (YAML 1.1's ``on``/``off``/``yes``/``no`` are *not* booleans here)."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    lowered = text.lower()
    if lowered in ("null", "~"):  # not "none": a valid string value of some options (ema_buffers)
        return None
    if lowered in ("true", "false"):
        return lowered == "true"
    for number in (int, float):
        try:
            return number(text)
        except ValueError:
            pass
    if text[:1] in "[{" and text[-1:] in "]}":
        try:
            return yaml.safe_load(text)
        except yaml.YAMLError:
            return value
    return value


def _apply_overrides(values: dict[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Apply dotted-key or section overrides to a nested dict of configuration values.

    Keys must exist in :class:`RunConfig`'s schema, except below free-form option dicts
    (``framework_options``, ``head.options``, ``model.options``, ``data.options``), which their
    own validators check. Raises ``ValueError`` naming an unknown key.
    """
    result = json.loads(json.dumps(values))  # deep copy of plain data
    for key, raw in overrides.items():
        if isinstance(raw, Mapping) and key in _section_models():
            for sub, item in raw.items():
                _set_dotted(result, f"{key}.{sub}", item)
        else:
            _set_dotted(result, key, raw)
    return result


def _section_models() -> dict[str, type[BaseModel]]:
    return {
        name: field.annotation
        for name, field in RunConfig.model_fields.items()
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)
    }


_FREE_FORM = {"framework_options", "head.options", "model.options", "data.options", "data.augmentation"}


def _set_dotted(values: dict[str, Any], key: str, raw: Any) -> None:
    parts = key.split(".")
    model: type[BaseModel] | None = RunConfig
    node = values
    path: list[str] = []
    for index, part in enumerate(parts):
        path.append(part)
        dotted = ".".join(path)
        last = index == len(parts) - 1
        if model is not None:
            if part not in model.model_fields:
                valid = ", ".join(sorted(model.model_fields))
                where = ".".join(path[:-1]) or "the configuration"
                raise ValueError(f"unknown configuration key {key!r}: {where} has no field {part!r} (valid: {valid})")
            annotation = model.model_fields[part].annotation
            next_model = annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None
            if not last and next_model is None and dotted not in _FREE_FORM:
                raise ValueError(f"unknown configuration key {key!r}: {dotted} is a value, not a section")
        else:
            next_model = None
        if last:
            if isinstance(raw, Mapping) and isinstance(node.get(part), dict):
                if dotted in _FREE_FORM:  # option dicts are merged: the preset's other options stay
                    node[part] = {**node[part], **{k: _parse_scalar(v) for k, v in raw.items()}}
                else:
                    for sub, item in raw.items():
                        _set_dotted(values, f"{key}.{sub}", item)
            else:
                node[part] = _parse_scalar(raw)
            return
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
        model = next_model
