"""ADE20K and COCO on fixture trees in their real formats: ADEChallengeData2016's folders and 0 = other
annotations (read as 255, k as k - 1), UniMatch's COCO layout (train2017 / val2017 / masks, 81 classes, unlabeled
= every other train2017 image); UniMatch V2's bundled lists; ``data check``; smoke cells: UniMatch V2 x every head on
the tiny ViT, every other framework x head (integration)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from data_fixtures import PAIRED_ITEMS as N
from data_fixtures import ade_tree, coco_tree, write_label
from PIL import Image
from typer.testing import CliRunner

from npsemiseg.config import cell_config
from npsemiseg.data import build_dataset, dataset_definition, dataset_info, partition_ids
from npsemiseg.frameworks import framework_names
from npsemiseg.heads import head_names
from npsemiseg.training import train
from semiseg_platform.cli.main import app

runner = CliRunner()


def test_the_bundled_lists_are_unimatch_v2s():
    ade, coco = dataset_info("ade20k"), dataset_info("coco")
    assert ade.num_classes == 150 and coco.num_classes == 81 and coco.class_names[:2] == ("void", "person")
    for alias, count in (("1/64", 316), ("1/2", 10105)):
        labeled = partition_ids("ade20k", "labeled", alias)
        unlabeled = partition_ids("ade20k", "unlabeled", alias)
        assert len(labeled) == count and len(unlabeled) == 20210 - count and not set(labeled) & set(unlabeled)
    assert set(partition_ids("ade20k", "labeled", "1/64")) < set(partition_ids("ade20k", "labeled", "1/32"))
    assert [len(partition_ids("coco", "labeled", a)) for a in ("1/512", "1/256", "1/128", "1/64", "1/32")] == \
        [232, 463, 925, 1849, 3697]
    assert len(partition_ids("ade20k", "val")) == 2000 and len(partition_ids("coco", "val")) == 5000
    with pytest.raises(ValueError, match="coco's unlabeled lists are every train2017 image"):
        partition_ids("coco", "unlabeled", "1/512")


def test_ade20k_reads_0_as_ignored_and_shifts_the_classes(tmp_path):
    folder = ade_tree(tmp_path)
    labeled = build_dataset("ade20k", "labeled", tmp_path, "1/64", max_items=N)
    assert labeled.root == folder and len(labeled) == N and labeled.ids[0].startswith("ADE_train_")
    for i in range(N):
        raw = np.asarray(Image.open(labeled.labels[i]))
        read = labeled[i]["label"].numpy()
        assert ((read == 255) == ((raw == 0) | (raw == 255))).all() and (read[raw == 150] == 149).all()
        assert (read[raw == 1] == 0).all() and (read[raw == 75] == 74).all()
    write_label(labeled.labels[1], np.full((20, 28), 151, dtype=np.uint8))
    with pytest.raises(ValueError, match=r"holds values \[151\] outside ADE20K annotation values \(0 = other\)"):
        labeled[1]


def test_coco_unlabeled_is_every_other_train2017_image(tmp_path):
    folder = coco_tree(tmp_path, unlabeled=3)
    unlabeled = build_dataset("coco", "unlabeled", tmp_path, "1/512")
    labeled = build_dataset("coco", "labeled", folder, "232", max_items=N)
    assert sorted(unlabeled.ids) == [f"9{i:011d}" for i in range(3)] and (unlabeled[0]["label"] == 255).all()
    assert set(np.unique(labeled[0]["label"].numpy())) <= {0, 1, 40, 80, 255}


@pytest.mark.parametrize("dataset,make,partition", [("ade20k", ade_tree, "316"), ("coco", coco_tree, "232")])
def test_data_check_names_an_out_of_range_class(tmp_path, dataset, make, partition):
    folder = make(tmp_path)
    check = ["data", "check", "--dataset", dataset, "--root", str(tmp_path), "--partition", partition,
             "--max-items", str(N)]
    good = runner.invoke(app, check)
    assert good.exit_code == 0, good.output
    label = folder / partition_ids(dataset, "val")[0].split()[1]
    write_label(label, np.full((20, 28), 151 if dataset == "ade20k" else 81, dtype=np.uint8))
    bad = runner.invoke(app, check)
    assert bad.exit_code == 2 and label.name in bad.stderr and len(bad.stderr.strip().splitlines()) == 1, bad.output


#: dataset -> (fixture tree, partition, the classes its val labels hold as read: ADE20K's raw 3 and 150 shifted to
#: sky and flag, COCO's 0 and 80)
TREES = {"ade20k": (ade_tree, "1/64", ("sky", "flag")), "coco": (coco_tree, "1/512", ("void", "toothbrush"))}
#: the DINOv2 frameworks' smoke cells on the tiny ViT (crops and evaluation at multiples of its patch, 14)
VIT = {"model.backbone": "vit_tiny", "schedule.crop_size": 28, "evaluation.resize_multiple": 14}


def _smoke(root: Path, monkeypatch, dataset: str, framework: str, head: str) -> None:
    """A smoke cell on the fixture tree, its lists cut to the first N entries (the full lists name 20,210 / 118,287
    images); the readers, the label conversion and the dataset's settings are the real ones. Evaluation reports
    one IoU per class of the dataset, finite for the classes the val labels hold (as read)."""
    make, partition, present = TREES[dataset]
    make(root)
    definition = dataset_definition(dataset)
    full = definition.list_ids
    monkeypatch.setattr(definition, "list_ids", classmethod(lambda cls, *a, **k: full(*a, **k)[:N]))
    overrides = VIT if framework in ("unimatch_v2", "fixmatch_v2") else {}
    config = cell_config("smoke", framework=framework, dataset=dataset, partition=partition, head=head,
                         **{"data.root": str(root), **overrides})
    result = train(config)
    ious = [key for key in result.metrics if key.startswith("iou/")]
    assert result.steps == 3 and 0.0 <= result.metrics["miou"] <= 1.0
    assert len(ious) == dataset_info(dataset).num_classes and all(math.isfinite(result.metrics[f"iou/{c}"]) for c in present)


@pytest.mark.parametrize("dataset,framework,head", [("ade20k", "unimatch", "np"), ("coco", "u2pl", "mc_dropout")])
def test_a_smoke_cell_trains_on_it(tmp_path, monkeypatch, dataset, framework, head):
    _smoke(tmp_path, monkeypatch, dataset, framework, head)
    partition = TREES[dataset][1]
    paper = cell_config("paper", framework="u2pl", dataset=dataset, partition=partition, head="np")
    assert (paper.evaluation.mode, paper.optim.lr, paper.optim.head_lr_mult) == ("whole", 4e-3, 10.0)
    assert paper.schedule.crop_size == {"ade20k": 518, "coco": 513}[dataset]


@pytest.mark.parametrize("dataset", sorted(TREES))
@pytest.mark.parametrize("head", head_names())
def test_unimatch_v2_on_a_tiny_vit_trains_with_every_head(tmp_path, monkeypatch, dataset, head):
    """UniMatch V2 (the framework of these benchmarks) x every head on the tiny ViT + DPT, at 150 and 81 classes."""
    _smoke(tmp_path, monkeypatch, dataset, "unimatch_v2", head)


@pytest.mark.integration
@pytest.mark.parametrize("dataset", sorted(TREES))
@pytest.mark.parametrize("framework", [f for f in framework_names() if f != "unimatch_v2"])
@pytest.mark.parametrize("head", head_names())
def test_every_framework_and_head_trains_on_it(tmp_path, monkeypatch, dataset, framework, head):
    """Every other framework x head on both trees (about 45 s in all on one core; UniMatch V2's: above)."""
    _smoke(tmp_path, monkeypatch, dataset, framework, head)


def test_the_tables_print_their_rows():
    """An mIoU table of ADE20K / COCO: one column per UniMatch V2 partition, labelled by the dataset's class."""
    from semiseg_platform.reports.tables import miou_table_spec

    ade = miou_table_spec("ade20k", ["fixmatch", "unimatch"], ["baseline", "np"])
    assert ade.title == "Table: mIoU on ADE20K" and len(ade.rows) == 4
    assert ade.columns == ("1/64 (316)", "1/32 (631)", "1/16 (1263)", "1/8 (2526)", "1/4 (5052)", "1/2 (10105)")
    coco = miou_table_spec("coco", ["unimatch"], ["np"])
    assert coco.columns[0] == "1/512 (232)" and coco.cells[0][0].partition == "232" and "COCO" in coco.title
