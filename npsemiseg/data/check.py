"""Check a dataset tree before training on it: layout, list counts, label values and sizes.

``check_dataset(name, root=None, ...) -> DatasetReport`` looks at every file the readers of
``datasets.py`` would open for the chosen lists (val and the labeled / unlabeled list of every
partition by default), each file once however many lists name it:

* every list entry names files inside the dataset's folder, symlinks resolved
  (:func:`npsemiseg.data.paths.inside_root`, which the readers use too);
* existence of every listed image and label (unlabeled lists need images only);
* image and label sizes and the images' bit depths, from the file headers;
* every image decoded as the readers decode it (a truncated file, a float image) and every label's mode
  (single-channel "L" / "P", as the readers demand) and values: values that are neither a class index
  nor the ignore value are reported with the file (all entries by default, or an evenly spread ``sample``
  of the labeled ones);
* files in the dataset's folder its layout cannot use, each with the reason (``DatasetDef.unusable_files``:
  a folder dataset's mask without an image, a JPEG mask, ...): named, not a problem on their own.

``report.usable`` is True only when every checked list can be read by the training loop;
``report.format()`` is a one-screen summary. The synthetic datasets are generated, always usable.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import UnidentifiedImageError

from npsemiseg.data.base import PARTITION_LIST_SOURCES, DatasetDef, ItemFiles
from npsemiseg.data.datasets import DATA_ROOT_ENV, image_depth, load_index_png, read_pixels
from npsemiseg.data.info import DATASETS, IGNORE_INDEX, DatasetInfo, dataset_info
from npsemiseg.untrusted import ImageTooLargeError, open_image

#: the project's cache folder (``~/.cache/npsemiseg`` when unset), shared with ``npsemiseg.pretrain``
CACHE_ENV = "NPSEMISEG_CACHE"
Progress = Callable[[int, int], None]
"""``progress(done, total)``, called after each file; the CLI turns it into a tqdm bar."""

#: kinds of Problem, in the order the summary lists them
PROBLEM_KINDS = ("root", "list_entry", "missing_image", "missing_label", "unreadable", "label_mode", "label_values",
                 "size_mismatch")


@dataclass(frozen=True)
class Problem:
    """One thing that stops training: ``kind`` (one of PROBLEM_KINDS), the file, a full message."""

    kind: str
    path: str
    detail: str


@dataclass(frozen=True)
class ListCount:
    """One list (``"val"``, ``"92/labeled"``, ``"92/unlabeled"``) against the files on disk.

    missing_labels is None for the unlabeled lists, whose labels are never read;
    bad_files counts listed files that exist but cannot be used (unreadable image; label mode,
    values or size).
    """

    name: str
    listed: int
    missing_images: int
    missing_labels: int | None
    bad_files: int

    @property
    def usable(self) -> bool:
        return self.listed > 0 and not (self.missing_images or self.missing_labels or self.bad_files)


@dataclass
class DatasetReport:
    """What ``check_dataset`` found. value_counts: ``[256]`` int64 pixels per label value
    (train ids for Cityscapes) over the ``labels_checked`` decoded labels of ``labels_total``."""

    name: str
    root: Path | None
    partition_lists: str
    layout: list[str] = field(default_factory=list)
    lists: list[ListCount] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    value_counts: np.ndarray = field(default_factory=lambda: np.zeros(256, dtype=np.int64))
    labels_checked: int = 0
    labels_total: int = 0
    synthetic: bool = False
    #: PIL mode -> how many checked images have it (the bit depth ``format`` says)
    image_modes: Counter = field(default_factory=Counter)
    images_decoded: int = 0
    #: files in the folder the layout cannot use: (relative path, why); named, not problems
    unusable: list[tuple[str, str]] = field(default_factory=list)

    @property
    def usable(self) -> bool:
        """True when every checked list can be trained on (always for a synthetic dataset)."""
        if self.synthetic:
            return True
        return self.root is not None and bool(self.lists) and not self.problems

    def problems_of(self, kind: str) -> list[Problem]:
        """The problems of one kind (see PROBLEM_KINDS)."""
        return [p for p in self.problems if p.kind == kind]

    def format(self, *, max_lines: int = 5) -> str:
        """One-screen summary: verdict, layout, list table, label values, problems by kind."""
        verdict = "usable" if self.usable else "NOT usable"
        where = "generated in memory" if self.synthetic else f"under {self.root or '(no root)'}"
        lines = [f"{self.name} {where} (lists: {self.partition_lists}): {verdict}"]
        lines += [f"  {line}" for line in self.layout]
        if self.lists:
            aliases = {part: alias for alias, part in dataset_info(self.name).partition_aliases.items()}
            names = [_shown(c.name, aliases) for c in self.lists]
            width = max(len(n) for n in names)
            lines.append(f"  {'list':<{width}}  {'listed':>7}  {'no image':>8}  {'no label':>8}  {'bad file':>8}")
            for c, shown in zip(self.lists, names):
                no_label = "-" if c.missing_labels is None else str(c.missing_labels)
                mark = "" if c.usable else "  <- not usable"
                lines.append(f"  {shown:<{width}}  {c.listed:>7}  {c.missing_images:>8}  {no_label:>8}  "
                             f"{c.bad_files:>8}{mark}")
        if self.image_modes:
            depths = Counter()
            for mode, count in self.image_modes.items():
                depths[image_depth(mode)] += count
            lines.append("  images: " + ", ".join(f"{count} {depth}" for depth, count in depths.most_common())
                         + f" (decoded {self.images_decoded} of {sum(self.image_modes.values())})")
        if self.labels_total:
            seen = value_ranges(np.flatnonzero(self.value_counts))
            lines.append(f"  label values: {seen or 'none read'} "
                         f"(decoded {self.labels_checked} of {self.labels_total} labels)")
        if self.unusable:
            lines.append(f"  not used: {len(self.unusable)} files the layout cannot use")
            lines += [f"    {path}: {why}" for path, why in self.unusable[:max_lines]]
            if len(self.unusable) > max_lines:
                lines.append(f"    ... and {len(self.unusable) - max_lines} more")
        lines += _format_problems(self.name, self.problems, max_lines)
        return "\n".join(lines)


def _shown(list_name: str, aliases: dict[str, str]) -> str:
    """``"92/labeled"`` -> ``"92 (1/16) labeled"``; ``"val"`` as it is."""
    if "/" not in list_name:
        return list_name
    part, split = list_name.split("/")
    return f"{part} ({aliases[part]}) {split}" if part in aliases else f"{part} {split}"


def value_ranges(values) -> str:
    """``[0, 1, 2, 5, 255]`` -> ``"0..2, 5, 255"``."""
    values = sorted(int(v) for v in values)
    parts, start = [], None
    for i, v in enumerate(values):
        start = v if start is None else start
        if i + 1 == len(values) or values[i + 1] != v + 1:
            parts.append(str(v) if start == v else f"{start}..{v}")
            start = None
    return ", ".join(parts)


def _format_problems(name: str, problems: list[Problem], max_lines: int) -> list[str]:
    by_kind: dict[str, list[Problem]] = defaultdict(list)
    for p in problems:
        by_kind[p.kind].append(p)
    lines = [f"  problems: {len(problems)}"] if problems else []
    for kind in PROBLEM_KINDS:
        found = by_kind.get(kind, [])
        if kind in ("missing_image", "missing_label") and found:
            what = kind.split("_")[1] + "s"
            examples = ", ".join(p.path for p in found[:2])
            lines.append(f"  missing {what}: {len(found)}, e.g. {examples} (expected {DATASETS.get(name).layout})")
            continue
        lines += [f"  {p.detail}" for p in found[:max_lines]]
        if len(found) > max_lines:
            lines.append(f"  ... and {len(found) - max_lines} more {kind.replace('_', ' ')} problems")
    return lines


def _chosen(info: DatasetInfo, partitions: Iterable[str | int] | None, partition_lists: str) -> list[str]:
    """The canonical partitions to check (all by default); ``ValueError`` for a wrong one or a wrong partition-list source."""
    if partition_lists not in PARTITION_LIST_SOURCES:
        raise ValueError(f"partition_lists must be one of {PARTITION_LIST_SOURCES}, got {partition_lists!r}")
    return list(info.partitions) if partitions is None else [info.resolve_partition(p) for p in partitions]


def _lists(info: DatasetInfo, partitions: Iterable[str | int] | None, partition_lists: str,
           max_items: int | None, root: Path | None = None,
           unlabeled_labels: bool = False) -> dict[str, tuple[list[str], bool]]:
    """List name -> (entries, needs labels), for val and each partition's labeled / unlabeled list (the unlabeled
    lists' labels are needed with ``unlabeled_labels``: the pseudo-label diagnostics read them)."""
    definition, chosen = DATASETS.get(info.name), _chosen(info, partitions, partition_lists)
    lists = {"val": (definition.list_ids("val", None, partition_lists, root=root)[:max_items], True)}
    for part in chosen:
        for split in ("labeled", "unlabeled"):
            entries = definition.list_ids(split, part, partition_lists, root=root)[:max_items]
            lists[f"{part}/{split}"] = (entries, split == "labeled" or unlabeled_labels)
    return lists


