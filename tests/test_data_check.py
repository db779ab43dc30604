"""check_dataset on fixture trees in the real VOC / Cityscapes layouts: every bad case is
reported (naming the file and what was expected), a usable tree passes, and the verdict agrees
with the readers (what check calls usable, build_dataset reads; what it refuses, they refuse)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from data_fixtures import make_cityscapes_split, make_cityscapes_tree, make_voc_split, random_label, write_label
from PIL import Image

from npsemiseg.data import DATA_ROOT_ENV, build_dataset, partition_ids
from npsemiseg.data.check import check_dataset, value_ranges

N = 3  # entries per list in the fixture trees (max_items)


def _voc_tree(root: Path, dataset: str = "pascal_classic", partition: str = "92", **kwargs) -> Path:
    for split in ("val", "labeled", "unlabeled"):
        make_voc_split(root, dataset, split, None if split == "val" else partition, max_items=N, **kwargs)
    return root


def _check(root, dataset="pascal_classic", partition="1/16", **kwargs):
    return check_dataset(dataset, root, partitions=[partition], max_items=N, **kwargs)


def _loader_reads_all(dataset, root, partition="1/16") -> bool:
    """True when build_dataset builds every checked list and loads every item."""
    try:
        for split in ("val", "labeled", "unlabeled"):
            ds = build_dataset(dataset, split, root, None if split == "val" else partition, max_items=N)
            for i in range(len(ds)):
                ds[i]
    except (FileNotFoundError, ValueError):
        return False
    return True


@pytest.mark.parametrize("label_mode", ["L", "P"])
def test_usable_voc_tree_passes(tmp_path, label_mode):
    _voc_tree(tmp_path, label_mode=label_mode)
    done = []
    report = _check(tmp_path, progress=lambda i, total: done.append((i, total)))
    assert report.usable, report.format()
    assert [c.name for c in report.lists] == ["val", "92/labeled", "92/unlabeled"]
    assert all(c.listed == N and c.usable for c in report.lists)
    assert report.lists[2].missing_labels is None  # unlabeled lists need no labels
    assert report.labels_checked == report.labels_total == 2 * N
    assert report.value_counts[21:255].sum() == 0 and report.value_counts[255] > 0
    assert done[-1] == (3 * N, 3 * N) and [i for i, _ in done] == list(range(1, 3 * N + 1))
    text = report.format()
    assert "usable" in text and "NOT usable" not in text and "92 (1/16) unlabeled" in text
    assert _loader_reads_all("pascal_classic", tmp_path)


@pytest.mark.parametrize("label_kind", ["trainIds", "labelIds"])
def test_usable_cityscapes_tree_passes(tmp_path, label_kind):
    for split in ("val", "labeled", "unlabeled"):
        make_cityscapes_split(tmp_path, split, None if split == "val" else "186", max_items=N, label_kind=label_kind)
    report = _check(tmp_path, "cityscapes")
    assert report.usable, report.format()
    # labelIds files are judged against 0..33 and summarised as the train ids the loader makes
    assert report.value_counts[19:255].sum() == 0
    assert ("labelIds files, converted at every read" in report.format()) == (label_kind == "labelIds")
    assert _loader_reads_all("cityscapes", tmp_path)


def test_empty_root_and_no_root(tmp_path, monkeypatch):
    report = _check(tmp_path)
    assert not report.usable and report.root is None and [p.kind for p in report.problems] == ["root"]
    assert f"not found under {tmp_path}: expected a JPEGImages/ folder" in report.format()
    monkeypatch.delenv(DATA_ROOT_ENV, raising=False)
    report = check_dataset("cityscapes", None)
    assert not report.usable and DATA_ROOT_ENV in report.problems[0].detail


def _ids(dataset="pascal_classic", split="val", partition=None):
    return partition_ids(dataset, split, partition)[:N]


def _delete_images(root: Path) -> str:
    for image_id in _ids()[:2]:
        (root / "JPEGImages" / f"{image_id}.jpg").unlink()
    return f"missing images: 2, e.g. {root}/JPEGImages/{_ids()[0]}.jpg, {root}/JPEGImages/{_ids()[1]}.jpg"


def _delete_labels(root: Path) -> str:
    for image_id in _ids():
        (root / "SegmentationClassAug" / f"{image_id}.png").unlink()
    return f"missing labels: {N}, e.g. {root}/SegmentationClassAug/{_ids()[0]}.png"


def _bad_values(root: Path) -> str:
    path = root / "SegmentationClassAug" / f"{_ids()[1]}.png"
    label = np.asarray(Image.open(path)).copy()
    label[0, :3] = [21, 40, 255]
    write_label(path, label)
    return f"label file {path} holds values [21, 40] outside pascal_classic class indices (0..20, 255 = ignore)"


def _size_mismatch(root: Path) -> str:
    path = root / "SegmentationClassAug" / f"{_ids()[2]}.png"
    write_label(path, random_label(np.random.default_rng(1), 20, 32, range(21)))
    return (f"label file {path} is 32x20 (WxH) but image {root}/JPEGImages/{_ids()[2]}.jpg is 32x24; "
            "expected the same size")


def _colour_label(root: Path) -> str:
    path = root / "SegmentationClassAug" / f"{_ids()[0]}.png"
    write_label(path, np.asarray(Image.open(path)), mode="RGB")
    return f"label file {path} has PIL mode 'RGB'; expected a single-channel index PNG"


def _corrupt_image(root: Path) -> str:
    path = root / "JPEGImages" / f"{_ids()[0]}.jpg"
    path.write_bytes(b"not a jpeg")
    return f"image file {path} is corrupt or not an image"


BAD_CASES = {
    "missing_image": (_delete_images, "val", "missing_images", 2),
    "missing_label": (_delete_labels, "val", "missing_labels", N),
    "label_values": (_bad_values, "val", "bad_files", 1),
    "size_mismatch": (_size_mismatch, "val", "bad_files", 1),
    "label_mode": (_colour_label, "val", "bad_files", 1),
    "unreadable": (_corrupt_image, "val", "bad_files", 1),
}


@pytest.mark.parametrize("kind", list(BAD_CASES))
def test_bad_voc_tree_is_reported_with_the_file(tmp_path, kind):
    spoil, list_name, column, count = BAD_CASES[kind]
    _voc_tree(tmp_path)
    expected = spoil(tmp_path)
    report = _check(tmp_path)
    assert not report.usable
    assert {p.kind for p in report.problems} == {kind}
    counts = {c.name: c for c in report.lists}
    assert getattr(counts[list_name], column) == count and not counts[list_name].usable
    assert counts["92/labeled"].usable and counts["92/unlabeled"].usable  # the other lists are untouched
    text = report.format()
    assert "NOT usable" in text and expected in text, text
    assert not _loader_reads_all("pascal_classic", tmp_path)


def test_partition_list_naming_a_missing_id(tmp_path):
    _voc_tree(tmp_path)
    missing = _ids("pascal_classic", "labeled", "92")[1]
    (tmp_path / "JPEGImages" / f"{missing}.jpg").unlink()
    (tmp_path / "SegmentationClassAug" / f"{missing}.png").unlink()
    report = _check(tmp_path)
    counts = {c.name: c for c in report.lists}
    assert (counts["92/labeled"].missing_images, counts["92/labeled"].missing_labels) == (1, 1)
    assert counts["val"].usable and counts["92/unlabeled"].usable and not report.usable
    assert f"{tmp_path}/JPEGImages/{missing}.jpg" in report.format()
    # a partition the tree does not hold at all: every entry of its lists is missing
    other = _check(tmp_path, partition="1/8")
    assert {c.name: c.missing_images for c in other.lists} == {"val": 0, "183/labeled": N, "183/unlabeled": N}


def test_unlabeled_list_needs_images_only(tmp_path):
    make_voc_split(tmp_path, "pascal_blender", "unlabeled", "662", max_items=N)
    report = _check(tmp_path, "pascal_blender")
    counts = {c.name: c for c in report.lists}
    assert counts["662/unlabeled"].usable and counts["662/unlabeled"].missing_labels is None
    assert not counts["662/labeled"].usable and not report.usable
    assert "SegmentationClassAug/ is missing: build it" in report.format()


def test_cityscapes_label_ids_out_of_range_names_the_file(tmp_path):
    entries = partition_ids("cityscapes", "val")[:N]
    make_cityscapes_tree(tmp_path, entries, label_kind="labelIds")
    for split in ("labeled", "unlabeled"):
        make_cityscapes_split(tmp_path, split, "186", max_items=N)
    path = tmp_path / entries[0].replace("leftImg8bit/", "gtFine/", 1).replace("leftImg8bit.png", "gtFine_labelIds.png")
    label = np.asarray(Image.open(path)).copy()
    label[0, 0] = 34
    write_label(path, label)
    report = _check(tmp_path, "cityscapes")
    assert [p.kind for p in report.problems] == ["label_values"]
    assert f"label file {path} holds values [34] outside Cityscapes label ids (0..33" in report.format()
    assert not _loader_reads_all("cityscapes", tmp_path)


def test_sample_decodes_fewer_labels_headers_still_checked(tmp_path):
    _voc_tree(tmp_path)
    _bad_values(tmp_path)
    _size_mismatch(tmp_path)
    headers_only = _check(tmp_path, sample=0)
    assert headers_only.labels_checked == 0 and headers_only.labels_total == 2 * N
    assert [p.kind for p in headers_only.problems] == ["size_mismatch"]  # sizes come from the headers
    assert "decoded 0 of 6 labels" in headers_only.format()
    sampled = _check(tmp_path, sample=2)
    assert sampled.labels_checked == 2
    assert {p.kind for p in _check(tmp_path).problems} == {"size_mismatch", "label_values"}


def test_bad_arguments_and_synthetic():
    with pytest.raises(ValueError, match="dataset: unknown name 'voc', expected one of"):
        check_dataset("voc")
    with pytest.raises(ValueError, match=r"partition '1/32' is not a partition of 'pascal_classic'"):
        check_dataset("pascal_classic", "/nonexistent", partitions=["1/32"])
    with pytest.raises(ValueError, match=r"sample must be an int >= 0 or None, got -1"):
        check_dataset("pascal_classic", "/nonexistent", sample=-1)
    with pytest.raises(ValueError, match="partition_lists must be one of"):
        check_dataset("cityscapes", "/nonexistent", partition_lists="cpss")
    with pytest.raises(ValueError, match=r"max_items must be an int >= 1 or None, got 0"):
        check_dataset("cityscapes", "/nonexistent", max_items=0)
    report = check_dataset("synthetic_voc")
    assert report.usable and report.synthetic and "generated in memory" in report.format()


def test_value_ranges():
    assert value_ranges([255, 0, 1, 2, 5, 7, 8]) == "0..2, 5, 7..8, 255"
    assert value_ranges([]) == ""
