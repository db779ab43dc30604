"""A researcher's own dataset: a folder of images and masks, registered under the folder's name.

Layout (``docs/datasets.md``)::

    <folder>/classes.yaml          names: [background, road, ...]   (required; K = len(names))
                                   palette: [[0, 0, 0], ...]        (optional; K RGB triples)
                                   ignore_index: 255                (optional; 255 or a value >= K)
    <folder>/images/<name>.jpg     (or .jpeg / .png, any case: .JPG) RGB images, 8-bit or 16-bit grey
    <folder>/masks/<name>.png      (or .PNG) single-channel index PNG, 0..K-1 and the ignore value, the image's size
    <folder>/lists/                written by ``npsemiseg data partition`` (:func:`write_partitions`):
        val.txt, <count>/labeled.txt, <count>/unlabeled.txt   (entries: image file names)
        partitions.yaml            the seed, the fractions asked for and the counts, for a study to cite

An image without a mask can only be unlabeled; a file the layout cannot use (a mask without an image, a JPEG mask,
another extension, a ``masks`` file instead of a folder) is named with the reason (:func:`unusable_files`), and
every image and mask must lie inside the folder, symlinks resolved (:func:`~npsemiseg.data.paths.inside_root`).
``register_folder(path)`` registers the folder as a dataset
named after it (``FolderDataset.define``); every folder under ``$NPSEMISEG_DATA`` holding a ``classes.yaml`` is
registered when ``npsemiseg.data`` is imported (a folder that does not parse is skipped there;
``npsemiseg data check --folder`` names its problem). A record whose ``data.root`` is the folder (or holds it) finds
it while it is read or built (:func:`find_folder`, ``npsemiseg.data.info.dataset_root``), registering nothing. The
paper preset trains it at :data:`FOLDER_SETTINGS` (VOC's, evaluated on whole images).
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import yaml

from npsemiseg.constants import IGNORE_INDEX
from npsemiseg.data.base import DatasetDef, ItemFiles
from npsemiseg.data.datasets import DATA_ROOT_ENV, load_index_png
from npsemiseg.data.info import DATA_ROOT_IN_USE, DATASETS, DatasetInfo
from npsemiseg.data.paths import inside_root
from npsemiseg.data.settings import VOC_SETTINGS
from npsemiseg.untrusted import load_yaml

if TYPE_CHECKING:
    import numpy as np

CLASSES_FILE = "classes.yaml"
PARTITIONS_FILE = "partitions.yaml"
#: image extensions, matched in any case (a camera's ``.JPG``); a mask is ``<name>.png`` or ``<name>.PNG``
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")
MASK_SUFFIXES = (".png", ".PNG")
#: the ``paper`` preset of a folder dataset: VOC's settings (crop 480, batch 12, lr 1e-3, 80 epochs) evaluated on
#: whole images (a folder's images need not share one size or fit a fixed window)
FOLDER_SETTINGS = VOC_SETTINGS.scaled(eval_mode="whole", eval_crop_size=None)


def read_classes(folder: Path) -> tuple[tuple[str, ...], tuple[tuple[int, int, int], ...] | None, int]:
    """``(names, palette or None, ignore_index)`` from ``folder/classes.yaml``; one-line ``ValueError`` otherwise."""
    path = folder / CLASSES_FILE
    if not path.is_file():
        raise ValueError(f"{path} does not exist; expected a classes file with 'names: [...]' (docs/datasets.md)")
    try:
        raw = load_yaml(path.read_text(encoding="utf-8"), where=f"classes file {path}")
    except yaml.YAMLError as err:
        raise ValueError(f"{path} does not parse as YAML ({' '.join(str(err).split())})") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("names"), list) or not raw["names"]:
        raise ValueError(f"{path}: expected a mapping with a non-empty list 'names', got {raw!r:.80}")
    unknown = sorted(set(raw) - {"names", "palette", "ignore_index"})
    names = tuple(str(n) for n in raw["names"])
    if unknown or len(set(names)) != len(names) or len(names) > 255:
        raise ValueError(f"{path}: expected keys names / palette / ignore_index and at most 255 distinct names, "
                         f"got keys {sorted(raw)} and {len(names)} names ({len(set(names))} distinct)")
    ignore = raw.get("ignore_index", IGNORE_INDEX)
    if not isinstance(ignore, int) or not len(names) <= ignore <= 255:
        raise ValueError(f"{path}: ignore_index must be an int in {len(names)}..255 (not a class index), got {ignore!r}")
    palette = raw.get("palette")
    if palette is not None:
        ok = isinstance(palette, list) and len(palette) == len(names) and all(
            isinstance(c, list) and len(c) == 3 and all(isinstance(v, int) and 0 <= v <= 255 for v in c) for c in palette)
        if not ok:
            raise ValueError(f"{path}: palette must be {len(names)} [R, G, B] triples of ints 0..255, one per name")
        palette = tuple(tuple(c) for c in palette)
    return names, palette, ignore


def image_files(folder: Path) -> list[str]:
    """The image file names under ``folder/images`` (sorted); one-line ``ValueError`` when there are none."""
    images = folder / "images"
    found = sorted(p.name for p in images.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES) if images.is_dir() else []
    if not found:
        why = "; ".join(f"{path}: {reason}" for path, reason in unusable_files(folder)[:3])
        raise ValueError(f"{folder} holds no images: expected images/<name>.jpg (or .png) and masks/<name>.png "
                         f"(docs/datasets.md){f'; not used: {why}' if why else ''}")
    return found


def mask_file(folder: Path, image: str) -> Path | None:
    """The mask of ``image`` on disk (``masks/<stem>.png``, else ``.PNG``) or None; refused when it leads out of
    ``folder`` (:func:`~npsemiseg.data.paths.inside_root`)."""
    stem = Path(image).stem
    candidates = (inside_root(folder, f"masks/{stem}{suffix}", what="mask") for suffix in MASK_SUFFIXES)
    return next((path for path in candidates if path.is_file()), None)


def _folder_files(folder: Path, sub: str) -> list[Path]:
    """The visible files of ``folder/sub`` (none when it is not a folder)."""
    path = folder / sub
    return sorted(p for p in path.iterdir() if not p.name.startswith(".")) if path.is_dir() else []


def unusable_files(folder: Path) -> list[tuple[str, str]]:
    """Files of ``folder`` the layout cannot use, ``(relative path, why)``: ``images`` or ``masks`` that is not a
    folder, an image of another extension, a mask that is a JPEG, of another extension or without an image."""
    found = [(sub, f"a file, expected a folder {sub}/ of <name>.{ext} files")
             for sub, ext in (("images", "jpg"), ("masks", "png")) if (folder / sub).exists() and not (folder / sub).is_dir()]
    found += [(f"{sub}/{path.name}", f"a folder: {sub} are read from {sub}/ itself, not from its subfolders")
              for sub in ("images", "masks") for path in _folder_files(folder, sub) if path.is_dir()]
    stems = set()
    for path in (p for p in _folder_files(folder, "images") if not p.is_dir()):
        if path.suffix.lower() in IMAGE_SUFFIXES:
            stems.add(path.stem)
        else:
            found.append((f"images/{path.name}", f"extension {path.suffix or '(none)'}: images are .jpg, .jpeg or .png "
                                                 "(any case)"))
    for path in (p for p in _folder_files(folder, "masks") if not p.is_dir()):
        name = f"masks/{path.name}"
        if path.suffix.lower() in (".jpg", ".jpeg"):
            found.append((name, "a JPEG mask: masks must be PNG (JPEG's compression changes the class indices)"))
        elif path.suffix not in MASK_SUFFIXES:
            found.append((name, f"extension {path.suffix or '(none)'}: a mask is <name>.png (or .PNG)"))
        elif path.stem not in stems:
            found.append((name, f"a mask without an image (no images/{path.stem}.jpg, .jpeg or .png): not read"))
    return found


class FolderDataset(DatasetDef):
    """Base of the folder datasets; :meth:`define` makes the class of one folder."""

    folder: ClassVar[Path] = Path()
    settings = FOLDER_SETTINGS
    root_marker = "images"
    layout = "images/<name>.jpg (or .png) and masks/<name>.png"
    layout_folders = ("images", "masks", "lists")
    list_folders = {"u2pl": "lists"}

    @classmethod
    def define(cls, folder: str | os.PathLike, name: str | None = None) -> type[FolderDataset]:
        """The class of the dataset in ``folder`` (classes read and checked now, lists when they are asked for)."""
        path = Path(folder).expanduser().resolve()
        names, palette, ignore = read_classes(path)
        image_files(path)
        label = name or path.name
        return type(f"Folder_{label}", (cls,), {"name": label, "label": label, "folder": path, "class_names": names,
                                                 "palette": palette, "ignore_index": ignore})

    @classmethod
    def partition_record(cls) -> dict[str, Any]:
        """``lists/partitions.yaml`` (empty when no partitions were written)."""
        path = cls.folder / "lists" / PARTITIONS_FILE
        return load_yaml(path.read_text(encoding="utf-8"), where=f"partitions file {path}") if path.is_file() else {}

    @classmethod
    def info(cls, **options: object) -> DatasetInfo:
        if options:
            raise ValueError(f"dataset_info: {cls.name} takes no options, got {sorted(options)}")
        record = cls.partition_record()
        counts = {str(k): int(v["labeled"]) for k, v in record.get("partitions", {}).items()}
        aliases = {str(v["asked"]): str(k) for k, v in record.get("partitions", {}).items() if str(v["asked"]) != str(k)}
        return DatasetInfo(
            name=cls.name, num_classes=len(cls.class_names), class_names=cls.class_names, partitions=counts,
            partition_aliases=aliases, eval_mode=cls.settings.eval_mode, eval_crop_size=cls.settings.crop_size,
            train_size=int(record.get("train_size", 0)), val_size=int(record.get("val_size", 0)),
            ignore_index=cls.ignore_index, settings=cls.settings, label=cls.label,
        )

    @classmethod
    def lists_root(cls) -> Path:  # type: ignore[override]
        return cls.folder

    @classmethod
    def list_ids(cls, split: str, partition: str | None, partition_lists: str = "u2pl", root: Path | None = None) -> list[str]:
        if not (cls.folder / "lists" / "val.txt").is_file():
            raise FileNotFoundError(f"{cls.folder} has no lists/: write them with `npsemiseg data partition "
                                    f"{cls.folder} --labeled 1/8 --seed 0`")
        relative = "val.txt" if split == "val" else f"{partition}/{split}.txt"
        path = cls.folder / "lists" / relative
        if not path.is_file():
            raise FileNotFoundError(f"partition list {path} is missing")
        return [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]

    @classmethod
    def entry_image(cls, entry: str) -> str:
        return f"images/{entry}"

    @classmethod
    def entry_labels(cls, entry: str) -> tuple[str, ...]:
        return tuple(f"masks/{Path(entry).stem}{suffix}" for suffix in MASK_SUFFIXES)

    @classmethod
    def unusable_files(cls, root: Path) -> list[tuple[str, str]]:
        return unusable_files(root)

    @classmethod
    def entry_id(cls, entry: str) -> str:
        return Path(entry).stem

    @classmethod
    def label_kind(cls, index: int) -> tuple[int, str, bool]:
        return len(cls.class_names) - 1, f"{cls.name} class indices", cls.ignore_index != IGNORE_INDEX

    @classmethod
    def item_files(cls, root: Path, entry: str, with_label: bool) -> ItemFiles:
        files = super().item_files(root, entry, with_label)
        return ItemFiles(files.image, files.label, files.id, files.max_value, files.what, files.converted,
                         ignore_value=cls.ignore_index)

    @classmethod
    def read_label(cls, files: ItemFiles) -> np.ndarray:
        """The mask with its ignore value mapped to 255; values that are no class index nor ignore are an error."""
        import numpy as np

        assert files.label is not None
        array = load_index_png(files.label, max_value=IGNORE_INDEX - 1, what=files.what)
        bad = np.unique(array[(array > files.max_value) & (array != cls.ignore_index) & (array != IGNORE_INDEX)])
        if bad.size:
            raise ValueError(f"label file {files.label} holds values {bad[:10].tolist()} outside {files.what} "
                             f"(0..{files.max_value}, ignore {cls.ignore_index})")
        return cls.convert_label(array, files)

    @classmethod
    def convert_label(cls, array: np.ndarray, files: ItemFiles) -> np.ndarray:
        import numpy as np

        return np.where(array == cls.ignore_index, IGNORE_INDEX, array).astype(np.uint8) if files.converted else array

    @classmethod
    def resolve_root(cls, root: str | os.PathLike | None = None) -> Path:
        """The registered folder (``root`` may name it, or a folder holding it under the dataset's name)."""
        if root is None:
            return cls.folder
        base = Path(root).expanduser()
        for candidate in (base, base / cls.name):
            if (candidate / cls.root_marker).is_dir():
                return candidate
        raise FileNotFoundError(f"{cls.name} not found under {base}: expected images/ at {base} or {base / cls.name}")


def register_folder(folder: str | os.PathLike, name: str | None = None) -> type[FolderDataset]:
    """Register the dataset in ``folder`` as ``name`` (default: the folder's name); its class. Registering the
    same folder again replaces the entry (its classes file may have changed)."""
    definition = FolderDataset.define(folder, name)
    existing = DATASETS.get(definition.name) if definition.name in DATASETS else None
    if existing is not None and not (isinstance(existing, type) and issubclass(existing, FolderDataset)):
        raise ValueError(f"dataset name {definition.name!r} is a built-in dataset; pass another name")
    if existing is not None:
        DATASETS.remove(definition.name)
    DATASETS.add(definition.name, definition)
    return definition


def labeled_count(asked: str, pool: int, what: str = "--labeled") -> int:
    """Images of ``asked`` (a fraction ``"1/8"`` / ``"0.125"`` or a count ``"50"``) out of ``pool``: 1..pool-1."""
    text = str(asked).strip()
    try:
        if "/" in text:
            top, bottom = text.split("/")
            count = round(int(top) / int(bottom) * pool)
        else:
            count = round(float(text) * pool) if "." in text else int(text)
    except (ValueError, ZeroDivisionError):
        raise ValueError(f"{what} {asked!r}: expected a fraction (1/8, 0.125) or a count (50)") from None
    if not 1 <= count < pool:
        raise ValueError(f"{what} {asked!r}: gives {count} of {pool} images with masks; expected 1..{pool - 1}")
    return count


def class_cover_first(folder: Path, pool: list[str], num_classes: int) -> list[str]:
    """``pool`` reordered so that its first images cover every class its masks hold: for each class, rarest
    first (fewest images), the first image of ``pool`` holding it unless an earlier pick covers it; then the rest
    in ``pool``'s order. A labeled list cut from the front holds every class it can (stratification by coverage)."""
    import numpy as np

    classes = {i: {int(v) for v in np.unique(load_index_png(mask_file(folder, i), max_value=IGNORE_INDEX - 1,
                                                             what="class indices")) if v < num_classes}
               for i in pool}
    counts = {k: sum(k in c for c in classes.values()) for k in range(num_classes)}
    picks: list[str] = []
    covered: set[int] = set()
    for k in sorted((k for k in counts if counts[k]), key=lambda k: (counts[k], k)):
        if k not in covered:
            first = next(i for i in pool if k in classes[i])
            picks.append(first)
            covered |= classes[first]
    return picks + [i for i in pool if i not in set(picks)]


def write_partitions(folder: str | os.PathLike, labeled: list[str], *, seed: int = 0, val: str = "0.1",
                     stratify: bool = True) -> Path:
    """Write ``lists/`` for the dataset in ``folder``: a seeded val split of the images with masks (``val``: a
    fraction or a count), then per ``labeled`` entry a labeled list drawn from the remaining images with masks
    (nested: smaller partitions are subsets of larger ones; ``stratify``: the draw covers every class first,
    :func:`class_cover_first`) and the unlabeled list of every other train image. Everything is checked before
    anything is written; returns the lists folder."""
    path = Path(folder).expanduser().resolve()
    names, _, _ = read_classes(path)
    images = image_files(path)
    for image in images:
        inside_root(path, f"images/{image}", what="image")
    with_mask = [i for i in images if mask_file(path, i) is not None]
    if len(with_mask) < 2:
        why = "; ".join(f"{name}: {reason}" for name, reason in unusable_files(path)[:3])
        raise ValueError(f"{path}: {len(with_mask)} of {len(images)} images have a mask masks/<name>.png; expected at "
                         f"least 2 (a val and a labeled one){f'; not used: {why}' if why else ''}")
    rng = random.Random(seed)
    order = rng.sample(with_mask, len(with_mask))
    num_val = labeled_count(val, len(with_mask), "--val")
    val_list, pool = sorted(order[:num_val]), order[num_val:]
    pool = class_cover_first(path, pool, len(names)) if stratify else pool
    train = sorted(set(images) - set(val_list))
    partitions = {}
    for asked in labeled:
        count = labeled_count(asked, len(pool))
        partitions[str(count)] = {"asked": str(asked), "labeled": count}
    lists = path / "lists"
    lists.mkdir(exist_ok=True)
    (lists / "val.txt").write_text("\n".join(val_list) + "\n", encoding="utf-8")
    for name, entry in partitions.items():
        chosen = sorted(pool[: entry["labeled"]])
        (lists / name).mkdir(exist_ok=True)
        (lists / name / "labeled.txt").write_text("\n".join(chosen) + "\n", encoding="utf-8")
        rest = [i for i in train if i not in set(chosen)]
        (lists / name / "unlabeled.txt").write_text("\n".join(rest) + "\n", encoding="utf-8")
    how = ("random.Random(seed).sample of the images with masks: the first val_size are val; the rest, "
           + ("reordered to cover every class first (class_cover_first), " if stratify else "")
           + "give each labeled list as its first `labeled` images (nested)")
    record = {"seed": seed, "val": str(val), "stratify": stratify, "val_size": len(val_list),
              "train_size": len(train), "partitions": partitions, "how": how}
    (lists / PARTITIONS_FILE).write_text(yaml.safe_dump(record, sort_keys=False), encoding="utf-8")
    return lists


def find_folder(name: str, root: object = None) -> type[FolderDataset] | None:
    """The folder dataset ``name`` defined from a folder holding a ``classes.yaml`` at ``root``, ``root/name`` or
    ``$NPSEMISEG_DATA/name`` (a run's ``data.root`` names it), not registered; None where none is."""
    bases = [Path(str(root)).expanduser()] if root and "://" not in str(root) else []
    if os.environ.get(DATA_ROOT_ENV):
        bases.append(Path(os.environ[DATA_ROOT_ENV]).expanduser())
    for candidate in [b for base in bases for b in (base, base / name)]:
        if (candidate / CLASSES_FILE).is_file() and candidate.name == name:
            return FolderDataset.define(candidate, name)
    return None


def _find_in_the_data_root(name: str) -> type[FolderDataset] | None:
    """``DATASETS``' finder: :func:`find_folder` under the data root in use (``npsemiseg.data.info.dataset_root``),
    each name looked for once in it."""
    in_use = DATA_ROOT_IN_USE.get()
    if in_use is None:
        return find_folder(name)
    if name not in in_use.found:
        in_use.found[name] = find_folder(name, in_use.root)
    return in_use.found[name]


DATASETS.finder = _find_in_the_data_root


def register_data_root() -> list[str]:
    """Register every folder under ``$NPSEMISEG_DATA`` holding a ``classes.yaml`` that parses; their names."""
    root = os.environ.get(DATA_ROOT_ENV)
    if not root or not Path(root).is_dir():
        return []
    names = []
    for classes in sorted(Path(root).glob(f"*/{CLASSES_FILE}")):
        if classes.parent.name in DATASETS and classes.parent.name not in _registered_folders():
            continue  # a built-in dataset's folder
        try:
            names.append(register_folder(classes.parent).name)
        except (ValueError, OSError):
            continue  # `npsemiseg data check --folder` names the problem
    return names


def _registered_folders() -> set[str]:
    return {n for n, d in DATASETS.items() if isinstance(d, type) and issubclass(d, FolderDataset)}


register_data_root()
