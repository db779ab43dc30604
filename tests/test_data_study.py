"""The study dataset of the mini-study: partitions, splits, determinism by seed, colour-free classes."""

from __future__ import annotations

import itertools

import pytest
import torch

from npsemiseg.data import build_dataset, dataset_info
from npsemiseg.data.study import FAMILIES, Family, StudyConfig, generate, texture_pattern
from npsemiseg.pretrain import PretrainConfig


def test_info_sizes_and_partitions():
    info = dataset_info("study")
    assert info.train_size >= 1000 and info.val_size >= 200
    assert dict(info.partitions) == {"1/16": 64, "1/8": 128, "1/4": 256, "1/2": 512, "full": 1024}
    assert info.num_classes == 9 and info.class_names[0] == "background"
    assert info.synthetic and info.eval_mode == "whole"
    from npsemiseg.data import dataset_names

    assert "study" in dataset_names()


def test_partitions_are_disjoint_nested_and_cover_train():
    labeled = {p: set(build_dataset("study", "labeled", partition=p).ids) for p in ("1/16", "1/8", "1/4", "1/2")}
    for p, ids in labeled.items():
        unlabeled = set(build_dataset("study", "unlabeled", partition=p).ids)
        assert not ids & unlabeled and len(ids | unlabeled) == 1024
    assert labeled["1/16"] < labeled["1/8"] < labeled["1/4"] < labeled["1/2"]
    assert len(build_dataset("study", "labeled", partition="full")) == 1024
    assert len(build_dataset("study", "unlabeled", partition="full")) == 0


def test_tune_split_is_separate_from_val_and_train():
    val, tune = build_dataset("study", "val", val_size=8, tune_size=8), build_dataset("study", "tune", val_size=8, tune_size=8)
    train = build_dataset("study", "labeled", partition="full", train_size=64)
    assert len(val) == len(tune) == 8
    images = [d[i]["image"] for d in (val, tune, train) for i in range(8)]
    for i in range(len(images)):
        for j in range(i + 1, len(images)):
            assert not torch.equal(images[i], images[j])


def test_seed_option_draws_another_instance_deterministically():
    a = build_dataset("study", "labeled", partition="1/16", seed=3)
    b = build_dataset("study", "labeled", partition="1/16", seed=3)
    c = build_dataset("study", "labeled", partition="1/16", seed=4)
    assert a.ids == b.ids and a.ids != c.ids
    for i in (0, 7):
        assert torch.equal(a[i]["image"], b[i]["image"]) and torch.equal(a[i]["label"], b[i]["label"])
    assert not torch.equal(build_dataset("study", "val", seed=3)[0]["image"], build_dataset("study", "val", seed=4)[0]["image"])


def test_items_follow_the_contract_and_unlabeled_is_ignored():
    item = build_dataset("study", "labeled", partition="1/8", image_size=32)[0]
    assert item["image"].dtype == torch.float32 and item["image"].shape == (3, 32, 32)
    assert 0 <= float(item["image"].min()) and float(item["image"].max()) <= 1
    assert item["label"].dtype == torch.int64 and int(item["label"].max()) < 9
    assert bool((build_dataset("study", "unlabeled", partition="1/8", image_size=32)[0]["label"] == 255).all())


def test_every_class_appears_and_colour_does_not_decide_the_class():
    """Mean object colour is the same for every class (within sampling noise): colour carries no label."""
    config = StudyConfig(image_size=32)
    sums, counts = torch.zeros(9, 3), torch.zeros(9)
    for i in range(300):
        image, label = generate(config, "train", i)
        for k in label.unique():
            mask = label == k
            sums[k] += image[:, mask].mean(1)
            counts[k] += 1
    assert bool((counts > 20).all())
    means = sums[1:] / counts[1:, None]
    assert float((means - means.mean(0)).abs().max()) < 0.12


def test_pretrain_family_shares_no_class_with_the_study():
    study, pretrain = FAMILIES["study"], FAMILIES["pretrain"]
    assert not set(study.shapes) & set(pretrain.shapes) and not set(study.textures) & set(pretrain.textures)
    for family in ("study_shapes", "study_textures", "study_textures8"):
        with pytest.raises(ValueError, match="family"):
            PretrainConfig(family=family)
    for family in ("study_shapes", "study_textures", "study_textures8"):
        assert not set(FAMILIES[family].textures) & set(pretrain.textures)


