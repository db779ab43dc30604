"""The file loaders every dataset of files shares, the Cityscapes id tables, and ``build_dataset``.

``build_dataset(name, ...)`` and ``resolve_root(name, ...)`` ask the dataset's registered class
(``npsemiseg.data.base.DatasetDef``; the classes live in ``npsemiseg/data/sets/``, one file each), which knows
its layout::

    <voc_root>/JPEGImages/<ID>.jpg
    <voc_root>/SegmentationClassAug/<ID>.png          index PNG ("L" or "P"), 0..20, 255 ignore
    <cityscapes_root>/leftImg8bit/<split>/<city>/<name>_leftImg8bit.png
    <cityscapes_root>/gtFine/<split>/<city>/<name>_gtFine_labelTrainIds.png   (0..18, 255)
        or, when absent, <name>_gtFine_labelIds.png (0..33, converted 34 -> 19 here)

Data root: the ``root`` argument, else the ``NPSEMISEG_DATA`` environment variable. The
root is either the dataset folder itself or a folder holding it in one of the dataset's
conventional subfolders (``VOC2012`` or ``VOCdevkit/VOC2012`` for both PASCAL datasets,
``cityscapes`` for Cityscapes).

File existence is checked when a dataset is built (a partial dataset fails at once,
naming the first missing files); a file's content (decodable image, label mode, label
values, matching sizes) is checked when the item is loaded.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from PIL import UnidentifiedImageError

from npsemiseg.data.info import DATASETS, IGNORE_INDEX, dataset_root
from npsemiseg.untrusted import IMAGE_FORMATS, LABEL_FORMATS, decode_image

if TYPE_CHECKING:  # torch is imported when an image is loaded, numpy when pixels are read: checking a dataset's
    # files does without torch, listing the datasets (the command line's help) without either
    import numpy as np
    import torch
    from torch.utils.data import Dataset

DATA_ROOT_ENV = "NPSEMISEG_DATA"

#: cityscapesScripts' labels.py: label id -> train id (everything else -> 255)
CITYSCAPES_ID_TO_TRAINID: dict[int, int] = {
    7: 0, 8: 1, 11: 2, 12: 3, 13: 4, 17: 5, 19: 6, 20: 7, 21: 8, 22: 9, 23: 10,
    24: 11, 25: 12, 26: 13, 27: 14, 28: 15, 31: 16, 32: 17, 33: 18,
}
CITYSCAPES_NUM_LABEL_IDS = 34  # labelIds images hold 0..33


@functools.cache
def _id_to_trainid_table() -> np.ndarray:
    import numpy as np  # numpy where pixels are read: the registries' import (the CLI's help) does without it

    table = np.full(256, IGNORE_INDEX, dtype=np.uint8)
    for label_id, train_id in CITYSCAPES_ID_TO_TRAINID.items():
        table[label_id] = train_id
    return table


Transform = Callable[[dict], dict]


def cityscapes_labelids_to_trainids(label_ids: np.ndarray) -> np.ndarray:
    """Map a Cityscapes ``labelIds`` array (values 0..33) to train ids (0..18, 255)."""
    return _id_to_trainid_table()[label_ids]


#: PIL modes of grey images of more than 8 bits: read as ``value / 65535`` (never clipped to 255), the same grey
#: in the three channels; a value above 65535 (a 32-bit "I" image) or a float image ("F") is refused
WIDE_GREY_MODES = ("I;16", "I;16L", "I;16B", "I;16N", "I")
_WIDE_MAX = 65535


def image_depth(mode: str) -> str:
    """What PIL ``mode`` holds and how :func:`load_image` reads it, for ``data check`` (``"8-bit RGB"``)."""
    if mode in WIDE_GREY_MODES:
        return "16-bit grey (read as value / 65535)"
    if mode == "F":
        return "32-bit float grey (refused)"
    return {"1": "1-bit black and white", "L": "8-bit grey", "P": "8-bit palette", "LA": "8-bit grey + alpha",
            "RGBA": "8-bit RGB + alpha (alpha dropped)", "CMYK": "8-bit CMYK"}.get(mode, f"8-bit {mode}")


def _image_pixels(img, path: Path) -> np.ndarray:
    """A loaded PIL image -> uint8 ``[H, W, 3]`` RGB, or ``[H, W]`` int32 grey of 0..65535 for the wide grey modes
    (:data:`WIDE_GREY_MODES`); ``ValueError`` for a float image or values beyond 16 bits."""
    import numpy as np

    if img.mode in WIDE_GREY_MODES:
        grey = np.asarray(img).astype(np.int32)
        if grey.size and (grey.min() < 0 or grey.max() > _WIDE_MAX):
            raise ValueError(f"image file {path} is a 32-bit integer image holding values {int(grey.min())}.."
                             f"{int(grey.max())}; expected 8-bit RGB or grey, or 16-bit grey (0..65535)")
        return grey
    if img.mode == "F":
        raise ValueError(f"image file {path} is a 32-bit float image; expected 8-bit RGB or grey, or 16-bit grey "
                         "(convert it to one of those first: its range is not known)")
    return np.array(img.convert("RGB"), dtype=np.uint8)


def read_pixels(path: Path, *, formats: Sequence[str] = IMAGE_FORMATS) -> tuple[np.ndarray, str]:
    """Decode an image file fully -> (its pixels: uint8 ``[H, W, 3]``, or ``[H, W]`` 0..65535 for 16-bit grey; its
    PIL mode); ``ValueError`` naming the file if it is truncated, corrupt, not an image, not of ``formats``, of a
    depth that cannot be read faithfully, or holds more pixels than any image may have
    (:func:`~npsemiseg.untrusted.decode_image`). ``data check`` and :func:`load_image` share it."""
    try:
        img = decode_image(path, formats=formats)
        return _image_pixels(img, path), img.mode
    except FileNotFoundError:
        raise FileNotFoundError(f"image file {path} does not exist") from None
    except (UnidentifiedImageError, OSError, SyntaxError) as err:
        raise ValueError(f"image file {path} is corrupt or not an image ({err})") from None


def load_image(path: Path, *, formats: Sequence[str] = IMAGE_FORMATS) -> torch.Tensor:
    """Image file of ``formats`` -> float32 ``[3, H, W]`` in [0, 1] (:func:`read_pixels`): 8-bit values / 255,
    16-bit grey values / 65535 in the three channels."""
    import numpy as np
    import torch

    pixels, _ = read_pixels(path, formats=formats)
    if pixels.ndim == 2:
        return torch.from_numpy(pixels.astype(np.float32) / _WIDE_MAX).expand(3, -1, -1).contiguous()
    return torch.from_numpy(pixels).permute(2, 0, 1).float().div_(255.0)


def load_index_png(path: Path, *, max_value: int, what: str) -> np.ndarray:
    """Single-channel index PNG (mode "L" or "P") -> uint8 ``[H, W]``.

    Values must be in ``0..max_value`` or 255; ``what`` says in the error what they are.
    """
    import numpy as np

    try:
        img = decode_image(path, formats=LABEL_FORMATS)
        mode = img.mode
        array = np.asarray(img) if mode in ("L", "P") else None
    except FileNotFoundError:
        raise FileNotFoundError(f"label file {path} does not exist") from None
    except (UnidentifiedImageError, OSError, SyntaxError) as err:
        raise ValueError(f"label file {path} is corrupt or not an image ({err})") from None
    if array is None:
        raise ValueError(
            f"label file {path} has PIL mode {mode!r}; expected a single-channel index PNG (mode 'L' or 'P') "
            f"holding {what} (a colour-rendered mask is not a label map)"
        )
    bad = np.unique(array[(array > max_value) & (array != IGNORE_INDEX)])
    if bad.size:
        raise ValueError(
            f"label file {path} holds values {bad[:10].tolist()} outside {what} (0..{max_value}, 255 = ignore)"
        )
    return array


def cityscapes_label_paths(image_entry: str) -> tuple[str, str]:
    """``leftImg8bit/.../x_leftImg8bit.png`` -> (``gtFine/.../x_gtFine_labelTrainIds.png``, ``..._labelIds.png``)."""
    if not (image_entry.startswith("leftImg8bit/") and image_entry.endswith("_leftImg8bit.png")):
        raise ValueError(f"Cityscapes list entry {image_entry!r}: expected leftImg8bit/<split>/<city>/<name>_leftImg8bit.png")
    stem = "gtFine/" + image_entry[len("leftImg8bit/"): -len("leftImg8bit.png")]
    return stem + "gtFine_labelTrainIds.png", stem + "gtFine_labelIds.png"


def root_subfolders(name: str) -> list[str]:
    """The conventional subfolders of a data root holding dataset ``name`` (``["VOC2012", "VOCdevkit/VOC2012"]``)."""
    return list(getattr(DATASETS.get(name), "root_subfolders", ()))


def resolve_root(name: str, root: str | os.PathLike | None = None) -> Path:
    """The folder of dataset ``name``: ``root`` (or ``$NPSEMISEG_DATA``) itself or its conventional subfolder."""
    with dataset_root(root):
        return DATASETS.get(name).resolve_root(root)


def build_dataset(name: str, split: str, root: str | os.PathLike | None = None,
                  partition: str | int | None = None, *, partition_lists: str = "u2pl",
                  transform: Transform | None = None, reveal_labels: bool = False, **options: object) -> Dataset:
    """One split of dataset ``name`` (its registered class's ``build``).

    split: ``"labeled"``, ``"unlabeled"`` (both need ``partition``, e.g. ``"92"`` or ``"1/16"``)
    or ``"val"`` (the study dataset also ``"tune"``). partition_lists: ``"u2pl"`` (default) or ``"cps"``
    partition lists (real datasets; for synthetic ones it is recorded only). options: generator settings
    of a generated dataset (``image_size``, ``train_size``, ``val_size``, ``seed``, ``num_classes``, ...);
    every dataset takes ``max_items`` (keep the first N list entries: smoke runs on real data).
    Items are dicts ``image [3,H,W]`` float32 in [0,1], ``label [H,W]``
    int64 (255 = ignore; all 255 on the unlabeled split unless ``reveal_labels``: the pseudo-label
    diagnostics of ``data.unlabeled_truth``), ``id`` str, passed through ``transform``.
    The returned dataset has ``info``, ``split``, ``partition`` and ``partition_lists`` attributes.
    """
    with dataset_root(root):
        definition = DATASETS.get(name)
    if partition_lists not in ("u2pl", "cps"):
        raise ValueError(f"partition_lists must be 'u2pl' or 'cps', got {partition_lists!r}")
    max_items = options.pop("max_items", None)
    if max_items is not None and (not isinstance(max_items, int) or max_items < 1):
        raise ValueError(f"max_items must be a positive int or None, got {max_items!r}")
    return definition.build(split, root, partition, partition_lists=partition_lists, transform=transform,
                            reveal_labels=reveal_labels, max_items=max_items, **options)
