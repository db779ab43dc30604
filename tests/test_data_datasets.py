"""VOC and Cityscapes readers on fixture trees in the real layouts and formats."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from data_fixtures import (
    make_cityscapes_split,
    make_cityscapes_tree,
    make_voc_split,
    make_voc_tree,
    random_label,
    write_label,
)
from PIL import Image

from npsemiseg.data import CITYSCAPES_ID_TO_TRAINID, build_dataset, partition_ids
from npsemiseg.data.transforms import val_transform


def _check_item(item, label: np.ndarray | None, size):
    image = item["image"]
    assert image.dtype == torch.float32 and image.shape == (3, *size)
    assert 0 <= float(image.min()) and float(image.max()) <= 1
    assert item["label"].dtype == torch.int64 and item["label"].shape == size
    if label is not None:
        assert torch.equal(item["label"], torch.from_numpy(label.astype(np.int64)))


@pytest.mark.parametrize("label_mode", ["L", "P"])
def test_voc_labeled_items_match_files(tmp_path, label_mode):
    written = make_voc_split(tmp_path, "pascal_classic", "labeled", "92", max_items=3, label_mode=label_mode)
    ds = build_dataset("pascal_classic", "labeled", tmp_path, "1/16", max_items=3)
    assert len(ds) == 3 and ds.partition == "92" and ds.partition_lists == "u2pl"
    for i, image_id in enumerate(ds.ids):
        item = ds[i]
        assert item["id"] == image_id
        _check_item(item, written[image_id], (24, 32))
        assert (item["label"] == 255).any() and item["label"][item["label"] != 255].max() <= 20


def test_voc_image_is_decoded_rgb(tmp_path):
    ids = partition_ids("pascal_blender", "val")[:1]
    make_voc_tree(tmp_path, ids)
    rgb = np.zeros((24, 32, 3), dtype=np.uint8)
    rgb[..., 0], rgb[..., 2] = 255, 51
    Image.fromarray(rgb).save(tmp_path / "JPEGImages" / f"{ids[0]}.jpg", quality=100)
    image = build_dataset("pascal_blender", "val", tmp_path, max_items=1)[0]["image"]
    assert torch.allclose(image.mean(dim=(1, 2)), torch.tensor([1.0, 0.0, 0.2]), atol=0.02)


def test_voc_unlabeled_split_reads_no_label_file(tmp_path):
    make_voc_split(tmp_path, "pascal_blender", "unlabeled", "662", partition_lists="cps", max_items=4)
    assert not (tmp_path / "SegmentationClassAug").exists()
    ds = build_dataset("pascal_blender", "unlabeled", tmp_path, "1/16", partition_lists="cps", max_items=4)
    assert ds.ids == partition_ids("pascal_blender", "unlabeled", "662", partition_lists="cps")[:4]
    item = ds[2]
    _check_item(item, None, (24, 32))
    assert bool((item["label"] == 255).all())


def test_data_root_from_env_and_conventional_subfolders(tmp_path, monkeypatch):
    make_voc_split(tmp_path / "VOC2012", "pascal_classic", "val", max_items=2)
    make_cityscapes_split(tmp_path / "cityscapes", "val", max_items=2)
    monkeypatch.setenv("NPSEMISEG_DATA", str(tmp_path))
    assert len(build_dataset("pascal_classic", "val", max_items=2)) == 2
    assert len(build_dataset("cityscapes", "val", max_items=2)) == 2
    assert build_dataset("cityscapes", "val", tmp_path / "cityscapes", max_items=1).root == tmp_path / "cityscapes"
    monkeypatch.delenv("NPSEMISEG_DATA")
    with pytest.raises(FileNotFoundError, match="NPSEMISEG_DATA"):
        build_dataset("pascal_classic", "val")


def test_missing_dataset_root(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"cityscapes not found under .*leftImg8bit"):
        build_dataset("cityscapes", "val", tmp_path)


def test_partial_dataset_names_missing_files_and_count(tmp_path):
    make_voc_split(tmp_path, "pascal_classic", "labeled", "183", max_items=5)
    ids = partition_ids("pascal_classic", "labeled", "183")
    (tmp_path / "SegmentationClassAug" / f"{ids[1]}.png").unlink()
    (tmp_path / "JPEGImages" / f"{ids[3]}.jpg").unlink()
    with pytest.raises(FileNotFoundError, match=rf"missing 2 of 10 listed files.*{ids[3]}\.jpg.*{ids[1]}\.png"):
        build_dataset("pascal_classic", "labeled", tmp_path, "183", max_items=5)
    with pytest.raises(FileNotFoundError, match=r"missing 358 of 366 listed files"):  # 183 images + 183 labels
        build_dataset("pascal_classic", "labeled", tmp_path, "183")


def test_corrupt_image_is_reported_at_load(tmp_path):
    make_voc_split(tmp_path, "pascal_classic", "val", max_items=2)
    image_id = partition_ids("pascal_classic", "val")[1]
    path = tmp_path / "JPEGImages" / f"{image_id}.jpg"
    path.write_bytes(path.read_bytes()[:40])  # truncated JPEG
    ds = build_dataset("pascal_classic", "val", tmp_path, max_items=2)
    ds[0]
    with pytest.raises(ValueError, match=rf"image file .*{image_id}\.jpg is corrupt"):
        ds[1]
    path.write_bytes(b"not an image at all")
    with pytest.raises(ValueError, match=rf"{image_id}\.jpg is corrupt or not an image"):
        ds[1]


def test_colour_label_png_is_rejected(tmp_path):
    written = make_voc_split(tmp_path, "pascal_classic", "val", max_items=1)
    image_id = next(iter(written))
    write_label(tmp_path / "SegmentationClassAug" / f"{image_id}.png", written[image_id], mode="RGB")
    ds = build_dataset("pascal_classic", "val", tmp_path, max_items=1)
    with pytest.raises(ValueError, match=rf"{image_id}\.png has PIL mode 'RGB'; expected a single-channel index PNG"):
        ds[0]


def test_out_of_range_label_values_are_rejected(tmp_path):
    written = make_voc_split(tmp_path, "pascal_blender", "val", max_items=1)
    image_id = next(iter(written))
    label = written[image_id].copy()
    label[0, :3] = [21, 40, 254]
    write_label(tmp_path / "SegmentationClassAug" / f"{image_id}.png", label)
    with pytest.raises(ValueError, match=rf"{image_id}\.png holds values \[21, 40, 254\] outside .*0\.\.20, 255"):
        build_dataset("pascal_blender", "val", tmp_path, max_items=1)[0]


def test_image_label_size_mismatch_is_rejected(tmp_path):
    make_voc_split(tmp_path, "pascal_classic", "val", max_items=1)
    image_id = partition_ids("pascal_classic", "val")[0]
    write_label(tmp_path / "SegmentationClassAug" / f"{image_id}.png",
                random_label(np.random.default_rng(1), 20, 32, range(21)))
    with pytest.raises(ValueError, match=rf"{image_id}\.png is 32x20 .* image .*{image_id}\.jpg is 32x24"):
        build_dataset("pascal_classic", "val", tmp_path, max_items=1)[0]


def test_cityscapes_train_ids_from_city_folders(tmp_path):
    written = make_cityscapes_split(tmp_path, "labeled", "186", partition_lists="cps", max_items=3)
    ds = build_dataset("cityscapes", "labeled", tmp_path, "1/16", partition_lists="cps", max_items=3)
    entries = partition_ids("cityscapes", "labeled", "186", partition_lists="cps")[:3]
    assert ds.ids == [e.split("/")[-1][: -len("_leftImg8bit.png")] for e in entries]
    assert all(p.parent.parent.name == "train" for p in ds.images)
    for i, name in enumerate(ds.ids):
        _check_item(ds[i], written[name], (16, 32))


def test_cityscapes_unlabeled_split_reads_no_label_file(tmp_path):
    make_cityscapes_split(tmp_path, "unlabeled", "744", max_items=2)
    assert not (tmp_path / "gtFine").exists()
    ds = build_dataset("cityscapes", "unlabeled", tmp_path, "1/4", max_items=2)
    item = ds[1]
    _check_item(item, None, (16, 32))
    assert bool((item["label"] == 255).all())


def test_cityscapes_label_ids_are_converted_34_to_19(tmp_path):
    entries = partition_ids("cityscapes", "val")[:2]
    written = make_cityscapes_tree(tmp_path, entries, label_kind="labelIds")
    assert not list(tmp_path.rglob("*labelTrainIds.png"))
    ds = build_dataset("cityscapes", "val", tmp_path, max_items=2)
    # hand-written case: the official mapping on a few ids
    name = ds.ids[0]
    label_ids = written[name].copy()
    label_ids[0, :6] = [7, 26, 33, 0, 6, 30]
    path = tmp_path / entries[0].replace("leftImg8bit/", "gtFine/", 1).replace("leftImg8bit.png", "gtFine_labelIds.png")
    write_label(path, label_ids)
    label = ds[0]["label"]
    assert label[0, :6].tolist() == [0, 13, 18, 255, 255, 255]
    expected = np.full(256, 255)
    for label_id, train_id in CITYSCAPES_ID_TO_TRAINID.items():
        expected[label_id] = train_id
    assert torch.equal(label, torch.from_numpy(expected[label_ids]))
    assert sorted(CITYSCAPES_ID_TO_TRAINID) == [7, 8, 11, 12, 13, 17, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 31, 32, 33]
    assert sorted(CITYSCAPES_ID_TO_TRAINID.values()) == list(range(19))
    label_ids[1, 1] = 34
    write_label(path, label_ids)
    with pytest.raises(ValueError, match=r"labelIds\.png holds values \[34\] outside Cityscapes label ids"):
        ds[0]


def test_cityscapes_train_ids_preferred_when_both_exist(tmp_path):
    entries = partition_ids("cityscapes", "val")[:1]
    make_cityscapes_tree(tmp_path, entries, label_kind="labelIds")
    written = make_cityscapes_tree(tmp_path, entries, label_kind="trainIds", seed=3)
    item = build_dataset("cityscapes", "val", tmp_path, max_items=1)[0]
    assert torch.equal(item["label"], torch.from_numpy(next(iter(written.values())).astype(np.int64)))


def test_dataset_applies_transform(tmp_path):
    make_voc_split(tmp_path, "pascal_classic", "val", max_items=1)
    item = build_dataset("pascal_classic", "val", tmp_path, max_items=1, transform=val_transform(40))[0]
    assert item["image"].shape == (3, 40, 40) and item["label"].shape == (40, 40)
    assert bool((item["label"][:8] == 255).all())  # (40 - 24) / 2 rows of label padding on top


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="split must be one of"):
        build_dataset("pascal_classic", "train", tmp_path, "92")
    with pytest.raises(ValueError, match=r"dataset: unknown name .kitti., expected one of \["):
        build_dataset("kitti", "val", tmp_path)
    with pytest.raises(ValueError, match="takes no options"):
        build_dataset("pascal_classic", "val", tmp_path, image_size=32)
    with pytest.raises(ValueError, match="not a partition of 'cityscapes'"):
        build_dataset("cityscapes", "labeled", tmp_path, "92")
