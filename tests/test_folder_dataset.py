"""A researcher's own folder dataset (``npsemiseg/data/sets/folder.py``): classes.yaml, images/, masks/; lists
written reproducibly from a seed; ``npsemiseg data check --folder``; a smoke cell; the grid accepting it; each
bad input one line, exit 2, nothing written."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image
from data_fixtures import FOLDER_CLASSES, make_folder_tree, write_label
from typer.testing import CliRunner

from npsemiseg.config import cell_config
from npsemiseg.data import DATASETS, build_dataset, dataset_info
from npsemiseg.data.sets.folder import FOLDER_SETTINGS, register_folder, write_partitions
from npsemiseg.training import train
from semiseg_platform.cli.main import app

runner = CliRunner()
NAMES = FOLDER_CLASSES
IMAGE_SIZE = (24, 32)


def make_folder(root: Path, **kwargs) -> Path:
    """``root/plants`` (``data_fixtures.make_folder_tree``)."""
    return make_folder_tree(root, **kwargs)


@pytest.fixture
def plants(tmp_path):
    folder = make_folder(tmp_path)
    yield folder
    if "plants" in DATASETS:
        DATASETS.remove("plants")


def _tree(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): p.read_text() for p in sorted((folder / "lists").rglob("*")) if p.is_file()}


def test_partitions_are_reproducible_from_the_seed_nested_and_cited(plants):
    write_partitions(plants, ["1/4", "8"], seed=3, val="4")
    first = _tree(plants)
    write_partitions(plants, ["1/4", "8"], seed=3, val="4")
    assert _tree(plants) == first  # the same seed writes the same lists
    record = yaml.safe_load(first["lists/partitions.yaml"])
    assert record["seed"] == 3 and record["val_size"] == 4 and record["train_size"] == 20
    assert record["partitions"] == {"4": {"asked": "1/4", "labeled": 4}, "8": {"asked": "8", "labeled": 8}}
    small, large = (set(first[f"lists/{n}/labeled.txt"].split()) for n in ("4", "8"))
    val = set(first["lists/val.txt"].split())
    assert small < large and not large & val and all((plants / "masks" / f"{Path(i).stem}.png").is_file() for i in large)
    assert set(first["lists/8/unlabeled.txt"].split()) == {f"p{i:03d}.jpg" for i in range(24)} - large - val
    write_partitions(plants, ["1/4", "8"], seed=4, val="4")
    assert _tree(plants)["lists/8/labeled.txt"] != first["lists/8/labeled.txt"]  # another seed, other lists


def test_a_registered_folder_reads_like_any_dataset(tmp_path):
    folder = make_folder(tmp_path, ignore=9)
    write_partitions(folder, ["1/4"], seed=0, val="4")
    try:
        register_folder(folder)
        info = dataset_info("plants")
        assert info.class_names == tuple(NAMES) and info.partitions == {"4": 4} and info.resolve_partition("1/4") == "4"
        assert info.settings is FOLDER_SETTINGS and info.ignore_index == 9
        labeled = build_dataset("plants", "labeled", partition="1/4")
        item = labeled[0]
        raw = np.asarray(Image.open(labeled.labels[0]))
        assert item["label"].shape == raw.shape and set(np.unique(item["label"].numpy())) <= {0, 1, 2, 255}
        assert (raw == 9).any() and (((raw == 9) | (raw == 255)) == (item["label"].numpy() == 255)).all()  # 9 -> 255
        unlabeled = build_dataset("plants", "unlabeled", partition="4")
        assert len(unlabeled) == 16 and (unlabeled[0]["label"] == 255).all()
    finally:
        DATASETS.remove("plants")


def test_check_then_a_smoke_cell_and_the_grid(plants):
    assert runner.invoke(app, ["data", "partition", str(plants), "--labeled", "1/4", "--seed", "0", "--val", "4"]
                         ).exit_code == 0
    checked = runner.invoke(app, ["data", "check", "--folder", str(plants)])
    assert checked.exit_code == 0, checked.output
    assert "plants under" in checked.stdout and "usable" in checked.stdout and "4 (1/4) labeled" in checked.stdout
    config = cell_config("smoke", framework="u2pl", dataset="plants", partition="1/4", head="np",
                         **{"data.root": str(plants)})
    result = train(config)
    assert result.steps == 3 and 0.0 <= result.metrics["miou"] <= 1.0
    paper = cell_config("paper", framework="u2pl", dataset="plants", partition="1/4", head="np")
    assert (paper.schedule.crop_size, paper.evaluation.mode, paper.dataset_info.num_classes) == (480, "whole", 3)
    from semiseg_platform.sweeps.grid_spec import GridSpec, cell_keys

    spec = GridSpec.model_validate({"name": "plants", "preset": "smoke", "frameworks": {"supervised": None},
                                    "datasets": {"plants": "all"}, "heads": {"baseline": None}, "seeds": [0]})
    assert [(k.dataset, k.partition) for k in cell_keys(spec)] == [("plants", "4")]


def _first_labeled(folder: Path) -> Path:
    """The mask of the first image of the 1/4 partition's labeled list (p019 with seed 0)."""
    return folder / "masks" / f"{Path((folder / 'lists' / '4' / 'labeled.txt').read_text().split()[0]).stem}.png"