def _header(path: Path) -> tuple[tuple[int, int], str] | None | Exception:
    """(size (W, H), PIL mode) from the file header; None if missing; the error if unreadable."""
    try:
        with open_image(path) as img:
            return img.size, img.mode
    except FileNotFoundError:
        return None
    except (UnidentifiedImageError, OSError, SyntaxError, ImageTooLargeError) as err:
        return err


def _unreadable(what: str, path: Path, error: Exception) -> Problem:
    """An image or label file that cannot be used: too large (its own message) or not decodable."""
    detail = str(error) if isinstance(error, ImageTooLargeError) else f"{what} file {path} is corrupt or not an image ({error})"
    return Problem("unreadable", str(path), detail)


def _check_entry(definition: type[DatasetDef], entry: ItemFiles, decode: bool,
                 report: DatasetReport) -> tuple[bool, bool | None, list[Problem]]:
    """(image found, label found or None if not needed, problems); the image's mode and decoded label values go
    into ``report``. ``decode``: decode the image and the label as the readers do (else headers only)."""
    problems: list[Problem] = []
    image = _header(entry.image)
    if isinstance(image, Exception):
        problems.append(_unreadable("image", entry.image, image))
    elif image is None:
        problems.append(Problem("missing_image", str(entry.image), f"image file {entry.image} does not exist"))
    else:
        report.image_modes[image[1]] += 1
        if decode:
            report.images_decoded += 1
            try:
                read_pixels(entry.image)
            except ValueError as error:
                problems.append(Problem("unreadable", str(entry.image), str(error)))
    image_found = image is not None
    if entry.label is None:
        return image_found, None, problems
    label = _header(entry.label)
    if label is None:
        problems.append(Problem("missing_label", str(entry.label), f"label file {entry.label} does not exist"))
        return image_found, False, problems
    if isinstance(label, Exception):
        problems.append(_unreadable("label", entry.label, label))
        return image_found, True, problems
    (width, height), mode = label
    if mode not in ("L", "P"):
        problems.append(Problem("label_mode", str(entry.label),
                                f"label file {entry.label} has PIL mode {mode!r}; expected a single-channel index "
                                f"PNG (mode 'L' or 'P') holding {entry.what}"))
        return image_found, True, problems
    if isinstance(image, tuple) and image[0] != (width, height):
        problems.append(Problem("size_mismatch", str(entry.label),
                                f"label file {entry.label} is {width}x{height} (WxH) but image {entry.image} is "
                                f"{image[0][0]}x{image[0][1]}; expected the same size"))
    if decode:
        problems += _check_values(definition, entry, report.value_counts)
    return image_found, True, problems


