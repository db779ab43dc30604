"""prepare_voc / prepare_cityscapes on inputs written in the real formats: VOC 2012 palette PNGs,
SBD ``cls/*.mat`` files (scipy.io.savemat, SBD's GTcls struct layout) and Cityscapes labelIds PNGs.
The output is what the readers read; runs are idempotent and resume after an interruption."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import scipy.io
import scipy.sparse
from data_fixtures import make_cityscapes_tree, make_voc_tree, random_label, write_image
from PIL import Image

from npsemiseg.data import CITYSCAPES_ID_TO_TRAINID, build_dataset, partition_ids
from npsemiseg.data.check import check_dataset
from npsemiseg.data.prepare import prepare_cityscapes, prepare_voc, read_sbd_mat

N = 3
SIZE = (24, 32)


def voc_colormap() -> np.ndarray:
    """VOC's palette (bit-interleaved), ``[256, 3]`` uint8, as in VOCdevkit's labelcolormap.m."""
    cmap = np.zeros((256, 3), dtype=np.uint8)
    for i in range(256):
        c, r, g, b = i, 0, 0, 0
        for j in range(8):
            r |= ((c >> 0) & 1) << (7 - j)
            g |= ((c >> 1) & 1) << (7 - j)
            b |= ((c >> 2) & 1) << (7 - j)
            c >>= 3
        cmap[i] = (r, g, b)
    return cmap


def write_voc_mask(path: Path, label: np.ndarray) -> None:
    """A VOC 2012 ``SegmentationClass`` PNG: mode "P" with VOC's palette."""
    path.parent.mkdir(parents=True, exist_ok=True)
    img = Image.fromarray(label, mode="P")
    img.putpalette(voc_colormap().flatten().tolist())
    img.save(path)


def write_sbd_mat(path: Path, label: np.ndarray) -> None:
    """An SBD ``cls/<ID>.mat``: struct GTcls with Boundaries (20x1 cell of sparse), Segmentation, CategoriesPresent."""
    path.parent.mkdir(parents=True, exist_ok=True)
    boundaries = np.empty((20, 1), dtype=object)
    for k in range(20):
        boundaries[k, 0] = scipy.sparse.csc_matrix((label == k + 1).astype(np.float64))
    present = np.unique(label[(label > 0) & (label < 255)]).astype(np.uint8)[:, None]
    scipy.io.savemat(path, {"GTcls": {"Boundaries": boundaries, "Segmentation": label, "CategoriesPresent": present}})


def _ids():
    return (partition_ids("pascal_classic", "val")[:N], partition_ids("pascal_classic", "labeled", "92")[:N],
            partition_ids("pascal_classic", "unlabeled", "92")[:N])


def _downloads(tmp_path: Path):
    """VOCdevkit/VOC2012 (JPEGImages + SegmentationClass for val and labeled) and benchmark_RELEASE/dataset/cls
    (SBD: two labeled IDs with other masks, one val ID, the unlabeled IDs). Returns (voc, sbd, VOC masks, SBD masks)."""
    val, labeled, unlabeled = _ids()
    voc = tmp_path / "VOCdevkit" / "VOC2012"
    make_voc_tree(voc, val + labeled + unlabeled, size=SIZE, labels=False)
    rng = np.random.default_rng(3)
    voc_masks = {i: random_label(rng, *SIZE, range(21)) for i in val + labeled}
    sbd_masks = {i: random_label(rng, *SIZE, range(21), outline=False) for i in labeled[:2] + val[:1] + unlabeled}
    for image_id, label in voc_masks.items():
        write_voc_mask(voc / "SegmentationClass" / f"{image_id}.png", label)
    sbd = tmp_path / "benchmark_RELEASE" / "dataset"
    for image_id, label in sbd_masks.items():
        write_sbd_mat(sbd / "cls" / f"{image_id}.mat", label)
    return voc, sbd, voc_masks, sbd_masks


def _read(path: Path) -> np.ndarray:
    with Image.open(path) as img:
        assert img.mode == "L"
        return np.asarray(img)


