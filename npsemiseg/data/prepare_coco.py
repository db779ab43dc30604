"""``npsemiseg data prepare coco``: UniMatch's 81-class COCO masks from the official COCO 2017 instance annotations.

UniMatch (LiheYoung/UniMatch@0324f3d README.md 110, 112; UniMatch-V2@f6afb4d README.md 98, 102) trains on masks it
ships pre-processed ("The groundtruth masks have already been pre-processed by us") and documents no conversion; its
reader (``dataset/semi.py`` 34-35) opens ``masks/<ID>.png`` as an index PNG and its classes
(``util/classes.py`` 9-19, the first 81 of the ``coco`` list) are ``void`` (0, trained as the background) and the 80
thing categories in the order of COCO's category ids. What this module writes is therefore the standard conversion,
not a reproduction of UniMatch's files: torchvision's segmentation reference (pytorch/vision
``references/segmentation/coco_utils.py``, ``convert_coco_poly_to_mask`` and ``ConvertCocoPolysToMask``), with all
80 categories instead of its 20 VOC ones:

* 0 where no annotation lies (the background, UniMatch's ``void``);
* the category's index 1..80 (COCO's 80 category ids in ascending order, 1 = person .. 80 = toothbrush) where one
  annotation lies; a polygon annotation's parts are merged, a crowd annotation (``iscrowd`` 1, an RLE) is its
  category like any other (semantically a crowd of people is people; only its instances are not separated);
* 255 (ignored) where two or more annotations overlap (torchvision's "discard overlapping instances").

Masks go to ``<root>/masks/<file_name stem>.png`` (train2017 and val2017 in one folder, as UniMatch's), one
single-channel PNG per image of the annotation file, images without annotations all 0. Both annotation files are read and
validated before anything is written (each image's height x width within the pixel limit of ``npsemiseg.untrusted``,
each RLE at its image's size: a mask is allocated from them); the masks are built in a temporary folder beside
``masks/`` and moved into it at the end, so a bad input (a missing file, JSON that does not parse or is not COCO's
instances format, an annotation of an unknown image or category) leaves ``masks/`` as it was. A mask already in
``masks/`` is kept (a rerun writes only what is missing). Needs ``pycocotools`` (``pip install 'npsemiseg[coco]'``).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from npsemiseg.data.check import Progress
from npsemiseg.data.info import IGNORE_INDEX
from npsemiseg.data.prepare import PrepareResult, write_png_atomic
from npsemiseg.data.sets.coco import COCO_CLASSES
from npsemiseg.untrusted import MAX_IMAGE_PIXELS

try:
    from pycocotools import mask as mask_utils
except ImportError:  # the optional extra: prepare_coco says how to install it
    mask_utils = None

COCO_SPLITS = ("train2017", "val2017")
MISSING_PYCOCOTOOLS = "npsemiseg data prepare coco needs pycocotools: pip install 'npsemiseg[coco]' (or pycocotools)"
_TEMP_FOLDER = ".masks.part"


@dataclass(frozen=True)
class Instances:
    """One ``instances_<split>.json``, validated: ``images`` ``(id, file stem, height, width)``, the annotations of
    each image id ``(segmentation, class index 1..80)`` in the file's order."""

    path: Path
    images: list[tuple[int, str, int, int]]
    annotations: Mapping[int, list[tuple[Any, int]]]


def _require(condition: bool, path: Path, what: str) -> None:
    if not condition:
        raise ValueError(f"COCO annotations {path}: {what}")


def _class_indices(path: Path, categories: Any) -> dict[int, int]:
    """COCO category id -> class index 1..80 (ascending ids), checked against UniMatch's class names."""
    _require(isinstance(categories, list) and all(isinstance(c, dict) and "id" in c and "name" in c
                                                    for c in categories), path, "'categories' is not a list of {id, name}")
    ordered = sorted(categories, key=lambda c: c["id"])
    names = tuple(c["name"] for c in ordered)
    _require(names == COCO_CLASSES[1:], path, f"expected COCO 2017's 80 thing categories ({COCO_CLASSES[1]} .. "
                                              f"{COCO_CLASSES[-1]}), got {len(names)} categories {list(names[:3])}...")
    return {c["id"]: index for index, c in enumerate(ordered, start=1)}


def _size(path: Path, image: dict[str, Any]) -> tuple[int, int]:
    """``(height, width)`` of an image entry: positive integers, at most :data:`MAX_IMAGE_PIXELS` pixels (its mask
    is allocated from them)."""
    height, width = image["height"], image["width"]
    _require(all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (height, width)), path,
             f"image {image['id']} has height {height!r} and width {width!r}; expected positive integers")
    _require(height * width <= MAX_IMAGE_PIXELS, path,
             f"image {image['id']} declares {height} x {width} = {height * width:,} pixels, more than the "
             f"{MAX_IMAGE_PIXELS:,} an image may have; refused before allocating its mask")
    return height, width


def _check_rle_size(path: Path, annotation: dict[str, Any], size: tuple[int, int]) -> None:
    """An RLE segmentation decodes to its own ``size``: it must be its image's (polygons are drawn at the image's)."""
    segmentation = annotation["segmentation"]
    if isinstance(segmentation, dict):
        _require(list(segmentation.get("size", ())) == list(size), path,
                 f"annotation {annotation.get('id')}: RLE size {segmentation.get('size')!r} is not its image's "
                 f"[height, width] {list(size)}")