def test_families_decide_the_class_by_shape_texture_or_both():
    """``study_shapes``: class = shape (4 + background), every shape drawn with every texture; in ``study`` the
    class fixes both; ``study_textures``: class = texture, every texture on every shape."""
    info = dataset_info("study", family="study_shapes")
    assert info.class_names == ("background", "disc", "ring", "triangle", "cross") and info.num_classes == 5
    g = torch.Generator().manual_seed(0)
    shapes_family, textured = FAMILIES["study_shapes"], FAMILIES["study"]
    seen = {(cls, shape, texture) for cls, shape, texture in (shapes_family.draw(g) for _ in range(400))}
    assert {(cls, shape) for cls, shape, _ in seen} == {(i + 1, s) for i, s in enumerate(shapes_family.shapes)}
    assert len(seen) == 8  # 4 shapes x 2 textures, the texture independent of the class
    seen = {textured.draw(g) for _ in range(400)}
    assert len(seen) == 8 and len({cls for cls, _, _ in seen}) == 8
    textures_family = FAMILIES["study_textures"]
    assert dataset_info("study", family="study_textures").class_names == ("background",) + textures_family.textures
    seen = {textures_family.draw(g) for _ in range(400)}
    assert {(cls, texture) for cls, _, texture in seen} == {(i + 1, t) for i, t in enumerate(textures_family.textures)}
    assert len(seen) == 16  # 4 textures x 4 shapes, the shape independent of the class
    eight = FAMILIES["study_textures8"]
    assert eight.textures[:4] == textures_family.textures and len(set(eight.textures)) == 8
    assert dataset_info("study", family="study_textures8").num_classes == 9
    seen = {eight.draw(g) for _ in range(800)}
    assert {(cls, texture) for cls, _, texture in seen} == {(i + 1, t) for i, t in enumerate(eight.textures)}
    with pytest.raises(ValueError, match="classes"):
        Family(("disc",), ("dots",), classes="colour")
    counts = torch.zeros(5)
    for i in range(100):
        _, label = generate(StudyConfig(image_size=32, family="study_shapes"), "train", i)
        counts += torch.bincount(label.flatten(), minlength=5) > 0
    assert bool((counts > 10).all())


def test_bad_options_and_splits_name_the_problem():
    with pytest.raises(ValueError, match="unknown study dataset option"):
        dataset_info("study", colours=3)
    with pytest.raises(ValueError, match="split must be one of"):
        build_dataset("study", "test")
    with pytest.raises(ValueError, match="partition '1/3' is not a partition"):
        build_dataset("study", "labeled", partition="1/3")
    with pytest.raises(ValueError, match="partition is required"):
        build_dataset("study", "unlabeled")


def test_object_radius_option_scales_objects_and_is_validated():
    """Larger ``object_radius`` paints larger objects (more object pixels) from the same draws."""
    small = StudyConfig(image_size=32, object_radius=(0.1, 0.1), objects_per_image=(1, 1))
    large = StudyConfig(image_size=32, object_radius=(0.3, 0.3), objects_per_image=(1, 1))
    pixels = [sum(int((generate(c, "train", i)[1] > 0).sum()) for i in range(20)) for c in (small, large)]
    assert pixels[1] > 4 * pixels[0]
    assert dataset_info("study", object_radius=[0.2, 0.3]).options["object_radius"] == (0.2, 0.3)
    with pytest.raises(ValueError, match="object_radius must be"):
        StudyConfig(object_radius=(0.3, 0.2))


def test_evaluation_split_tune_evaluates_the_tune_images_and_val_stays_the_default(smoke_config):
    from npsemiseg.training.factories import build_datasets

    default = build_datasets(smoke_config(dataset="study"))["val"]
    tune = build_datasets(smoke_config(dataset="study", **{"evaluation.split": "tune"}))["val"]
    assert default.split == "val" and all("/val/" in i for i in default.ids)
    assert tune.split == "tune" and all("/tune/" in i for i in tune.ids) and not set(tune.ids) & set(default.ids)
    with pytest.raises(ValueError, match="split must be one of"):  # no tune split outside the study datasets
        build_datasets(smoke_config(dataset="synthetic", **{"evaluation.split": "tune"}))
    with pytest.raises(ValueError, match="evaluation.split"):
        smoke_config(dataset="study", **{"evaluation.split": "test"})