def _bad_mask_size(folder: Path) -> None:
    write_label(_first_labeled(folder), np.zeros((10, 10), dtype=np.uint8))


def _bad_class_index(folder: Path) -> None:
    write_label(_first_labeled(folder), np.full((24, 32), 3, dtype=np.uint8))


def _no_mask(folder: Path) -> None:
    _first_labeled(folder).unlink()


def _bad_classes(folder: Path) -> None:
    (folder / "classes.yaml").write_text("names: [background, leaf\n")


def _empty(folder: Path) -> None:
    for image in (folder / "images").iterdir():
        image.unlink()


@pytest.mark.parametrize("spoil,message", [
    (_bad_mask_size, r"p\d+\.png is 10x10 \(WxH\) but image .*p\d+\.jpg is 32x24"),
    (_bad_class_index, r"p\d+\.png holds values \[3\] outside plants class indices"),
    (_no_mask, r"labels? missing|label file .* does not exist"),
    (_bad_classes, r"classes\.yaml does not parse as YAML"),
    (_empty, r"plants holds no images"),
], ids=["mask_size", "class_index", "no_mask", "classes_file", "empty"])
def test_bad_input_is_one_line_exit_2_and_nothing_written(plants, spoil, message):
    """Each spoiled tree fails ``data check`` (and ``data partition`` where it reads the spoiled part) with one
    ``error:`` line naming the file, exit 2, leaving the tree as it was. Unspoiled, the same tree checks usable
    (test above), so each failure is the spoil's."""
    write_partitions(plants, ["1/4"], seed=0, val="4")
    spoil(plants)
    before = {p: p.stat().st_mtime_ns for p in plants.rglob("*")}
    result = runner.invoke(app, ["data", "check", "--folder", str(plants), "--sample", "100"])
    assert result.exit_code == 2, result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and re.search(message, errors[0]), result.stderr
    if spoil in (_bad_classes, _empty):
        again = runner.invoke(app, ["data", "partition", str(plants), "--labeled", "1/4"])
        assert again.exit_code == 2 and len(again.stderr.strip().splitlines()) == 1
    assert {p: p.stat().st_mtime_ns for p in plants.rglob("*")} == before


def test_a_run_record_finds_its_folder_dataset_by_its_data_root(tmp_path):
    """A fresh process (a Ray worker) knows no folder dataset: reading a run's configuration finds it under the
    record's ``data.root`` and registers it nowhere (reading a configuration changes no registry); a name no folder
    holds stays an unknown dataset."""
    folder = make_folder(tmp_path)
    write_partitions(folder, ["1/4"], seed=0, val="4")
    assert "plants" not in DATASETS
    config = cell_config("smoke", framework="supervised", dataset="plants", partition="1/4",
                         **{"data.root": str(folder)})
    record = config.model_dump(mode="json")
    again = type(config).model_validate(record)
    assert again.dataset == "plants" and again.num_classes == 3 and "plants" not in DATASETS
    assert again.dataset_info.partitions == config.dataset_info.partitions
    assert len(build_dataset("plants", "val", root=str(folder))) == 4 and "plants" not in DATASETS
    with pytest.raises(ValueError, match="dataset: unknown name 'weeds'"):
        type(config).model_validate({**record, "dataset": "weeds"})
    with pytest.raises(ValueError, match="dataset: unknown name 'plants'"):
        type(config).model_validate({**record, "data": {**record["data"], "root": str(tmp_path / "elsewhere")}})


def test_stratified_lists_cover_a_rare_class_first(tmp_path):
    """Class 2 is in one image only (p005): each stratified 2-image labeled list holds it (whenever p005 is not
    drawn for val); unstratified, most seeds' lists miss it, which is what the stratification is for."""
    folder = make_folder(tmp_path)
    for i in range(20):
        mask = np.asarray(Image.open(folder / "masks" / f"p{i:03d}.png"))
        write_label(folder / "masks" / f"p{i:03d}.png", np.where(mask == 2, 1, mask).astype(np.uint8))
    write_label(folder / "masks" / "p005.png", np.full(IMAGE_SIZE, 2, dtype=np.uint8))
    found = {True: [], False: []}
    for seed in range(8):
        for stratify in (True, False):
            lists = write_partitions(folder, ["2"], seed=seed, val="4", stratify=stratify)
            if "p005.jpg" not in (lists / "val.txt").read_text().split():
                found[stratify].append("p005.jpg" in (lists / "2" / "labeled.txt").read_text().split())
    assert found[True] and all(found[True]) and not all(found[False])
    assert yaml.safe_load((lists / "partitions.yaml").read_text())["stratify"] is False