def load_instances(path: Path) -> Instances:
    """Read and validate ``path`` (COCO's instances format); a ``ValueError`` names the file and what is wrong."""
    if not path.is_file():
        raise FileNotFoundError(f"COCO annotations {path} do not exist: expected the official {path.name} "
                                "(annotations_trainval2017.zip)")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as error:
        raise ValueError(f"COCO annotations {path}: not JSON ({type(error).__name__}: {error})") from None
    _require(isinstance(data, dict) and all(k in data for k in ("images", "annotations", "categories")), path,
             "expected COCO's instances format (an object with images, annotations and categories)")
    indices = _class_indices(path, data["categories"])
    images = []
    for image in data["images"]:
        _require(isinstance(image, dict) and all(k in image for k in ("id", "file_name", "height", "width")), path,
                 f"image entry {str(image)[:80]} lacks id, file_name, height or width")
        images.append((image["id"], Path(image["file_name"]).stem, *_size(path, image)))
    sizes = {image[0]: image[2:] for image in images}
    annotations: dict[int, list[tuple[Any, int]]] = {}
    for annotation in data["annotations"]:
        _require(isinstance(annotation, dict) and all(k in annotation for k in ("image_id", "category_id", "segmentation")),
                 path, f"annotation {str(annotation)[:80]} lacks image_id, category_id or segmentation")
        _require(annotation["image_id"] in sizes, path, f"annotation {annotation.get('id')} names unknown image "
                                                        f"{annotation['image_id']}")
        _require(annotation["category_id"] in indices, path, f"annotation {annotation.get('id')} names unknown category "
                                                             f"{annotation['category_id']}")
        _check_rle_size(path, annotation, sizes[annotation["image_id"]])
        annotations.setdefault(annotation["image_id"], []).append((annotation["segmentation"],
                                                                   indices[annotation["category_id"]]))
    return Instances(path, images, annotations)


def annotation_mask(segmentation: Any, height: int, width: int) -> np.ndarray:
    """One annotation's pixels, bool ``[H, W]``: polygons (merged), an uncompressed RLE (crowd) or a compressed one."""
    if isinstance(segmentation, list):
        rle = mask_utils.merge(mask_utils.frPyObjects(segmentation, height, width))
    elif isinstance(segmentation, dict) and isinstance(segmentation.get("counts"), list):
        rle = mask_utils.frPyObjects(segmentation, height, width)
    elif isinstance(segmentation, dict) and isinstance(segmentation.get("counts"), (str, bytes)):
        counts = segmentation["counts"]
        rle = {"size": segmentation["size"], "counts": counts.encode() if isinstance(counts, str) else counts}
    else:
        raise ValueError(f"segmentation {str(segmentation)[:60]}: expected polygons or an RLE")
    return mask_utils.decode(rle).astype(bool)


def semantic_mask(annotations: list[tuple[Any, int]], height: int, width: int) -> np.ndarray:
    """uint8 ``[H, W]``: 0, the class index where one annotation lies, 255 where two or more overlap."""
    label = np.zeros((height, width), dtype=np.uint8)
    covered = np.zeros((height, width), dtype=np.uint16)
    for segmentation, index in annotations:
        pixels = annotation_mask(segmentation, height, width)
        label[pixels] = index
        covered += pixels
    label[covered > 1] = IGNORE_INDEX
    return label


def _write_masks(instances: list[Instances], masks: Path, temp: Path, progress: Progress | None) -> tuple[int, int]:
    """Build every mask not in ``masks`` into ``temp``; returns (written, existing)."""
    jobs = [(item, image) for item in instances for image in item.images]
    written = existing = 0
    for done, (item, (image_id, stem, height, width)) in enumerate(jobs, start=1):
        if (masks / f"{stem}.png").is_file():
            existing += 1
        else:
            try:
                label = semantic_mask(item.annotations.get(image_id, []), height, width)
            except Exception as error:  # noqa: BLE001 - pycocotools raises bare Exceptions on bad segmentations
                raise ValueError(f"COCO annotations {item.path}: image {image_id}: {error}") from None
            write_png_atomic(temp / f"{stem}.png", label)
            written += 1
        if progress is not None:
            progress(done, len(jobs))
    return written, existing


def prepare_coco(root: str | os.PathLike, annotations: str | os.PathLike | None = None,
                 splits: tuple[str, ...] = COCO_SPLITS, *, progress: Progress | None = None) -> PrepareResult:
    """Write ``<root>/masks/<ID>.png`` from ``<annotations>/instances_<split>.json`` for each split (default
    annotations folder: ``<root>/annotations``); see the module docstring for the rule and the guarantees."""
    if mask_utils is None:
        raise ValueError(MISSING_PYCOCOTOOLS)
    folder = Path(root).expanduser()
    if not folder.is_dir():
        raise FileNotFoundError(f"COCO folder {folder} does not exist: expected the folder holding train2017/ and val2017/")
    source = Path(annotations).expanduser() if annotations is not None else folder / "annotations"
    instances = [load_instances(source / f"instances_{split}.json") for split in splits]
    masks, temp = folder / "masks", folder / _TEMP_FOLDER
    removed = sum(1 for _ in temp.iterdir()) if temp.is_dir() else 0  # an interrupted call's
    shutil.rmtree(temp, ignore_errors=True)
    temp.mkdir()
    try:
        written, existing = _write_masks(instances, masks, temp, progress)
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
    masks.mkdir(exist_ok=True)
    for path in temp.iterdir():
        os.replace(path, masks / path.name)
    temp.rmdir()
    sources = {item.path.name: len(item.images) for item in instances}
    return PrepareResult(masks, written + existing, written, existing, removed, sources)