def _check_values(definition: type[DatasetDef], entry: ItemFiles, counts: np.ndarray) -> list[Problem]:
    """Decode one label; values outside ``0..max_value`` and 255 are a problem naming the file."""
    assert entry.label is not None
    try:  # max_value=254 accepts every value: the values are judged here, all of them named
        array = load_index_png(entry.label, max_value=IGNORE_INDEX - 1, what=entry.what)
    except ValueError as err:
        return [Problem("unreadable", str(entry.label), str(err))]
    histogram = np.bincount(array.ravel(), minlength=256)
    bad = [int(v) for v in np.flatnonzero(histogram) if entry.max_value < v < IGNORE_INDEX and v != entry.ignore_value]
    if bad:
        return [Problem("label_values", str(entry.label),
                        f"label file {entry.label} holds values {bad[:10]} outside {entry.what} "
                        f"(0..{entry.max_value}, 255 = ignore)")]
    if entry.converted:
        histogram = np.bincount(definition.convert_label(array, entry).ravel(), minlength=256)
    counts += histogram
    return []


def _layout(definition: type[DatasetDef], root: Path, entries: dict[Path, ItemFiles]) -> list[str]:
    """Lines saying which folders exist (with file counts), then the dataset's own notes (what to prepare)."""
    found = []
    for folder in definition.layout_folders:
        path = root / folder
        found.append(f"{folder}/ ({sum(1 for _ in os.scandir(path))} entries)" if path.is_dir()
                     else f"{folder}/ missing")
    lines = ["layout: " + ", ".join(found)] if found else []
    return lines + definition.check_notes(root, list(entries.values()))


