"""A procedurally generated segmentation dataset: no files, deterministic from a seed.

The generator (one "world" per seed):

* **Classes.** K classes, each with its own texture: a base colour (classes come in
  pairs sharing a palette colour, so colour alone cannot separate them), an oriented
  pattern (stripes or checker) with its own spatial frequency, orientation, amplitude
  and colour direction.
* **Scene types.** S scene types, each allowing a subset of the foreground classes with
  its own prior over them (every foreground class belongs to at least one scene; the
  subsets overlap). A per-scene background class is an option (Cityscapes-like
  "stuff"); by default class 0 is the background of every scene (VOC-like). The scene
  type is the per-image latent factor the NP head's global latent can pick up.
* **Images.** For image ``index`` of a stream (train / val) a generator seeded by
  ``(seed, stream, index)`` draws the scene type, then 2-5 shapes (rectangles, ellipses,
  blobs: ellipses with a wavy radius) of classes drawn from the scene's prior, painted
  in order over the background. Pixels take their class's texture, varied per instance
  (colour +-0.08, orientation +-20 degrees, frequency +-20%, random phase: intra-class
  variation, so a few labeled examples do not cover a class), then a per-image gain,
  colour cast and shading gradient, then Gaussian noise; an optional band of 255
  (ignore) along class boundaries mimics VOC's outlines.

Everything is vectorised torch on one image (a 64x64 item takes well under a
millisecond-range budget, see ``benchmarks/``). Labeled/unlabeled splits of a partition
come from one seeded permutation of the train indices (so smaller labeled sets are
nested in larger ones, as in CPS's lists); val is a separate stream of images.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

from npsemiseg.constants import IGNORE_INDEX
from npsemiseg.data.synthetic_settings import SyntheticConfig

_STREAMS = {"train": 1, "val": 2, "partition": 3, "world": 4}


def _generator(*keys: int) -> torch.Generator:
    """A torch CPU generator seeded by hashing ``keys`` (numpy's SeedSequence)."""
    state = np.random.SeedSequence([int(k) & 0xFFFFFFFF for k in keys]).generate_state(2, dtype=np.uint32)
    return torch.Generator().manual_seed(int(state[0]) << 31 ^ int(state[1]))


@dataclass(frozen=True)
class SyntheticWorld:
    """Class appearance and scene priors shared by every image of one config.

    colour / texture_dir ``[K, 3]``; frequency, orientation, amplitude ``[K]``;
    pattern ``[K]`` (0 stripes, 1 checker); scene_prior ``[S, K]`` (rows sum to 1, zero
    outside the scene's classes); scene_background ``[S]``.
    """

    colour: Tensor
    texture_dir: Tensor
    frequency: Tensor
    orientation: Tensor
    amplitude: Tensor
    pattern: Tensor
    scene_prior: Tensor
    scene_background: Tensor


@lru_cache(maxsize=16)
def build_world(config: SyntheticConfig) -> SyntheticWorld:
    """The class textures and scene priors of ``config`` (cached; depends on seed and sizes)."""
    k, s = config.num_classes, config.num_scene_types
    g = _generator(config.seed, _STREAMS["world"], k, s)
    num_colours = math.ceil(k / 2)
    palette = 0.15 + 0.7 * torch.rand(num_colours, 3, generator=g)
    colour = (palette[torch.arange(k) % num_colours] + 0.04 * torch.randn(k, 3, generator=g)).clamp(0.1, 0.9)
    texture_dir = torch.nn.functional.normalize(torch.randn(k, 3, generator=g), dim=1)
    # classes sharing a colour (k and k + num_colours) get distinct frequency bands
    band = (torch.arange(k) // num_colours).float()
    frequency = 0.06 + 0.1 * band + 0.08 * torch.rand(k, generator=g)
    orientation = math.pi * torch.rand(k, generator=g)
    amplitude = 0.1 + 0.12 * torch.rand(k, generator=g)
    pattern = (torch.arange(k) + torch.randint(0, 2, (1,), generator=g)) % 2

    if config.per_scene_background:
        order = torch.randperm(k, generator=g)
        scene_background, foreground = order[:s], order[s:]
    else:
        scene_background, foreground = torch.zeros(s, dtype=torch.long), torch.arange(1, k)
        foreground = foreground[torch.randperm(len(foreground), generator=g)]
    n_fg = len(foreground)
    per_scene = config.classes_per_scene or max(2, math.ceil(0.4 * n_fg))
    per_scene = min(per_scene, n_fg)
    scene_prior = torch.zeros(s, k)
    for scene in range(s):
        core = foreground[scene::s]  # round-robin: every foreground class is in some scene
        others = foreground[~torch.isin(foreground, core)]
        extra = others[torch.randperm(len(others), generator=g)[: max(0, per_scene - len(core))]]
        members = torch.cat([core, extra])
        weights = 0.2 + torch.rand(len(members), generator=g)
        scene_prior[scene, members] = weights / weights.sum()
    return SyntheticWorld(colour, texture_dir, frequency, orientation, amplitude, pattern,
                          scene_prior, scene_background)


def generate(config: SyntheticConfig, stream: str, index: int) -> tuple[Tensor, Tensor, int]:
    """Image ``index`` of ``stream`` ("train" or "val").

    Returns ``image [3, H, W]`` float32 in [0, 1], ``label [H, W]`` int64 (0..K-1, 255 on the
    ignore band) and the scene type.
    """
    world = build_world(config)
    g = _generator(config.seed, _STREAMS[stream], index)
    scene = int(torch.randint(0, config.num_scene_types, (1,), generator=g))
    top, shape_class = _shapes(config, world, scene, g)
    # the last shape covering a pixel wins (painter's order); instance 0 = the scene's background
    instance_class = torch.cat([world.scene_background[scene].view(1), shape_class])
    label = instance_class[top]
    image = _texture(config, world, instance_class, top, label, g)
    image = _lighting(config, image, g)
    if config.boundary_ignore > 0:
        label = label.clone()
        label[boundary_mask(label, config.boundary_ignore)] = IGNORE_INDEX
    return image.contiguous(), label, scene


def _pixel_grid(h: int, w: int) -> tuple[Tensor, Tensor]:
    """Row and column coordinates ``yy [1, H, 1]``, ``xx [1, 1, W]``."""
    return torch.arange(h, dtype=torch.float32).view(1, h, 1), torch.arange(w, dtype=torch.float32).view(1, 1, w)


def _shapes(config: SyntheticConfig, world: SyntheticWorld, scene: int, g: torch.Generator) -> tuple[Tensor, Tensor]:
    """2-5 shapes (rectangles, ellipses, blobs) of classes from the scene's prior: ``top [H, W]``, the
    index (1-based, 0 = background) of the last shape covering each pixel, and ``shape_class [n]``."""
    h, w = config.image_size
    lo, hi = config.shapes_per_image
    n = int(torch.randint(lo, hi + 1, (1,), generator=g))
    shape_class = torch.multinomial(world.scene_prior[scene], n, replacement=True, generator=g)
    shape_kind = torch.randint(0, 3, (n,), generator=g)  # 0 rectangle, 1 ellipse, 2 blob
    params = torch.rand(n, 6, generator=g)
    side = min(h, w)
    cy, cx = params[:, 0] * h, params[:, 1] * w
    radius = side * (0.1 + 0.25 * params[:, 2])
    aspect = 0.5 + 1.5 * params[:, 3]
    angle = math.pi * params[:, 4]
    ry, rx = radius * aspect.sqrt(), radius / aspect.sqrt()
    wobble = 0.15 * torch.rand(n, 3, generator=g)
    wobble_phase = 2 * math.pi * torch.rand(n, 3, generator=g)

    yy, xx = _pixel_grid(h, w)
    dy, dx = yy - cy.view(n, 1, 1), xx - cx.view(n, 1, 1)
    cos, sin = angle.cos().view(n, 1, 1), angle.sin().view(n, 1, 1)
    u = (dx * cos + dy * sin) / rx.view(n, 1, 1)
    v = (-dx * sin + dy * cos) / ry.view(n, 1, 1)
    radial = (u * u + v * v).sqrt()
    inside = torch.where(shape_kind.view(n, 1, 1) == 0, torch.maximum(u.abs(), v.abs()) <= 1, radial <= 1)
    blobs = (shape_kind == 2).nonzero().flatten()
    if len(blobs):  # blob: radius 1 + sum_j a_j sin(j phi + phase_j), j = 2..4
        phi = torch.atan2(v[blobs], u[blobs]).unsqueeze(1)
        harmonics = torch.arange(2, 5, dtype=torch.float32).view(1, 3, 1, 1)
        wavy = 1 + (wobble[blobs].view(-1, 3, 1, 1) * torch.sin(harmonics * phi + wobble_phase[blobs].view(-1, 3, 1, 1))).sum(1)
        inside[blobs] = radial[blobs] <= wavy
    top = (inside * torch.arange(1, n + 1).view(n, 1, 1)).amax(0)
    return top, shape_class


def _texture(config: SyntheticConfig, world: SyntheticWorld, instance_class: Tensor, top: Tensor, label: Tensor,
             g: torch.Generator) -> Tensor:
    """``image [3, H, W]``: every instance's class texture with instance jitter (colour, orientation, frequency)."""
    h, w = config.image_size
    yy, xx = _pixel_grid(h, w)
    n_instances = len(instance_class)
    jitter = config.instance_jitter * (2 * torch.rand(n_instances, 5, generator=g) - 1)
    colour = (world.colour[instance_class] + 0.08 * jitter[:, :3]).clamp(0, 1)
    theta = world.orientation[instance_class] + 0.35 * jitter[:, 3]
    freq = 2 * math.pi * world.frequency[instance_class] * (1 + 0.2 * jitter[:, 4])
    phase = 2 * math.pi * torch.rand(n_instances, generator=g)
    theta_px, freq_px = theta[top], freq[top]
    along = xx[0] * theta_px.cos() + yy[0] * theta_px.sin()
    across = -xx[0] * theta_px.sin() + yy[0] * theta_px.cos()
    stripes = torch.sin(freq_px * along + phase[top])
    checker = stripes * torch.sin(freq_px * across)
    texture = torch.where(world.pattern[label] == 0, stripes, checker)
    image = colour[top] + (world.amplitude[label] * texture).unsqueeze(-1) * world.texture_dir[label]
    return image.permute(2, 0, 1)  # [3, H, W]


def _lighting(config: SyntheticConfig, image: Tensor, g: torch.Generator) -> Tensor:
    """Per-image gain, colour cast and shading gradient, then Gaussian noise, clamped to [0, 1]."""
    h, w = config.image_size
    yy, xx = _pixel_grid(h, w)
    look = torch.rand(7, generator=g)
    gain = 1 + config.illumination * (2 * look[0] - 1)
    cast = 0.1 * (look[1:4] - 0.5).view(3, 1, 1)
    shading = 0.2 * (look[4] - 0.5) * (xx[0] / w - 0.5) + 0.2 * (look[5] - 0.5) * (yy[0] / h - 0.5)
    noise = config.noise_std * torch.randn(3, h, w, generator=g)
    return (image * gain + cast + shading + noise).clamp_(0, 1)


def boundary_mask(label: Tensor, width: int) -> Tensor:
    """Pixels within ``width`` of a class boundary. label ``[H, W]`` -> bool ``[H, W]``."""
    edge = torch.zeros_like(label, dtype=torch.bool)
    edge[1:, :] |= label[1:, :] != label[:-1, :]
    edge[:, 1:] |= label[:, 1:] != label[:, :-1]
    if width > 1:
        pooled = torch.nn.functional.max_pool2d(edge[None, None].float(), 2 * width - 1, stride=1, padding=width - 1)
        edge = pooled[0, 0] > 0
    return edge


def labeled_indices(config: SyntheticConfig, num_labeled: int) -> tuple[list[int], list[int]]:
    """Disjoint labeled / unlabeled train indices: the first ``num_labeled`` of one seeded permutation."""
    if not 1 <= num_labeled < config.train_size:
        raise ValueError(f"num_labeled must be in [1, {config.train_size - 1}], got {num_labeled}")
    order = torch.randperm(config.train_size, generator=_generator(config.seed, _STREAMS["partition"])).tolist()
    return sorted(order[:num_labeled]), sorted(order[num_labeled:])


class SyntheticSegmentation(Dataset):
    """One split of a synthetic dataset. Items: ``image [3,H,W]``, ``label [H,W]``, ``id``.

    split: "labeled" / "unlabeled" (the partition's train indices; unlabeled labels are
    all 255 unless ``reveal_labels``) or "val" (a separate stream). ``transform`` maps an item dict to an item dict.
    ``max_items`` keeps the first N items; ``info``, ``partition`` and ``partition_lists`` are
    recorded for the run (``build_dataset`` fills them).
    """

    def __init__(self, config: SyntheticConfig, split: str, *, num_labeled: int | None = None,
                 partition: str | None = None, info: object = None, partition_lists: str | None = None,
                 max_items: int | None = None, transform=None, reveal_labels: bool = False) -> None:
        if split == "val":
            indices = list(range(config.val_size))
        elif split in ("labeled", "unlabeled"):
            if num_labeled is None:
                raise ValueError(f"num_labeled (from the partition) is required for the {split} split")
            labeled, unlabeled = labeled_indices(config, num_labeled)
            indices = labeled if split == "labeled" else unlabeled
        else:
            raise ValueError(f"split must be 'labeled', 'unlabeled' or 'val', got {split!r}")
        self.config = config
        self.split = split
        self.indices = indices[:max_items]
        self.partition = partition
        self.num_labeled = num_labeled
        self.info = info
        self.partition_lists = partition_lists
        self.transform = transform
        self.hide_labels = split == "unlabeled" and not reveal_labels
        self.stream = "val" if split == "val" else "train"
        self.ids = [f"{config.name}/{self.stream}/{i:06d}" for i in self.indices]

    def __len__(self) -> int:
        return len(self.indices)

    def scene_of(self, i: int) -> int:
        """Scene type of item ``i`` (without generating the image)."""
        g = _generator(self.config.seed, _STREAMS[self.stream], self.indices[i])
        return int(torch.randint(0, self.config.num_scene_types, (1,), generator=g))

    def __getitem__(self, i: int) -> dict:
        image, label, _ = generate(self.config, self.stream, self.indices[i])
        if self.hide_labels:
            label = torch.full_like(label, IGNORE_INDEX)
        item = {"image": image, "label": label, "id": self.ids[i]}
        return self.transform(item) if self.transform is not None else item
