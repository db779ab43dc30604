"""Partition lists shipped in the package and dataset_info."""

from __future__ import annotations

from importlib import resources

import pytest

from npsemiseg.data import dataset_info, dataset_names, partition_ids
from npsemiseg.data.info import CITYSCAPES_CLASSES, VOC_CLASSES
from npsemiseg.data.partitions import list_folder

REAL = {"pascal_classic": ("u2pl",), "pascal_blender": ("u2pl", "cps"), "cityscapes": ("u2pl", "cps")}


def _line_count(folder: str, relative: str) -> int:
    node = resources.files("npsemiseg.data").joinpath("splits", folder, *relative.split("/"))
    return len(node.read_text().splitlines())


@pytest.mark.parametrize("dataset,variant", [(d, v) for d, vs in REAL.items() for v in vs])
def test_partition_counts_match_list_files_and_split_the_train_set(dataset, variant):
    info = dataset_info(dataset)
    folder = list_folder(dataset, variant)
    val = set(partition_ids(dataset, "val", partition_lists=variant))
    assert len(val) == info.val_size == _line_count(folder, "val.txt")
    for name, count in info.partitions.items():
        labeled = partition_ids(dataset, "labeled", name, partition_lists=variant)
        unlabeled = partition_ids(dataset, "unlabeled", name, partition_lists=variant)
        assert len(labeled) == count == _line_count(folder, f"{name}/labeled.txt")
        assert len(unlabeled) == _line_count(folder, f"{name}/unlabeled.txt")
        assert len(set(labeled)) == len(labeled)
        assert not set(labeled) & set(unlabeled)
        assert len(labeled) + len(unlabeled) == info.train_size
        assert not (set(labeled) | set(unlabeled)) & val


def test_cps_variant_selects_different_lists():
    u2pl = set(partition_ids("pascal_blender", "labeled", "662"))
    cps = set(partition_ids("pascal_blender", "labeled", "662", partition_lists="cps"))
    assert len(u2pl & cps) == 43  # splits/README.md: the two blender variants share 43 of 662
    city_u2pl = set(partition_ids("cityscapes", "labeled", "186"))
    city_cps = set(partition_ids("cityscapes", "labeled", "186", partition_lists="cps"))
    assert len(city_u2pl & city_cps) == 8
    # classic VOC has one set of lists; both variant names select it
    assert partition_ids("pascal_classic", "labeled", "92", partition_lists="cps") == partition_ids(
        "pascal_classic", "labeled", "92")


@pytest.mark.parametrize("dataset,alias,name", [
    ("pascal_classic", "1/16", "92"), ("pascal_classic", "1/2", "732"), ("pascal_classic", "full", "1464"),
    ("pascal_blender", "1/8", "1323"), ("pascal_blender", 5291, "5291"),
    ("cityscapes", "1/4", "744"), ("cityscapes", " 186 ", "186"),
])
def test_partition_aliases_resolve(dataset, alias, name):
    info = dataset_info(dataset)
    assert info.resolve_partition(alias) == name
    assert partition_ids(dataset, "labeled", alias) == partition_ids(dataset, "labeled", name)


def test_partition_of_another_dataset_is_rejected_with_the_valid_names():
    with pytest.raises(ValueError, match=r"'662' is not a partition of 'pascal_classic'.*92, 183, 366, 732, 1464.*1/16"):
        partition_ids("pascal_classic", "labeled", "662")
    with pytest.raises(ValueError, match="partition is required"):
        partition_ids("cityscapes", "unlabeled")
    with pytest.raises(ValueError, match="split must be"):
        partition_ids("cityscapes", "train", "186")
    with pytest.raises(ValueError, match="partition_lists"):
        partition_ids("cityscapes", "labeled", "186", partition_lists="unimatch")


def test_dataset_info_describes_each_dataset():
    assert all(dataset_info(name).name == name for name in dataset_names())  # every registered one, none listed here
    voc = dataset_info("pascal_blender")
    assert (voc.num_classes, voc.class_names, voc.eval_mode, voc.eval_crop_size) == (21, VOC_CLASSES, "center_crop", 513)
    assert dict(voc.partition_aliases) == {"1/16": "662", "1/8": "1323", "1/4": "2646", "1/2": "5291"}
    city = dataset_info("cityscapes")
    assert (city.num_classes, city.class_names, city.eval_mode, city.eval_crop_size) == (19, CITYSCAPES_CLASSES, "sliding", 769)
    assert dict(city.partitions) == {"186": 186, "372": 372, "744": 744, "1488": 1488}
    assert dataset_info("pascal_classic").partition_list_sources == ("u2pl",)
    with pytest.raises(ValueError, match=r"dataset: unknown name .*expected one of \[.pascal_classic"):
        dataset_info("voc")
    with pytest.raises(ValueError, match="takes no options"):
        dataset_info("cityscapes", image_size=32)


@pytest.mark.parametrize("name,real", [("synthetic_voc", "pascal_classic"), ("synthetic_blender", "pascal_blender"),
                                       ("synthetic_cityscapes", "cityscapes")])
def test_synthetic_standins_carry_the_real_protocol(name, real):
    info, real_info = dataset_info(name, train_size=1024), dataset_info(real)
    assert info.real_dataset == real and info.synthetic
    assert info.num_classes == real_info.num_classes and info.class_names == real_info.class_names
    assert list(info.partitions) == list(real_info.partitions)
    assert dict(info.partition_aliases) == dict(real_info.partition_aliases)
    assert info.eval_mode == real_info.eval_mode
    for part, count in info.partitions.items():  # the real labeled ratio, scaled to 1024 images
        assert count == max(2, round(1024 * real_info.partitions[part] / real_info.train_size))
    counts = list(info.partitions.values())
    assert counts == sorted(counts)
    with pytest.raises(ValueError, match="num_classes"):
        dataset_info(name, num_classes=5)


def test_infos_and_datasets_pickle():
    """Spawned DataLoader workers and Ray workers receive datasets by pickling."""
    import pickle

    import torch

    from npsemiseg.data import build_dataset
    from npsemiseg.data.transforms import train_transform

    info = dataset_info("synthetic_cityscapes", image_size=16)
    assert pickle.loads(pickle.dumps(info)) == info
    dataset = build_dataset("synthetic_voc", "unlabeled", partition="1/8", image_size=16,
                            transform=train_transform(12, strong="augseg"))
    clone = pickle.loads(pickle.dumps(dataset))
    torch.manual_seed(0)
    a = dataset[0]
    torch.manual_seed(0)
    b = clone[0]
    assert a["id"] == b["id"]
    assert all(torch.equal(a[k], b[k]) for k in ("image", "image_strong", "label"))