def check_dataset(name: str, root: str | os.PathLike | None = None, *,
                  partitions: Iterable[str | int] | None = None, partition_lists: str = "u2pl",
                  max_items: int | None = None, sample: int | None = None,
                  progress: Progress | None = None, reuse: bool = False,
                  unlabeled_labels: bool = False) -> DatasetReport:
    """Check dataset ``name`` under ``root`` (else ``$NPSEMISEG_DATA``), as the readers will read it.

    partitions: names or aliases to check (default: all) besides val; max_items: only the first
    N entries of each list (as ``build_dataset``'s option); sample: decode at most N labeled entries (image and
    label), evenly spread (default: every entry, unlabeled images too: what training reads; 0: headers only).
    reuse: an entry decoded good before (:class:`CheckedRecord`) whose files are unchanged is not decoded again
    (the run preflight; ``data check`` decodes everything and records what it found good); unlabeled_labels: the
    unlabeled lists' labels are read too (a run with ``data.unlabeled_truth`` measured / oracle reads them).
    An unknown dataset, partition or partition-list source is a ``ValueError``; every finding about the files
    (an entry leading out of the folder included) is in the report.
    """
    info, definition = dataset_info(name), DATASETS.get(name)
    if info.synthetic:
        return DatasetReport(name, None, partition_lists, ["generated in memory: no files to check"], synthetic=True)
    for key, value, least in (("max_items", max_items, 1), ("sample", sample, 0)):
        if value is not None and (not isinstance(value, int) or value < least):
            raise ValueError(f"{key} must be an int >= {least} or None, got {value!r}")
    _chosen(info, partitions, partition_lists)  # a wrong partition or partition-list source: the error before the root's
    try:
        folder = definition.resolve_root(root)
    except FileNotFoundError as err:
        where = str(root if root is not None else os.environ.get(DATA_ROOT_ENV, ""))
        return DatasetReport(name, None, partition_lists, problems=[Problem("root", where, str(err))])
    lists = _lists(info, partitions, partition_lists, max_items, folder, unlabeled_labels)
    entries: dict[Path, ItemFiles] = {}
    images: dict[str, list[Path]] = {}
    refused: dict[Path, Problem] = {}
    for list_name, (items, with_label) in lists.items():
        images[list_name] = []
        for item in items:
            try:
                entry = definition.item_files(folder, item, with_label)
            except ValueError as error:  # out of the folder (OutsideRootError), or not the layout's form
                key = Path(f"{list_name}: {item}")
                refused[key] = Problem("list_entry", str(key), f"{list_name}: {error}")
                images[list_name].append(key)
                continue
            if entry.image not in entries or entry.label is not None:
                entries[entry.image] = entry
            images[list_name].append(entry.image)
    report = DatasetReport(name, folder, partition_lists, _layout(definition, folder, entries),
                           problems=list(refused.values()), unusable=definition.unusable_files(folder))
    status = _check_entries(definition, list(entries.values()), sample, progress, report, reuse)
    status.update({key: (True, False, None, False) for key in refused})
    report.lists = [_count(list_name, [status[i] for i in images[list_name]], lists[list_name][1])
                    for list_name in lists]
    return report