def test_sbd_mat_round_trip(tmp_path):
    label = random_label(np.random.default_rng(0), *SIZE, range(21), outline=False)
    write_sbd_mat(tmp_path / "a.mat", label)
    assert np.array_equal(read_sbd_mat(tmp_path / "a.mat"), label)


def test_prepare_voc_builds_the_aug_set_voc_wins(tmp_path):
    voc, sbd, voc_masks, sbd_masks = _downloads(tmp_path)
    done = []
    result = prepare_voc(tmp_path, tmp_path, progress=lambda i, total: done.append((i, total)))
    ids = sorted(set(voc_masks) | set(sbd_masks))
    assert result.out == voc / "SegmentationClassAug"
    assert (result.total, result.written, result.existing, result.temp_removed) == (len(ids), len(ids), 0, 0)
    assert result.sources == {"voc": len(voc_masks), "sbd": len(set(sbd_masks) - set(voc_masks))}
    assert done[-1] == (len(ids), len(ids))
    assert sorted(p.stem for p in result.out.iterdir()) == ids
    for image_id in ids:  # VOC's mask where it has one (overriding SBD's), else SBD's
        expected = voc_masks.get(image_id, sbd_masks.get(image_id))
        assert np.array_equal(_read(result.out / f"{image_id}.png"), expected), image_id
    overlap = set(voc_masks) & set(sbd_masks)
    assert overlap and all(not np.array_equal(voc_masks[i], sbd_masks[i]) for i in overlap)
    # the prepared tree is what the readers and check_dataset expect
    report = check_dataset("pascal_classic", tmp_path, partitions=["1/16"], max_items=N)
    assert report.usable, report.format()
    ds = build_dataset("pascal_classic", "labeled", tmp_path, "92", max_items=N)
    assert np.array_equal(ds[2]["label"].numpy(), voc_masks[ds.ids[2]])


def test_prepare_voc_is_idempotent(tmp_path):
    voc, sbd, _, _ = _downloads(tmp_path)
    out = tmp_path / "out"
    first = prepare_voc(voc, sbd, out)
    stamps = {p.name: p.stat().st_mtime_ns for p in first.out.iterdir()}
    (first.out / sorted(stamps)[0]).write_bytes(b"kept as it is")  # a finished file is never rewritten
    second = prepare_voc(voc, sbd, out)
    assert (second.written, second.existing, second.total) == (0, first.total, first.total)
    assert {p.name: p.stat().st_mtime_ns for p in second.out.iterdir() if p.name != sorted(stamps)[0]} == \
        {k: v for k, v in stamps.items() if k != sorted(stamps)[0]}
    assert (first.out / sorted(stamps)[0]).read_bytes() == b"kept as it is"


def test_prepare_voc_resumes_after_an_interruption(tmp_path):
    voc, sbd, _, _ = _downloads(tmp_path)
    reference = prepare_voc(voc, sbd, tmp_path / "reference")

    def interrupt(done, total):
        if done == 4:
            raise KeyboardInterrupt

    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        prepare_voc(voc, sbd, out, progress=interrupt)
    aug = out / "SegmentationClassAug"
    assert len(list(aug.glob("*.png"))) == 4
    pending = sorted(p.name for p in reference.out.iterdir() if not (aug / p.name).exists())
    (aug / f".{pending[0]}.part").write_bytes(b"half a PNG")  # killed mid-write
    resumed = prepare_voc(voc, sbd, out)
    assert (resumed.written, resumed.existing, resumed.temp_removed) == (reference.total - 4, 4, 1)
    assert not list(aug.glob(".*"))
    for path in reference.out.iterdir():
        assert np.array_equal(_read(aug / path.name), _read(path))


