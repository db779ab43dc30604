"""``npsemiseg data check`` / ``manifest`` / ``prepare voc|cityscapes|coco``: a dataset tree before training on it.

``check`` prints ``npsemiseg.data.check_dataset``'s one-screen summary (layout, counts per list,
label values, missing files with examples, size mismatches) and exits 0 only when the dataset is
usable, 2 otherwise; for an S3 root (``s3://bucket/prefix/VOC2012``) it compares the store's listing
with the tree's ``manifest.json`` (sizes), downloading nothing else. ``manifest DIR`` writes that
manifest (every file's path, size and SHA-256) into ``DIR`` before it is uploaded. ``prepare voc``
builds ``SegmentationClassAug/`` from VOC 2012 and SBD, ``prepare cityscapes`` writes
``*_labelTrainIds.png``, ``prepare coco`` UniMatch's 81-class ``masks/`` from COCO's instance annotations (with
pycocotools, the ``coco`` extra); all resumable, with a progress bar. A folder dataset of one's own
(``docs/datasets.md``): ``partition FOLDER --labeled 1/8 --seed 0`` writes its lists,
``check --folder FOLDER`` checks it (its classes file, images, masks, lists) as any other dataset.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from tqdm import tqdm

from npsemiseg.data import dataset_names
from semiseg_platform.cli.app import app, fail, one_line

if TYPE_CHECKING:  # each command imports what it reads with when it runs: the --help answers at once
    from npsemiseg.data.prepare import PrepareResult

data_app = typer.Typer(help="Check a dataset tree, or prepare VOC / Cityscapes / COCO labels.", no_args_is_help=True)
prepare_app = typer.Typer(help="Build the label files the readers expect.", no_args_is_help=True)
data_app.add_typer(prepare_app, name="prepare")
app.add_typer(data_app, name="data")


@contextmanager
def progress_bar(what: str, enabled: bool = True) -> Iterator[Callable[[int, int], None]]:
    """A ``progress(done, total)`` callback drawing a tqdm bar on stderr when it is a terminal (closed at the end)."""
    bar: tqdm | None = None

    def update(done: int, total: int) -> None:
        nonlocal bar
        if not enabled:
            return
        if bar is None:
            bar = tqdm(total=total, desc=what, unit="file", leave=False, dynamic_ncols=True, disable=None)
        bar.update(done - bar.n)

    try:
        yield update
    finally:
        if bar is not None:
            bar.close()


@data_app.command("check")
def check(
    dataset: str | None = typer.Option(None, help=" | ".join(dataset_names()) + " (or --folder)"),
    folder: Path | None = typer.Option(None, help="a folder dataset of one's own (classes.yaml, images/, masks/, "
                                                  "lists/), registered under its folder's name"),
    root: str | None = typer.Option(None, help="the data root, a folder or s3://bucket/prefix (default: $NPSEMISEG_DATA)"),
    partition: list[str] | None = typer.Option(None, help="check only this partition besides val (repeatable; "
                                                           "default: all), e.g. 92 or 1/16"),
    partition_lists: str = typer.Option("u2pl", "--partition-lists", "--list-variant",
                                       help="whose partition lists: u2pl | cps (--list-variant: its earlier name)"),
    sample: int | None = typer.Option(None, help="decode at most N labeled entries, image and label (default: every "
                                                 "image and label, as training reads them; 0: headers only)"),
    max_items: int | None = typer.Option(None, help="only the first N entries of each list"),
    progress: bool = typer.Option(True, help="a progress bar on stderr"),
) -> None:
    """Check a dataset tree as the readers will read it; exit 0 only when it is usable (2 otherwise).
    An S3 root: its manifest against the lists, and the store's listing against the manifest."""
    from npsemiseg.data import DATA_ROOT_ENV, dataset_info
    from npsemiseg.data.check import check_dataset, data_problem
    from npsemiseg.data.sets.folder import register_folder
    from semiseg_platform.data_staging import check_remote, is_remote

    if (dataset is None) == (folder is None):
        fail("pass one of --dataset NAME or --folder PATH")
    if folder is not None:
        try:
            dataset, root = register_folder(folder).name, str(folder)
        except (ValueError, OSError) as error:
            fail(one_line(error))
    assert dataset is not None
    remote = root if root is not None else os.environ.get(DATA_ROOT_ENV)
    try:
        found = (check_remote(remote, dataset, partitions=partition or None, partition_lists=partition_lists,
                              max_items=max_items)
                 if is_remote(remote) and not dataset_info(dataset).synthetic else None)
    except ValueError as error:
        fail(one_line(error))
    if found is not None:
        typer.echo(found.format())
        if not found.usable:
            fail(found.first_problem())
        return
    try:
        with progress_bar(f"checking {dataset}", progress) as update:
            report = check_dataset(dataset, root, partitions=partition or None, partition_lists=partition_lists,
                                   max_items=max_items, sample=sample, progress=update)
    except (ValueError, FileNotFoundError) as error:
        fail(one_line(error))
    typer.echo(report.format())
    if not report.usable:
        fail(data_problem(report))