def _check_entries(definition: type[DatasetDef], entries: list[ItemFiles], sample: int | None, progress: Progress | None,
                   report: DatasetReport, reuse: bool) -> dict[Path, tuple[bool, bool, bool | None, bool]]:
    """Check each entry once; image path -> (image found, image ok, label found or None, label ok). ``reuse``: an
    entry :class:`CheckedRecord` holds unchanged is not decoded again (its headers are read)."""
    labeled = [i for i, e in enumerate(entries) if e.label is not None]
    report.labels_total = len(labeled)
    if sample is None:
        decode = set(range(len(entries)))
    elif sample >= len(labeled):
        decode = set(labeled)
    else:
        decode = {labeled[int(j)] for j in np.linspace(0, len(labeled) - 1, sample).round()} if sample else set()
    status = {}
    record = CheckedRecord(definition, report.root) if report.root is not None else None
    for i, entry in enumerate(entries):
        signature = record.signature(entry) if record is not None else None
        decoded = i in decode and not (reuse and signature is not None and record.holds(entry, signature))
        image_found, label_found, problems = _check_entry(definition, entry, decoded, report)
        report.labels_checked += decoded and label_found is True
        report.problems += problems
        if decoded and not problems and signature is not None:
            record.add(entry, signature)
        paths = {p.path for p in problems}
        status[entry.image] = (image_found, str(entry.image) not in paths, label_found, str(entry.label) not in paths)
        if progress is not None:
            progress(i + 1, len(entries))
    if record is not None:
        record.save()
    return status


class CheckedRecord:
    """The entries of one dataset folder found good when decoded, with their files' sizes and modification times:
    ``<cache>/checked/<digest>.json`` (``$NPSEMISEG_CACHE``, else ``~/.cache/npsemiseg``). A check with ``reuse``
    (the run preflight) decodes only the entries whose files changed since: the same check, paid once per file.
    Best effort: a record that cannot be read or written is no record."""

    def __init__(self, definition: type[DatasetDef], root: Path) -> None:
        self.root = root.resolve()
        key = f"{definition.name}|{self.root}|{len(definition.class_names)}|{definition.ignore_index}"
        base = os.environ.get(CACHE_ENV)
        folder = (Path(base) if base else Path.home() / ".cache" / "npsemiseg") / "checked"
        self.path = folder / f"{hashlib.sha256(key.encode()).hexdigest()[:24]}.json"
        try:
            self.entries: dict[str, list[int]] = json.loads(self.path.read_text())["entries"]
        except (OSError, ValueError, KeyError, TypeError):
            self.entries = {}
        self.changed = False

    @staticmethod
    def _key(entry: ItemFiles) -> str:
        return f"{entry.image}|{entry.label}|{entry.max_value}|{entry.ignore_value}"

    def signature(self, entry: ItemFiles) -> list[int] | None:
        """The sizes and modification times (ns) of the entry's files; None when one is missing."""
        try:
            stats = [os.stat(p) for p in (entry.image, entry.label) if p is not None]
        except OSError:
            return None
        return [value for st in stats for value in (st.st_size, st.st_mtime_ns)]

    def holds(self, entry: ItemFiles, signature: list[int]) -> bool:
        return self.entries.get(self._key(entry)) == signature

    def add(self, entry: ItemFiles, signature: list[int]) -> None:
        self.entries[self._key(entry)] = signature
        self.changed = True

    def save(self) -> None:
        if not self.changed:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            temporary = self.path.with_name(f".{self.path.name}.tmp-{os.getpid()}")
            temporary.write_text(json.dumps({"format": 1, "root": str(self.root), "entries": self.entries}))
            os.replace(temporary, self.path)
        except OSError:
            pass


