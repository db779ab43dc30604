"""Joint image + label transforms on torchvision.transforms.v2 (tv_tensors.Image + Mask).

An item is a dict ``image [3, H, W]`` float in [0, 1], ``label [H, W]`` int64, ``id``.
``SegmentationTransform(weak, strong)`` applies the weak geometric pipeline to image and
label together (the label is resized with nearest neighbour, padded with 255), then the
strong photometric pipeline to the weak crop only, adding ``image_strong``.

Pipelines of the frameworks (``docs/frameworks.md``):

* weak, U2PL: scale s ~ U[0.5, 1] or U[1, 2] with probability 1/2 each (``resize="rescale_balanced"``),
  flip, random crop. U2PL pads crop labels with 0 (background); here the label is padded
  with 255 unless ``label_pad_value=0`` asks for U2PL's quirk. The rescale resamples as PIL does (the image
  antialiased, the label's nearest pixel by centre, the size rounded: ``resize_resample="antialiased"``) or as U2PL's
  ``RandResize`` does (``"interpolate"``: torch's bilinear without antialiasing, its legacy ``nearest`` for the label,
  which shifts it by up to half a source pixel against the image, the size floored; switch ``u2pl_resize``).
* weak, AugSeg / PS-MT on VOC: long side resized to a random integer in
  [0.5, 2] x base size (AugSeg base 500 -> [250, 1000]; PS-MT base 600 -> [300, 1200])
  (``resize="long_side"``); on Cityscapes s ~ U[0.5, 2] (``resize="rescale"``); flip; crop
  padding the image with the ImageNet mean and the label with 255.
* strong, AugSeg: k ~ U{1, 2, 3} operations drawn with replacement from 11 intensity
  operations with uniform strengths (``RandomIntensityAugment``).
* strong, PS-MT: ColorJitter(0.5, 0.5, 0.5, 0.25) p=0.8, grayscale p=0.2, Gaussian blur
  sigma in [0.1, 2] p=0.5 (kernel 2 ceil(3 sigma) + 1, or PS-MT's own 1 / 3 / 5 with ``blur_kernel="psmt"``).
* both blurs draw sigma from ``blur_sigma`` (default the papers' [0.1, 2] pixels, at crops of ~500 px; a run on
  smaller images keeps the blur's size relative to the image with ``npsemiseg.short_run.scale_pixel_settings``).
* strong, ``identity``: the weak view itself (a diagnostic: what a framework gains or loses by its strong view).
* crops larger than the image are padded evenly on both sides (as U2PL), or on the bottom and right only as
  PS-MT's and AugSeg's crop code does (``crop_padding="bottom_right"``); the image's padding is the ImageNet mean
  (zero after normalisation: U2PL, PS-MT, AugSeg) or black (``crop_fill="zero"``: UniMatch's and UniMatch V2's
  ``crop`` pads the raw image with 0).

Every random draw uses torch's global RNG, so seeding torch (and a DataLoader's
generator / worker seeds) makes the pipelines reproducible.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor
from torchvision import tv_tensors
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F
from torchvision.transforms.v2._utils import query_size

from npsemiseg.constants import IGNORE_INDEX, PAPER_BLUR_SIGMA
from npsemiseg.data.augmentation import (  # noqa: F401  (described without torch, read from here too)
    AUGMENTATION_CHOICES,
    AUGMENTATION_KEYS,
    PAPER_AUGMENTATIONS,
    TRANSFORM_DEFAULTS,
    VIEW_KEYS,
    augmentation_keys,
    paper_augmentation,
)

IMAGENET_MEAN = (0.485, 0.456, 0.406)
RESIZE_MODES = AUGMENTATION_CHOICES["resize"]
#: how a random rescale resamples image and label (switch ``u2pl_resize``): ``antialiased`` (PIL's way: antialiased
#: bilinear image, nearest label pixel by centre, size rounded) or ``interpolate`` (U2PL's ``RandResize``,
#: u2pl/dataset/augmentation.py 190-211: ``F.interpolate`` bilinear without antialiasing, labels ``mode="nearest"``,
#: size ``int(s * side)``)
RESIZE_RESAMPLES = AUGMENTATION_CHOICES["resize_resample"]
STRONG_KINDS = tuple(kind for kind in AUGMENTATION_CHOICES["strong"] if kind is not None)
#: where a crop larger than the image is padded: evenly on both sides (U2PL's crop code too), or on the bottom and
#: right only (PS-MT's and AugSeg's crop code; switch ``crop_padding``)
CROP_PADDINGS = AUGMENTATION_CHOICES["crop_padding"]
#: what the image of a crop larger than it is padded with (switch ``crop_fill``): the ImageNet mean (zero after
#: normalisation; U2PL, PS-MT, AugSeg) or black (UniMatch's and UniMatch V2's ``crop``: the raw image padded with 0)
CROP_FILLS: dict[str, tuple[float, float, float]] = {"mean": IMAGENET_MEAN, "zero": (0.0, 0.0, 0.0)}
#: the blur kernel of PS-MT's strong view: ``sigma`` = 2 ceil(3 sigma) + 1, ``psmt`` = 1, 3 or 5 as PS-MT draws it
BLUR_KERNELS = AUGMENTATION_CHOICES["blur_kernel"]


def _uniform(low: float, high: float) -> float:
    return low + (high - low) * float(torch.rand(()))


def resize_pair_member(inpt: Any, size: list[int], resample: str = "antialiased") -> Any:
    """Resize an image (bilinear, antialiased) or a Mask (nearest with pixel centres aligned,
    i.e. ``NEAREST_EXACT`` like PIL/cv2; torchvision's default NEAREST shifts masks by up to
    half a source pixel against the bilinear image). ``resample="interpolate"`` (:data:`RESIZE_RESAMPLES`): U2PL's
    ``RandResize``, bilinear without antialiasing and the shifted ``nearest`` for masks."""
    if resample == "interpolate":
        mode = v2.InterpolationMode.NEAREST if isinstance(inpt, tv_tensors.Mask) else v2.InterpolationMode.BILINEAR
        return F.resize(inpt, size=size, interpolation=mode, antialias=False)
    if isinstance(inpt, tv_tensors.Mask):
        return F.resize(inpt, size=size, interpolation=v2.InterpolationMode.NEAREST_EXACT)
    return F.resize(inpt, size=size, antialias=True)


class RandomRescale(v2.Transform):
    """Resize by a random factor s (image bilinear, label nearest).

    balanced=False: s ~ U[low, high]. balanced=True (U2PL): with probability 1/2
    s ~ U[low, 1], else s ~ U[1, high]. ``choices`` (TorchSemiSeg's ``random.choice(train_scale_array)``): s one of
    them, each as likely, instead of either draw. ``resample`` (:data:`RESIZE_RESAMPLES`): ``antialiased``, the size
    ``round(s * side)``; ``interpolate`` (U2PL's ``RandResize``; OpenCV's ``INTER_LINEAR`` and ``INTER_NEAREST``, as
    TorchSemiSeg resizes, sample the same points), ``int(s * side)``.
    """

    def __init__(self, scale_range: Sequence[float] = (0.5, 2.0), *, balanced: bool = False,
                 resample: str = "antialiased", choices: Sequence[float] | None = None) -> None:
        super().__init__()
        low, high = float(scale_range[0]), float(scale_range[1])
        if not 0 < low <= high or (balanced and not low <= 1 <= high):
            raise ValueError(f"scale_range must be 0 < low <= high (balanced: low <= 1 <= high), got {scale_range}")
        if resample not in RESIZE_RESAMPLES:
            raise ValueError(f"resize_resample: expected one of {list(RESIZE_RESAMPLES)}, got {resample!r}")
        if choices is not None and (not choices or any(float(c) <= 0 for c in choices)):
            raise ValueError(f"scale_choices: expected a non-empty list of positive scales, got {list(choices)}")
        self.scale_range = (low, high)
        self.balanced, self.resample = balanced, resample
        self.choices = None if choices is None else tuple(float(c) for c in choices)

    def make_params(self, flat_inputs: list[Any]) -> dict[str, Any]:
        low, high = self.scale_range
        if self.choices is not None:
            scale = self.choices[int(torch.randint(len(self.choices), ()))]
        elif self.balanced:
            scale = _uniform(low, 1.0) if float(torch.rand(())) < 0.5 else _uniform(1.0, high)
        else:
            scale = _uniform(low, high)
        height, width = query_size(flat_inputs)
        size = int if self.resample == "interpolate" else round
        return {"size": [max(1, size(height * scale)), max(1, size(width * scale))]}

    def transform(self, inpt: Any, params: dict[str, Any]) -> Any:
        return resize_pair_member(inpt, params["size"], self.resample)


class RandomLongSideResize(v2.Transform):
    """Resize so that the long side is a random integer in [min_size, max_size] (aspect kept)."""

    def __init__(self, min_size: int, max_size: int) -> None:
        super().__init__()
        if not 1 <= min_size <= max_size:
            raise ValueError(f"need 1 <= min_size <= max_size, got {min_size}, {max_size}")
        self.min_size, self.max_size = int(min_size), int(max_size)

    def make_params(self, flat_inputs: list[Any]) -> dict[str, Any]:
        long_side = int(torch.randint(self.min_size, self.max_size + 1, ()))
        height, width = query_size(flat_inputs)
        scale = long_side / max(height, width)
        return {"size": [max(1, round(height * scale)), max(1, round(width * scale))]}

    def transform(self, inpt: Any, params: dict[str, Any]) -> Any:
        return resize_pair_member(inpt, params["size"])


def crop_pad_sides(pad_h: int, pad_w: int, placement: str) -> list[int]:
    """``[left, top, right, bottom]`` padding of ``pad_h`` rows and ``pad_w`` columns: split evenly
    (``centered``, U2PL) or all on the bottom and right (``bottom_right``, PS-MT's and AugSeg's crop code)."""
    if placement == "centered":
        return [pad_w // 2, pad_h // 2, pad_w - pad_w // 2, pad_h - pad_h // 2]
    if placement == "bottom_right":
        return [0, 0, pad_w, pad_h]
    raise ValueError(f"crop_padding: expected one of {list(CROP_PADDINGS)}, got {placement!r}")


class PadCrop(v2.Transform):
    """Pad to at least ``crop_size`` (``padding``: evenly on both sides or bottom/right only), then crop ``crop_size``.

    The image is padded with ``image_fill`` (ImageNet mean: zero after normalisation),
    the label with ``label_pad_value`` (255 = ignore). ``random=True`` draws the crop
    offset uniformly; ``random=False`` takes the center crop (evaluation).
    """

    def __init__(self, crop_size: int | Sequence[int], *, random: bool = True,
                 image_fill: Sequence[float] = IMAGENET_MEAN, label_pad_value: int = IGNORE_INDEX,
                 padding: str = "centered") -> None:
        super().__init__()
        crop_pad_sides(0, 0, padding)  # checks the name
        self.padding = padding
        size = (crop_size, crop_size) if isinstance(crop_size, int) else tuple(crop_size)
        if len(size) != 2 or min(size) < 1:
            raise ValueError(f"crop_size must be a positive int or (H, W), got {crop_size!r}")
        if not 0 <= label_pad_value <= 255:
            raise ValueError(f"label_pad_value must be in [0, 255], got {label_pad_value}")
        self.crop_size = (int(size[0]), int(size[1]))
        self.random = random
        self.image_fill = [float(v) for v in image_fill]
        self.label_pad_value = int(label_pad_value)

    def make_params(self, flat_inputs: list[Any]) -> dict[str, Any]:
        height, width = query_size(flat_inputs)
        crop_h, crop_w = self.crop_size
        pad_h, pad_w = max(crop_h - height, 0), max(crop_w - width, 0)
        padding = crop_pad_sides(pad_h, pad_w, self.padding)  # left, top, right, bottom
        room_h, room_w = height + pad_h - crop_h, width + pad_w - crop_w
        if self.random:
            top, left = int(torch.randint(0, room_h + 1, ())), int(torch.randint(0, room_w + 1, ()))
        else:
            top, left = room_h // 2, room_w // 2
        return {"padding": padding, "top": top, "left": left}

    def transform(self, inpt: Any, params: dict[str, Any]) -> Any:
        if any(params["padding"]):
            fill = self.label_pad_value if isinstance(inpt, tv_tensors.Mask) else self.image_fill
            inpt = self._call_kernel(F.pad, inpt, padding=params["padding"], fill=fill)
        return self._call_kernel(F.crop, inpt, top=params["top"], left=params["left"],
                                 height=self.crop_size[0], width=self.crop_size[1])


def gaussian_blur(image: Tensor, sigma: float, kernel_size: int | None = None) -> Tensor:
    """Gaussian blur with a kernel of 2*ceil(3 sigma)+1 (PIL's GaussianBlur(radius=sigma) analogue), or of
    ``kernel_size`` (odd) when given; 1 leaves the image as it is."""
    size = 2 * math.ceil(3 * sigma) + 1 if kernel_size is None else int(kernel_size)
    if size == 1:
        return image
    largest = 2 * (min(image.shape[-2:]) - 1) - 1  # reflect padding must stay inside the image
    size = max(1, min(size, largest if largest % 2 else largest - 1))
    return F.gaussian_blur(image, kernel_size=[size, size], sigma=[sigma, sigma])


def psmt_blur_kernel_size() -> int:
    """PS-MT's blur kernel (VocCode base_dataset.py ``data_aug``): ``int(u x 4.95)`` for u ~ U[0, 1), made odd
    by adding 1 to an even value: 1, 3 or 5 with p = 0.40 / 0.40 / 0.19 (a kernel of 1 leaves the image as it is)."""
    size = int(float(torch.rand(())) * 4.95)
    return size + 1 if size % 2 == 0 else size


class RandomGaussianBlur(v2.Transform):
    """With probability ``p``, blur with sigma ~ U[sigma_range] (images only).

    ``kernel``: ``sigma`` = the kernel :func:`gaussian_blur` derives from sigma; ``psmt`` = a kernel of
    :func:`psmt_blur_kernel_size` (drawn before sigma, as PS-MT does, whether the blur applies or not)."""

    def __init__(self, sigma_range: Sequence[float] = PAPER_BLUR_SIGMA, p: float = 0.5, *, kernel: str = "sigma") -> None:
        super().__init__()
        if kernel not in BLUR_KERNELS:
            raise ValueError(f"blur_kernel: expected one of {list(BLUR_KERNELS)}, got {kernel!r}")
        self.sigma_range = _sigma_range(sigma_range)
        self.p = p
        self.kernel = kernel

    def make_params(self, flat_inputs: list[Any]) -> dict[str, Any]:
        size = psmt_blur_kernel_size() if self.kernel == "psmt" else None
        apply = float(torch.rand(())) < self.p
        return {"sigma": _uniform(*self.sigma_range) if apply else None, "size": size}

    def transform(self, inpt: Any, params: dict[str, Any]) -> Any:
        if params["sigma"] is None or isinstance(inpt, tv_tensors.Mask):
            return inpt
        return gaussian_blur(inpt, params["sigma"], kernel_size=params["size"])


def _sigma_range(sigma: Sequence[float]) -> tuple[float, float]:
    low, high = (float(v) for v in sigma)
    if not 0 < low <= high:
        raise ValueError(f"blur_sigma: expected (min, max) with 0 < min <= max, got {tuple(sigma)}")
    return low, high


def _enhance_factor() -> float:
    return _uniform(0.05, 0.95)


def _signed_hue() -> float:
    shift = _uniform(0.0, 0.5)
    return -shift if float(torch.rand(())) < 0.5 else shift


#: AugSeg's 11 intensity operations: name -> (strength sampler, op(image, strength)).
AUGSEG_OPS: dict[str, tuple[Callable[[], Any], Callable[[Tensor, Any], Tensor]]] = {
    "identity": (lambda: None, lambda img, _: img),
    "autocontrast": (lambda: None, lambda img, _: F.autocontrast(img)),
    "equalize": (lambda: None, lambda img, _: F.equalize(img)),
    "blur": (lambda: _uniform(*PAPER_BLUR_SIGMA), gaussian_blur),  # RandomIntensityAugment draws its own range
    "contrast": (_enhance_factor, F.adjust_contrast),
    "brightness": (_enhance_factor, F.adjust_brightness),
    "color": (_enhance_factor, F.adjust_saturation),
    "sharpness": (_enhance_factor, F.adjust_sharpness),
    "posterize": (lambda: int(torch.randint(4, 8, ())), F.posterize),
    "solarize": (lambda: int(torch.randint(1, 256, ())) / 255.0, F.solarize),
    "hue": (_signed_hue, F.adjust_hue),
}


class RandomIntensityAugment(v2.Transform):
    """AugSeg's random intensity-based augmentation: k ~ U{min_ops..max_ops} operations drawn
    with replacement from ``AUGSEG_OPS``, each with a uniformly drawn strength. Images only.
    """

    def __init__(self, num_ops: tuple[int, int] = (1, 3), ops: Sequence[str] | None = None,
                 blur_sigma: Sequence[float] = PAPER_BLUR_SIGMA) -> None:
        super().__init__()
        self.blur_sigma = _sigma_range(blur_sigma)
        self.ops = tuple(ops) if ops is not None else tuple(AUGSEG_OPS)
        unknown = [o for o in self.ops if o not in AUGSEG_OPS]
        if unknown or not self.ops:
            raise ValueError(f"ops: unknown {unknown}; valid: {list(AUGSEG_OPS)}")
        if not 1 <= num_ops[0] <= num_ops[1]:
            raise ValueError(f"num_ops must be (min, max) with 1 <= min <= max, got {num_ops}")
        self.num_ops = (int(num_ops[0]), int(num_ops[1]))

    def make_params(self, flat_inputs: list[Any]) -> dict[str, Any]:
        k = int(torch.randint(self.num_ops[0], self.num_ops[1] + 1, ()))
        chosen = torch.randint(0, len(self.ops), (k,)).tolist()
        names = [self.ops[i] for i in chosen]
        return {"ops": [(name, _uniform(*self.blur_sigma) if name == "blur" else AUGSEG_OPS[name][0]())
                        for name in names]}

    def transform(self, inpt: Any, params: dict[str, Any]) -> Any:
        if isinstance(inpt, tv_tensors.Mask):
            return inpt
        for name, strength in params["ops"]:
            inpt = AUGSEG_OPS[name][1](inpt, strength).clamp(0, 1)
        return inpt


def strong_pipeline(kind: str, *, blur_kernel: str = "sigma",
                    blur_sigma: Sequence[float] = PAPER_BLUR_SIGMA) -> v2.Transform:
    """The strong (photometric) view: ``"augseg"``, ``"psmt"`` or ``"identity"`` (see module docstring);
    ``blur_kernel`` is the PS-MT view's (:class:`RandomGaussianBlur`); ``blur_sigma`` the (min, max) sigma in
    pixels of either view's blur."""
    if kind == "identity":
        return v2.Identity()
    if kind == "augseg":
        return RandomIntensityAugment(blur_sigma=blur_sigma)
    if kind == "psmt":
        return v2.Compose([
            v2.RandomApply([v2.ColorJitter(0.5, 0.5, 0.5, 0.25)], p=0.8),
            v2.RandomGrayscale(p=0.2),
            RandomGaussianBlur(blur_sigma, p=0.5, kernel=blur_kernel),
        ])
    raise ValueError(f"strong kind must be one of {STRONG_KINDS}, got {kind!r}")


def weak_pipeline(crop_size: int | Sequence[int], *, resize: str = "rescale_balanced",
                  scale_range: Sequence[float] = (0.5, 2.0), scale_choices: Sequence[float] | None = None,
                  base_size: int | None = None,
                  flip: bool = True, label_pad_value: int = IGNORE_INDEX, crop_padding: str = "centered",
                  crop_fill: str = "mean", resize_resample: str = "antialiased") -> v2.Compose:
    """Random resize, horizontal flip, random crop (pads the image with ``crop_fill``, :data:`CROP_FILLS`, the label
    with 255, on the sides ``crop_padding`` names: :func:`crop_pad_sides`). ``resize_resample``: how the rescale
    modes resample (:data:`RESIZE_RESAMPLES`; the long side's resize is antialiased).

    resize: ``"rescale_balanced"`` (U2PL), ``"rescale"`` (s ~ U[scale_range]; either draws one of
    ``scale_choices`` instead where given: TorchSemiSeg's), ``"long_side"``
    (long side in scale_range x ``base_size``, an integer; AugSeg/PS-MT on VOC) or ``"none"``.
    """
    if resize not in RESIZE_MODES:
        raise ValueError(f"resize must be one of {RESIZE_MODES}, got {resize!r}")
    steps: list[v2.Transform] = []
    if resize in ("rescale", "rescale_balanced"):
        steps.append(RandomRescale(scale_range, balanced=resize == "rescale_balanced", resample=resize_resample,
                                   choices=scale_choices))
    elif resize == "long_side":
        if base_size is None:
            raise ValueError("resize='long_side' needs base_size (VOC: AugSeg 500, PS-MT 600)")
        steps.append(RandomLongSideResize(round(scale_range[0] * base_size), round(scale_range[1] * base_size)))
    if flip:
        steps.append(v2.RandomHorizontalFlip(p=0.5))
    if crop_fill not in CROP_FILLS:
        raise ValueError(f"crop_fill: expected one of {list(CROP_FILLS)}, got {crop_fill!r}")
    steps.append(PadCrop(crop_size, random=True, image_fill=CROP_FILLS[crop_fill], label_pad_value=label_pad_value,
                         padding=crop_padding))
    return v2.Compose(steps)


#: keywords of :func:`train_transform` that a framework asks for (``Framework.unlabeled_views``), not configuration keys
#: suffix of the keys of an item's second augmentation draw (``image_mix``, ``image_strong_mix``, ...)
DRAW_SUFFIX = "_mix"


def strong_key(view: int) -> str:
    """The item key of strong view ``view`` (0-based): ``image_strong``, ``image_strong2``, ..."""
    return "image_strong" if view == 0 else f"image_strong{view + 1}"


class SegmentationTransform:
    """Item dict -> item dict: ``weak`` on image + label together, ``strong`` on the weak image.

    Output: ``image [3, h, w]`` (weak view), ``label [h, w]``, ``id`` and, with ``strong``,
    ``image_strong [3, h, w]`` (same geometry as ``image``, only intensities differ); ``strong_views = n`` > 1 adds
    ``image_strong2`` ... ``image_strong<n>``, each from its own photometric draws on the same weak crop (UniMatch's two
    strong views, dataset/semi.py 51-60). ``padding_mask``: ``padding [h, w]`` bool, True where the crop padded the
    image (UniMatch's ``ignore_mask``, dataset/semi.py 45, 64-68). ``draws = 2``: the same keys again with suffix
    ``_mix`` from a second, independent draw of every random step on the same source item (the official second
    iterator over the unlabeled set, unimatch.py 121: the same image, another view).
    """

    def __init__(self, weak: v2.Transform | None = None, strong: v2.Transform | None = None, *, strong_views: int = 1,
                 padding_mask: bool = False, draws: int = 1) -> None:
        if strong_views < 1 or draws not in (1, 2):
            raise ValueError(f"strong_views: expected >= 1 (got {strong_views!r}); draws: expected 1 or 2 (got {draws!r})")
        self.weak = weak
        self.strong = strong
        self.strong_views, self.padding_mask, self.draws = strong_views, padding_mask, draws

    def __call__(self, item: dict) -> dict:
        out = self._draw(item)
        if self.draws == 2:
            mix = self._draw(item)
            out.update({f"{k}{DRAW_SUFFIX}": v for k, v in mix.items() if isinstance(v, Tensor)})
        return out

    def _draw(self, item: dict) -> dict:
        out = dict(item)
        pair = {"image": tv_tensors.Image(item["image"]), "label": tv_tensors.Mask(item["label"])}
        if self.padding_mask:  # ones padded with the label's pad value (255, or U2PL's 0): True where the crop padded
            pair["padding"] = tv_tensors.Mask(torch.ones(item["label"].shape, dtype=torch.uint8))
        if self.weak is not None:
            pair = self.weak(pair)
        out["image"] = pair["image"].as_subclass(Tensor).contiguous()
        out["label"] = pair["label"].as_subclass(Tensor).contiguous()
        if self.padding_mask:
            out["padding"] = pair["padding"].as_subclass(Tensor) != 1
        if self.strong is not None:
            for view in range(self.strong_views):
                strong = self.strong(tv_tensors.Image(out["image"]))
                out[strong_key(view)] = strong.as_subclass(Tensor).contiguous()
        return out

    def __repr__(self) -> str:
        return (f"SegmentationTransform(weak={self.weak!r}, strong={self.strong!r}, strong_views={self.strong_views}, "
                f"padding_mask={self.padding_mask}, draws={self.draws})")


def train_transform(crop_size: int | Sequence[int], *, resize: str = "rescale_balanced",
                    scale_range: Sequence[float] = (0.5, 2.0), scale_choices: Sequence[float] | None = None,
                    base_size: int | None = None,
                    strong: str | None = None, flip: bool = True,
                    label_pad_value: int = IGNORE_INDEX, crop_padding: str = "centered", crop_fill: str = "mean",
                    resize_resample: str = "antialiased",
                    blur_kernel: str = "sigma", blur_sigma: Sequence[float] = PAPER_BLUR_SIGMA,
                    strong_views: int = 1, padding_mask: bool = False, draws: int = 1) -> SegmentationTransform:
    """Training transform: ``weak_pipeline(...)`` plus, if ``strong`` ("augseg" / "psmt"), the strong view
    (``blur_kernel``: the PS-MT view's blur kernel, :data:`BLUR_KERNELS`). ``strong_views``, ``padding_mask`` and
    ``draws`` (:data:`VIEW_KEYS`, :class:`SegmentationTransform`) are what a framework's unlabeled stream asks for."""
    weak = weak_pipeline(crop_size, resize=resize, scale_range=scale_range, scale_choices=scale_choices,
                         base_size=base_size,
                         flip=flip, label_pad_value=label_pad_value, crop_padding=crop_padding, crop_fill=crop_fill,
                         resize_resample=resize_resample)
    view = None if strong is None else strong_pipeline(strong, blur_kernel=blur_kernel, blur_sigma=blur_sigma)
    return SegmentationTransform(weak, view, strong_views=strong_views, padding_mask=padding_mask, draws=draws)


def val_transform(crop_size: int | Sequence[int] | None = None, *,
                  label_pad_value: int = IGNORE_INDEX) -> SegmentationTransform:
    """Evaluation transform: the whole image (``crop_size=None``) or its padded center crop."""
    weak = None if crop_size is None else PadCrop(crop_size, random=False, label_pad_value=label_pad_value)
    return SegmentationTransform(weak)
