"""Generated datasets (no files): ``synthetic`` (K classes, option ``num_classes``) and the stand-ins
``synthetic_voc`` / ``synthetic_blender`` / ``synthetic_cityscapes``, which carry the partition names, classes,
evaluation convention and paper settings of the real dataset they mimic, with labeled counts scaled to the
synthetic train-set size (same labeled ratio). The generator: ``npsemiseg.data.synthetic``.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, ClassVar

from npsemiseg.data.base import DatasetDef, Transform
from npsemiseg.data.info import _FRACTIONS, DATASETS, DatasetInfo, scaled_partition_count
from npsemiseg.data.settings import VOC_SETTINGS

if TYPE_CHECKING:
    from torch.utils.data import Dataset


class Synthetic(DatasetDef):
    """The generic synthetic dataset (8 classes by default; partitions named by their fractions)."""

    name = "synthetic"
    label = "synthetic"
    settings = VOC_SETTINGS
    #: the real dataset this one stands in for (None: none)
    stands_in_for: ClassVar[str | None] = None
    #: the generator's settings for this dataset (``SyntheticConfig``), which options override
    generator_defaults: ClassVar[dict[str, object]] = {}

    @classmethod
    def info(cls, *, num_classes: int | None = None, train_size: int = 1024, val_size: int = 128,
             image_size: int | tuple[int, int] = 64, **options: object) -> DatasetInfo:
        """DatasetInfo with the given generator settings (validated; unknown options are a ``ValueError``)."""
        from npsemiseg.data.synthetic_settings import SyntheticConfig

        if train_size < 4 or val_size < 1:
            raise ValueError(f"train_size must be >= 4 and val_size >= 1, got {train_size}, {val_size}")
        if cls.stands_in_for is None:
            k = 8 if num_classes is None else int(num_classes)
            class_names = ("background",) + tuple(f"class_{i}" for i in range(1, k))
            partitions = {f: max(2, train_size // int(f[2:])) for f in _FRACTIONS}
            aliases: dict[str, str] = {}
            eval_mode, sources, settings = "whole", ("u2pl",), cls.settings
        else:
            real = DATASETS.get(cls.stands_in_for)
            real_info = real.info()
            if num_classes is not None and int(num_classes) != real_info.num_classes:
                raise ValueError(f"num_classes: {cls.name} has {real_info.num_classes} classes (like "
                                 f"{cls.stands_in_for}), got {num_classes}")
            class_names = real_info.class_names
            partitions = {p: scaled_partition_count(c, real_info.train_size, train_size)
                          for p, c in real_info.partitions.items()}
            aliases = dict(real_info.partition_aliases)
            eval_mode, sources, settings = real_info.eval_mode, real_info.partition_list_sources, real.settings
        # sliding evaluation needs windows smaller than the image (Cityscapes: 769 of 1024 rows)
        shortest = min(image_size) if isinstance(image_size, (tuple, list)) else int(image_size)
        crop = shortest if eval_mode != "sliding" else max(8, round(shortest * 0.75))
        config = SyntheticConfig.for_dataset(cls.name, num_classes=len(class_names), train_size=train_size,
                                             val_size=val_size, image_size=image_size, **options)
        return DatasetInfo(
            name=cls.name, num_classes=len(class_names), class_names=class_names,
            partitions=dict(partitions), partition_aliases=dict(aliases),
            eval_mode=eval_mode, eval_crop_size=crop, train_size=train_size, val_size=val_size,
            partition_list_sources=sources, real_dataset=cls.stands_in_for, synthetic=True,
            options=dict(config.as_dict()), settings=settings, label=cls.label,
        )

    @classmethod
    def build(cls, split: str, root: str | os.PathLike | None = None, partition: str | int | None = None, *,
              partition_lists: str = "u2pl", transform: Transform | None = None, reveal_labels: bool = False,
              max_items: int | None = None, **options: object) -> Dataset:
        """One split generated in memory (``root`` is not used)."""
        from npsemiseg.data.synthetic import SyntheticConfig, SyntheticSegmentation

        info, part = cls.split_info(split, partition, **options)
        return SyntheticSegmentation(
            SyntheticConfig(**info.options), split, num_labeled=None if part is None else info.partitions[part],
            partition=part, info=info, partition_lists=partition_lists, max_items=max_items, transform=transform,
            reveal_labels=reveal_labels,
        )


DATASETS.add("synthetic", Synthetic)


@DATASETS.register("synthetic_voc")
class SyntheticVOC(Synthetic):
    """21 classes like VOC classic, class 0 the background of every scene, a 1-pixel ignore band."""

    name = "synthetic_voc"
    label = "synthetic_voc"
    stands_in_for = "pascal_classic"
    generator_defaults = {"num_classes": 21, "boundary_ignore": 1, "num_scene_types": 5}


@DATASETS.register("synthetic_blender")
class SyntheticBlender(Synthetic):
    """21 classes like VOC blender."""

    name = "synthetic_blender"
    label = "synthetic_blender"
    stands_in_for = "pascal_blender"
    generator_defaults = SyntheticVOC.generator_defaults


@DATASETS.register("synthetic_cityscapes")
class SyntheticCityscapes(Synthetic):
    """19 classes like Cityscapes, a per-scene background, more shapes per image; Cityscapes' settings."""

    name = "synthetic_cityscapes"
    label = "synthetic_cityscapes"
    stands_in_for = "cityscapes"
    generator_defaults = {"num_classes": 19, "per_scene_background": True, "shapes_per_image": (4, 8),
                          "num_scene_types": 4}
