"""Build the label files the readers expect from the official downloads, once.

* ``prepare_voc(voc_dir, sbd_dir, out_dir=None)`` writes ``SegmentationClassAug/`` (the standard
  "aug" label set of 12,031 maps) from VOC 2012's ``SegmentationClass/*.png`` and SBD's
  ``cls/*.mat``.
* ``prepare_cityscapes(root)`` writes ``*_gtFine_labelTrainIds.png`` beside each
  ``*_gtFine_labelIds.png`` (the readers otherwise convert at every read).

Both are idempotent and resumable: a finished file is never rewritten, each file is written to a
temporary ``.<name>.part`` beside it and renamed into place (so a file is either absent or
whole), and a rerun after an interruption removes leftover ``.part`` files and writes only what is
missing. Progress: ``progress(done, total)`` after each file (the CLI's tqdm bar).
"""

from __future__ import annotations

import logging
import os
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import scipy.io
from PIL import Image

from npsemiseg.data.check import Progress
from npsemiseg.data.datasets import (
    CITYSCAPES_NUM_LABEL_IDS,
    cityscapes_labelids_to_trainids,
    load_index_png,
)
from npsemiseg.data.info import IGNORE_INDEX, VOC_CLASSES
from npsemiseg.untrusted import MAX_IMAGE_PIXELS

log = logging.getLogger(__name__)

VOC_MAX_CLASS = len(VOC_CLASSES) - 1
TEMP_SUFFIX = ".part"
#: the bytes an SBD ``.mat`` may inflate to: a uint8 label map at the pixel limit (SBD's own: about 200 KB)
MAT_INFLATED_BUDGET = MAX_IMAGE_PIXELS
_MI_COMPRESSED = 15  # MATLAB v5's tag of a zlib-compressed variable

#: where each input may sit below the folder the user names (first match wins)
_VOC_SUBFOLDERS = ((), ("VOC2012",), ("VOCdevkit", "VOC2012"))
_SBD_SUBFOLDERS = ((), ("dataset",), ("benchmark_RELEASE", "dataset"))
_CITYSCAPES_SUBFOLDERS = ((), ("cityscapes",))


@dataclass(frozen=True)
class PrepareResult:
    """What a prepare call left: ``total`` files in ``out`` (``written`` now, ``existing``
    before, never rewritten), ``sources`` (where the total came from) and the leftover
    temporary files of an interrupted call it removed."""

    out: Path
    total: int
    written: int
    existing: int
    temp_removed: int
    sources: dict[str, int] = field(default_factory=dict)


def _find(base: str | os.PathLike, marker: str, subfolders, what: str) -> Path:
    """``base`` or its conventional subfolder holding the folder ``marker``."""
    base = Path(base).expanduser()
    candidates = [base.joinpath(*sub) for sub in subfolders]
    for candidate in candidates:
        if (candidate / marker).is_dir():
            return candidate
    tried = ", ".join(str(c / marker) for c in candidates)
    raise FileNotFoundError(f"{what} not found under {base}: expected a {marker}/ folder at one of {tried}")


def _temp(path: Path) -> Path:
    return path.with_name(f".{path.name}{TEMP_SUFFIX}")


def write_png_atomic(path: Path, label: np.ndarray) -> None:
    """Write uint8 ``[H, W]`` as a single-channel ("L") PNG: temp file beside it, then rename."""
    temp = _temp(path)
    Image.fromarray(np.ascontiguousarray(label, dtype=np.uint8)).save(temp, format="PNG")
    os.replace(temp, path)


def remove_leftovers(folder: Path) -> int:
    """Remove the ``.*.png.part`` files an interrupted call left under ``folder``; returns how many."""
    leftovers = list(folder.rglob(f".*.png{TEMP_SUFFIX}"))
    for path in leftovers:
        path.unlink()
    if leftovers:
        log.info("removed %d unfinished temporary files under %s", len(leftovers), folder)
    return len(leftovers)


