"""A new dataset in one file: the class below (its own layout, lists, label convention and paper settings) and
its fixture tree are all there is; registering it is enough for ``dataset_info``, ``build_dataset``, ``data
check``, the presets and training. Fast: three representative cells (supervised x baseline, U2PL x NP, UniMatch x
MC dropout); ``-m integration``: every framework x head."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from data_fixtures import random_label, write_image, write_label

from npsemiseg.config import cell_config
from npsemiseg.data import DATASETS, build_dataset, dataset_info
from npsemiseg.data.base import DatasetDef, ItemFiles
from npsemiseg.data.check import check_dataset
from npsemiseg.data.info import fraction_partitions
from npsemiseg.data.settings import PaperSettings, Publication
from npsemiseg.frameworks import framework_names
from npsemiseg.heads import head_names
from npsemiseg.training import train

IMAGE_SIZE = (24, 32)


class ToyTiles(DatasetDef):
    """``<root>/rgb/<split>/<id>.png`` and ``<root>/gt/<split>/<id>_gt.png``; ground truth 0 = unlabeled (ignored),
    1..4 = the classes (read as 0..3, as ADE20K's are); 16 train and 4 val tiles, lists generated here."""

    name = "toy_tiles"
    label = "Toy tiles"
    class_names = ("sky", "grass", "rock", "water")
    partitions, partition_aliases = fraction_partitions((1, 2, 4, 8))
    train_size, val_size = 16, 4
    root_marker = "rgb"
    root_subfolders = ("toy_tiles",)
    layout = "rgb/<split>/<id>.png and gt/<split>/<id>_gt.png"
    layout_folders = ("rgb/train", "rgb/val", "gt/train", "gt/val")
    settings = PaperSettings(recipe="voc", crop_size=321, batch=8, lr=4e-3, epochs=30, head_lr_mult=1.0,
                             eval_mode="sliding", eval_crop_size=20, processes=2,
                             publications={"u2pl": Publication(257, 4, lr=2e-3, epochs=12)})

    @classmethod
    def list_ids(cls, split: str, partition: str | None, partition_lists: str = "u2pl", root: Path | None = None) -> list[str]:
        if split == "val":
            return [f"val/v{i}" for i in range(cls.val_size)]
        count = cls.partitions[partition]  # type: ignore[index]
        train = [f"train/t{i:02d}" for i in range(cls.train_size)]
        return train[:count] if split == "labeled" else train[count:]

    @classmethod
    def entry_image(cls, entry: str) -> str:
        return f"rgb/{entry}.png"

    @classmethod
    def entry_labels(cls, entry: str) -> tuple[str, ...]:
        return (f"gt/{entry}_gt.png",)

    @classmethod
    def label_kind(cls, index: int) -> tuple[int, str, bool]:
        return len(cls.class_names), "toy_tiles ground truth (0 = unlabeled)", True

    @classmethod
    def convert_label(cls, array: np.ndarray, files: ItemFiles) -> np.ndarray:
        """0 -> 255 (ignored), k -> k - 1."""
        return np.where((array == 0) | (array == 255), 255, array.astype(np.int16) - 1).astype(np.uint8)


def make_tiles(root: Path) -> Path:
    """The fixture tree: every train and val tile with its ground truth (values 0..4, 255 on block edges)."""
    folder = root / "toy_tiles"
    rng = np.random.default_rng(0)
    for entry in ToyTiles.list_ids("labeled", "8") + ToyTiles.list_ids("unlabeled", "8") + ToyTiles.list_ids("val", None):
        (folder / "rgb" / entry).parent.mkdir(parents=True, exist_ok=True)
        (folder / "gt" / entry).parent.mkdir(parents=True, exist_ok=True)
        write_image(folder / ToyTiles.entry_image(entry), rng, *IMAGE_SIZE, fmt="PNG")
        write_label(folder / ToyTiles.entry_labels(entry)[0], random_label(rng, *IMAGE_SIZE, range(5)))
    return root


@pytest.fixture
def tiles(tmp_path):
    DATASETS.add(ToyTiles.name, ToyTiles)
    yield make_tiles(tmp_path)
    DATASETS.remove(ToyTiles.name)


def test_the_registered_class_is_all_the_platform_needs(tiles):
    info = dataset_info("toy_tiles")
    assert (info.num_classes, info.resolve_partition("1/4"), info.eval_mode, info.eval_crop_size) == (4, "4", "sliding", 20)
    labeled = build_dataset("toy_tiles", "labeled", tiles, "1/8")
    raw = labeled.load_label(0)
    gt = np.asarray(Image.open(labeled.labels[0]))
    assert len(labeled) == 2 and labeled[0]["id"] == "train/t00" and raw.shape == IMAGE_SIZE
    classes = (gt > 0) & (gt < 255)
    assert ((gt == 0) | (gt == 255)).sum() == (raw == 255).sum() and (raw[classes] == gt[classes] - 1).all()
    report = check_dataset("toy_tiles", tiles)
    assert report.usable and report.value_counts[4:255].sum() == 0, report.format()
    paper = cell_config("paper", framework="u2pl", dataset="toy_tiles", partition="1/4", head="baseline",
                        **{"schedule.head_settings": "per_head"})
    assert (paper.schedule.crop_size, paper.optim.reference_batch, paper.schedule.batch_size) == (257, 4, 2)
    assert (paper.optim.lr, paper.schedule.epochs, paper.evaluation.mode) == (2e-3, 12, "sliding")
    shared = cell_config("paper", framework="mt", dataset="toy_tiles", partition="1/4", head="np")
    assert (shared.schedule.crop_size, shared.optim.lr, shared.schedule.epochs, shared.optim.head_lr_mult) == (321, 4e-3, 30, 1.0)


def _smoke(root: Path, framework: str, head: str) -> None:
    config = cell_config("smoke", framework=framework, dataset="toy_tiles", partition="1/2", head=head,
                         **{"data.root": str(root), "evaluation.mode": "sliding", "evaluation.crop_size": 20,
                            "evaluation.stride": 12})
    result = train(config)
    assert result.steps == 3 and 0.0 <= result.metrics["miou"] <= 1.0 and result.metrics["num_images"] == 2


@pytest.mark.parametrize("framework,head", [("supervised", "baseline"), ("u2pl", "np"), ("unimatch", "mc_dropout")])
def test_a_smoke_cell_trains_on_it(tiles, framework, head):
    _smoke(tiles, framework, head)


@pytest.mark.integration
@pytest.mark.parametrize("framework", framework_names())
@pytest.mark.parametrize("head", head_names())
def test_every_framework_and_head_trains_on_it(tiles, framework, head):
    _smoke(tiles, framework, head)
