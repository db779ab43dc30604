"""The training augmentation as a configuration sees it, without torch: its settings (the keys of
``data.augmentation``) and the paper pipelines a framework names.

``npsemiseg.data.transforms`` builds the pipelines from the same settings (``train_transform``'s keywords).
"""

from __future__ import annotations

from typing import Any

from npsemiseg.constants import IGNORE_INDEX, PAPER_BLUR_SIGMA

#: the training pipelines a framework names (``FrameworkSpec.augmentation``): weak/strong settings per dataset family
PAPER_AUGMENTATIONS: tuple[str, ...] = ("u2pl", "augseg", "psmt")

#: ``npsemiseg.data.transforms.train_transform``'s keywords besides the crop, with their defaults. A new keyword
#: of ``train_transform`` goes here too (``tests/test_registry.py`` checks both agree).
TRANSFORM_DEFAULTS: dict[str, Any] = {
    "resize": "rescale_balanced", "scale_range": (0.5, 2.0), "scale_choices": None, "base_size": None, "strong": None,
    "flip": True,
    "label_pad_value": IGNORE_INDEX, "crop_padding": "centered", "crop_fill": "mean", "resize_resample": "antialiased",
    "blur_kernel": "sigma",
    "blur_sigma": PAPER_BLUR_SIGMA,
    "strong_views": 1, "padding_mask": False, "draws": 1,
}
#: the values of the enumerated settings, checked by the configuration before anything starts (one source: the
#: transforms' own checks read these too)
AUGMENTATION_CHOICES: dict[str, tuple[Any, ...]] = {
    "resize": ("rescale", "rescale_balanced", "long_side", "none"),
    "strong": (None, "augseg", "psmt", "identity"),
    "crop_padding": ("centered", "bottom_right"),
    "crop_fill": ("mean", "zero"),
    "resize_resample": ("antialiased", "interpolate"),
    "blur_kernel": ("sigma", "psmt"),
}
#: what a framework's unlabeled stream asks for (``Framework.unlabeled_views``), not a configuration
VIEW_KEYS: tuple[str, ...] = ("strong_views", "padding_mask", "draws")
#: the settings of the training augmentation (the keys of a configuration's ``data.augmentation``): the transform's
#: keywords besides the crop and the views
AUGMENTATION_KEYS: tuple[str, ...] = tuple(key for key in TRANSFORM_DEFAULTS if key not in VIEW_KEYS)


def augmentation_keys() -> tuple[str, ...]:
    """The keys of a configuration's ``data.augmentation`` (:data:`AUGMENTATION_KEYS`)."""
    return AUGMENTATION_KEYS


def unknown_augmentation_values(settings: dict[str, Any]) -> list[str]:
    """Each enumerated setting of ``settings`` whose value is not one of :data:`AUGMENTATION_CHOICES`'s, as
    ``key=value (expected one of [...])``."""
    return [f"{key}={settings[key]!r} (expected one of {list(choices)})" for key, choices in AUGMENTATION_CHOICES.items()
            if key in settings and settings[key] not in choices]


def paper_augmentation(pipeline: str, dataset_kind: str) -> dict[str, Any]:
    """The weak/strong settings of training pipeline ``pipeline`` (``u2pl``: U2PL's, also MT's and the
    supervised reference's; ``augseg``; ``psmt``) on ``"voc"`` or ``"cityscapes"`` (kwargs of
    ``train_transform`` except ``crop_size``); ``strong`` is the view given to unlabeled images.
    """
    if dataset_kind not in ("voc", "cityscapes"):
        raise ValueError(f"dataset_kind must be 'voc' or 'cityscapes', got {dataset_kind!r}")
    if pipeline == "u2pl":
        return {"resize": "rescale_balanced", "strong": None}
    if pipeline in ("augseg", "psmt"):
        if dataset_kind == "voc":
            return {"resize": "long_side", "base_size": 500 if pipeline == "augseg" else 600, "strong": pipeline}
        return {"resize": "rescale", "strong": pipeline}
    raise ValueError(f"augmentation: unknown name {pipeline!r} (a framework's training pipeline), "
                     f"expected one of {list(PAPER_AUGMENTATIONS)}")