@data_app.command("partition")
def partition_command(
    folder: Path = typer.Argument(..., help="the folder dataset (classes.yaml, images/, masks/)"),
    labeled: list[str] = typer.Option(..., help="a labeled partition: a fraction (1/8, 0.125) or a count (50); "
                                                "repeatable"),
    seed: int = typer.Option(0, help="the seed of the val split and the labeled draws"),
    val: str = typer.Option("0.1", help="the val split: a fraction or a count of the images with masks"),
    stratify: bool = typer.Option(True, help="labeled lists cover every class first (then random)"),
) -> None:
    """Write FOLDER/lists/ (val, each partition's labeled and unlabeled lists, partitions.yaml with the seed),
    reproducibly from the seed; nothing is written when an argument or the folder is wrong."""
    from npsemiseg.data.sets.folder import write_partitions

    try:
        lists = write_partitions(folder, labeled, seed=seed, val=val, stratify=stratify)
    except (ValueError, OSError) as error:
        fail(one_line(error))
    typer.echo(f"{lists}: val.txt and {', '.join(labeled)} (seed {seed}); cite {lists / 'partitions.yaml'}")


@data_app.command("manifest")
def manifest_command(
    root: Path = typer.Argument(..., help="the dataset tree (e.g. .../VOC2012), before it is uploaded"),
    progress: bool = typer.Option(True, help="a progress bar on stderr"),
) -> None:
    """Write ROOT/manifest.json: every file's path, size and SHA-256, what a staged copy is verified against."""
    from npsemiseg.data.manifest import write_manifest

    try:
        with progress_bar("manifest", progress) as update:
            path, manifest = write_manifest(root, progress=update)
    except ValueError as error:
        fail(one_line(error))
    typer.echo(f"{path}: {len(manifest.files)} files, {manifest.total_bytes} bytes")


def _prepared(result: PrepareResult) -> None:
    sources = ", ".join(f"{count} from {source}" for source, count in result.sources.items())
    typer.echo(f"{result.total} label files in {result.out} ({result.written} written now, {result.existing} there "
               f"before{', ' + sources if sources else ''}"
               f"{f'; removed {result.temp_removed} leftover temporary files' if result.temp_removed else ''})")


@prepare_app.command("voc")
def prepare_voc_command(
    voc: Path = typer.Option(..., help="VOC 2012 (holding SegmentationClass/, or its VOC2012 / VOCdevkit/VOC2012)"),
    sbd: Path = typer.Option(..., help="SBD (holding cls/, or dataset/cls, benchmark_RELEASE/dataset/cls)"),
    out: Path | None = typer.Option(None, help="where SegmentationClassAug/ goes (default: the VOC folder)"),
    progress: bool = typer.Option(True, help="a progress bar on stderr"),
) -> None:
    """Build SegmentationClassAug/ from VOC 2012 and SBD (the standard 'aug' set); resumable, idempotent."""
    from npsemiseg.data.prepare import prepare_voc

    try:
        with progress_bar("SegmentationClassAug", progress) as update:
            result = prepare_voc(voc, sbd, out, progress=update)
    except (ValueError, FileNotFoundError) as error:
        fail(one_line(error))
    _prepared(result)


@prepare_app.command("cityscapes")
def prepare_cityscapes_command(
    root: Path = typer.Option(..., help="the Cityscapes folder (holding gtFine/) or a folder holding cityscapes/"),
    progress: bool = typer.Option(True, help="a progress bar on stderr"),
) -> None:
    """Write *_labelTrainIds.png beside every *_labelIds.png under gtFine/ once; resumable, idempotent."""
    from npsemiseg.data.prepare import prepare_cityscapes

    try:
        with progress_bar("labelTrainIds", progress) as update:
            result = prepare_cityscapes(root, progress=update)
    except (ValueError, FileNotFoundError) as error:
        fail(one_line(error))
    _prepared(result)


@prepare_app.command("coco")
def prepare_coco_command(
    root: Path = typer.Option(..., help="the COCO folder (holding train2017/, val2017/; masks/ is written there)"),
    annotations: Path | None = typer.Option(None, help="the folder of instances_<split>.json (default: ROOT/annotations)"),
    split: list[str] | None = typer.Option(None, help="the splits whose masks to build (repeat the option; default: "
                                                      "train2017 and val2017)"),
    progress: bool = typer.Option(True, help="a progress bar on stderr"),
) -> None:
    """Build UniMatch's 81-class masks/ from COCO 2017's instances_*.json (needs pycocotools: the coco extra)."""
    from npsemiseg.data.prepare_coco import COCO_SPLITS, prepare_coco

    split = split or list(COCO_SPLITS)
    unknown = sorted(set(split) - set(COCO_SPLITS))
    if unknown:
        fail(f"--split: expected {' or '.join(COCO_SPLITS)}, got {', '.join(unknown)}")
    try:
        with progress_bar("masks", progress) as update:
            result = prepare_coco(root, annotations, tuple(split), progress=update)
    except (ValueError, FileNotFoundError) as error:
        fail(one_line(error))
    _prepared(result)
