"""The synthetic dataset: determinism, class coverage, scene priors, partitions."""

from __future__ import annotations

import pytest
import torch

from npsemiseg.data import build_dataset, dataset_info
from npsemiseg.data.synthetic import SyntheticConfig, build_world, generate


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_same_seed_same_tensors_different_seed_different():
    a = build_dataset("synthetic", "val", seed=3, image_size=32)
    b = build_dataset("synthetic", "val", seed=3, image_size=32)
    c = build_dataset("synthetic", "val", seed=4, image_size=32)
    for i in (0, 5):
        assert torch.equal(a[i]["image"], b[i]["image"]) and torch.equal(a[i]["label"], b[i]["label"])
        assert a[i]["id"] == b[i]["id"]
        assert not torch.equal(a[i]["image"], c[i]["image"])
    assert not torch.equal(a[0]["image"], a[1]["image"])


def test_items_follow_the_contract():
    ds = build_dataset("synthetic_cityscapes", "labeled", partition="1/8", image_size=(24, 40))
    item = ds[0]
    assert item["image"].dtype == torch.float32 and item["image"].shape == (3, 24, 40)
    assert 0 <= float(item["image"].min()) and float(item["image"].max()) <= 1
    assert item["label"].dtype == torch.int64 and item["label"].shape == (24, 40)
    assert int(item["label"].max()) < 19
    assert item["id"].startswith("synthetic_cityscapes/train/")


def test_val_is_a_separate_stream():
    config = SyntheticConfig(image_size=(16, 16))
    train, _, _ = generate(config, "train", 0)
    val, _, _ = generate(config, "val", 0)
    assert not torch.equal(train, val)


def test_every_class_appears_and_scene_priors_differ():
    config = SyntheticConfig.for_dataset("synthetic_voc", image_size=24)
    world = build_world(config)
    support = world.scene_prior > 0
    assert bool(support[:, 1:].any(0).all())  # every foreground class belongs to some scene
    assert not bool(support[:, 0].any())  # the VOC-like background is not drawn as a shape
    assert len({tuple(row.tolist()) for row in support}) == config.num_scene_types

    seen = torch.zeros(config.num_scene_types, config.num_classes, dtype=torch.long)
    for index in range(300):
        _, label, scene = generate(config, "train", index)
        seen[scene] += torch.bincount(label[label != 255], minlength=config.num_classes)
    assert bool((seen.sum(0) > 0).all()), "some class never appears in 300 images"
    # classes outside a scene's support never appear in its images (background 0 aside)
    outside = seen[:, 1:] * (~support[:, 1:])
    assert int(outside.sum()) == 0
    # the class distributions of two scene types differ
    freq = seen[:, 1:].float() / seen[:, 1:].sum(1, keepdim=True)
    assert float((freq[0] - freq[1]).abs().sum()) > 0.5


def test_per_scene_background_for_the_cityscapes_standin():
    config = SyntheticConfig.for_dataset("synthetic_cityscapes", image_size=24)
    world = build_world(config)
    backgrounds = world.scene_background.tolist()
    assert len(set(backgrounds)) == config.num_scene_types
    for index in range(20):
        _, label, scene = generate(config, "train", index)
        assert int((label == backgrounds[scene]).sum()) > 0


def test_scene_of_matches_generation():
    ds = build_dataset("synthetic", "labeled", partition="1/4", image_size=16, train_size=64)
    for i in range(5):
        assert ds.scene_of(i) == generate(ds.config, "train", ds.indices[i])[2]


def test_partitions_are_disjoint_nested_and_deterministic():
    info = dataset_info("synthetic_blender", train_size=256)
    unlabeled_sizes = []
    previous: set[int] = set()
    for part, count in info.partitions.items():
        labeled = build_dataset("synthetic_blender", "labeled", partition=part, train_size=256)
        unlabeled = build_dataset("synthetic_blender", "unlabeled", partition=part, train_size=256)
        assert len(labeled) == count and len(labeled) + len(unlabeled) == 256
        assert not set(labeled.indices) & set(unlabeled.indices)
        assert previous <= set(labeled.indices)
        previous = set(labeled.indices)
        unlabeled_sizes.append(len(unlabeled))
        assert bool((unlabeled[0]["label"] == 255).all())
    assert unlabeled_sizes == sorted(unlabeled_sizes, reverse=True)
    again = build_dataset("synthetic_blender", "labeled", partition="1/16", train_size=256)
    assert again.indices == build_dataset("synthetic_blender", "labeled", partition="662", train_size=256).indices
    other_seed = build_dataset("synthetic_blender", "labeled", partition="662", train_size=256, seed=1)
    assert other_seed.indices != again.indices


def test_voc_standin_has_an_ignore_outline():
    ds = build_dataset("synthetic_voc", "val", image_size=32)
    labels = torch.stack([ds[i]["label"] for i in range(4)])
    assert bool((labels == 255).any())
    assert not bool((build_dataset("synthetic", "val", image_size=32)[0]["label"] == 255).any())


def test_bad_synthetic_options():
    with pytest.raises(ValueError, match=r"unknown synthetic dataset option\(s\) \['colour'\]"):
        build_dataset("synthetic", "val", colour=3)
    with pytest.raises(ValueError, match="partition is required"):
        build_dataset("synthetic_voc", "labeled")
    with pytest.raises(ValueError, match="not a partition of 'synthetic_voc'"):
        build_dataset("synthetic_voc", "labeled", partition="662")
    with pytest.raises(ValueError, match="image_size"):
        SyntheticConfig(image_size=(4, 4))


def test_standin_evaluation_convention_scales_with_the_image():
    city = dataset_info("synthetic_cityscapes", image_size=(32, 64))
    assert (city.eval_mode, city.eval_crop_size) == ("sliding", 24)  # windows smaller than the image
    voc = dataset_info("synthetic_voc", image_size=40)
    assert (voc.eval_mode, voc.eval_crop_size) == ("center_crop", 40)
    assert dict(voc.options)["image_size"] == (40, 40)
