"""``npsemiseg data prepare coco`` on a COCO 2017 tree the test writes in the official format: ``instances_*.json``
with COCO's 80 category ids (gaps included), polygon annotations (one of two parts), an uncompressed-RLE crowd
annotation and overlapping instances, plus the JPEGs; the PNG masks' pixel values are checked against the rule
(0 background, class index 1..80 by ascending category id, 255 where annotations overlap), then read back by the
COCO reader. Bad input ends with one line, exit 2, ``masks/`` as it was."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from data_fixtures import write_image
from PIL import Image
from typer.testing import CliRunner

from npsemiseg.data import build_dataset, partition_ids
from npsemiseg.data.sets.coco import COCO_CLASSES
from semiseg_platform.cli.main import app

pytest.importorskip("pycocotools")
runner = CliRunner()

#: COCO 2017's 80 category ids (ascending; 12, 26, 29, 30, 45, 66, 68, 69, 71, 83 unused)
COCO_IDS = [*range(1, 12), *range(13, 26), 27, 28, *range(31, 45), *range(46, 66), 67, 70, *range(72, 83),
            *range(84, 91)]
H, W = 20, 30


def _rle(mask: np.ndarray) -> dict:
    """COCO's uncompressed RLE of a bool ``[H, W]``: run lengths in column-major order, starting with zeros."""
    flat = mask.flatten(order="F").astype(np.uint8)
    changes = np.flatnonzero(np.diff(flat)) + 1
    runs = np.diff(np.concatenate([[0], changes, [flat.size]])).tolist()
    return {"size": [mask.shape[0], mask.shape[1]], "counts": ([0] if flat[0] else []) + runs}


def _box(x0: float, y0: float, x1: float, y1: float) -> list[float]:
    return [x0, y0, x1, y0, x1, y1, x0, y1]


def _crowd() -> np.ndarray:
    mask = np.zeros((H, W), dtype=bool)
    mask[14:19, 20:29] = True
    return mask


def coco_tree(root: Path) -> tuple[Path, list[str], str]:
    """``root/coco`` with two labeled train images of the 1/512 list, one train image without annotations and one
    val image; returns (folder, train stems, val stem)."""
    folder = root / "coco"
    train = [entry.split()[0].split("/")[1][:-4] for entry in partition_ids("coco", "labeled", "232")[:3]]
    val = partition_ids("coco", "val")[0].split()[0].split("/")[1][:-4]
    rng = np.random.default_rng(0)
    for split, stems in (("train2017", train), ("val2017", [val])):
        for stem in stems:
            write_image(folder / split / f"{stem}.jpg", rng, H, W)
    categories = [{"id": i, "name": n, "supercategory": "thing"} for i, n in zip(COCO_IDS, COCO_CLASSES[1:])]
    images = [{"id": int(stem), "file_name": f"{stem}.jpg", "height": H, "width": W} for stem in train]
    annotations = [
        {"id": 1, "image_id": int(train[0]), "category_id": 1, "iscrowd": 0, "segmentation": [_box(2, 2, 12, 12)]},
        {"id": 2, "image_id": int(train[0]), "category_id": 90, "iscrowd": 0, "segmentation": [_box(8, 8, 18, 16)]},
        {"id": 3, "image_id": int(train[0]), "category_id": 44, "iscrowd": 1, "segmentation": _rle(_crowd())},
        {"id": 4, "image_id": int(train[1]), "category_id": 18, "iscrowd": 0,
         "segmentation": [_box(1, 1, 6, 6), _box(20, 10, 27, 17)]},
    ]
    (folder / "annotations").mkdir(parents=True)
    write = lambda name, data: (folder / "annotations" / name).write_text(json.dumps(data))  # noqa: E731
    write("instances_train2017.json", {"images": images, "annotations": annotations, "categories": categories})
    val_annotations = [{"id": 5, "image_id": int(val), "category_id": 2, "iscrowd": 0, "segmentation": [_box(3, 3, 9, 9)]}]
    write("instances_val2017.json", {"images": [{"id": int(val), "file_name": f"{val}.jpg", "height": H, "width": W}],
                                     "annotations": val_annotations, "categories": categories})
    return folder, train, val


def _prepare(folder: Path, *extra: str):
    return runner.invoke(app, ["data", "prepare", "coco", "--root", str(folder), "--no-progress", *extra])


