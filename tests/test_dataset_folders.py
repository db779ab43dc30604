"""Dataset folders from others (``docs/reliability.md``, "Dataset folders"), one test per class of fault, through
the real CLI on fixture trees in the real layouts (``data_fixtures``): a path that leaves the dataset's folder
(a list line, a symlink, a manifest entry) is refused by every reader; ``data check`` and the run preflight decode
what training reads (a truncated image, a 16-bit image, a mask value outside the classes) so a run never fails
part-way; files the layout cannot use are named with the reason; a mistyped dataset name gets the near one."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from data_fixtures import PAIRED_ITEMS, ade_tree, coco_tree, make_folder_tree, write_image, write_label
from PIL import Image
from typer.testing import CliRunner

from npsemiseg.data import DATASETS, build_dataset, partition_ids
from npsemiseg.data.check import check_dataset
from npsemiseg.data.manifest import Manifest
from npsemiseg.data.paths import OutsideRootError
from npsemiseg.data.sets.folder import write_partitions
from semiseg_platform.cli.main import app

runner = CliRunner()


@pytest.fixture
def plants(tmp_path, monkeypatch):
    """A folder dataset under ``tmp_path/data/plants`` and a file outside it, ``tmp_path/outside/x.jpg``; the
    check records go to ``tmp_path/cache``."""
    monkeypatch.setenv("NPSEMISEG_CACHE", str(tmp_path / "cache"))
    folder = make_folder_tree(tmp_path / "data")
    write_image(tmp_path / "outside" / "x.jpg", np.random.default_rng(5), 24, 32)
    yield folder
    if "plants" in DATASETS:
        DATASETS.remove("plants")


def _check(folder: Path):
    return runner.invoke(app, ["data", "check", "--folder", str(folder), "--no-progress"])


def _error(result) -> str:
    """The one ``error:`` line of a failed command (asserted to be one)."""
    assert result.exit_code == 2, result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    return errors[0]


def _labeled(folder: Path, index: int = 0) -> str:
    return (folder / "lists" / "4" / "labeled.txt").read_text().split()[index]


def test_a_path_leaving_the_dataset_folder_is_refused_by_every_reader(plants, tmp_path):
    write_partitions(plants, ["1/4"], seed=0, val="4")
    assert _check(plants).exit_code == 0
    val = plants / "lists" / "val.txt"
    good = val.read_text()
    for line in ("../../outside/x.jpg", "../../../../../../etc/passwd"):
        val.write_text(good + line + "\n")
        assert "outside the dataset folder" in _error(_check(plants)) and line in _check(plants).stderr
    val.write_text(good)
    link = plants / "images" / _labeled(plants)
    link.unlink()
    link.symlink_to(tmp_path / "outside" / "x.jpg")  # a symlink in images/ pointing out
    assert f"a symlink to {(tmp_path / 'outside' / 'x.jpg').resolve()}" in _error(_check(plants))
    with pytest.raises(OutsideRootError, match="outside the dataset folder"):
        build_dataset("plants", "labeled", plants, "4")
    with pytest.raises(OutsideRootError):
        write_partitions(plants, ["1/4"], seed=0, val="4")
    # ADE20K and COCO under their real names: a label linked out of the tree
    for dataset, make, partition in (("ade20k", ade_tree, "316"), ("coco", coco_tree, "232")):
        root = tmp_path / dataset
        folder = make(root)
        check = ["data", "check", "--dataset", dataset, "--root", str(root), "--partition", partition,
                 "--max-items", str(PAIRED_ITEMS), "--no-progress"]
        assert runner.invoke(app, check).exit_code == 0
        label = folder / partition_ids(dataset, "val")[0].split()[1]
        shutil.copy(label, tmp_path / "outside" / f"{dataset}.png")
        label.unlink()
        label.symlink_to(tmp_path / "outside" / f"{dataset}.png")
        assert "outside the dataset folder" in _error(runner.invoke(app, check))
        with pytest.raises(OutsideRootError):
            build_dataset(dataset, "val", root, max_items=PAIRED_ITEMS)
        # its manifest refuses to describe the link, and a manifest naming '..' is refused when read
        assert "outside the dataset folder" in _error(runner.invoke(app, ["data", "manifest", str(folder),
                                                                           "--no-progress"]))
    with pytest.raises(ValueError, match="is not a dataset manifest"):
        Manifest.from_json('{"format": 1, "files": [{"path": "a/../../x", "size": 1, "sha256": "' + "0" * 64 + '"}]}')


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def test_data_check_and_the_run_preflight_decode_what_training_reads(plants, tmp_path, monkeypatch):
    # a 16-bit grey image is read at its depth, never clipped to white, and data check says so
    wide = (np.arange(24 * 32, dtype=np.uint16).reshape(24, 32) * 80)
    (plants / "images" / "p000.jpg").unlink()
    Image.fromarray(wide).save(plants / "images" / "p000.png")
    write_partitions(plants, ["1/4"], seed=0, val="4")
    checked = _check(plants)
    assert checked.exit_code == 0 and "1 16-bit grey (read as value / 65535)" in checked.stdout, checked.output
    assert "23 8-bit RGB" in checked.stdout and "(decoded 24 of 24)" in checked.stdout
    again = check_dataset("plants", plants, reuse=True)  # the preflight's: what data check found good is not decoded
    assert again.usable and again.images_decoded == 0 and check_dataset("plants", plants).images_decoded == 24
    lists = {split: (plants / "lists" / name).read_text().split()
             for split, name in (("val", "val.txt"), ("labeled", "4/labeled.txt"), ("unlabeled", "4/unlabeled.txt"))}
    dataset = build_dataset("plants", next(split for split, names in lists.items() if "p000.png" in names), plants, "4")
    image = dataset[dataset.ids.index("p000")]["image"]
    assert torch_close(image[0], wide / 65535.0) and (image[0] == image[2]).all()
    # a run whose data would fail part-way stops in the preflight: one line, nothing written
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    for name in ("MLFLOW_TRACKING_URI", "RAY_ADDRESS", "NPSEMISEG_DATA"):
        monkeypatch.delenv(name, raising=False)
    run = ["run", "--framework", "supervised", "--dataset", "plants", "--partition", "1/4", "--head", "baseline",
           "--set", f"data.root={plants}"]
    bad_mask = plants / "masks" / Path(_labeled(plants, 1)).with_suffix(".png").name
    write_label(bad_mask, np.full((24, 32), 7, dtype=np.uint8))  # data check above recorded it good: changed since
    assert f"{bad_mask} holds values [7] outside plants class indices" in _error(runner.invoke(app, run))
    write_label(bad_mask, np.ones((24, 32), dtype=np.uint8))
    # the pseudo-label diagnostics read the unlabeled lists' labels: the 4 images without a mask are named
    measured = runner.invoke(app, [*run, "--set", "data.unlabeled_truth=measured"])
    assert "4 listed labels missing, e.g. " in _error(measured)
    unlabeled = (plants / "lists" / "4" / "unlabeled.txt").read_text().split()[-1]
    _truncate(plants / "images" / unlabeled)  # an unlabeled image: its header reads, its pixels do not
    error = _error(runner.invoke(app, run))
    assert f"image file {plants / 'images' / unlabeled} is corrupt or not an image (image file is truncated" in error
    assert list(work.iterdir()) == []
    assert "truncated" in _error(_check(plants))


def torch_close(tensor, expected: np.ndarray) -> bool:
    return bool(np.allclose(tensor.numpy(), expected, atol=1e-6))


def test_files_the_layout_cannot_use_are_named_with_the_reason(plants, tmp_path):
    # upper-case extensions are accepted: a camera's .JPG, a mask's .PNG
    (plants / "images" / "p001.jpg").rename(plants / "images" / "p001.JPG")
    (plants / "masks" / "p001.png").rename(plants / "masks" / "p001.PNG")
    Image.open(plants / "masks" / "p002.png").save(plants / "masks" / "p002.jpg", quality=95)  # a JPEG mask
    (plants / "masks" / "p002.png").unlink()
    shutil.copy(plants / "masks" / "p003.png", plants / "masks" / "orphan.png")  # a mask without an image
    shutil.copy(plants / "masks" / "p004.png", plants / "masks" / "p004.tif")
    (plants / "images" / "notes.txt").write_text("not an image")
    (plants / "images" / "train").mkdir()  # a subfolder: not read
    write_partitions(plants, ["1/4"], seed=0, val="4")
    checked = _check(plants)
    assert checked.exit_code == 0, checked.output
    lines = checked.stdout
    assert "not used: 5 files the layout cannot use" in lines
    assert "images/train: a folder: images are read from images/ itself, not from its subfolders" in lines
    assert "masks/p002.jpg: a JPEG mask: masks must be PNG" in lines
    assert "masks/orphan.png: a mask without an image (no images/orphan.jpg, .jpeg or .png): not read" in lines
    assert "masks/p004.tif: extension .tif: a mask is <name>.png (or .PNG)" in lines
    assert "images/notes.txt: extension .txt" in lines
    listed = {line for name in ("val.txt", "4/labeled.txt") for line in (plants / "lists" / name).read_text().split()}
    assert "p001.JPG" in listed and "p002.jpg" not in listed  # p001 has its mask; p002 has none it can use
    # a listed image whose mask became a JPEG: the error line says why its label is missing
    mask = plants / "masks" / Path(_labeled(plants)).with_suffix(".png").name
    Image.open(mask).save(mask.with_suffix(".jpg"), quality=95)
    mask.unlink()
    error = _error(_check(plants))
    assert "1 listed labels missing" in error and f"not used: masks/{mask.stem}.jpg: a JPEG mask" in error
    # a `masks` file instead of a folder, or only JPEG masks: the partition names the cause, writes nothing
    shutil.rmtree(plants / "lists")
    for spoil, cause in ((lambda m: (shutil.rmtree(m), m.write_text("x")), "masks: a file, expected a folder masks/"),
                         (lambda m: [p.rename(p.with_suffix(".jpg")) for p in list(m.iterdir())], "a JPEG mask")):
        masks = plants / "masks"
        spoil(masks)
        result = runner.invoke(app, ["data", "partition", str(plants), "--labeled", "1/4"])
        error = _error(result)
        assert "0 of 24 images have a mask" in error and cause in error and not (plants / "lists").exists()
        if masks.is_file():
            masks.unlink()
            masks.mkdir()
            write_label(masks / "p000.png", np.zeros((24, 32), dtype=np.uint8))


@pytest.mark.parametrize("typed,near", [("ade20K", "ade20k"), ("cocoo", "coco"), ("Cityscape", "cityscapes")])
def test_an_unknown_dataset_name_suggests_the_nearest(typed, near):
    error = _error(runner.invoke(app, ["data", "check", "--dataset", typed]))
    assert f"dataset: unknown name '{typed}' (did you mean '{near}'?), expected one of [" in error
    run = runner.invoke(app, ["run", "--framework", "supervised", "--dataset", typed, "--partition", "1/16",
                                "--head", "baseline"])
    assert f"did you mean '{near}'?" in _error(run)
