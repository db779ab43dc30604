"""What each dataset is: classes, partition protocols, evaluation convention, paper settings.

``dataset_info(name)`` is the single place the config, the training loop and the table code learn a
dataset's class count, class names, partition names (with the "1/16"-style aliases of the paper), default
evaluation mode and paper settings. It asks the dataset's registered class (``DATASETS``: every
``npsemiseg.data.base.DatasetDef`` subclass, registered where it is defined, ``npsemiseg/data/sets/``).
Synthetic stand-ins (``synthetic_voc``, ``synthetic_blender``, ``synthetic_cityscapes``) carry the
partition *names* of the real dataset they mimic, with labeled counts scaled to the synthetic train-set size
(same labeled ratio).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from npsemiseg._registry import Registry
from npsemiseg.constants import IGNORE_INDEX
from npsemiseg.data.settings import VOC_SETTINGS, PaperSettings

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

_FRACTIONS = ("1/16", "1/8", "1/4", "1/2")


@dataclass(frozen=True)
class DatasetInfo:
    """Static description of one dataset.

    partitions: partition name -> number of labeled images (for synthetic datasets: at the
    default ``train_size``; ``dataset_info(name, train_size=...)`` gives other sizes).
    partition_aliases: "1/16" -> "92" etc. (the paper's protocol names).
    partition_list_sources: the partition-list sources available ("u2pl", and "cps" where CPS's
    lists differ; classic VOC has one set, which both names select).
    eval_mode / eval_crop_size: the evaluation convention (VOC center crop 513,
    Cityscapes sliding window 769, both U2PL's).
    real_dataset: for a synthetic stand-in, the dataset whose protocol it mimics.
    settings: the dataset's paper settings (``npsemiseg.data.settings``); label: its name in tables.
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
    partition_list_sources: tuple[str, ...] = ("u2pl",)
    real_dataset: str | None = None
    synthetic: bool = False
    ignore_index: int = IGNORE_INDEX
    options: Mapping[str, object] = field(default_factory=dict)
    settings: PaperSettings = VOC_SETTINGS
    label: str = ""

    @property
    def paper_dataset(self) -> str:
        """The dataset whose paper settings apply: a synthetic stand-in's real dataset, else this one."""
        return self.real_dataset or self.name

    @property
    def recipe(self) -> str:
        """The paper recipe the dataset follows: its augmentation pipeline (``settings.recipe``:
        ``"cityscapes"`` for Cityscapes and its stand-in, ``"voc"`` for the others)."""
        return self.settings.recipe

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


#: every dataset by name: its ``DatasetDef`` subclass (``npsemiseg.data.base``), registered where it is defined
DATASETS: Registry[Any] = Registry("dataset")


@dataclass(frozen=True)
class DataRoot:
    """The data root of a record being read or built (``data.root``) and the folder datasets found under it."""

    root: object
    found: dict[str, Any] = field(default_factory=dict)


#: the data root in use (:func:`dataset_root`); None outside one
DATA_ROOT_IN_USE: ContextVar[DataRoot | None] = ContextVar("data_root_in_use", default=None)


@contextmanager
def dataset_root(root: object) -> Iterator[None]:
    """While a record whose ``data.root`` is ``root`` is read or built: a dataset name no registered class holds is
    looked for as a folder dataset at ``root``, ``root/<name>`` or ``$NPSEMISEG_DATA/<name>``
    (``npsemiseg.data.sets.folder``), found for the lookups inside this block and registered nowhere (reading a
    configuration changes no registry; a Ray worker reading a run's configuration finds the run's folder)."""
    token = DATA_ROOT_IN_USE.set(DataRoot(root))
    try:
        yield
    finally:
        DATA_ROOT_IN_USE.reset(token)


def dataset_names() -> tuple[str, ...]:
    """Every dataset name (the real datasets, then the built-in synthetic ones, then any registered later)."""
    return DATASETS.names()


def fraction_partitions(counts: tuple[int, ...], *, full: int | None = None) -> tuple[dict[str, int], dict[str, str]]:
    """``(partitions, aliases)`` of a dataset whose partitions are 1/16, 1/8, 1/4, 1/2 of its train set (labeled
    counts ``counts``, smallest first), plus ``"full"`` = ``full`` where given."""
    partitions = {str(c): c for c in counts}
    aliases = {f: str(c) for f, c in zip(_FRACTIONS, counts)}
    if full is not None:
        partitions[str(full)] = full
        aliases["full"] = str(full)
    return partitions, aliases


def scaled_partition_count(real_count: int, real_train_size: int, train_size: int) -> int:
    """Labeled count of a synthetic partition: the real label ratio applied to ``train_size``.

    At least 2 labeled images and at least 1 unlabeled image remain.
    """
    count = round(train_size * real_count / real_train_size)
    return int(min(max(count, 2), train_size - 1))


def dataset_info(name: str, **options: object) -> DatasetInfo:
    """Describe dataset ``name`` (one of :func:`dataset_names`).

    ``options`` are the generator settings of a generated dataset (``train_size``, ``image_size``, ...) or the
    options a dataset class declares (a folder dataset's ``path``); the others take none.
    """
    return DATASETS.get(name).info(**options)


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
