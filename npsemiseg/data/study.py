"""The ``study`` dataset: a procedural task where labels are the bottleneck (the CPU mini-study's data).

Why another synthetic dataset: on ``synthetic`` classes differ by colour pairs and fine
texture, which the frameworks' strong photometric views (greyscale, hue, blur, ...) destroy,
and 1/16 of the labels are as good as 1/2 at a CPU budget (``docs/history/learning.md``, "The first learning
check"). Here:

* **Classes are shapes and textures.** A *family* (the dataset option ``family``) fixes the
  shapes, the textures (bold brightness patterns of period ~ 1/8 of the image, so blur and colour
  changes keep them) and what decides the class: ``study`` (the default) shape x texture, class
  ``1 + s * T + t`` (disc, ring, triangle, cross x stripes, dots); ``study_shapes`` the shape
  alone; ``study_textures`` the texture alone (stripes, dots, grid, waves; the shape a nuisance);
  ``study_textures8`` the same with eight textures (also zigzag, bricks, dashes, lines).
  Class 0 is the background. Colour carries no information: every object and the background get
  a random colour, and a texture is a brightness pattern. Which family the mini-study uses, and
  why, is in ``jobs/specs/mini.yaml`` and ``docs/learning.md``.
* **Intra-class variation.** Size, aspect, rotation, position (shapes may leave the
  image), texture phase and orientation, texture period and contrast (ranges: the options
  ``texture_period`` and ``texture_contrast``), colour, a per-image gain and noise; 1-4 objects
  per image painted in order (occlusion).
* **Splits.** ``train`` (``train_size`` images, the labeled/unlabeled partitions 1/16, 1/8,
  1/4, 1/2 and ``full`` from one seeded permutation, smaller labeled sets nested in larger
  ones), ``val`` (``val_size``, reported) and ``tune`` (``tune_size``, for choosing settings:
  never the validation split), each its own stream of images.
* **Seed.** ``seed`` (the dataset option ``data.options.seed``) seeds every image by
  ``(seed, stream, index)``: another seed draws another instance of the same task.
* **Background.** ``gradient`` (default: two colours blended by one smooth wave) or ``field`` (every
  channel a sum of random plane waves over [0.05, 0.95]; same objects and labels). A flat background
  plus pixel noise has narrow histograms, which AugSeg's equalize and solarize turn into clutter over
  the objects (``docs/history/learning.md``); ``field`` behaves more like a natural image under them.

The ``pretrain`` family (star, crescent, T, bar, hexagon x checker, rings) is the corpus of
``npsemiseg.pretrain``: other shapes, other textures, its own seeds, so it shares no image
and no class with the study. Every item is generated on demand from its index (~1 ms at
64 x 64): nothing to download. A split keeps the items it generated in memory
(``StudySegmentation``, up to ``CACHE_LIMIT_BYTES``): generating them again every epoch costs a sixth of a
mini-study step.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

from npsemiseg.data.info import IGNORE_INDEX, DatasetInfo
from npsemiseg.data.study_settings import (  # noqa: F401  (the study's settings, read from here too)
    BACKGROUNDS,
    CLASS_RULES,
    FAMILIES,
    STUDY_DATASETS,
    STUDY_FAMILIES,
    STUDY_SPLITS,
    Family,
    StudyConfig,
    partition_counts,
    study_info,
)

_STREAMS = {"train": 11, "val": 12, "tune": 13, "partition": 14, "pretrain": 15, "pretrain_val": 16}
_FIELD_KEY = 1
#: a split keeps its generated items in memory when they all fit in this (image float32, label uint8)
CACHE_LIMIT_BYTES = 256 << 20


def _polygon(u: Tensor, v: Tensor, sides: int, inradius: float) -> Tensor:
    """Inside a regular polygon of circumradius 1 (``inradius`` = cos(pi / sides))."""
    angles = math.pi / 2 + 2 * math.pi * torch.arange(sides) / sides
    proj = u.unsqueeze(-1) * angles.cos() + v.unsqueeze(-1) * angles.sin()
    return proj.amax(-1) <= inradius


def shape_mask(shape: str, u: Tensor, v: Tensor) -> Tensor:
    """Whether object-frame coordinates ``u, v [H, W]`` (radius 1) lie inside ``shape``."""
    r = (u * u + v * v).sqrt()
    if shape == "disc":
        return r <= 1
    if shape == "ring":
        return (r <= 1) & (r >= 0.5)
    if shape == "triangle":
        return _polygon(u, v, 3, 0.5)
    if shape == "cross":
        return ((u.abs() <= 0.3) & (v.abs() <= 1)) | ((v.abs() <= 0.3) & (u.abs() <= 1))
    if shape == "star":
        return r <= 0.6 + 0.4 * torch.cos(5 * torch.atan2(v, u))
    if shape == "crescent":
        return (r <= 1) & ((u - 0.45) ** 2 + v * v > 0.75 ** 2)
    if shape == "tee":
        return ((u.abs() <= 1) & (v >= 0.5) & (v <= 1)) | ((u.abs() <= 0.25) & (v >= -1) & (v < 0.5))
    if shape == "bar":
        return (u.abs() <= 1) & (v.abs() <= 0.3)
    if shape == "hexagon":
        return _polygon(u, v, 6, math.cos(math.pi / 6))
    raise ValueError(f"shape: unknown shape {shape!r}, expected one of the families' shapes")


def texture_pattern(texture: str, x: Tensor, y: Tensor, period: float) -> Tensor:
    """A two-tone pattern in {0, 1} over texture coordinates ``x, y [H, W]`` (pixels)."""
    a, b = 2 * math.pi * x / period, 2 * math.pi * y / period
    if texture == "stripes":
        return (torch.sin(a) > 0).float()
    if texture == "dots":
        return (torch.cos(a) * torch.cos(b) > 0.35).float()
    if texture == "grid":  # thin lines both ways (not the pretraining's checker of filled squares)
        return ((torch.cos(a) > 0.7) | (torch.cos(b) > 0.7)).float()
    if texture == "waves":  # stripes bent by a slow sine across them
        return (torch.sin(a + 1.5 * torch.sin(b / 2)) > 0).float()
    if texture == "zigzag":  # stripes bent by a triangle wave of their own period: twice the bends of waves, corners
        return (torch.sin(a + 2.0 * (2 / math.pi) * torch.asin(torch.sin(b))) > 0).float()
    if texture == "bricks":  # rows of bricks: a line between rows, joints offset by half a brick every other row
        row = torch.floor(y / period)
        joint = torch.cos(2 * math.pi * (x / (2 * period) + 0.5 * row)) > 0.9
        return ((torch.cos(b) > 0.8) | joint).float()
    if texture == "dashes":  # stripes broken into dashes, the breaks offset row to row
        return ((torch.sin(a) > 0.3) & (torch.sin(b / 1.5 + 0.5 * torch.floor(x / period)) > -0.3)).float()
    if texture == "lines":  # thin lines one way: the grid's lines without the cross lines, stripes' period
        return (torch.cos(a) > 0.7).float()
    if texture == "checker":
        return ((torch.sin(a) > 0) ^ (torch.sin(b) > 0)).float()
    if texture == "rings":
        return (torch.sin((a * a + b * b).sqrt()) > 0).float()
    raise ValueError(f"texture: unknown texture {texture!r}, expected one of the families' textures")


def wave_field(g: torch.Generator, xx: Tensor, yy: Tensor, size: int, waves: int = 3) -> Tensor:
    """``[3, S, S]``: per channel a sum of ``waves`` plane waves (periods size/4 to 2 x size, random directions and
    phases) stretched over [0.05, 0.95]: a smooth background with a broad histogram in every channel."""
    params = torch.rand(3, waves, 3, generator=g)
    period = size / 4 + params[..., 0] * (2 * size - size / 4)
    angle, phase = 2 * math.pi * params[..., 1], 2 * math.pi * params[..., 2]
    proj = xx * angle.cos()[..., None, None] + yy * angle.sin()[..., None, None]  # [3, waves, S, S]
    summed = torch.sin(2 * math.pi * proj / period[..., None, None] + phase[..., None, None]).sum(dim=1)
    low = summed.amin(dim=(1, 2), keepdim=True)
    high = summed.amax(dim=(1, 2), keepdim=True)
    return 0.05 + 0.9 * (summed - low) / (high - low).clamp_min(1e-6)


def _generator(*keys: int) -> torch.Generator:
    state = np.random.SeedSequence([int(k) & 0xFFFFFFFF for k in keys]).generate_state(2, dtype=np.uint32)
    return torch.Generator().manual_seed(int(state[0]) << 31 ^ int(state[1]))


def generate(config: StudyConfig, stream: str, index: int) -> tuple[Tensor, Tensor]:
    """Image ``index`` of ``stream``: ``image [3, S, S]`` float32 in [0, 1], ``label [S, S]`` int64."""
    family, size = config.family_spec, config.image_size
    g = _generator(config.seed, _STREAMS[stream], index)
    yy, xx = torch.meshgrid(torch.arange(size, dtype=torch.float32), torch.arange(size, dtype=torch.float32),
                            indexing="ij")
    # background: two random colours blended by a smooth random field (colour is uninformative)
    colours = 0.1 + 0.8 * torch.rand(2, 3, generator=g)
    wave = torch.rand(4, generator=g)
    field_ = 0.5 + 0.5 * torch.sin(2 * math.pi * (wave[0] * xx + wave[1] * yy) / (2 * size) + 6.3 * wave[2])
    image = colours[0].view(3, 1, 1) * field_ + colours[1].view(3, 1, 1) * (1 - field_)
    if config.background == "field":  # from a stream of its own: the objects and labels stay the gradient's
        image = wave_field(_generator(config.seed, _STREAMS[stream], index, _FIELD_KEY), xx, yy, size)
    label = torch.zeros(size, size, dtype=torch.long)

    lo, hi = config.objects_per_image
    n = int(torch.randint(lo, hi + 1, (1,), generator=g))
    for _ in range(n):
        cls, shape, texture = family.draw(g)
        p = torch.rand(8, generator=g)
        r_lo, r_hi = config.object_radius
        radius = size * (r_lo + (r_hi - r_lo) * p[0])
        aspect = 0.8 + 0.4 * p[1]
        angle = 2 * math.pi * p[2]
        cy, cx = size * (0.1 + 0.8 * p[3]), size * (0.1 + 0.8 * p[4])
        dy, dx = yy - cy, xx - cx
        u = (dx * math.cos(angle) + dy * math.sin(angle)) / (radius * aspect)
        v = (-dx * math.sin(angle) + dy * math.cos(angle)) / (radius / aspect)
        inside = shape_mask(shape, u, v)
        tex_angle = math.pi * p[5]
        tx = dx * math.cos(tex_angle) + dy * math.sin(tex_angle)
        ty = -dx * math.sin(tex_angle) + dy * math.cos(tex_angle)
        p_lo, p_hi = config.texture_period
        period = size / 8 * (p_lo + (p_hi - p_lo) * p[6])
        pattern = texture_pattern(texture, tx + period * p[7], ty, period)
        colour = 0.15 + 0.8 * torch.rand(3, generator=g)
        c_lo, c_hi = config.texture_contrast  # drawn only when it varies: a fixed contrast leaves the stream as it was
        contrast = c_lo if c_lo == c_hi else c_lo + (c_hi - c_lo) * float(torch.rand(1, generator=g))
        painted = colour.view(3, 1, 1) * (1 - contrast * pattern)  # texture = brightness pattern
        image = torch.where(inside, painted, image)
        label[inside] = cls

    gain = 0.85 + 0.3 * torch.rand(1, generator=g)
    noise = config.noise_std * torch.randn(3, size, size, generator=g)
    return (image * gain + noise).clamp_(0, 1).contiguous(), label


def labeled_indices(config: StudyConfig, num_labeled: int) -> tuple[list[int], list[int]]:
    """Disjoint labeled / unlabeled train indices: the first ``num_labeled`` of one seeded permutation."""
    if not 1 <= num_labeled <= config.train_size:
        raise ValueError(f"num_labeled must be in [1, {config.train_size}], got {num_labeled}")
    order = torch.randperm(config.train_size, generator=_generator(config.seed, _STREAMS["partition"])).tolist()
    return sorted(order[:num_labeled]), sorted(order[num_labeled:])


class StudySegmentation(Dataset):
    """One split of a study dataset. Items: ``image [3,S,S]``, ``label [S,S]`` (all 255 on
    ``unlabeled`` unless ``reveal_labels``), ``id``; ``transform`` maps an item dict to an item dict."""

    def __init__(self, config: StudyConfig, split: str, *, partition: str | None = None, info: DatasetInfo | None = None,
                 partition_lists: str | None = None, max_items: int | None = None, transform=None,
                 reveal_labels: bool = False) -> None:
        if split not in STUDY_SPLITS:
            raise ValueError(f"split must be one of {STUDY_SPLITS}, got {split!r}")
        if split in ("val", "tune"):
            self.stream, indices = split, list(range(config.val_size if split == "val" else config.tune_size))
        else:
            counts = partition_counts(config.train_size)
            if partition not in counts:
                raise ValueError(f"partition {partition!r} is not a partition of {config.name!r}; valid: {', '.join(counts)}")
            labeled, unlabeled = labeled_indices(config, counts[partition])
            self.stream, indices = "train", labeled if split == "labeled" else unlabeled
        self.config, self.split, self.partition = config, split, partition
        self.info, self.partition_lists, self.transform = info, partition_lists, transform
        self.indices = indices[:max_items]
        self.hide_labels = split == "unlabeled" and not reveal_labels
        self.ids = [f"{config.name}/{self.stream}/{i:06d}" for i in self.indices]
        item_bytes = config.image_size ** 2 * (3 * 4 + 1)
        self._cacheable = len(self.indices) * item_bytes <= CACHE_LIMIT_BYTES
        self._cache: dict[int, tuple[Tensor, Tensor]] = {}

    def __len__(self) -> int:
        return len(self.indices)

    def _generate(self, i: int) -> tuple[Tensor, Tensor]:
        """Item ``i``'s image and label, generated once and then kept when the split fits ``CACHE_LIMIT_BYTES``
        (generation is deterministic in the index; copies are returned, so a transform cannot alter the cache)."""
        cached = self._cache.get(i)
        if cached is None:
            image, label = generate(self.config, self.stream, self.indices[i])
            if not self._cacheable:
                return image, label
            cached = self._cache[i] = (image, label.to(torch.uint8))
        return cached[0].clone(), cached[1].long()

    def __getitem__(self, i: int) -> dict:
        image, label = self._generate(i)
        if self.hide_labels:
            label = torch.full_like(label, IGNORE_INDEX)
        item = {"image": image, "label": label, "id": self.ids[i]}
        return self.transform(item) if self.transform is not None else item


def build_study_dataset(name: str, split: str, partition: str | int | None = None, *, partition_lists: str = "u2pl",
                        transform=None, max_items: int | None = None, reveal_labels: bool = False,
                        **options: object) -> StudySegmentation:
    """``build_dataset`` for the study datasets: split ``labeled`` / ``unlabeled`` (need ``partition``),
    ``val`` or ``tune``."""
    info = study_info(name, **options)
    part = None
    if split in ("labeled", "unlabeled"):
        if partition is None:
            raise ValueError(f"partition is required for the {split} split of {name}; valid: {', '.join(info.partitions)}")
        part = info.resolve_partition(partition)
    return StudySegmentation(StudyConfig.from_options(name, **options), split, partition=part, info=info,
                             partition_lists=partition_lists, max_items=max_items, transform=transform,
                             reveal_labels=reveal_labels)