def _write_missing(jobs: list[tuple[Path, Callable[[], np.ndarray]]], progress: Progress | None) -> tuple[int, int]:
    """Write each (target, make label) whose target does not exist yet; returns (written, existing)."""
    written = existing = 0
    for done, (target, make) in enumerate(jobs, start=1):
        if target.is_file():
            existing += 1
        else:
            write_png_atomic(target, make())
            written += 1
        if progress is not None:
            progress(done, len(jobs))
    return written, existing


def _check_mat_inflation(path: Path) -> None:
    """Refuse a MATLAB v5 file whose compressed variables inflate past :data:`MAT_INFLATED_BUDGET` bytes,
    counting as they inflate (a chunk at a time) before scipy inflates them whole."""
    with open(path, "rb") as file:
        header = file.read(128)
        if len(header) < 128 or header[126:128] not in (b"IM", b"MI"):
            return  # not v5 (v4 holds its data uncompressed; scipy refuses the rest)
        order = "<" if header[126:128] == b"IM" else ">"
        inflated = 0
        while len(tag := file.read(8)) == 8:
            kind, size = struct.unpack(order + "II", tag)
            if kind != _MI_COMPRESSED:
                file.seek(size + (-size % 8), os.SEEK_CUR)
                continue
            inflater, left = zlib.decompressobj(), size
            while left > 0 and (chunk := file.read(min(left, 1 << 16))):
                left -= len(chunk)
                while chunk:
                    inflated += len(inflater.decompress(chunk, 1 << 20))
                    chunk = inflater.unconsumed_tail
                    if inflated > MAT_INFLATED_BUDGET:
                        raise ValueError(f"SBD file {path} inflates to more than {MAT_INFLATED_BUDGET:,} bytes (an SBD "
                                         "annotation is a few hundred KB); refused before reading it")


def read_sbd_mat(path: Path) -> np.ndarray:
    """SBD ``cls/<ID>.mat`` -> uint8 ``[H, W]`` class indices (``GTcls.Segmentation``, 0..20), within the pixel limit
    of :mod:`npsemiseg.untrusted` (the file inflating to at most :data:`MAT_INFLATED_BUDGET` bytes first)."""
    _check_mat_inflation(path)
    try:
        segmentation = scipy.io.loadmat(path)["GTcls"]["Segmentation"][0, 0]
    except (KeyError, ValueError, TypeError, IndexError, OSError, scipy.io.matlab.MatReadError) as err:
        raise ValueError(f"SBD file {path} is not an SBD class annotation ({type(err).__name__}: {err}); "
                         "expected a MATLAB struct GTcls with a Segmentation field (SBD's cls/*.mat)") from None
    label = np.asarray(segmentation)
    if label.ndim != 2 or label.dtype.kind not in "ui":
        raise ValueError(f"SBD file {path}: GTcls.Segmentation is {label.dtype} {label.shape}; "
                         "expected a 2-D integer map of VOC class indices")
    if label.size > MAX_IMAGE_PIXELS:
        raise ValueError(f"SBD file {path}: GTcls.Segmentation is {label.shape[0]} x {label.shape[1]} = {label.size:,} "
                         f"pixels, more than the {MAX_IMAGE_PIXELS:,} a label map may have; refused")
    bad = np.unique(label[((label < 0) | (label > VOC_MAX_CLASS)) & (label != IGNORE_INDEX)])
    if bad.size:
        raise ValueError(f"SBD file {path} holds values {bad[:10].tolist()} outside VOC class indices "
                         f"(0..{VOC_MAX_CLASS}, 255 = ignore)")
    return label.astype(np.uint8)