def test_field_background_spans_the_intensity_range_and_keeps_the_labels():
    """``background="field"``: the same objects and labels on a background whose every channel spans most of
    [0, 1] (the default gradient's channels span a narrow range); validated by name."""
    gradient, field = StudyConfig(), StudyConfig(background="field")
    spans = {"gradient": [], "field": []}
    for i in range(8):
        for name, config in (("gradient", gradient), ("field", field)):
            image, label = generate(config, "train", i)
            background = image[:, label == 0]  # [3, N] background pixels
            spans[name].append(float((background.quantile(0.95, dim=1) - background.quantile(0.05, dim=1)).min()))
        assert torch.equal(generate(gradient, "train", i)[1], generate(field, "train", i)[1])
    assert min(spans["field"]) > 0.5 and sorted(spans["gradient"])[4] < 0.5
    with pytest.raises(ValueError, match="background: expected one of"):
        StudyConfig(background="noise")


def test_a_split_keeps_generated_items_and_hands_out_copies(monkeypatch):
    from npsemiseg.data import study

    calls = []
    real = study.generate
    monkeypatch.setattr(study, "generate", lambda *a: calls.append(a[2]) or real(*a))
    val = build_dataset("study", "val", val_size=4, image_size=32)
    first = val[1]
    first["image"].zero_()
    first["label"].fill_(3)
    again = val[1]
    image, label = real(StudyConfig(val_size=4, image_size=32), "val", val.indices[1])
    assert torch.equal(again["image"], image) and torch.equal(again["label"], label)
    assert again["label"].dtype == torch.int64 and calls == [val.indices[1]]
    # a split larger than the cache limit generates every time
    monkeypatch.setattr(study, "CACHE_LIMIT_BYTES", 32 * 32 * 13 * 3)
    big = build_dataset("study", "val", val_size=4, image_size=32)
    big[0], big[0]
    assert calls[1:] == [0, 0]


def test_texture_period_and_contrast_options_vary_the_textures_and_are_validated():
    base = StudyConfig(family="study_textures", image_size=64)
    image, label = generate(base, "val", 3)
    # a fixed contrast draws no random number: same objects and labels, another brightness pattern
    faint_image, faint_label = generate(StudyConfig(family="study_textures", texture_contrast=(0.2, 0.2)), "val", 3)
    assert torch.equal(label, faint_label) and not torch.equal(image, faint_image)
    objects = label > 0
    spread = [float(im[:, objects].std()) for im in (image, faint_image)]
    assert spread[1] < spread[0]  # a fainter texture: less brightness variation inside the objects
    coarse_image, coarse_label = generate(StudyConfig(family="study_textures", texture_period=(2.0, 2.0)), "val", 3)
    assert torch.equal(label, coarse_label) and not torch.equal(image, coarse_image)
    for bad in ({"texture_period": (0.1, 1.0)}, {"texture_period": (1.5, 1.0)}, {"texture_contrast": (0.0, 0.5)},
                {"texture_contrast": (0.5, 1.2)}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            StudyConfig(**bad)


def test_the_eight_textures_are_distinct_two_tone_patterns():
    """Every texture of ``study_textures8`` is a two-tone pattern that differs from every other one on more than a
    tenth of the pixels (same coordinates and period): no two classes of the family draw the same image."""
    yy, xx = torch.meshgrid(torch.arange(64.0), torch.arange(64.0), indexing="ij")
    patterns = {t: texture_pattern(t, xx, yy, 8.0) for t in FAMILIES["study_textures8"].textures}
    for name, pattern in patterns.items():
        assert set(pattern.unique().tolist()) == {0.0, 1.0}, name
    for a, b in itertools.combinations(patterns, 2):
        assert float((patterns[a] != patterns[b]).float().mean()) > 0.1, (a, b)