def test_the_masks_follow_the_rule_and_the_reader_reads_them(tmp_path):
    folder, train, val = coco_tree(tmp_path)
    assert (COCO_CLASSES[1], COCO_CLASSES[2], COCO_CLASSES[17], COCO_CLASSES[40], COCO_CLASSES[80]) == (
        "person", "bicycle", "dog", "bottle", "toothbrush")  # category ids 1, 2, 18, 44, 90
    with pytest.raises(FileNotFoundError, match=r"masks/ folder .* `npsemiseg data prepare coco --root"):
        build_dataset("coco", "labeled", tmp_path, "232", max_items=2)
    result = _prepare(folder)
    assert result.exit_code == 0, result.output
    assert "4 label files" in result.stdout and "4 written now" in result.stdout
    assert sorted(p.name for p in (folder / "masks").iterdir()) == sorted(f"{s}.png" for s in [*train, val])
    assert not (folder / ".masks.part").exists()
    first = np.asarray(Image.open(folder / "masks" / f"{train[0]}.png"))
    assert first.dtype == np.uint8 and first.shape == (H, W)
    assert first[4, 4] == 1 and first[14, 15] == 80 and first[10, 10] == 255  # person, toothbrush, their overlap
    assert (first[_crowd()] == 40).all() and (first == 40).sum() == _crowd().sum()  # the crowd RLE: bottle, exactly
    assert first[2, 25] == 0 and set(np.unique(first)) == {0, 1, 40, 80, 255}
    second = np.asarray(Image.open(folder / "masks" / f"{train[1]}.png"))
    assert second[3, 3] == 17 and second[13, 23] == 17 and second[15, 10] == 0  # both parts of the polygon
    assert not np.asarray(Image.open(folder / "masks" / f"{train[2]}.png")).any()  # no annotation: background
    assert np.asarray(Image.open(folder / "masks" / f"{val}.png"))[5, 5] == 2
    labeled = build_dataset("coco", "labeled", tmp_path, "232", max_items=2)
    assert labeled.root == folder and np.array_equal(labeled[0]["label"].numpy(), first)
    again = _prepare(folder)
    assert again.exit_code == 0 and "0 written now, 4 there before" in again.stdout


def _one_line_exit_2(result, *expected: str) -> None:
    assert result.exit_code == 2, result.output
    assert len(result.stderr.strip().splitlines()) == 1 and all(e in result.stderr for e in expected), result.stderr


@pytest.mark.parametrize("damage,expected", [
    ("missing", ("instances_val2017.json", "do not exist")),
    ("truncated", ("instances_val2017.json", "not JSON")),
    ("not_instances", ("instances_val2017.json", "expected COCO's instances format")),
    ("category", ("instances_val2017.json", "annotation 5 names unknown category 12")),
    ("categories", ("instances_val2017.json", "expected COCO 2017's 80 thing categories")),
])
def test_bad_annotations_are_one_line_and_write_nothing(tmp_path, damage, expected):
    folder, _, _ = coco_tree(tmp_path)
    path = folder / "annotations" / "instances_val2017.json"
    data = json.loads(path.read_text())
    if damage == "missing":
        path.unlink()
    elif damage == "truncated":
        path.write_text(path.read_text()[:100])
    elif damage == "not_instances":
        path.write_text(json.dumps({"images": []}))
    elif damage == "category":
        data["annotations"][0]["category_id"] = 12
        path.write_text(json.dumps(data))
    else:
        data["categories"] = data["categories"][:79]
        path.write_text(json.dumps(data))
    _one_line_exit_2(_prepare(folder), *expected)
    assert not (folder / "masks").exists() and not (folder / ".masks.part").exists()


def test_a_bad_segmentation_midway_leaves_the_masks_as_they_were(tmp_path):
    """Built in a temporary folder and moved at the end: a failure on the last image leaves ``masks/`` with only
    what it held before (a mask already there is never rewritten)."""
    folder, train, val = coco_tree(tmp_path)
    (folder / "masks").mkdir()
    kept = np.full((H, W), 7, dtype=np.uint8)
    Image.fromarray(kept).save(folder / "masks" / f"{train[0]}.png")
    path = folder / "annotations" / "instances_val2017.json"
    data = json.loads(path.read_text())
    data["annotations"][0]["segmentation"] = {"size": [H, W], "counts": 3.5}
    path.write_text(json.dumps(data))
    _one_line_exit_2(_prepare(folder), "instances_val2017.json", f"image {int(val)}", "expected polygons or an RLE")
    assert [p.name for p in (folder / "masks").iterdir()] == [f"{train[0]}.png"]
    assert not (folder / ".masks.part").exists()
    path.write_text(json.dumps({**data, "annotations": []}))
    assert _prepare(folder).exit_code == 0
    assert np.array_equal(np.asarray(Image.open(folder / "masks" / f"{train[0]}.png")), kept)


def test_without_pycocotools_one_line_names_the_extra(tmp_path, monkeypatch):
    import npsemiseg.data.prepare_coco as prepare_coco

    folder, _, _ = coco_tree(tmp_path)
    monkeypatch.setattr(prepare_coco, "mask_utils", None)
    _one_line_exit_2(_prepare(folder), "needs pycocotools", "npsemiseg[coco]")
    _one_line_exit_2(_prepare(folder, "--split", "test2017"), "--split: expected train2017 or val2017, got test2017")
    assert not (folder / "masks").exists()