def _count(name: str, found: list[tuple[bool, bool, bool | None, bool]], with_label: bool) -> ListCount:
    """Counts of one list from the status of its entries (see ``_check_entries``)."""
    return ListCount(
        name=name, listed=len(found),
        missing_images=sum(not image_found for image_found, _, _, _ in found),
        missing_labels=sum(label_found is False for _, _, label_found, _ in found) if with_label else None,
        bad_files=sum((image_found and not image_ok) or (with_label and label_found is True and not label_ok)
                      for image_found, image_ok, label_found, label_ok in found),
    )


def check_file_list(name: str, paths: Iterable[str], *, partitions: Iterable[str | int] | None = None,
                    partition_lists: str = "u2pl", max_items: int | None = None) -> tuple[str | None, dict[str, list[str]]]:
    """A tree known only by its files' relative ``/`` paths (a manifest) against the lists ``check_dataset``
    would check: the dataset's folder in it (``""``: the tree itself, or ``"VOC2012"``, ...; None when no
    folder holds the dataset's ``JPEGImages/`` / ``leftImg8bit/``) and, per list name, the listed files the
    tree lacks, relative to that folder (a Cityscapes label may be its ``labelTrainIds`` or ``labelIds`` file).
    Nothing is opened: the values and sizes of the files are the staged copy's to check."""
    info, definition = dataset_info(name), DATASETS.get(name)
    files = set(paths)
    marker = definition.root_marker + "/"
    folder = next((prefix for prefix in ["", *definition.root_subfolders]
                   if any(p.startswith(f"{prefix}/{marker}" if prefix else marker) for p in files)), None)
    if folder is None:
        return None, {}
    inside = {p[len(folder) + 1:] if folder else p for p in files if not folder or p.startswith(folder + "/")}
    missing: dict[str, list[str]] = {}
    for list_name, (items, with_label) in _lists(info, partitions, partition_lists, max_items).items():
        lacking = []
        for item in items:
            image, labels = definition.entry_image(item), definition.entry_labels(item) if with_label else ()
            if image not in inside:
                lacking.append(image)
            if labels and not any(label in inside for label in labels):
                lacking.append(labels[0])
        if lacking:
            missing[list_name] = lacking
    return folder, missing


def data_problem(report: DatasetReport) -> str:
    """The first reason a ``DatasetReport`` is not usable, as one line naming the dataset."""
    where = f"data: dataset {report.name}"
    if report.root is None:
        detail = report.problems[0].detail if report.problems else "no data root"
        return f"{where}: {detail} (command line: --set data.root=DIR)"
    where += f" under {report.root}"
    for kind, what in (("missing_image", "images"), ("missing_label", "labels")):
        missing = report.problems_of(kind)
        if missing:
            examples = ", ".join(p.path for p in missing[:2])
            hints = [line for line in report.layout if "npsemiseg data prepare" in line]
            stems = {Path(p.path).stem for p in missing}  # a file the layout cannot use that explains one
            hints += [f"not used: {path}: {why}" for path, why in report.unusable
                      if Path(path).stem in stems][:1]
            hint = hints[0] if hints else f"npsemiseg data check --dataset {report.name} tells more"
            return f"{where}: {len(missing)} listed {what} missing, e.g. {examples} (expected the standard layout; {hint})"
    if report.problems:
        first = report.problems[0]
        more = f" (and {len(report.problems) - 1} more problems)" if len(report.problems) > 1 else ""
        return f"{where}: {first.detail}{more}"
    return f"{where}: no list could be read (expected the dataset's list files and folders)"