def prepare_voc(voc_dir: str | os.PathLike, sbd_dir: str | os.PathLike, out_dir: str | os.PathLike | None = None,
                *, progress: Progress | None = None) -> PrepareResult:
    """Build ``<out_dir>/SegmentationClassAug/<ID>.png`` for every ID of VOC or SBD.

    voc_dir: VOC 2012 (the folder holding ``SegmentationClass/``, or its ``VOC2012`` /
    ``VOCdevkit/VOC2012`` subfolder); sbd_dir: SBD (holding ``cls/``, or ``dataset/cls`` /
    ``benchmark_RELEASE/dataset/cls``); out_dir: default the VOC folder, where the readers look.

    The rule of the standard SegmentationClassAug: an ID with a VOC 2012 ``SegmentationClass``
    PNG (the 2,913 fine train + val masks, 255 on object outlines) takes VOC's mask, even when
    SBD also annotates it; every other ID takes SBD's ``GTcls.Segmentation`` (no 255 outline).
    Values are kept as they are (palette indices for VOC), written as single-channel PNGs.
    A source file that is not a label map raises ``ValueError`` naming it; a rerun resumes.
    """
    voc = _find(voc_dir, "SegmentationClass", _VOC_SUBFOLDERS, "VOC 2012")
    sbd = _find(sbd_dir, "cls", _SBD_SUBFOLDERS, "SBD")
    voc_ids = {p.stem for p in (voc / "SegmentationClass").glob("*.png")}
    sbd_ids = {p.stem for p in (sbd / "cls").glob("*.mat")}
    if not voc_ids and not sbd_ids:
        raise FileNotFoundError(f"no labels found: expected {voc}/SegmentationClass/<ID>.png and/or {sbd}/cls/<ID>.mat")
    out = Path(out_dir if out_dir is not None else voc).expanduser() / "SegmentationClassAug"
    out.mkdir(parents=True, exist_ok=True)
    removed = remove_leftovers(out)

    def make(image_id: str) -> Callable[[], np.ndarray]:
        if image_id in voc_ids:  # VOC's own mask wins where both exist
            return lambda: load_index_png(voc / "SegmentationClass" / f"{image_id}.png", max_value=VOC_MAX_CLASS,
                                          what="VOC class indices")
        return lambda: read_sbd_mat(sbd / "cls" / f"{image_id}.mat")

    ids = sorted(voc_ids | sbd_ids)
    written, existing = _write_missing([(out / f"{i}.png", make(i)) for i in ids], progress)
    result = PrepareResult(out, len(ids), written, existing, removed,
                           {"voc": len(voc_ids), "sbd": len(sbd_ids - voc_ids)})
    log.info("SegmentationClassAug: %d labels in %s (%d written, %d already there)", len(ids), out, written, existing)
    return result


def prepare_cityscapes(root: str | os.PathLike, *, progress: Progress | None = None) -> PrepareResult:
    """Write ``<name>_gtFine_labelTrainIds.png`` beside each ``<name>_gtFine_labelIds.png`` under ``gtFine/``.

    root: the Cityscapes folder (holding ``gtFine/``) or a folder holding ``cityscapes/``. The
    mapping is the readers' (``cityscapes_labelids_to_trainids``: cityscapesScripts' table, 34 ->
    19 + 255). An existing labelTrainIds file is kept as it is (never rewritten).
    """
    folder = _find(root, "gtFine", _CITYSCAPES_SUBFOLDERS, "Cityscapes") / "gtFine"
    removed = remove_leftovers(folder)
    sources = sorted(folder.rglob("*_gtFine_labelIds.png"))

    def make(source: Path) -> Callable[[], np.ndarray]:
        return lambda: cityscapes_labelids_to_trainids(
            load_index_png(source, max_value=CITYSCAPES_NUM_LABEL_IDS - 1, what="Cityscapes label ids"))

    jobs = [(s.with_name(s.name[: -len("labelIds.png")] + "labelTrainIds.png"), make(s)) for s in sources]
    written, existing = _write_missing(jobs, progress)
    log.info("labelTrainIds: %d files under %s (%d written, %d already there)", len(jobs), folder, written, existing)
    return PrepareResult(folder, len(jobs), written, existing, removed, {"labelIds": len(sources)})
