"""What each dataset is: classes, partition protocols, evaluation convention.

``dataset_info(name)`` is the single place the config, the training loop and the
table code learn a dataset's class count, class names, partition names (with the
"1/16"-style aliases of the paper) and default evaluation mode. Synthetic
stand-ins (``synthetic_voc``, ``synthetic_blender``, ``synthetic_cityscapes``)
carry the partition *names* of the real dataset they mimic, with labeled counts
scaled to the synthetic train-set size (same labeled ratio).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction

from npsemiseg._registry import Registry
from npsemiseg.constants import IGNORE_INDEX
from npsemiseg.data.synthetic import SyntheticConfig

VOC_CLASSES: tuple[str, ...] = (
    "background", "aeroplane", "bicycle", "bird", "boat", "bottle", "bus", "car", "cat",
    "chair", "cow", "diningtable", "dog", "horse", "motorbike", "person", "pottedplant",
    "sheep", "sofa", "train", "tvmonitor",
)
CITYSCAPES_CLASSES: tuple[str, ...] = (
    "road", "sidewalk", "building", "wall", "fence", "pole", "traffic light", "traffic sign",
    "vegetation", "terrain", "sky", "person", "rider", "car", "truck", "bus", "train",
    "motorcycle", "bicycle",
)

#: Full train-set sizes of the real datasets (the denominators of the label ratios).
VOC_TRAIN_AUG_SIZE = 10582
CITYSCAPES_TRAIN_SIZE = 2975

_FRACTIONS = ("1/16", "1/8", "1/4", "1/2")


@dataclass(frozen=True)
class DatasetInfo:
    """Static description of one dataset.

    partitions: partition name -> number of labeled images (for synthetic datasets: at the
    default ``train_size``; ``dataset_info(name, train_size=...)`` gives other sizes).
    partition_aliases: "1/16" -> "92" etc. (the paper's protocol names).
    list_variants: the partition-list variants available ("u2pl", and "cps" where CPS's
    lists differ; classic VOC has one set, which both names select).
    eval_mode / eval_crop_size: the evaluation convention (VOC center crop 513,
    Cityscapes sliding window 769, both U2PL's).
    real_dataset: for a synthetic stand-in, the dataset whose protocol it mimics.
    """

    name: str
    num_classes: int
    class_names: tuple[str, ...]
    partitions: Mapping[str, int]
    partition_aliases: Mapping[str, str]
    eval_mode: str
    eval_crop_size: int
    train_size: int
    val_size: int
    list_variants: tuple[str, ...] = ("u2pl",)
    real_dataset: str | None = None
    synthetic: bool = False
    ignore_index: int = IGNORE_INDEX
    options: Mapping[str, object] = field(default_factory=dict)
    #: for a generated dataset, ``describe(name, **options)``: its info under other generator options
    describe: Callable[..., DatasetInfo] | None = field(default=None, compare=False, repr=False)

    @property
    def paper_dataset(self) -> str:
        """The dataset whose paper settings apply: a synthetic stand-in's real dataset, else this one."""
        return self.real_dataset or self.name

    @property
    def family(self) -> str:
        """``"cityscapes"`` for Cityscapes and its stand-in, else ``"voc"`` (VOC classic, blender, the other
        synthetic and study datasets): which of the paper's two settings a cell gets."""
        return "cityscapes" if self.paper_dataset == "cityscapes" else "voc"

    def resolve_partition(self, partition: str | int) -> str:
        """Canonical partition name (``"92"``) from a name, a count or an alias (``"1/16"``).

        Raises ``ValueError`` listing the valid names when ``partition`` does not belong here.
        """
        key = str(partition).strip()
        key = self.partition_aliases.get(key, key)
        if key not in self.partitions:
            valid = ", ".join(list(self.partitions) + [f"{a} (= {t})" for a, t in self.partition_aliases.items()])
            raise ValueError(f"partition {partition!r} is not a partition of {self.name!r}; valid: {valid}")
        return key


def _real(name: str, classes: tuple[str, ...], counts: tuple[int, ...], *, eval_mode: str, crop: int,
          train_size: int, val_size: int, variants: tuple[str, ...], extra_aliases: dict[str, str] | None = None) -> DatasetInfo:
    partitions = {str(c): c for c in counts}
    aliases = {f: str(c) for f, c in zip(_FRACTIONS, counts)}
    aliases.update(extra_aliases or {})
    return DatasetInfo(
        name=name, num_classes=len(classes), class_names=classes,
        partitions=dict(partitions), partition_aliases=dict(aliases),
        eval_mode=eval_mode, eval_crop_size=crop, train_size=train_size, val_size=val_size,
        list_variants=variants,
    )


REAL_DATASETS: dict[str, DatasetInfo] = {
    "pascal_classic": _real(
        "pascal_classic", VOC_CLASSES, (92, 183, 366, 732, 1464), eval_mode="center_crop", crop=513,
        train_size=VOC_TRAIN_AUG_SIZE, val_size=1449, variants=("u2pl",), extra_aliases={"full": "1464"},
    ),
    "pascal_blender": _real(
        "pascal_blender", VOC_CLASSES, (662, 1323, 2646, 5291), eval_mode="center_crop", crop=513,
        train_size=VOC_TRAIN_AUG_SIZE, val_size=1449, variants=("u2pl", "cps"),
    ),
    "cityscapes": _real(
        "cityscapes", CITYSCAPES_CLASSES, (186, 372, 744, 1488), eval_mode="sliding", crop=769,
        train_size=CITYSCAPES_TRAIN_SIZE, val_size=500, variants=("u2pl", "cps"),
    ),
}

#: synthetic name -> real dataset it stands in for (None: the generic ``synthetic``)
SYNTHETIC_STANDINS: dict[str, str | None] = {
    "synthetic": None,
    "synthetic_voc": "pascal_classic",
    "synthetic_blender": "pascal_blender",
    "synthetic_cityscapes": "cityscapes",
}

#: every dataset by name: its DatasetInfo (a synthetic one's at the default generator settings)
DATASETS: Registry[DatasetInfo] = Registry("dataset")


def dataset_names() -> tuple[str, ...]:
    """Every dataset name (the real datasets, then the built-in synthetic ones)."""
    return DATASETS.names()


def scaled_partition_count(real_count: int, real_train_size: int, train_size: int) -> int:
    """Labeled count of a synthetic partition: the real label ratio applied to ``train_size``.

    At least 2 labeled images and at least 1 unlabeled image remain.
    """
    count = round(train_size * real_count / real_train_size)
    return int(min(max(count, 2), train_size - 1))


def synthetic_info(name: str, *, num_classes: int | None = None, train_size: int = 1024,
                   val_size: int = 128, image_size: int | tuple[int, int] = 64, **options: object) -> DatasetInfo:
    """DatasetInfo of a synthetic dataset with the given generator settings."""
    if name not in SYNTHETIC_STANDINS:
        raise ValueError(f"name: {name!r} is not a synthetic dataset; valid: {sorted(SYNTHETIC_STANDINS)}")
    if train_size < 4 or val_size < 1:
        raise ValueError(f"train_size must be >= 4 and val_size >= 1, got {train_size}, {val_size}")
    real_name = SYNTHETIC_STANDINS[name]
    if real_name is None:
        k = 8 if num_classes is None else int(num_classes)
        class_names = ("background",) + tuple(f"class_{i}" for i in range(1, k))
        partitions = {f: max(2, train_size // int(f[2:])) for f in _FRACTIONS}
        aliases: dict[str, str] = {}
        eval_mode, variants = "whole", ("u2pl",)
    else:
        real = REAL_DATASETS[real_name]
        if num_classes is not None and int(num_classes) != real.num_classes:
            raise ValueError(f"num_classes: {name} has {real.num_classes} classes (like {real_name}), got {num_classes}")
        class_names = real.class_names
        partitions = {p: scaled_partition_count(c, real.train_size, train_size) for p, c in real.partitions.items()}
        aliases = dict(real.partition_aliases)
        eval_mode, variants = real.eval_mode, real.list_variants
    # sliding evaluation needs windows smaller than the image (Cityscapes: 769 of 1024 rows)
    shortest = min(image_size) if isinstance(image_size, (tuple, list)) else int(image_size)
    crop = shortest if eval_mode != "sliding" else max(8, round(shortest * 0.75))
    # validates the remaining generator options (unknown keys -> ValueError)
    config = SyntheticConfig.for_dataset(name, num_classes=len(class_names), train_size=train_size,
                                         val_size=val_size, image_size=image_size, **options)
    return DatasetInfo(
        name=name, num_classes=len(class_names), class_names=class_names,
        partitions=dict(partitions), partition_aliases=dict(aliases),
        eval_mode=eval_mode, eval_crop_size=crop, train_size=train_size, val_size=val_size,
        list_variants=variants, real_dataset=real_name, synthetic=True, describe=synthetic_info,
        options=dict(config.as_dict()),
    )


def dataset_info(name: str, **options: object) -> DatasetInfo:
    """Describe dataset ``name`` (one of :func:`dataset_names`).

    ``options`` are the synthetic generator settings (``train_size``, ``image_size``, ...);
    real datasets take none.
    """
    info = DATASETS.get(name)
    if info.describe is not None:
        return info.describe(name, **options)
    if options:
        raise ValueError(f"dataset_info: {name} takes no options, got {sorted(options)}")
    return info


for _name, _info in REAL_DATASETS.items():
    DATASETS.add(_name, _info)
for _name in SYNTHETIC_STANDINS:
    DATASETS.add(_name, synthetic_info(_name))


def _fraction(text: str) -> Fraction | None:
    try:
        value = Fraction(text)
    except (ValueError, ZeroDivisionError):
        return None
    return value if "/" in text and 0 < value < 1 else None


def protocol_partitions(dataset: str) -> list[tuple[str, str]]:
    """``[(partition, "1/16 (92)"), ...]``: the dataset's partition protocols (the paper's
    1/16, 1/8, 1/4, 1/2), smallest label ratio first. Partitions that are no protocol
    (classic VOC's ``1464`` = "full") are left out; a dataset whose partitions are named
    by the fractions themselves (``synthetic``) gets those names as labels.
    """
    info = dataset_info(dataset)
    protocols = [(fraction, alias, name) for alias, name in info.partition_aliases.items()
                 if (fraction := _fraction(alias)) is not None]
    if protocols:
        return [(name, f"{alias} ({name})") for _, alias, name in sorted(protocols)]
    named = sorted((fraction, name) for name in info.partitions if (fraction := _fraction(name)) is not None)
    if named:
        return [(name, name) for _, name in named]
    return [(name, name) for name in info.partitions]