def test_prepare_voc_bad_inputs_name_the_file(tmp_path):
    voc, sbd, voc_masks, sbd_masks = _downloads(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"VOC 2012 not found under .*: expected a SegmentationClass/ folder"):
        prepare_voc(tmp_path / "nowhere", sbd)
    with pytest.raises(FileNotFoundError, match=r"SBD not found under .*: expected a cls/ folder"):
        prepare_voc(voc, voc)
    bad = sbd / "cls" / f"{sorted(set(sbd_masks) - set(voc_masks))[0]}.mat"  # an SBD-only ID: its .mat is read
    scipy.io.savemat(bad, {"GTinst": {"Segmentation": np.zeros(SIZE, np.uint8)}})
    with pytest.raises(ValueError, match=rf"SBD file {bad} is not an SBD class annotation .*expected a MATLAB struct"):
        prepare_voc(voc, sbd, tmp_path / "a")
    write_sbd_mat(bad, np.full(SIZE, 30, np.uint8))
    with pytest.raises(ValueError, match=rf"SBD file {bad} holds values \[30\] outside VOC class indices"):
        prepare_voc(voc, sbd, tmp_path / "b")
    bad.write_bytes(b"not a mat file")
    with pytest.raises(ValueError, match=rf"SBD file {bad} is not an SBD class annotation"):
        prepare_voc(voc, sbd, tmp_path / "c")
    colour = voc / "SegmentationClass" / f"{_ids()[0][0]}.png"
    Image.fromarray(voc_colormap()[np.asarray(Image.open(colour))]).save(colour)
    with pytest.raises(ValueError, match=rf"label file {colour} has PIL mode 'RGB'; expected a single-channel"):
        prepare_voc(voc, sbd, tmp_path / "d")


def _city_tree(root: Path) -> list[str]:
    entries = partition_ids("cityscapes", "val")[:N] + partition_ids("cityscapes", "labeled", "186")[:N]
    make_cityscapes_tree(root, entries, label_kind="labelIds")
    return entries


def test_prepare_cityscapes_matches_the_readers_conversion(tmp_path):
    _city_tree(tmp_path / "cityscapes")
    before = build_dataset("cityscapes", "val", tmp_path, max_items=N)
    assert all(before.converted)
    result = prepare_cityscapes(tmp_path)
    assert (result.total, result.written, result.existing) == (2 * N, 2 * N, 0)
    after = build_dataset("cityscapes", "val", tmp_path, max_items=N)
    assert not any(after.converted) and all(p.name.endswith("_gtFine_labelTrainIds.png") for p in after.labels)
    for i in range(N):
        assert np.array_equal(after.load_label(i), before.load_label(i))
    # the whole table: every label id, as cityscapesScripts (and the readers) map it
    source = tmp_path / "cityscapes" / "gtFine" / "train" / "x" / "x_000000_000000_gtFine_labelIds.png"
    source.parent.mkdir(parents=True)
    Image.fromarray(np.arange(34, dtype=np.uint8)[None, :]).save(source)
    prepare_cityscapes(tmp_path / "cityscapes")
    mapped = _read(source.with_name("x_000000_000000_gtFine_labelTrainIds.png"))[0]
    assert mapped.tolist() == [CITYSCAPES_ID_TO_TRAINID.get(i, 255) for i in range(34)]


def test_prepare_cityscapes_idempotent_and_resumable(tmp_path):
    _city_tree(tmp_path)
    gtfine = tmp_path / "gtFine"
    targets = sorted(gtfine.rglob("*_labelIds.png"))
    first_target = targets[0].with_name(targets[0].name.replace("labelIds", "labelTrainIds"))
    write_image(first_target, np.random.default_rng(0), 2, 2, fmt="PNG")  # an existing file: kept as it is
    kept = first_target.read_bytes()
    (first_target.parent / f".{targets[1].name.replace('labelIds', 'labelTrainIds')}.part").write_bytes(b"half")
    first = prepare_cityscapes(tmp_path)
    assert (first.written, first.existing, first.temp_removed) == (2 * N - 1, 1, 1)
    assert first_target.read_bytes() == kept and not list(gtfine.rglob(".*"))
    second = prepare_cityscapes(tmp_path)
    assert (second.written, second.existing, second.total) == (0, 2 * N, 2 * N)
    with pytest.raises(FileNotFoundError, match=r"Cityscapes not found under .*: expected a gtFine/ folder"):
        prepare_cityscapes(tmp_path / "nowhere")
