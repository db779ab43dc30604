"""The synthetic datasets' generator settings (:class:`SyntheticConfig`), without torch: a configuration's
``data.options`` of a synthetic dataset are checked here; ``npsemiseg.data.synthetic`` generates the images."""

from __future__ import annotations

from dataclasses import asdict, field
from typing import Any

from pydantic import field_validator
from pydantic.dataclasses import dataclass as pydantic_dataclass

from npsemiseg.data.info import DATASETS


@pydantic_dataclass(frozen=True)
class SyntheticConfig:
    """Generator settings. ``image_size`` is ``(H, W)`` (an int ``n`` means ``(n, n)``)."""

    num_classes: int = 8
    image_size: tuple[int, int] = (64, 64)
    train_size: int = 1024
    val_size: int = 128
    seed: int = 0
    num_scene_types: int = 4
    classes_per_scene: int | None = None  # default: 40% of the foreground classes (>= 2)
    per_scene_background: bool = False  # True: each scene type has its own background class
    shapes_per_image: tuple[int, int] = (2, 5)
    noise_std: float = 0.06
    instance_jitter: float = 1.0  # per-instance colour / orientation / frequency variation (0 = none)
    illumination: float = 0.15
    boundary_ignore: int = 0  # width in pixels of the 255 band along class boundaries
    name: str = field(default="synthetic", compare=False)

    @field_validator("image_size", mode="before")
    @classmethod
    def _square_from_int(cls, size: Any) -> Any:
        if isinstance(size, int):
            return (size, size)
        if not isinstance(size, (tuple, list)) or len(size) != 2:
            raise ValueError(f"image_size: expected an int or (H, W), got {size!r}")
        return tuple(int(v) for v in size)

    def __post_init__(self) -> None:
        if min(self.image_size) < 8:
            raise ValueError(f"image_size must be at least 8x8, got {self.image_size}")
        if self.num_classes < 2 or self.num_classes > 254:
            raise ValueError(f"num_classes must be in [2, 254], got {self.num_classes}")
        if self.num_scene_types < 1:
            raise ValueError(f"num_scene_types must be >= 1, got {self.num_scene_types}")
        if self.per_scene_background and self.num_scene_types >= self.num_classes:
            raise ValueError(
                f"per_scene_background needs num_scene_types < num_classes, got {self.num_scene_types} >= {self.num_classes}"
            )
        lo, hi = self.shapes_per_image
        if not 1 <= lo <= hi:
            raise ValueError(f"shapes_per_image must be (min, max) with 1 <= min <= max, got {self.shapes_per_image}")
        if self.train_size < 4 or self.val_size < 1:
            raise ValueError(f"train_size must be >= 4 and val_size >= 1, got {self.train_size}, {self.val_size}")
        if self.boundary_ignore < 0 or self.noise_std < 0 or self.instance_jitter < 0 or not 0 <= self.illumination < 1:
            raise ValueError("boundary_ignore, noise_std and instance_jitter must be >= 0 and illumination in [0, 1)")

    @classmethod
    def for_dataset(cls, name: str, **options: object) -> SyntheticConfig:
        """Settings of a named synthetic dataset, with ``options`` overriding its defaults (its registered
        class's ``generator_defaults``, ``npsemiseg/data/sets/synthetic.py``).

        ``synthetic_voc`` / ``synthetic_blender``: 21 classes, class 0 the background of every
        scene, a 1-pixel ignore band on boundaries. ``synthetic_cityscapes``: 19 classes,
        per-scene background ("stuff"), more shapes per image.
        """
        defaults: dict[str, object] = {"name": name, **getattr(DATASETS.get(name), "generator_defaults", {})}
        valid = {f for f in cls.__dataclass_fields__ if f != "name"}
        unknown = sorted(set(options) - valid)
        if unknown:
            raise ValueError(f"unknown synthetic dataset option(s) {unknown}; valid: {sorted(valid)}")
        defaults.update({k: v for k, v in options.items() if v is not None})
        return cls(**defaults)  # type: ignore[arg-type]

    def as_dict(self) -> dict[str, object]:
        return asdict(self)
