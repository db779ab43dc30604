"""The study datasets' settings, without torch: their families, generator options (:class:`StudyConfig`),
partitions and :func:`study_info`; ``npsemiseg.data.study`` generates the images."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from npsemiseg.data.info import DatasetInfo

STUDY_DATASETS = ("study",)
STUDY_SPLITS = ("labeled", "unlabeled", "val", "tune")
_FRACTIONS = ("1/16", "1/8", "1/4", "1/2")
BACKGROUNDS = ("gradient", "field")

CLASS_RULES = ("shape_texture", "shape", "texture")


@dataclass(frozen=True)
class Family:
    """A scene family: its shapes, its textures and what decides the class (``classes``):

    * ``shape_texture``: class ``1 + s * len(textures) + t`` is shape ``s`` with texture ``t``;
    * ``shape``: class ``1 + s`` is shape ``s``, the texture drawn at random (a nuisance, like colour);
    * ``texture``: class ``1 + t`` is texture ``t``, the shape drawn at random.
    """

    shapes: tuple[str, ...]
    textures: tuple[str, ...]
    classes: str = "shape_texture"

    def __post_init__(self) -> None:
        if self.classes not in CLASS_RULES:
            raise ValueError(f"classes: expected one of {list(CLASS_RULES)}, got {self.classes!r}")

    @property
    def class_names(self) -> tuple[str, ...]:
        if self.classes == "shape":
            return ("background",) + self.shapes
        if self.classes == "texture":
            return ("background",) + self.textures
        return ("background",) + tuple(f"{s}_{t}" for s in self.shapes for t in self.textures)

    def draw(self, g: Any) -> tuple[int, str, str]:
        """A random object: ``(class, shape, texture)``, drawn with torch generator ``g`` (the image generator's,
        ``npsemiseg.data.study``, which has imported torch already)."""
        import torch

        cls = int(torch.randint(1, len(self.class_names), (1,), generator=g))
        if self.classes == "shape":
            return cls, self.shapes[cls - 1], self.textures[int(torch.randint(len(self.textures), (1,), generator=g))]
        if self.classes == "texture":
            return cls, self.shapes[int(torch.randint(len(self.shapes), (1,), generator=g))], self.textures[cls - 1]
        num_textures = len(self.textures)
        return cls, self.shapes[(cls - 1) // num_textures], self.textures[(cls - 1) % num_textures]


FAMILIES: dict[str, Family] = {
    "study": Family(("disc", "ring", "triangle", "cross"), ("stripes", "dots")),
    # classes by shape alone: what the strong views keep (colour, brightness and blur leave outlines)
    "study_shapes": Family(("disc", "ring", "triangle", "cross"), ("stripes", "dots"), classes="shape"),
    # classes by texture alone, the shape a nuisance: a brightness pattern of period ~ 1/8 of the image, which
    # the strong views' colour and intensity operations and their scaled blur keep (docs/history/learning.md)
    "study_textures": Family(("disc", "ring", "triangle", "cross"), ("stripes", "dots", "grid", "waves"),
                             classes="texture"),
    # eight textures: twice the classes of `study_textures` in the same 64 labeled images, and pairs that differ
    # in one detail (lines / stripes: the duty cycle; dashes / stripes: breaks; zigzag / waves: the bend)
    "study_textures8": Family(("disc", "ring", "triangle", "cross"),
                              ("stripes", "dots", "grid", "waves", "zigzag", "bricks", "dashes", "lines"),
                              classes="texture"),
    "pretrain": Family(("star", "crescent", "tee", "bar", "hexagon"), ("checker", "rings")),
}
#: the study's families: every family but the pretraining corpus's
STUDY_FAMILIES = tuple(name for name in FAMILIES if name != "pretrain")


@dataclass(frozen=True)
class StudyConfig:
    """Generator settings of one study dataset instance (``image_size`` is square)."""

    seed: int = 0
    family: str = "study"
    train_size: int = 1024
    val_size: int = 200
    tune_size: int = 200
    image_size: int = 64
    objects_per_image: tuple[int, int] = (1, 4)
    object_radius: tuple[float, float] = (0.14, 0.28)  # object radius range, as a fraction of image_size
    #: texture period range, as a multiple of image_size / 8 (the intra-class variation of a texture's scale)
    texture_period: tuple[float, float] = (0.85, 1.15)
    #: texture contrast range: a texture darkens its object's colour by this fraction on its dark tone
    texture_contrast: tuple[float, float] = (0.6, 0.6)
    noise_std: float = 0.04
    #: ``gradient``: two colours blended by one smooth wave (narrow per-channel histograms); ``field``: each channel
    #: a sum of random plane waves stretched over [0.05, 0.95] (broad histograms, as natural images have, so that
    #: AugSeg's equalize and solarize do not turn the background's noise into clutter)
    background: str = "gradient"
    name: str = field(default="study", compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.image_size, (tuple, list)):
            if len(set(self.image_size)) != 1:
                raise ValueError(f"image_size: the study dataset is square, got {self.image_size!r}")
            object.__setattr__(self, "image_size", int(self.image_size[0]))
        object.__setattr__(self, "objects_per_image", tuple(int(v) for v in self.objects_per_image))
        for name in ("object_radius", "texture_period", "texture_contrast"):
            object.__setattr__(self, name, tuple(float(v) for v in getattr(self, name)))
        if self.family not in FAMILIES:
            raise ValueError(f"family: expected one of {sorted(FAMILIES)}, got {self.family!r}")
        if self.background not in BACKGROUNDS:
            raise ValueError(f"background: expected one of {list(BACKGROUNDS)}, got {self.background!r}")
        if self.image_size < 16:
            raise ValueError(f"image_size must be at least 16, got {self.image_size}")
        if self.train_size < 32 or self.val_size < 1 or self.tune_size < 1:
            raise ValueError(f"train_size must be >= 32, val_size and tune_size >= 1, got "
                             f"{self.train_size}, {self.val_size}, {self.tune_size}")
        lo, hi = self.objects_per_image
        if not 1 <= lo <= hi:
            raise ValueError(f"objects_per_image must be (min, max) with 1 <= min <= max, got {self.objects_per_image}")
        r_lo, r_hi = self.object_radius
        if not 0 < r_lo <= r_hi <= 0.5:
            raise ValueError(f"object_radius must be (min, max) with 0 < min <= max <= 0.5, got {self.object_radius}")
        p_lo, p_hi = self.texture_period
        if not 0.25 <= p_lo <= p_hi <= 4:
            raise ValueError(f"texture_period must be (min, max) with 0.25 <= min <= max <= 4 (x image_size / 8), "
                             f"got {self.texture_period}")
        c_lo, c_hi = self.texture_contrast
        if not 0 < c_lo <= c_hi <= 1:
            raise ValueError(f"texture_contrast must be (min, max) with 0 < min <= max <= 1, got {self.texture_contrast}")

    @classmethod
    def from_options(cls, name: str = "study", **options: object) -> StudyConfig:
        """Settings from dataset options (unknown keys -> ValueError naming them)."""
        valid = {f for f in cls.__dataclass_fields__ if f != "name"}
        unknown = sorted(set(options) - valid)
        if unknown:
            raise ValueError(f"unknown {name} dataset option(s) {unknown}; valid: {sorted(valid)}")
        return cls(name=name, **{k: v for k, v in options.items() if v is not None})  # type: ignore[arg-type]

    @property
    def family_spec(self) -> Family:
        return FAMILIES[self.family]


def partition_counts(train_size: int) -> dict[str, int]:
    """Labeled images per partition: 1/16, 1/8, 1/4, 1/2 of ``train_size`` and ``full``."""
    return {**{f: train_size // int(f[2:]) for f in _FRACTIONS}, "full": train_size}


def study_info(name: str = "study", **options: object) -> DatasetInfo:
    """DatasetInfo of a study dataset with the given generator options (validated)."""
    if name not in STUDY_DATASETS:
        raise ValueError(f"name: {name!r} is not a study dataset; valid: {list(STUDY_DATASETS)}")
    config = StudyConfig.from_options(name, **options)
    names = config.family_spec.class_names
    return DatasetInfo(
        name=name, num_classes=len(names), class_names=names, partitions=partition_counts(config.train_size),
        partition_aliases={}, eval_mode="whole", eval_crop_size=config.image_size, train_size=config.train_size,
        val_size=config.val_size, synthetic=True, options={k: v for k, v in asdict(config).items() if k != "name"},
    )
