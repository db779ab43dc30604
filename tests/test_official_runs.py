"""``benchmarks/official_runs.py`` (the package ``benchmarks/official/``): what runs without the official checkouts
(CI has none): the export of the study data in the official layouts, the project's side of the comparison, the
official interfaces of the project's network and the equivalence test. The whole runs themselves need checkouts of
LiheYoung/UniMatch and Haochen-Wang409/U2PL (``--official-root``; ``NPSEMISEG_OFFICIAL_ROOT`` in the tests that use
them)."""

from __future__ import annotations

import collections
import collections.abc
import importlib
import json
import logging
import math
import os
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch
from benchmark_scripts import load_benchmark
from PIL import Image
from scipy import stats

from npsemiseg.config import with_overrides
from npsemiseg.data.study import StudyConfig, generate, labeled_indices
from npsemiseg.models import upsample_logits

load_benchmark("official_runs")  # benchmarks/ on sys.path (as when the script runs): the package official
from official import patching  # noqa: E402
from official.study import (  # noqa: E402
    LAYOUT, MINI_SPEC, MINI_VIT_SPEC, OFFICIAL, PROJECT_FRAMEWORK, SIDES, V2_EMA_DECAY, export_official_layout, official_cfg,
    official_epochs, project_config, repeated_list, study_of, v2_supervised_items)
from official.patching import answered_load, in_process_loader, official_process, patched, recorded  # noqa: E402
from official.networks import AugSegInterface, DPTInterface, OfficialInterface, U2PLInterface, initial_network, initial_networks  # noqa: E402
from official.unimatch import PATCHES  # noqa: E402
from official.voc_semi import U2PL_VOC_TRAIN_SIZE  # noqa: E402
from official.u2pl import NP_U2PL_PATCHES, U2PL_PATCHES, U2PL_SUP_PATCHES, u2pl_cfg, u2pl_sup_cfg, with_banks  # noqa: E402
from official.augseg import AUGSEG_PATCHES, NP_AUGSEG_CONFIG, NP_AUGSEG_PATCHES, augseg_cfg, numpy1_uint8  # noqa: E402
from official.np_network import (  # noqa: E402
    HEAD_MAP, NP_PATCHES, AugSegAuthorsModel, AuthorsModel, NPInterface, RankZero, authors_model, copied_lists,
    reorder_decoder_input, with_device_ids, with_memories)
from official.v2 import V2_MODEL_CONFIG, V2_PATCHES, v2_cfg  # noqa: E402
from official.psmt import (  # noqa: E402
    PSMT_PATCHES, capped_topk, padded_classes, psmt_cfg, psmt_entire_model, psmt_warm_up_epochs, with_classes,
    with_keep_rate)
from official.mt_cps import (  # noqa: E402
    MT_CPS_PATCHES, AttributeDict, OneRankDistributedDataParallel, lenient_to, mt_cps_cfg, recording_evaluation,
    stand_in_modules)
from official.mt_cps_network import mean_teacher_network  # noqa: E402
from official.study import MT_CPS_PIPELINE, mt_cps_evaluated_from  # noqa: E402
from official.report import equivalence, panels_of  # noqa: E402
from official.cli import frameworks_run, main, one_framework, parse_args, patches_of, regime  # noqa: E402
from official_side_by_side import (  # noqa: E402
    IMAGENET_MEAN, IMAGENET_STD, NP_U2PL_CONFIG, U2PL_UNUSED_MODULES, checkout, official_imports, stand_ins)


def small_study() -> StudyConfig:
    return StudyConfig(seed=3, family="study_textures", train_size=32, val_size=3, tune_size=1, image_size=16)


def behind_interface(framework: str, interface: type) -> tuple[torch.nn.Module, torch.nn.Module, torch.Tensor, torch.Tensor]:
    """The project's initial network of ``framework``'s cell, behind the official ``interface`` (both in eval mode),
    two 32 px images in [0, 1] and the same normalised as the official loaders normalise them."""
    student = initial_network(project_config(framework, data_seed=0, seed=0)).eval()
    images = torch.rand(2, 3, 32, 32)
    mean, std = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1), torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    return student, interface(student).eval(), images, (images - mean) / std


def test_export_writes_the_official_layout_the_semidataset_reads(tmp_path: Path):
    """List files of ``image label`` lines relative to the root; images open as RGB JPEGs and labels as PNG class
    indices, read as UniMatch's ``SemiDataset.__getitem__`` reads them (dataset/semi.py 33-34); the labeled and
    unlabeled lists are the project's partition; ``splits/study/val.txt`` sits where the official code looks for it
    (its working directory is the root)."""
    config = small_study()
    lists = export_official_layout(config, tmp_path)
    assert lists["val"] == tmp_path / "splits" / "study" / "val.txt"
    assert lists["labeled"].parent == tmp_path / "splits" / "study" / "1_16"
    labeled, unlabeled = labeled_indices(config, 2)
    expected = {"labeled": [("train", i) for i in labeled], "unlabeled": [("train", i) for i in unlabeled],
                "val": [("val", i) for i in range(3)]}
    for split, items in expected.items():
        lines = lists[split].read_text().splitlines()
        assert len(lines) == len(items)
        for line, (stream, index) in zip(lines, items):
            image_path, label_path = line.split(" ")
            assert image_path == f"JPEGImages/{stream}_{index:06d}.jpg"
            image = Image.open(tmp_path / image_path)
            assert image.format == "JPEG"
            rgb = np.asarray(image.convert("RGB"), dtype=np.float64) / 255.0
            label = np.array(Image.open(tmp_path / label_path))
            truth_image, truth_label = generate(config, stream, index)
            assert label.dtype == np.uint8 and label.shape == (16, 16)
            np.testing.assert_array_equal(label, truth_label.numpy())
            # quality 100 without chroma subsampling: within a few levels of the generated image
            assert np.abs(rgb - truth_image.permute(1, 2, 0).numpy()).mean() < 3 / 255


def test_export_writes_the_u2pl_layout_its_base_dataset_reads(tmp_path: Path):
    """U2PL's layout: list files under a folder naming ``pascal`` (U2PL's ``BaseDataset`` reads a list as VOC's only
    then), one id per line, images ``JPEGImages/<id>.jpg`` and labels ``SegmentationClassAug/<id>.png`` (the paths
    its parser makes of an id); the labeled and unlabeled lists are the project's partition."""
    config = small_study()
    lists = export_official_layout(config, tmp_path, layout="u2pl")
    assert lists["val"] == tmp_path / "splits" / "pascal_study" / "val.txt"
    assert lists["unlabeled"] == Path(str(lists["labeled"]).replace("labeled.txt", "unlabeled.txt"))
    labeled, _ = labeled_indices(config, 2)
    assert lists["labeled"].read_text().splitlines() == [f"train_{i:06d}" for i in labeled]
    for name in lists["val"].read_text().splitlines():
        label = np.array(Image.open(tmp_path / "SegmentationClassAug" / f"{name}.png"))
        np.testing.assert_array_equal(label, generate(config, "val", int(name[4:]))[1].numpy())
        assert Image.open(tmp_path / "JPEGImages" / f"{name}.jpg").format == "JPEG"


def test_repeated_list_repeats_the_labeled_list_as_unimatch_repeats_its_labeled_set(tmp_path: Path):
    source = tmp_path / "labeled.txt"
    source.write_text("a x\nb y\nc z\n")
    out = repeated_list(source, 7, tmp_path / "repeated.txt")
    ids = ["a x", "b y", "c z"]
    assert out.read_text().splitlines() == (ids * math.ceil(7 / len(ids)))[:7]


@pytest.mark.parametrize("framework", ["supervised", "unimatch", "fixmatch"])
def test_project_side_runs_the_official_settings(framework: str):
    """The project's cell: released, the official resize and blur, epochs of N_u / B_u iterations evaluated each,
    the best reported; supervised on UniMatch's network (AugSeg decoder variant, no dropout) and LR timing."""
    config = project_config(framework, data_seed=5, seed=2)
    assert config.protocol == "released" and config.seed == 2 and config.data.options["seed"] == 5
    assert config.data.augmentation["resize"] == "long_side" and config.data.augmentation["base_size"] == 64
    assert list(config.data.augmentation["blur_sigma"]) == [0.1, 2.0]
    assert config.schedule.epoch_length == "unlabeled" and config.schedule.eval_every_epochs == 1
    assert config.evaluation.select == "best" and config.schedule.max_steps == 960
    assert config.model.decoder == "augseg" and config.head.options.get("dropout", 0.0) == 0.0
    assert config.schedule.lr_timing == "after_step"
    cfg = official_cfg(config, Path("/data"), epochs=8)
    assert (cfg["lr"], cfg["lr_multi"], cfg["batch_size"], cfg["crop_size"], cfg["nclass"]) == (
        config.optim.lr, config.optim.head_lr_mult, 8, 64, config.num_classes)


def test_a_regime_changes_both_sides_settings_and_the_data_instance(capsys: pytest.CaptureFixture[str]):
    """``--set`` and ``--split tune``: a larger image (the official resize's base size follows it, the data seed and
    family kept), a larger unlabeled pool and the tune split evaluated; malformed or repeated settings are refused
    before anything runs."""
    args = parse_args(["--official-root", "R", "--framework", "unimatch", "--out", "O", "--split", "tune",
                            "--set", "data.options.image_size=96", "--set", "schedule.crop_size=96"])
    assert args.regime == {"data.options.image_size": 96, "schedule.crop_size": 96, "evaluation.split": "tune"}
    config = project_config("unimatch", data_seed=5, seed=0, overrides=args.regime)
    assert config.data.options == {"seed": 5, "family": "study_textures", "image_size": 96}
    assert config.data.augmentation["base_size"] == 96 and config.schedule.crop_size == 96
    assert config.evaluation.split == "tune" and official_cfg(config, Path("/d"), epochs=8)["crop_size"] == 96
    larger_pool = project_config("u2pl", data_seed=0, seed=0, overrides={"data.options.train_size": 2048})
    assert larger_pool.data.options == {"seed": 0, "family": "study_textures", "train_size": 2048}
    for bad, message in ((["--set", "crop"], "expected KEY=VALUE"),
                         (["--set", "a=1", "--set", "a=2"], "a given twice")):
        with pytest.raises(SystemExit) as exit_info:
            parse_args(["--official-root", "R", "--framework", "unimatch", "--out", "O", *bad])
        assert exit_info.value.code == 2 and message in capsys.readouterr().err
    with pytest.raises(ValueError, match="given twice"):
        regime(["a=1", "a=2"])
    assert regime(["model.options={aspp_channels: 32}"]) == {"model.options": {"aspp_channels": 32}}


def test_export_of_the_tune_split_lists_the_tune_images(tmp_path: Path):
    config = small_study()
    lists = export_official_layout(config, tmp_path, split="tune")
    assert lists["val"].read_text().splitlines() == ["JPEGImages/tune_000000.jpg SegmentationClass/tune_000000.png"]
    label = np.array(Image.open(tmp_path / "SegmentationClass" / "tune_000000.png"))
    np.testing.assert_array_equal(label, generate(config, "tune", 0)[1].numpy())


def test_combine_refuses_reports_of_different_regimes(tmp_path: Path):
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    first.write_text(json.dumps(part("unimatch", [0], 0.0)))
    second.write_text(json.dumps({**part("unimatch", [1], 0.0), "regime": {"schedule.crop_size": 96}}))
    with pytest.raises(ValueError, match="different regimes"):
        main(["--combine", str(first), str(second), "--out", str(tmp_path / "out")])


def test_u2pl_project_side_has_the_official_pipeline_and_the_mini_studys_rule_for_official_epochs():
    """U2PL's cell: released (its label padding with 0), U2PL's resize (a balanced scale in [0.5, 2]) padded evenly,
    and the time settings by the mini study's rule for epochs of 120 iterations: EMA decay and queue lengths as the
    mini study's (``jobs/specs/mini.yaml``'s cell_overrides), one supervised-only epoch (the mini study's 2 are of
    8 iterations); only the clean evaluation (the comparison's)."""
    import yaml

    config = project_config("u2pl", data_seed=1, seed=3)
    augmentation, options = config.data.augmentation, config.framework_options
    assert config.protocol == "released" and augmentation["label_pad_value"] == 0
    assert augmentation["resize"] == "rescale_balanced" and list(augmentation["scale_range"]) == [0.5, 2.0]
    assert augmentation["crop_padding"] == "centered" and augmentation["strong"] is None
    assert augmentation["resize_resample"] == "interpolate"  # U2PL's RandResize (switch u2pl_resize)
    mini = yaml.safe_load(MINI_SPEC.read_text())["cell_overrides"]
    scaled = next(rule["overrides"] for rule in mini if rule["when"] == {"frameworks": ["u2pl"]})
    for key in ("ema_decay", "queue_size", "background_queue_size"):
        assert options[key] == scaled[f"framework_options.{key}"]
    assert scaled["framework_options.sup_only_epochs"] == 2 and options["sup_only_epochs"] == 1
    assert config.evaluation.corruptions == () and not config.evaluation.also_student
    assert config.schedule.epoch_length == "unlabeled" and config.evaluation.select == "best"


def test_u2pl_interface_gives_the_projects_logits_and_representation_with_the_official_parameter_groups():
    """``forward`` returns ``pred`` (the project's logits) and ``rep`` (its representation) at feature resolution,
    as U2PL's decoder; ``encoder`` and ``decoder`` (the optimiser's groups at lr and lr x 10) hold every parameter
    of the project's network once, the backbone's in the first."""
    student, interface, images, normalised = behind_interface("u2pl", U2PLInterface)
    with torch.no_grad():
        outs = interface(normalised)
        expected = student(images)
    torch.testing.assert_close(outs["pred"], expected.head.logits[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(outs["rep"], expected.representation, atol=1e-5, rtol=1e-5)
    assert outs["pred"].shape[-2:] == outs["rep"].shape[-2:] == (8, 8)
    assert outs["rep"].shape[1] == project_config("u2pl", data_seed=0, seed=0).model.options["representation_dim"]
    groups = [list(interface.encoder.parameters()), list(interface.decoder.parameters())]
    ids = [id(p) for group in groups for p in group]
    assert sorted(ids) == sorted(id(p) for p in student.parameters()) and len(set(ids)) == len(ids)
    assert {id(p) for p in student.backbone.parameters()} == {id(p) for p in groups[0]}


def test_with_banks_gives_trains_banks_of_the_representations_width_and_the_cells_queues():
    """``main`` hands ``train`` banks 256 wide and queues of 50000 / 30000 every epoch: the first call replaces the
    banks (empty, ``width`` wide), every call sets the queue lengths; keys queued in an epoch stay for the next."""
    seen = []

    def train(*args):
        seen.append((args[-3], list(args[-1])))
        args[-3][1][0] = torch.cat([args[-3][1][0], torch.ones(2, 16)])

    memobank, queue_size = [[torch.zeros(0, 256)] for _ in range(3)], [50000, 30000, 30000]
    wrapped = with_banks(train, 16, [593, 356, 356])
    for epoch in range(2):
        wrapped("model", epoch, memobank, [torch.zeros(1)] * 3, queue_size)
    assert seen[0][1] == seen[1][1] == [593, 356, 356] and queue_size == [593, 356, 356]
    assert [bank[0].shape for bank in memobank] == [(0, 16), (4, 16), (0, 16)]


def test_patches_of_a_run_list_each_patch_once_the_frameworks_first():
    patches = patches_of(["u2pl", "supervised"])
    assert patches[: len(U2PL_PATCHES)] == list(U2PL_PATCHES)
    assert len(patches) == len(set(patches)) == len(set(U2PL_PATCHES) | set(PATCHES))
    assert any(p[0] == "tensorboardX" for p in patches) and any(p[0] == "torch.utils.tensorboard" for p in patches)


def test_official_interface_gives_the_project_networks_logits():
    """``forward(normalised x)`` is the project's model on ``x`` upsampled to the input (align_corners=True as
    the official model); ``need_fp`` returns the clean and the feature-perturbed logits of the same shape."""
    student, interface, images, normalised = behind_interface("unimatch", OfficialInterface)
    with torch.no_grad():
        logits = interface(normalised)
        expected = torch.nn.functional.interpolate(student(images).head.logits[0], size=(32, 32), mode="bilinear",
                                                   align_corners=True)
        clean, perturbed = interface(normalised, True)
    assert logits.shape == (2, student(images).head.logits[0].shape[1], 32, 32)
    torch.testing.assert_close(logits, expected, atol=1e-5, rtol=1e-5)
    assert clean.shape == perturbed.shape == logits.shape and not torch.allclose(clean, perturbed)


def test_initial_network_is_the_weights_the_projects_run_starts_from():
    config = project_config("supervised", data_seed=0, seed=4)
    first, second = initial_network(config), initial_network(config)
    other = initial_network(project_config("supervised", data_seed=0, seed=5))
    head = "head.classifier.8.weight"
    assert torch.equal(first.state_dict()[head], second.state_dict()[head])
    assert not torch.equal(first.state_dict()[head], other.state_dict()[head])


def test_equivalence_is_welchs_two_one_sided_tests():
    official, project = [50.0, 51.0, 52.0], [50.2, 51.2, 52.2]
    result = equivalence(official, project, margin=1.0)
    se = math.sqrt(1.0 / 3 + 1.0 / 3)  # both sample variances 1
    p_lower = stats.t.sf((0.2 + 1.0) / se, df=4)
    p_upper = stats.t.cdf((0.2 - 1.0) / se, df=4)
    assert result["difference"] == pytest.approx(0.2)
    assert result["p"] == pytest.approx(max(p_lower, p_upper))
    assert result["ci90_low"] < 0.2 < result["ci90_high"]
    tight = equivalence([50.0, 50.1, 49.9, 50.05], [50.02, 50.08, 49.95, 50.0], margin=1.0)
    assert tight["p"] < 0.001
    apart = equivalence([50.0, 50.1, 49.9], [55.0, 55.1, 54.9], margin=1.0)
    assert apart["p"] > 0.99


def test_equivalence_needs_two_runs_a_side():
    with pytest.raises(ValueError, match="at least 2 runs per side, got 1 official and 2 project"):
        equivalence([50.0], [50.0, 51.0])


def part(framework: str, seeds: list[int], offset: float, supervised: bool = False) -> dict:
    """An ``official_runs.json`` as a run writes it (the schema of the interface), values made up."""
    def row(seed: int) -> dict:
        return {"seed": seed, "official_miou": 50.0 + seed, "project_miou": 50.0 + seed + offset,
                "official_curve": [40.0, 50.0 + seed], "project_curve": [41.0, 50.0 + seed + offset]}
    rows = [row(s) for s in seeds]
    return {"framework": framework, "data_seed": 0, "runs": rows, "supervised": rows if supervised else [],
            "command": f"python benchmarks/official_runs.py --framework {framework}", "date": "2026-11-29 07:00 UTC",
            "machine": "here", "seconds": 1.0}


def minus_supervised(records: list[dict], framework: str, side: str) -> tuple[int, float]:
    """The seeds and mean of a framework's ``minus_supervised`` record of one side."""
    record = next(r for r in records if r.get("framework") == framework and r.get("side") == side
                  and "minus_supervised" in r)
    return record["seeds"], record["minus_supervised"]


def test_paired_difference_counts_the_seeds_below_and_tests_the_mean():
    from official.report import paired_difference

    result = paired_difference([-4.64, -5.55, -1.22, -0.99, -2.49])
    assert result["minus_supervised"] == -2.98 and result["below"] == 5
    assert result["ci90"][0] < -2.98 < result["ci90"][1] < 0 and result["p"] < 0.05
    assert paired_difference([1.0, -1.0])["below"] == 1 and "ci90" not in paired_difference([0.5, 0.5])


def test_combine_joins_seeds_run_apart_and_tests_equivalence(tmp_path: Path):
    paths = []
    for name, report in (("a", part("unimatch", [0], 0.1)), ("b", part("unimatch", [1], 0.2)),
                         ("c", part("supervised", [0, 1], -0.1, supervised=True))):
        paths.append(tmp_path / f"{name}.json")
        paths[-1].write_text(json.dumps(report))
    combined = main(["--combine", *map(str, paths), "--out", str(tmp_path / "out")])
    written = json.loads((tmp_path / "out" / "official_runs.json").read_text())
    assert written == combined
    assert combined["framework"] == "unimatch" and combined["data_seed"] == 0
    assert [r["seed"] for r in combined["runs"]] == [0, 1] and [r["seed"] for r in combined["supervised"]] == [0, 1]
    for row in combined["runs"]:
        assert {"seed", "official_miou", "project_miou", "official_curve", "project_curve"} <= set(row)
    assert combined["equivalence"]["framework"]["difference"] == pytest.approx(0.15)
    assert combined["equivalence"]["supervised"]["difference"] == pytest.approx(-0.1)
    assert len(combined["parts"]) == 3
    drawn = main(["--figure", str(tmp_path / "curves.png"), "--combine", str(tmp_path / "out" / "official_runs.json")])
    assert Image.open(tmp_path / "curves.png").size[0] > 400
    lines = [json.loads(line) for line in (tmp_path / "curves.jsonl").read_text().splitlines()]
    assert lines == drawn["records"]
    assert {"framework": "unimatch", "side": "project", "seed": 1, "miou": 51.2} in lines
    # unimatch and supervised share seeds 0 and 1: official (50 + 51) / 2 - (50 + 51) / 2 = 0
    assert minus_supervised(lines, "unimatch", "official") == (2, 0.0)
    assert minus_supervised(lines, "unimatch", "project") == (2, 0.25)
    tost = next(r for r in lines if r["framework"] == "unimatch" and "project_minus_official" in r)
    assert tost["project_minus_official"] == 0.15 and tost["seeds"] == 2
    assert tost["project_mean"] - tost["official_mean"] == pytest.approx(0.15)
    low, high = combined["equivalence"]["framework"]["ci90_low"], combined["equivalence"]["framework"]["ci90_high"]
    assert tost["ci90"] == [round(low, 2), round(high, 2)] and low < 0.15 < high
    assert tost["equivalent_within"] == max(abs(round(low, 2)), abs(round(high, 2)))
    assert tost["official_sd"] == pytest.approx(float(np.std([r["official_miou"] for r in combined["runs"]], ddof=1)), abs=0.005)


def test_combine_refuses_reports_of_different_data_seeds(tmp_path: Path):
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    first.write_text(json.dumps(part("unimatch", [0], 0.0)))
    second.write_text(json.dumps({**part("unimatch", [1], 0.0), "data_seed": 3}))
    with pytest.raises(ValueError, match=r"different data seeds: \[0, 3\]"):
        main(["--combine", str(first), str(second), "--out", str(tmp_path / "out")])


def test_combine_joins_the_sides_of_a_seed_run_apart(tmp_path: Path):
    """``--side official`` and ``--side project`` reports of the same seeds (None for the side not run) join into
    rows with both sides."""
    official, project = part("unimatch", [0, 1], 0.5), part("unimatch", [0, 1], 0.5)
    for row in official["runs"]:
        row.update(project_miou=None, project_curve=None)
    for row in project["runs"]:
        row.update(official_miou=None, official_curve=None)
    paths = [tmp_path / "official.json", tmp_path / "project.json"]
    for path, report in zip(paths, (official, project)):
        path.write_text(json.dumps(report))
    combined = main(["--combine", *map(str, paths), "--out", str(tmp_path / "out")])
    assert [(r["official_miou"], r["project_miou"]) for r in combined["runs"]] == [(50.0, 50.5), (51.0, 51.5)]
    assert combined["equivalence"]["framework"]["difference"] == pytest.approx(0.5)
    one_side = main(["--combine", str(paths[0]), "--out", str(tmp_path / "one")])
    assert one_side["runs"][0]["project_miou"] is None and one_side["equivalence"] == {}
    assert "supervised" not in combined["equivalence"]


@pytest.mark.integration
def test_the_official_semidataset_reads_the_export(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """UniMatch's own ``SemiDataset`` (from a checkout under ``NPSEMISEG_OFFICIAL_ROOT``; skipped without one) reads
    the export: a labeled crop, an unlabeled item's three views, ignore mask and boxes, and a validation image from
    ``splits/study/val.txt`` in the working directory."""
    from test_official_side_by_side import official_root

    folder = checkout(official_root("LiheYoung/UniMatch"), "LiheYoung/UniMatch")
    lists = export_official_layout(small_study(), tmp_path)
    monkeypatch.chdir(tmp_path)
    with official_imports(folder):
        semi = __import__("dataset.semi", fromlist=["SemiDataset"])
        labeled = semi.SemiDataset("study", str(tmp_path), "train_l", 16, str(lists["labeled"]), nsample=30)
        unlabeled = semi.SemiDataset("study", str(tmp_path), "train_u", 16, str(lists["unlabeled"]))
        val = semi.SemiDataset("study", str(tmp_path), "val")
        image, label = labeled[0]
        weak, strong1, strong2, ignore, box1, box2 = unlabeled[0]
        val_image, val_label, _ = val[2]
    assert len(labeled) == 30 and len(unlabeled) == 30 and len(val) == 3
    assert image.shape == weak.shape == strong1.shape == strong2.shape == (3, 16, 16)
    assert set(label.unique().tolist()) <= set(range(5)) | {255} and ignore.shape == box1.shape == box2.shape == (16, 16)
    assert val_image.shape == (3, 16, 16) and val_label.shape == (16, 16)


def tiny_u2pl_overrides() -> dict:
    """A study of 64 training images (4 labeled, 60 unlabeled) and 8 validation images, batches of 4 + 4: epochs of
    15 iterations."""
    return {"data.options": {"seed": 0, "family": "study_textures", "train_size": 64, "val_size": 8},
            "schedule.batch_size": 4, "schedule.unlabeled_batch_size": 4}


@pytest.mark.integration
def test_u2pl_cfg_is_the_official_voc_config_with_the_cells_settings(tmp_path: Path):
    """U2PL's own config of the checkout with the cell's data, crop, batch, optimiser, EMA and epochs; what the
    project's options share with it (the unsupervised and contrastive settings) agree; U2PL's ``voc_dset`` and
    transforms read the export: both training sets drawn to the unlabeled pool's size, crops of the cell's size."""
    from test_official_side_by_side import official_root

    folder = checkout(official_root("Haochen-Wang409/U2PL"), "Haochen-Wang409/U2PL")
    config = project_config("u2pl", 0, 0, 30, tiny_u2pl_overrides())
    lists = export_official_layout(study_of(config), tmp_path / "data", layout="u2pl")
    cfg = u2pl_cfg(config, folder, lists, epochs=2, save_path=tmp_path / "run")
    options, trainer = config.framework_options, cfg["trainer"]
    assert (trainer["epochs"], trainer["sup_only_epoch"], cfg["net"]["ema_decay"]) == (2, 1, options["ema_decay"])
    assert trainer["optimizer"]["kwargs"] == {"lr": config.optim.lr, "momentum": 0.9, "weight_decay": 1e-4}
    assert trainer["unsupervised"]["drop_percent"] == options["drop_percent"] and config.optim.head_lr_mult == 10
    contrastive = trainer["contrastive"]
    assert (contrastive["low_entropy_threshold"], contrastive["current_class_threshold"], contrastive["low_rank"],
            contrastive["high_rank"], contrastive["temperature"], contrastive["num_queries"],
            contrastive["num_negatives"]) == (options["alpha_0"], options["anchor_threshold"], options["low_rank"],
                                               options["high_rank"], options["temperature"], options["num_queries"],
                                               options["num_negatives"])
    assert "aux_loss" not in cfg["net"] and cfg["dataset"]["workers"] == 0
    with official_imports(folder), stand_ins(U2PL_UNUSED_MODULES), patched(
            [(collections, "Iterable", collections.abc.Iterable)]):
        voc = importlib.import_module("u2pl.dataset.pascal_voc")
        train = {**cfg["dataset"], **cfg["dataset"]["train"]}  # as build_voc_semi_loader merges them
        labeled = voc.voc_dset(train["data_root"], train["data_list"], voc.build_transfrom(train), 0,
                               U2PL_VOC_TRAIN_SIZE - train["n_sup"], "train")
        image, label = labeled[0]
    assert len(labeled) == 60
    assert image.shape == (3, 64, 64) and label.shape == (64, 64)
    assert set(label.unique().tolist()) <= set(range(config.num_classes)) | {255}


@pytest.mark.integration
def test_augseg_cfg_is_the_official_voc_config_with_the_cells_settings(tmp_path: Path):
    """AugSeg's own 1/16 config of the checkout with the cell's data, crop, batch, resize base, optimiser, EMA,
    threshold and epochs; only the teacher evaluated; AugSeg's ``voc_dset`` reads the export: the unlabeled set drawn
    to its own size, a weak and a strong view of the crop size."""
    from test_official_side_by_side import official_root

    folder = checkout(official_root("ZhenZHAO/AugSeg"), "ZhenZHAO/AugSeg")
    config = project_config("augseg", 0, 0, 30, tiny_u2pl_overrides())
    lists = export_official_layout(study_of(config), tmp_path / "data", layout=LAYOUT["augseg"])
    cfg = augseg_cfg(config, folder, lists, epochs=2, save_path=tmp_path / "run")
    train, trainer = cfg["dataset"]["train"], cfg["trainer"]
    assert (train["batch_size"], train["crop"]["size"], train["resize_base_size"], train["rand_resize"]) == (
        4, [64, 64], 64, [0.5, 2.0])
    assert (trainer["epochs"], trainer["sup_only_epoch"], trainer["evaluate_student"]) == (2, 0, False)
    assert cfg["net"]["ema_decay"] == config.framework_options["ema_decay"] and cfg["net"]["num_classes"] == 5
    assert trainer["unsupervised"]["threshold"] == 0.95 and trainer["unsupervised"]["use_cutmix_adaptive"]
    with official_imports(folder), stand_ins(U2PL_UNUSED_MODULES):
        voc = importlib.import_module("augseg.dataset.pascal_voc")
        merged = {**cfg["dataset"], **train}  # as build_voc_semi_loader merges them
        unlabeled = voc.voc_dset(merged["data_root"], merged["data_list"].replace("labeled.txt", "unlabeled.txt"),
                                 voc.build_basic_transfrom(merged, split="train"),
                                 voc.build_additional_strong_transform(merged), 0,
                                 U2PL_VOC_TRAIN_SIZE - merged["n_sup"], "train", flag_semi=True)
        _, weak, strong, label = unlabeled[0]
    assert len(unlabeled) == 60 and weak.shape == strong.shape == (3, 64, 64) and label.shape == (64, 64)


def test_augseg_interface_gives_the_projects_logits_at_image_size_and_no_aux():
    config = project_config("augseg", data_seed=0, seed=0)
    student = initial_network(config).eval()
    interface = AugSegInterface(student).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        pred, aux = interface(x)
        expected = OfficialInterface(student).eval()(x)
    assert aux is None and pred.shape == (2, config.num_classes, 32, 32)
    torch.testing.assert_close(pred, expected)
    ids = [id(p) for module in (interface.encoder, interface.decoder) for p in module.parameters()]
    assert sorted(ids) == sorted(id(p) for p in student.parameters()) and len(set(ids)) == len(ids)
    with pytest.raises(NotImplementedError, match="flag_use_fdrop"):
        interface(x, True)


def test_numpy1_uint8_wraps_python_numbers_as_numpy_1_did():
    """AugSeg's hue operation adds ``np.uint8(hue_factor * 255)`` to a hue channel, a negative factor meaning a turn
    backwards: NumPy 1 wrapped the number modulo 256, NumPy 2 raises; arrays and in-range numbers are cast as before,
    and it stays a dtype."""
    compat = numpy1_uint8()
    assert compat.uint8(-40.8) == 216 and compat.uint8(300) == 44 and compat.uint8(7) == np.uint8(7)
    np.testing.assert_array_equal(compat.uint8(np.array([1.7, 255.0])), np.uint8(np.array([1.7, 255.0])))
    assert np.array([1, 2], dtype=compat.uint8).dtype == np.uint8 and compat.float32 is np.float32
    hue = np.array([10, 250], dtype=compat.uint8)
    hue += compat.uint8(-0.1 * 255)  # AugSeg's shift of -0.1 of a turn
    np.testing.assert_array_equal(hue, [241, 225])


def test_augseg_project_side_has_the_official_pipeline_and_the_mini_studys_ema():
    import yaml

    config = project_config("augseg", data_seed=0, seed=1)
    augmentation = config.data.augmentation
    assert (augmentation["resize"], augmentation["base_size"], augmentation["crop_padding"], augmentation["crop_fill"]) \
        == ("long_side", 64, "bottom_right", "mean")
    assert list(augmentation["blur_sigma"]) == [0.1, 2.0] and augmentation["strong"] == "augseg"
    for framework in ("supervised", "fixmatch", "unimatch", "unimatch_v2", "supervised_v2"):  # UniMatch's black fill
        assert project_config(framework, data_seed=0, seed=1).data.augmentation["crop_fill"] == "zero", framework
    mini = yaml.safe_load(MINI_SPEC.read_text())["cell_overrides"]
    scaled = next(rule["overrides"] for rule in mini if rule["when"] == {"frameworks": ["augseg"]})
    assert config.framework_options["ema_decay"] == scaled["framework_options.ema_decay"]


@pytest.mark.integration
@pytest.mark.parametrize("framework", ["u2pl", "augseg", "np_u2pl", "np_augseg"])
def test_u2pl_and_augseg_run_both_sides_for_a_few_iterations(framework: str, tmp_path: Path):
    """The official ``train_semi.py`` ``main()`` from the checkout (skipped without one) and the project's cell, two
    epochs of 15 iterations each at a tiny size (U2PL: the first supervised-only, the second with the teacher, the
    unsupervised and contrastive losses; AugSeg: both semi-supervised; the NP-SemiSeg authors' versions of both with
    the NP head): each side reports one evaluation per epoch, its best and its last; nothing of the official run is
    left in the process."""
    from test_official_side_by_side import official_root

    repository = OFFICIAL[framework][0]
    folder = checkout(official_root(repository), repository)
    overrides = tiny_u2pl_overrides()
    config = project_config(framework, 0, 0, 30, overrides)
    lists = export_official_layout(study_of(config), tmp_path / "data", layout=LAYOUT[framework])
    torch.set_num_threads(1)
    handlers = list(logging.root.handlers)
    row = one_framework(folder, framework, 0, 0, lists, tmp_path, steps=30, overrides=overrides)
    for side in SIDES:
        curve = row[f"{side}_curve"]
        assert len(curve) == 2 and all(0.0 < value <= 100.0 for value in curve)
        assert row[f"{side}_miou"] == max(curve) and row[f"{side}_last_miou"] == curve[-1]
    assert (tmp_path / f"{framework}_0" / "checkpoints" / "ckpt_best.pth").is_file()
    assert not {"tensorboardX", "train_semi", "skimage"} & set(sys.modules) and not torch.distributed.is_initialized()
    assert logging.root.handlers == handlers


@pytest.mark.integration
def test_np_u2pl_steps_carry_the_official_state_from_iteration_to_iteration(tmp_path: Path):
    """The authors' ``U2PL/train_semi.py`` recorded for three epochs of 15 iterations (supervised-only, the first
    semi-supervised with the shared teacher, one with the EMA; :mod:`official.lockstep`; queues of 6 and 8 keys, which
    fill up), and the project's step run from each recorded state with the official batch and draws: every part of the
    state the loop carries (parameters, BN buffers, momentum, the memory bank) equals the official one after each
    iteration up to float32 round-off (measured 2026-11-29: parameters 5.8e-7, momentum 1.2e-5, buffers and bank 0),
    every draw taken. With the NP
    memories persisting (the paper's ``persist_memories``, not the authors' code: deviation N2) the second iteration
    already departs."""
    from test_official_side_by_side import official_root

    from official import lockstep

    folder = checkout(official_root("Jianf-Wang/NP-SemiSeg"), "Jianf-Wang/NP-SemiSeg")
    config = with_overrides(project_config("np_u2pl", 0, 0, 45, tiny_u2pl_overrides()),  # queues that fill up
                            {"framework_options.queue_size": 6, "framework_options.background_queue_size": 8})
    lists = export_official_layout(study_of(config), tmp_path / "data", layout="u2pl")
    torch.set_num_threads(1)
    recorder, _ = lockstep.record_official(folder, config, lists, tmp_path / "official")
    assert len(recorder.iterations) == 45 and [len(keys) for keys in recorder.iterations[-1]["after"]["queues"]][0] == 8
    rows = lockstep.lockstep(config, recorder)
    assert [row["epoch"] for row in rows] == [0] * 15 + [1] * 15 + [2] * 15 and any(row["mixed"] for row in rows)
    for row in rows:
        assert row["draws_left"] == row["draws_mismatched"] == 0, row["iteration"]
        assert max(row["student"], row["teacher"]) < 1e-5 and row["momentum"] < 1e-4, row
        assert row["student_buffers"] < 1e-6 and row["teacher_buffers"] < 1e-6 and row["queues"] < 1e-6, row
        assert row["project_lr"] == pytest.approx(row["official_lr"], rel=1e-12)
        assert row["project_sup"] == pytest.approx(row["official_sup"], rel=1e-5), row
    persisting = lockstep.lockstep(with_overrides(config, {"head.options.persist_memories": True}), recorder)
    assert persisting[1]["student"] > 1e-4


@pytest.mark.integration
@pytest.mark.parametrize("framework", ["unimatch_v2", "fixmatch_v2"])
def test_unimatch_v2_runs_both_sides_for_a_few_iterations(framework: str, tmp_path: Path):
    """UniMatch V2's ``unimatch_v2.py`` (and ``fixmatch.py``) ``main()`` from the checkout (skipped without one) on the
    project's ViT and the project's cell, two epochs of 15 iterations at a tiny size: each side reports one evaluation
    per epoch, its best and its last; the official side the EMA's (what it reports and the project's cell evaluates)
    and the model's beside it; nothing of the official run is left in the process."""
    from test_official_side_by_side import official_root

    repository = OFFICIAL[framework][0]
    folder = checkout(official_root(repository), repository)
    overrides = tiny_u2pl_overrides()
    config = project_config(framework, 0, 0, 30, overrides)
    lists = export_official_layout(study_of(config), tmp_path / "data")
    torch.set_num_threads(1)
    row = one_framework(folder, framework, 0, 0, lists, tmp_path, steps=30, overrides=overrides)
    for side in SIDES:
        curve = row[f"{side}_curve"]
        assert len(curve) == 2 and all(0.0 < value <= 100.0 for value in curve)
        assert row[f"{side}_miou"] == max(curve) and row[f"{side}_last_miou"] == curve[-1]
    assert len(row["official_student_curve"]) == 2 and row["official_student_miou"] == max(row["official_student_curve"])
    assert (tmp_path / f"{framework}_0" / "latest.pth").is_file()
    assert not {OFFICIAL[framework][1].removesuffix(".py"), "supervised", "dataset.semi"} & set(sys.modules)
    assert not torch.distributed.is_initialized() and torch.load is patching.torch.load


@pytest.mark.parametrize("framework", ["unimatch_v2", "fixmatch_v2"])
def test_v2_project_side_is_the_mini_vit_cell_with_the_official_pipeline_and_ema(framework: str):
    """UniMatch V2's cells: ``mini_vit.yaml``'s network (vit_mini + DPT, the shipped pretrained ViT), crop 56, AdamW
    with the head at x40, released (the official class projection, the LR after the step), the official resize and
    blur, and the EMA decay the official loop hard-codes (0.996; the mini study's time rule makes it 0.9); the
    official config: the cell's values, a backbone name picking ``model_configs``' entry."""
    import yaml

    config = project_config(framework, data_seed=2, seed=1)
    mini_vit = yaml.safe_load(MINI_VIT_SPEC.read_text())
    assert (config.model.backbone, config.model.weights) == ("vit_mini", "pretrained:vit_mini")
    assert config.framework_options["ema_decay"] == 0.996 == V2_EMA_DECAY
    scaled = next(rule["overrides"] for rule in mini_vit["cell_overrides"] if rule["when"] == {"frameworks": ["unimatch_v2"]})
    assert scaled["framework_options.ema_decay"] != config.framework_options["ema_decay"]
    assert config.head.options["block"] == "projection" and config.schedule.lr_timing == "after_step"
    assert (config.optim.name, config.optim.lr, config.optim.head_lr_mult) == ("adamw", 5e-5, 40)
    assert config.data.augmentation["resize"] == "long_side" and list(config.data.augmentation["blur_sigma"]) == [0.1, 2.0]
    assert config.schedule.epoch_length == "unlabeled" and config.schedule.eval_every_epochs == 1
    assert config.evaluation.resize_multiple == 14 and config.evaluation.select == "best"
    cfg = v2_cfg(framework, config, Path("/data"), epochs=8)
    assert (cfg["dataset"], cfg["crop_size"], cfg["batch_size"], cfg["lr"], cfg["lr_multi"], cfg["epochs"]) == (
        "study", 56, 8, 5e-5, 40.0, 8)
    assert cfg["backbone"].split("_")[-1] == V2_MODEL_CONFIG and cfg["lock_backbone"] is False
    with pytest.raises(ValueError, match="share one batch_size"):
        v2_cfg(framework, project_config(framework, 0, 0, overrides={"schedule.unlabeled_batch_size": 4}),
                    Path("/data"), epochs=8)


def test_supervised_v2_is_the_official_supervised_run_on_the_vit_both_ways():
    """UniMatch V2's ``supervised.py`` doubles the batch and draws at least 3000 labeled items an epoch
    (``pascal``'s entry): the project's ``supervised`` cell on the ViT with the official head, batch 16 and an
    evaluation every 240 iterations, the official config at half the batch under the dataset name ``pascal``."""
    config = project_config("supervised_v2", data_seed=0, seed=0)
    assert config.framework == "supervised" and config.model.backbone == "vit_mini"
    assert config.head.options["block"] == "projection" and config.data.augmentation["strong"] is None
    assert config.schedule.batch_size == 16 and config.schedule.lr_timing == "after_step"
    assert v2_supervised_items(960) == 3840
    assert config.schedule.epoch_length == "labeled" and config.schedule.eval_every_epochs * 64 // 16 == 3840 // 16
    cfg = v2_cfg("supervised_v2", config, Path("/data"), epochs=4)
    assert (cfg["dataset"], cfg["batch_size"]) == ("pascal", 8)
    with pytest.raises(ValueError, match="not a whole number"):
        project_config("supervised_v2", 0, 0, overrides={"schedule.batch_size": 28})


def test_dpt_interface_gives_the_projects_logits_groups_and_complementary_dropout():
    """``forward(normalised x)`` is the project's model on ``x``; ``comp_drop`` with every pair kept whole is the same,
    with none kept it is not; the parameters named with ``backbone`` are the ViT's (the official first group), the
    others the decoder's and head's, each once; ``lock_backbone`` freezes the ViT only."""
    student = initial_network(project_config("unimatch_v2", data_seed=0, seed=0)).eval()
    images = torch.rand(4, 3, 56, 56)
    mean, std = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1), torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    normalised = (images - mean) / std
    with torch.no_grad():
        expected = upsample_logits(student(images).head.logits, (56, 56), align_corners=True)[0]
        whole = DPTInterface(student, kept_fraction=1.0).eval()
        torch.testing.assert_close(whole(normalised), expected, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(whole(normalised, comp_drop=True), expected, atol=1e-5, rtol=1e-5)
        dropped = DPTInterface(student, kept_fraction=0.0).eval()(normalised, comp_drop=True)
    assert dropped.shape == expected.shape and not torch.allclose(dropped, expected, atol=1e-3)
    interface = DPTInterface(student)
    named = dict(interface.named_parameters())
    backbone = [p for name, p in named.items() if "backbone" in name]
    assert {id(p) for p in backbone} == {id(p) for p in interface.backbone.parameters()}
    assert {id(p) for name, p in named.items() if "backbone" not in name} == {id(p) for p in interface.head.parameters()}
    assert len(named) == len(list(student.parameters()))
    interface.lock_backbone()
    assert not any(p.requires_grad for p in backbone) and all(p.requires_grad for p in interface.head.parameters())


def test_answered_load_gives_the_state_for_its_path_and_loads_any_other(tmp_path: Path):
    state = {"w": torch.ones(2)}
    torch.save({"other": torch.zeros(1)}, tmp_path / "other.pth")
    load = answered_load("./pretrained/vit_mini_small.pth", state)
    assert load("pretrained/vit_mini_small.pth") is state
    assert torch.equal(load(str(tmp_path / "other.pth"))["other"], torch.zeros(1))


def test_recorded_hands_the_results_to_the_curves_in_turn():
    """UniMatch V2's loops evaluate the model, then its EMA, every epoch: results alternate between the curves."""
    model, ema = [], []
    evaluate = recorded(lambda value: (value, "per class"), model, ema)
    for value in (0.1, 0.2, 0.3, 0.4):
        assert evaluate(value) == (value, "per class")
    assert (model, ema) == ([0.1, 0.3], [0.2, 0.4])


def test_in_process_loader_loads_in_the_process():
    loader = in_process_loader(list(range(6)), batch_size=2, num_workers=4, drop_last=True)
    assert loader.num_workers == 0 and [b.tolist() for b in loader] == [[0, 1], [2, 3], [4, 5]]


def test_v2_frameworks_run_with_their_supervised_reference_and_its_patches():
    args = parse_args(["--official-root", "R", "--framework", "fixmatch_v2", "--out", "O"])
    assert frameworks_run(args) == ["fixmatch_v2", "supervised_v2"]
    assert LAYOUT["supervised_v2"] == "pascal" and PROJECT_FRAMEWORK["supervised_v2"] == "supervised"
    patched = [p[0] for p in patches_of(frameworks_run(args))]
    assert patched == [p[0] for p in V2_PATCHES] and "DPT (as the script imported it)" in patched


def test_export_of_the_pascal_layout_lists_the_images_where_supervised_v2_reads_them(tmp_path: Path):
    lists = export_official_layout(small_study(), tmp_path, layout="pascal")
    assert lists["val"] == tmp_path / "splits" / "pascal" / "val.txt"
    first = lists["labeled"].read_text().splitlines()[0].split(" ")
    assert (tmp_path / first[0]).is_file() and (tmp_path / first[1]).is_file()


def test_combine_and_figure_take_v2_reports_beside_the_deeplab_ones(tmp_path: Path):
    """A UniMatch V2 run and its supervised reference's run join; a figure of V1 and V2 reports draws each
    reference's panel and measures each framework against its own reference."""
    paths = {name: tmp_path / f"{name}.json" for name in ("v2", "sup_v2", "v1")}
    paths["v2"].write_text(json.dumps(part("unimatch_v2", [0, 1], 0.5)))
    paths["sup_v2"].write_text(json.dumps(part("supervised_v2", [0, 1], 0.0, supervised=True)))
    v1 = part("unimatch", [0, 1], 0.0, supervised=True)
    v1["supervised"] = [{**r, "official_miou": r["official_miou"] - 3.0} for r in v1["runs"]]
    paths["v1"].write_text(json.dumps(v1))
    combined = main(["--combine", str(paths["v2"]), str(paths["sup_v2"]), "--out", str(tmp_path / "out")])
    assert combined["framework"] == "unimatch_v2" and [r["seed"] for r in combined["supervised"]] == [0, 1]
    assert combined["equivalence"]["framework"]["difference"] == pytest.approx(0.5)
    drawn = main(["--figure", str(tmp_path / "curves.png"), "--combine", str(tmp_path / "out" / "official_runs.json"),
                       str(paths["v1"])])
    assert list(panels_of([combined, v1])) == ["supervised", "supervised_v2", "unimatch_v2", "unimatch"]
    lines = drawn["records"]
    assert minus_supervised(lines, "unimatch_v2", "project") == (2, 0.5)
    assert minus_supervised(lines, "unimatch", "official") == (2, 3.0)


def test_steps_that_are_not_whole_official_epochs_exit_before_anything_starts(tmp_path: Path):
    """The official loops count epochs of N_u / B iterations (960 / 8 = 120 here; supervised_v2's 3840 / 16 = 240):
    other steps exit with a message naming them, before any checkout is read or any folder made."""
    out = tmp_path / "out"
    with pytest.raises(SystemExit, match="--steps: unimatch's official script counts epochs of 120 iterations"):
        main(["--official-root", str(tmp_path / "none"), "--framework", "unimatch", "--steps", "100",
                   "--out", str(out)])
    with pytest.raises(SystemExit, match="supervised_v2's official script counts epochs of 240 iterations"):
        main(["--official-root", str(tmp_path / "none"), "--framework", "unimatch_v2", "--steps", "360",
                   "--out", str(out)])
    assert not out.exists()
    config = project_config("unimatch", data_seed=0, seed=0, steps=240)
    assert official_epochs("unimatch", config) == 2


def tiny_psmt_overrides() -> dict:
    """:func:`tiny_u2pl_overrides` on 32 px images and crops: epochs of 15 iterations, PS-MT's labeled epoch one."""
    overrides = tiny_u2pl_overrides()
    overrides["data.options"]["image_size"] = 32
    return {**overrides, "schedule.crop_size": 32}


def test_psmt_project_side_has_the_official_pipeline_and_the_mini_studys_rule_for_official_epochs():
    """PS-MT's cell: released, PS-MT's resize (base 600 / 500 of the image), crop padding (bottom and right, the mean)
    and blur; the mini study's EMA keep rate, the ramp-up and the released 5 warm-up epochs scaled by its rule to
    epochs of 120 iterations (one warm-up epoch: 15 of PS-MT's labeled epochs of 8), 7 official epochs after it."""
    import yaml

    config = project_config("psmt", data_seed=0, seed=1)
    augmentation, options = config.data.augmentation, config.framework_options
    assert config.protocol == "released" and config.model.decoder == "psmt"
    assert (augmentation["resize"], augmentation["base_size"], augmentation["crop_padding"], augmentation["crop_fill"]) \
        == ("long_side", 77, "bottom_right", "mean")
    assert list(augmentation["blur_sigma"]) == [0.1, 2.0] and augmentation["strong"] == "psmt"
    mini = yaml.safe_load(MINI_SPEC.read_text())["cell_overrides"]
    scaled = next(rule["overrides"] for rule in mini if rule["when"] == {"frameworks": ["psmt"]})
    assert options["ema_keep_rate"] == scaled["framework_options.ema_keep_rate"] == 0.9
    assert (options["rampup_epochs"], options["warmup_epochs"]) == (1.2, 1)
    assert official_epochs("psmt", config) == 7 and psmt_warm_up_epochs(config) == 15
    assert config.schedule.epoch_length == "unlabeled" and config.evaluation.select == "best"
    with pytest.raises(ValueError, match="no more than its 1 warm-up epochs"):
        official_epochs("psmt", project_config("psmt", 0, 0, steps=120))


def test_export_writes_the_psmt_layout_its_voc_dataset_reads(tmp_path: Path):
    """PS-MT's layout: under ``VOCdevkit/VOC2012``, lists ``VocCode/DataLoader/voc_splits/<n>_train_supervised.txt``
    (``n`` the labeled count), ``..._unsupervised.txt`` and ``val.txt``, lines of paths the root joined with each
    path less its first character opens (``DataLoader/voc.py`` 49-57)."""
    config = small_study()
    lists = export_official_layout(config, tmp_path, layout="psmt")
    root = tmp_path / "VOCdevkit" / "VOC2012"
    assert lists["labeled"] == root / "VocCode" / "DataLoader" / "voc_splits" / "2_train_supervised.txt"
    assert lists["unlabeled"].name == "2_train_unsupervised.txt" and lists["val"].parents[3] == root
    labeled, _ = labeled_indices(config, 2)
    lines = lists["labeled"].read_text().splitlines()
    assert [line.split(" ")[0] for line in lines] == [f"/JPEGImages/train_{i:06d}.jpg" for i in labeled]
    image, label = lines[0].split(" ")
    assert Image.open(root / image[1:]).format == "JPEG"
    np.testing.assert_array_equal(np.array(Image.open(root / label[1:])), generate(config, "train", labeled[0])[1].numpy())


def test_padded_classes_keep_the_softmax_argmax_and_cross_entropy_of_the_classes():
    seen = {}

    def loss(inputs, targets, threshold):
        seen.update(inputs=inputs, targets=targets, threshold=threshold)
        return torch.nn.functional.cross_entropy(inputs, targets.argmax(dim=1))

    logits, target = torch.randn(2, 5, 4, 4, requires_grad=True), torch.randn(2, 5, 4, 4) * 30
    value = padded_classes(loss, 21)(inputs=logits, targets=target, threshold=0.6)
    assert seen["inputs"].shape == seen["targets"].shape == (2, 21, 4, 4) and seen["threshold"] == 0.6
    for padded, original in ((seen["inputs"], logits), (seen["targets"], target)):
        probabilities = padded.softmax(dim=1)
        assert torch.equal(probabilities[:, 5:], torch.zeros(2, 16, 4, 4))
        torch.testing.assert_close(probabilities[:, :5], original.softmax(dim=1))
        assert torch.equal(padded.argmax(dim=1), original.argmax(dim=1))
    torch.testing.assert_close(value, torch.nn.functional.cross_entropy(logits, target.argmax(dim=1)))
    value.backward()
    assert torch.isfinite(logits.grad).all()


def test_psmt_trainer_patches_cap_topk_set_the_keep_rate_and_the_classes():
    calls = []

    class Trainer:
        num_classes = 5

        def assist(self, core_predict, assist_predict, topk=1):
            calls.append(("assist", topk))

        def update(self, teacher_encoder, teacher_decoder, keep_rate=0.996):
            calls.append(("update", keep_rate))

    Trainer.assist, Trainer.update = capped_topk(Trainer.assist), with_keep_rate(Trainer.update, 0.9)
    Trainer().assist(core_predict=None, assist_predict=None, topk=7)
    Trainer().assist(None, None, topk=3)
    Trainer().update(teacher_encoder=None, teacher_decoder=None)
    assert calls == [("assist", 5), ("assist", 3), ("update", 0.9)]

    class Dataset:
        def __init__(self, ddp_training, dgx, **kwargs):
            self.num_classes, self.kwargs = 21, kwargs

    Dataset.__init__ = with_classes(Dataset.__init__, 5)
    assert vars(Dataset(False, dgx=False, split="val")) == {"num_classes": 5, "kwargs": {"split": "val"}}


def test_psmt_entire_model_holds_copies_of_the_projects_three_networks_split_as_the_golden():
    """Each of the student and both teachers: encoder (backbone + decoder) and decoder (the classifier head,
    upsampled to the crop with align_corners=True in training, to the asked shape in eval) give the project's
    network's logits; the backbone and business layers hold each network's parameters once (what BaseTrainer
    groups), trainable, copies of the project's; main's loss, weight and ignore index kept."""
    config = project_config("psmt", data_seed=0, seed=0)
    networks = initial_networks(config)
    assert set(networks) == {"student", "teacher1", "teacher2"}
    stand_in = types.SimpleNamespace(DecoderNetwork=type("DecoderNetwork", (torch.nn.Module,), {}),
                                     VATDecoderNetwork=type("VATDecoderNetwork", (torch.nn.Module,), {}))
    build = psmt_entire_model(networks, [64, 64], torch.nn.Module, stand_in, semi_ce_loss=lambda **kw: kw)
    model = build(num_classes=21, config={"semi": True}, sup_loss="ce", cons_w_unsup="weight", ignore_index=255)
    assert (model.mode, model.sup_loss, model.unsup_loss_w, model.ignore_index) == ("semi", "ce", "weight", 255)
    images = torch.rand(2, 3, 48, 48)
    for suffix, name in (("1", "teacher1"), ("2", "teacher2"), ("_s", "student")):
        encoder, decoder, network = getattr(model, f"encoder{suffix}"), getattr(model, f"decoder{suffix}"), networks[name]
        parameters = [p for module in (encoder.backbone, *encoder.business_layer, *decoder.business_layer)
                      for p in module.parameters()]
        assert len({id(p) for p in parameters}) == len(parameters) == len(list(network.parameters()))
        assert all(p.requires_grad for p in parameters) and not {id(p) for p in parameters} & {
            id(p) for p in network.parameters()}
        encoder.eval(), decoder.eval(), network.eval()
        with torch.no_grad():
            expected = upsample_logits(network(images).head.logits, (48, 48), align_corners=True)[0]
            # the official DecoderNetwork.forward is its upsample's (encoder_decoder.py 133-135)
            torch.testing.assert_close(decoder.upsample(encoder(images), data_shape=[48, 48]), expected)
    assert type(model.decoder_s).__name__ == "VATDecoderNetwork" and type(model.decoder1).__name__ == "DecoderNetwork"


@pytest.mark.integration
def test_psmt_runs_both_sides_for_a_few_iterations(tmp_path: Path):
    """PS-MT's ``main()`` from the checkout (skipped without one) and the project's cell, three epochs of 15
    iterations at a tiny size: the warm-up (one epoch of the cell's, 15 of PS-MT's labeled epochs of one iteration)
    and two semi-supervised epochs, each evaluated (the project's side evaluates the warm-up epoch too); PS-MT's
    config is its own with the cell's settings; nothing of the official run is left in the process."""
    from test_official_side_by_side import official_root

    repository = OFFICIAL["psmt"][0]
    folder = checkout(official_root(repository), repository)
    overrides = tiny_psmt_overrides()
    config = project_config("psmt", 0, 0, 45, overrides)
    lists = export_official_layout(study_of(config), tmp_path / "data", layout="psmt")
    cfg = psmt_cfg(config, folder, tmp_path / "data", tmp_path / "run")
    assert (cfg["model"]["warm_up_epoch"], cfg["trainer"]["epochs"], cfg["n_labeled_examples"]) == (15, 2, 4)
    assert (cfg["ramp_up"], cfg["unsupervised_w"], cfg["lr_scheduler"]) == (0.45, 1.5, "Poly")
    assert cfg["train_unsupervised"]["base_size"] == 38 and cfg["train_supervised"]["crop_size"] == 32
    torch.set_num_threads(1)
    row = one_framework(folder, "psmt", 0, 0, lists, tmp_path, steps=45, overrides=overrides)
    assert len(row["official_curve"]) == 2 and len(row["project_curve"]) == 3
    for side in SIDES:
        curve = row[f"{side}_curve"]
        assert all(0.0 < value <= 100.0 for value in curve)
        assert row[f"{side}_miou"] == max(curve) and row[f"{side}_last_miou"] == curve[-1]
    assert len(list((tmp_path / "psmt_0" / "psmt").glob("4_mIoU_*_e2.pth"))) == 1
    assert not {"main", "train", "wandb", "seaborn"} & set(sys.modules) and not hasattr(np, "int")


def test_combine_and_figure_take_psmt_reports_with_the_supervised_reference(tmp_path: Path):
    """A PS-MT report joins UniMatch's ``supervised.py`` runs as the U2PL and AugSeg ones do; its patches are PS-MT's
    and its run's frameworks PS-MT and that reference."""
    paths = [tmp_path / "psmt.json", tmp_path / "supervised.json"]
    paths[0].write_text(json.dumps(part("psmt", [0, 1], -0.4)))
    paths[1].write_text(json.dumps(part("supervised", [0, 1], 0.0, supervised=True)))
    combined = main(["--combine", *map(str, paths), "--out", str(tmp_path / "out")])
    assert combined["framework"] == "psmt" and combined["equivalence"]["framework"]["difference"] == pytest.approx(-0.4)
    drawn = main(["--figure", str(tmp_path / "curves.png"), "--combine", str(tmp_path / "out" / "official_runs.json")])
    assert minus_supervised(drawn["records"], "psmt", "project") == (2, -0.4)
    args = parse_args(["--official-root", "R", "--framework", "psmt", "--out", "O"])
    assert frameworks_run(args) == ["psmt", "supervised"]
    assert patches_of(["psmt"]) == list(PSMT_PATCHES) and LAYOUT["psmt"] == "psmt"


def test_export_writes_the_torchsemiseg_layout_its_voc_dataset_reads(tmp_path: Path):
    """TorchSemiSeg's layout: ``<root>/train_aug/image/<id>.jpg`` and ``.../label/<id>.png`` for both training lists
    (their file names hold ``train``), ``<root>/val/...`` for ``val.txt``; lists of ids (dataloader.py 128-146)."""
    config = small_study()
    lists = export_official_layout(config, tmp_path, layout="torchsemiseg")
    assert lists["labeled"] == tmp_path / "subset_train_aug" / "train_aug_labeled_1-16.txt"
    assert lists["unlabeled"].name == "train_aug_unlabeled_1-16.txt" and lists["val"] == tmp_path / "val.txt"
    labeled, unlabeled = labeled_indices(config, 2)
    assert lists["labeled"].read_text().split() == [f"train_{i:06d}" for i in labeled]
    assert lists["unlabeled"].read_text().split() == [f"train_{i:06d}" for i in unlabeled]
    name = lists["val"].read_text().split()[0]
    assert Image.open(tmp_path / "val" / "image" / f"{name}.jpg").format == "JPEG"
    np.testing.assert_array_equal(np.array(Image.open(tmp_path / "val" / "label" / f"{name}.png")),
                                  generate(config, "val", 0)[1].numpy())
    assert (tmp_path / "train_aug" / "label" / f"train_{unlabeled[0]:06d}.png").is_file()


def test_mt_cps_evaluates_the_script_range_scaled_to_the_run_and_never_an_unsaved_epoch():
    """script.sh's ``eval.py -e 20-34`` of 34 epochs; 8 epochs: 5-7 (20 x 8 / 34 = 4.7, and train.py saves the
    epochs after 8 // 2); a run of one epoch: its only checkpoint."""
    assert [mt_cps_evaluated_from(epochs) for epochs in (34, 8, 3, 1)] == [20, 5, 2, 0]


def test_mt_cps_project_side_is_the_mini_studys_released_mt_cell_with_the_official_pipeline():
    """The mini study's ``mt`` cell under ``released`` (framework ``mt_cps``, its released step switches), the
    mini study's EMA decay (its rule, the cell's name's), TorchSemiSeg's pipeline as near as the project's goes; the
    best among epochs 6-8 (counted from 1): the checkpoints of epochs 5-7 that eval.py evaluates."""
    import yaml

    config = project_config("mt_cps", data_seed=0, seed=1)
    assert PROJECT_FRAMEWORK["mt_cps"] == "mt" and config.cell_name == "mt/study/1/16/baseline"
    assert config.framework == "mt_cps" and config.protocol == "released"
    mini = yaml.safe_load(MINI_SPEC.read_text())["cell_overrides"]
    scaled = next(rule["overrides"] for rule in mini if rule["when"] == {"frameworks": ["mt"]})
    assert config.framework_options["ema_decay"] == scaled["framework_options.ema_decay"] == 0.9
    assert {k: config.framework_options[k] for k in ("passes", "ema_timing", "train_dropout", "mse_weight")} == {
        "passes": "split", "ema_timing": "before_unlabeled", "train_dropout": False, "mse_weight": 100.0}
    assert {f"data.augmentation.{k}": v for k, v in config.data.augmentation.items() if f"data.augmentation.{k}"
            in MT_CPS_PIPELINE} == MT_CPS_PIPELINE and config.data.augmentation["strong"] is None
    assert official_epochs("mt_cps", config) == 8 and config.evaluation.select_from_epoch == 6
    assert config.optim.parameter_groups == "single_lr" and config.evaluation.select == "best"


def test_mt_cps_cfg_gives_config_py_the_cells_settings_and_its_own_epoch_formula(tmp_path: Path):
    config = project_config("mt_cps", data_seed=0, seed=0)
    lists = {"labeled": tmp_path / "l.txt", "unlabeled": tmp_path / "u.txt", "val": tmp_path / "val.txt"}
    cfg = mt_cps_cfg(config, lists, 8, tmp_path / "run")
    assert (cfg["niters_per_epoch"], cfg["max_samples"], cfg["num_train_imgs"], cfg["nepochs"]) == (120, 960, 64, 8)
    assert (cfg["lr"], cfg["batch_size"], cfg["ema_decay"], cfg["unsup_weight"], cfg["image_height"]) == (
        0.01, 8, 0.9, 100.0, 64)
    assert cfg["img_root_folder"] == str(tmp_path) and cfg["eval_source"] == str(lists["val"])
    assert cfg["snapshot_dir"] == str(tmp_path / "run" / "snapshot") and cfg["num_workers"] == 0
    with pytest.raises(ValueError, match="one batch_size"):
        mt_cps_cfg(project_config("mt_cps", 0, 0, overrides={"schedule.unlabeled_batch_size": 4}), lists, 8, tmp_path)


class _Network(torch.nn.Module):
    """An official ``Network``'s place in the tests (the checkout's needs ``config``)."""


def test_mean_teacher_network_holds_the_projects_networks_behind_single_networks_interface():
    """Training: (features, logits upsampled with align_corners=True); eval: the logits; the input normalised as the
    official loaders normalise it; the optimiser's groups; the state dict the models' only; the teacher detached."""
    networks = initial_networks(project_config("mt_cps", data_seed=0, seed=0))
    network = mean_teacher_network(_Network, networks["student"], networks["teacher"], normalised=True)
    images = torch.rand(2, 3, 32, 32)
    mean, std = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1), torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    network.eval()
    with torch.no_grad():
        logits = network.branch1((images - mean) / std)
        expected = torch.nn.functional.interpolate(networks["student"](images).head.logits[0], size=(32, 32),
                                                   mode="bilinear", align_corners=True)
    torch.testing.assert_close(logits, expected, atol=1e-5, rtol=1e-5)
    network.train()
    features, pred = network.branch2(images)
    assert pred.shape == logits.shape and features.shape[0] == 2
    assert network.branch1.backbone is networks["student"].backbone
    assert network.branch1.business_layer == [networks["student"].decoder, networks["student"].head]
    assert set(network.state_dict()) == {f"branch{i}.model.{k}" for i, model in ((1, networks["student"]),
                                                                              (2, networks["teacher"]))
                                         for k in model.state_dict()}
    assert not any(p.requires_grad for p in network.branch2.parameters())
    assert all(p.requires_grad for p in network.branch1.parameters())


def test_mt_cps_stand_ins_and_patches(tmp_path: Path):
    """apex's DDP in one process calls the network (its checkpoint keys ``module.``-prefixed, what the Engine strips);
    SyncBatchNorm is BatchNorm2d; the EasyDict stand-in holds items as attributes; ``to(-1)`` leaves the model; the
    recorded evaluation keys each mIoU by its checkpoint's epoch and refuses a checkpoint of other keys."""
    modules = stand_in_modules()
    ddp = modules["apex.parallel"].DistributedDataParallel(torch.nn.Linear(2, 1))
    assert isinstance(ddp, OneRankDistributedDataParallel) and set(ddp.state_dict()) == {"module.weight", "module.bias"}
    assert torch.equal(ddp(torch.ones(1, 2)), ddp.module(torch.ones(1, 2)))
    assert modules["apex.parallel"].SyncBatchNorm is torch.nn.BatchNorm2d
    config = AttributeDict(lr=0.1)
    config.batch_size = 8
    assert (config["batch_size"], config.lr) == (8, 0.1)
    assert "missing" not in config
    assert not hasattr(config, "missing")
    model = torch.nn.Linear(2, 1)
    assert lenient_to(torch.nn.Module.to)(model, -1) is model
    curve: dict[int, float] = {}
    load, score = recording_evaluation(lambda m, f, *a: m, lambda *a: (None, 0.25, None, None), curve)
    torch.save({"model": model.state_dict()}, tmp_path / "epoch-6.pth")
    load(model, str(tmp_path / "epoch-6.pth"))
    score()
    assert curve == {6: 25.0}
    with pytest.raises(ValueError, match="keys are not the network's"):
        load(torch.nn.Linear(2, 2, bias=False), str(tmp_path / "epoch-6.pth"))


def test_mt_cps_runs_with_the_supervised_reference_and_its_patches(tmp_path: Path):
    """An MT-CPS report joins its supervised reference's runs as the others do; its patches are MT_CPS_PATCHES."""
    args = parse_args(["--official-root", "R", "--framework", "mt_cps", "--out", "O"])
    assert frameworks_run(args) == ["mt_cps", "supervised_u2pl"] and LAYOUT["mt_cps"] == "torchsemiseg"
    assert patches_of(["mt_cps"]) == list(MT_CPS_PATCHES)
    paths = [tmp_path / "mt_cps.json", tmp_path / "supervised.json"]
    paths[0].write_text(json.dumps(part("mt_cps", [0, 1], 0.3)))
    paths[1].write_text(json.dumps(part("supervised_u2pl", [0, 1], 0.0, supervised=True)))
    combined = main(["--combine", *map(str, paths), "--out", str(tmp_path / "out")])
    assert combined["framework"] == "mt_cps" and combined["equivalence"]["framework"]["difference"] == pytest.approx(0.3)
    drawn = main(["--figure", str(tmp_path / "curves.png"), "--combine", str(tmp_path / "out" / "official_runs.json")])
    assert minus_supervised(drawn["records"], "mt_cps", "project") == (2, 0.3)


@pytest.mark.integration
def test_mt_cps_runs_both_sides_for_a_few_iterations(tmp_path: Path):
    """TorchSemiSeg MeanTeacher's train.py and eval.py from the checkout (skipped without one) and the project's
    cell, eight epochs of 15 iterations at 32 px: the official evaluates the checkpoints of epochs 5-7 (counted from
    0), the project every epoch and reports the best of epochs 6-8 (counted from 1); nothing of the official run is
    left in the process (modules, process group, the collate function and pickler reducers eval.py replaces)."""
    from multiprocessing.reduction import ForkingPickler

    from test_official_side_by_side import official_root

    repository = OFFICIAL["mt_cps"][0]
    folder = checkout(official_root(repository), repository)
    overrides = {**tiny_psmt_overrides()}
    config = project_config("mt_cps", 0, 0, 120, overrides)
    lists = export_official_layout(study_of(config), tmp_path / "data", layout="torchsemiseg")
    collate, reducers = torch.utils.data.dataloader.default_collate, dict(ForkingPickler._extra_reducers)
    torch.set_num_threads(1)
    row = one_framework(folder, "mt_cps", 0, 0, lists, tmp_path, steps=120, overrides=overrides)
    assert len(row["official_curve"]) == 3 and len(row["project_curve"]) == 8
    for side in SIDES:
        assert all(0.0 < value <= 100.0 for value in row[f"{side}_curve"])
        assert row[f"{side}_last_miou"] == row[f"{side}_curve"][-1]
    assert row["official_miou"] == max(row["official_curve"]) and row["project_miou"] == max(row["project_curve"][5:])
    assert sorted(p.name for p in (tmp_path / "mt_cps_0" / "snapshot").glob("epoch-*.pth")) == [
        "epoch-5.pth", "epoch-6.pth", "epoch-7.pth", "epoch-last.pth"]
    assert not {"config", "network", "dataloader", "train", "engine", "apex", "easydict"} & set(sys.modules)
    assert not torch.distributed.is_initialized() and torch.utils.data.dataloader.default_collate is collate
    assert ForkingPickler._extra_reducers == reducers and not torch.backends.cudnn.benchmark


def test_the_supervised_reference_is_u2pls_train_sup_on_u2pls_network_and_unimatchs_elsewhere():
    """U2PL and MT-CPS (the U2PL decoder) are judged against U2PL's ``train_sup.py``; the frameworks on UniMatch's
    network (the AugSeg decoder variant: FixMatch, UniMatch, AugSeg, PS-MT) against UniMatch's ``supervised.py``;
    ``train_sup.py``'s patches are ``train_semi.py``'s but its memory banks."""
    def reference(framework: str) -> list[str]:
        return frameworks_run(parse_args(["--official-root", "R", "--framework", framework, "--out", "O"]))

    assert reference("u2pl") == ["u2pl", "supervised_u2pl"] and reference("mt_cps") == ["mt_cps", "supervised_u2pl"]
    assert [reference(f)[1] for f in ("augseg", "psmt", "fixmatch", "unimatch")] == ["supervised"] * 4
    assert reference("supervised_u2pl") == ["supervised_u2pl"]
    assert set(U2PL_PATCHES) - set(U2PL_SUP_PATCHES) == {p for p in U2PL_PATCHES if p[0].startswith("train (")}
    project = {f: project_config(f, 0, 0) for f in ("supervised_u2pl", "u2pl", "mt_cps")}
    assert {config.model.decoder for config in project.values()} == {"u2pl"}


def test_supervised_u2pl_is_the_projects_supervised_cell_with_train_sups_epochs():
    """The project's ``supervised`` cell (released, U2PL's network and pipeline, the head at 10x as train_sup.py's
    ``times``), epochs of the labeled images (8 iterations), each evaluated: 120 epochs, as train_sup.py's."""
    config = project_config("supervised_u2pl", data_seed=0, seed=0)
    assert config.framework == "supervised" and config.cell_name == "supervised/study/1/16/baseline"
    assert (config.model.decoder, config.optim.parameter_groups, config.optim.head_lr_mult) == ("u2pl", "backbone_head", 10.0)
    assert config.data.augmentation["resize"] == "rescale_balanced" and config.data.augmentation["crop_padding"] == "centered"
    assert config.data.augmentation["resize_resample"] == "interpolate"  # train_sup.py's RandResize
    assert config.data.augmentation["label_pad_value"] == 0  # train_sup.py's Crop (u2pl/dataset/augmentation.py 243)
    assert (config.schedule.epoch_length, config.schedule.eval_every_epochs) == ("labeled", 1)
    assert official_epochs("supervised_u2pl", config) == 120


@pytest.mark.integration
def test_u2pl_sup_cfg_is_the_official_suponly_config_with_the_cells_settings(tmp_path: Path):
    from test_official_side_by_side import official_root

    folder = checkout(official_root("Haochen-Wang409/U2PL"), "Haochen-Wang409/U2PL")
    config = project_config("supervised_u2pl", data_seed=0, seed=0)
    lists = {"labeled": tmp_path / "l.txt", "unlabeled": tmp_path / "u.txt", "val": tmp_path / "a" / "b" / "val.txt"}
    cfg = u2pl_sup_cfg(config, folder, lists, 120, tmp_path / "run")
    assert cfg["dataset"]["type"] == "pascal" and (cfg["dataset"]["n_sup"], cfg["dataset"]["batch_size"]) == (64, 8)
    assert cfg["trainer"]["epochs"] == 120 and cfg["trainer"]["optimizer"]["kwargs"]["lr"] == 0.01
    assert cfg["dataset"]["val"]["crop"] == {"type": "center", "size": [64, 64]} and cfg["net"]["num_classes"] == 5
    assert cfg["dataset"]["train"]["data_list"] == str(lists["labeled"]) and cfg["dataset"]["workers"] == 0
    assert cfg["criterion"]["type"] == "CELoss" and cfg["net"]["ema_decay"] == 0.99  # the config's own, unused


@pytest.mark.integration
def test_supervised_u2pl_runs_both_sides_for_a_few_iterations(tmp_path: Path):
    """U2PL's ``train_sup.py`` ``main()`` from the checkout (skipped without one) and the project's supervised cell,
    30 iterations at a tiny size: epochs of the 4 labeled images (one iteration), each evaluated on both sides."""
    from test_official_side_by_side import official_root

    folder = checkout(official_root("Haochen-Wang409/U2PL"), "Haochen-Wang409/U2PL")
    overrides = tiny_u2pl_overrides()
    config = project_config("supervised_u2pl", 0, 0, 30, overrides)
    lists = export_official_layout(study_of(config), tmp_path / "data", layout=LAYOUT["supervised_u2pl"])
    torch.set_num_threads(1)
    row = one_framework(folder, "supervised_u2pl", 0, 0, lists, tmp_path, steps=30, overrides=overrides)
    for side in SIDES:
        curve = row[f"{side}_curve"]
        assert len(curve) == 30 and all(0.0 < value <= 100.0 for value in curve)
        assert row[f"{side}_miou"] == max(curve) and row[f"{side}_last_miou"] == curve[-1]
    assert (tmp_path / "supervised_u2pl_0" / "checkpoints" / "ckpt_best.pth").is_file()
    assert not {"tensorboardX", "train_sup", "skimage"} & set(sys.modules) and not torch.distributed.is_initialized()


@pytest.mark.parametrize(("framework", "plain"), [("np_u2pl", "u2pl"), ("np_augseg", "augseg")])
def test_np_project_side_is_the_plain_cell_with_the_mini_studys_np_head_and_the_authors_evaluation(framework: str,
                                                                                                   plain: str):
    """The NP-SemiSeg authors' scripts beside the project's cell of the same framework with the NP head under
    ``released``: the mini study's NP widths (latent 2 from its cell_overrides, the heads' 64 channels), the released
    memory (2560, every pixel) and T = 5, evaluated as the authors' ``validate`` (T = 5, not eval.py's 20); the plain
    comparison's pipeline and time settings (``released`` sets the NP cells' own framework switches)."""
    import yaml

    config, reference = project_config(framework, data_seed=0, seed=1), project_config(plain, data_seed=0, seed=1)
    options = config.head.options
    assert (config.framework, config.head.name, config.protocol) == (plain, "np", "released")
    mini = yaml.safe_load(MINI_SPEC.read_text())["cell_overrides"]
    np_rule = next(rule["overrides"] for rule in mini if rule["when"] == {"heads": ["np", "np_mean"]})
    assert options["latent_dim"] == np_rule["head.options.latent_dim"] == 2 and options["hidden_channels"] == 64
    assert (options["memory_size"], options["enqueue_per_class"], options["training_samples"]) == (2560, None, 5)
    assert config.evaluation.num_samples == 5 and config.optim.grad_clip == 5.0
    assert config.data.augmentation == reference.data.augmentation
    for key in ("ema_decay", "sup_only_epochs", "queue_size", "background_queue_size"):  # the time settings
        assert config.framework_options.get(key) == reference.framework_options.get(key), key
    assert (LAYOUT[framework], OFFICIAL[framework]) == (LAYOUT[plain], ("Jianf-Wang/NP-SemiSeg",
                                                                        f"{OFFICIAL[plain][0].split('/')[1]}/train_semi.py"))


def test_np_patches_are_the_plain_scripts_with_the_np_network_and_memories():
    """The authors' scripts run with their plain script's patches but the network's, which maps the project's NP head;
    the NP patches listed once; PATCHES_OF gives them."""
    for np_patches, plain in ((NP_U2PL_PATCHES, U2PL_PATCHES), (NP_AUGSEG_PATCHES, AUGSEG_PATCHES)):
        builder = [p for p in np_patches if p[0].startswith("ModelBuilder")]
        assert len(builder) == 1 and "NP_HEAD" in builder[0][1] and "HEAD_MAP" in builder[0][2]
        assert set(np_patches) - set(builder) == set(plain) - {p for p in plain if p[0].startswith("ModelBuilder")} \
            | set(NP_PATCHES)
        assert len(np_patches) == len(set(np_patches))
    assert patches_of(["np_u2pl"]) == list(NP_U2PL_PATCHES) and patches_of(["np_augseg"]) == list(NP_AUGSEG_PATCHES)


def test_with_memories_gives_train_memories_of_the_latent_width_once():
    """``main`` makes the memories' initial rows 32 wide and hands its lists to every epoch: the first call replaces
    them in place (zeros of the cell's width, what main's validation centers are taken from), later calls keep them."""
    seen = []

    def train(model, teacher, latent, deterministic, *rest):
        seen.append([m.shape for m in latent + deterministic])
        latent[0] = torch.ones(3, 2)

    latent, deterministic = [torch.zeros(1, 32) for _ in range(3)], [torch.zeros(1, 32) for _ in range(3)]
    wrapped = with_memories(train, 2)
    wrapped("model", "teacher", latent, deterministic, "optimizer")
    wrapped("model", "teacher", latent, deterministic, "optimizer")
    assert seen[0] == [(1, 2)] * 6 and seen[1][0] == (3, 2)
    assert all(torch.equal(m, torch.zeros(1, 2)) for m in latent[1:] + deterministic)


def test_ddp_device_ids_read_as_rank_zero_and_as_none():
    """The scripts' ``.cuda(model.device_ids[0])`` gets 0; DDP's forward, which moves inputs when ``device_ids``
    is truthy, sees none; a DDP module of a CPU run keeps working."""
    ids = RankZero([0])
    assert ids[0] == 0 and not ids
    made = []
    wrapped = with_device_ids(lambda module, **kwargs: made.append(kwargs) or module)
    module = wrapped(torch.nn.Linear(2, 2), find_unused_parameters=True)
    assert module.device_ids[0] == 0 and not module.device_ids and made == [{"find_unused_parameters": True}]


class WritingHead(torch.nn.Module):
    """A stand-in of the authors' ``NP_HEAD`` (the real one needs the checkout): writes a row into each memory list
    it is given, returns logits [T, B, K, h, w] of a 1x1 convolution and its inputs' statistics."""

    def __init__(self, channels: int, classes: int) -> None:
        super().__init__()
        self.classify = torch.nn.Conv2d(channels, classes, 1)

    def forward(self, x, deterministic_memory, latent_memory, x_context_in=None, labels_target_in=None,
                labels_context_in=None, forward_times=5, phase_train=True):
        output = self.classify(x).unsqueeze(0).expand(forward_times, -1, -1, -1, -1)
        if not phase_train:
            return output
        for memory in (deterministic_memory, latent_memory):
            memory[0] = torch.cat([memory[0], torch.ones(1, memory[0].shape[1])])
        stats = x.mean((2, 3))
        return output, stats, stats, x_context_in.mean((2, 3)), stats, deterministic_memory, latent_memory


@pytest.mark.parametrize("model_class", [AuthorsModel, AugSegAuthorsModel])
def test_np_interface_gives_the_authors_model_images_in_0_1_and_copies_of_the_memories(model_class: type):
    """NPInterface un-normalises the targets and the context (the official loaders normalise, the project's encoder
    does), hands the authors' model copies of the memory lists (the authors' DDP did: main's lists keep their initial
    rows) and groups every parameter once: the backbone at lr, the decoder, the NP head and the representation head at
    lr x 10."""
    config = project_config("np_u2pl", data_seed=0, seed=0)
    student = initial_network(config).eval()
    head = WritingHead(student.head.in_channels, config.num_classes)
    authors = model_class(student, head)
    interface = NPInterface(authors).eval()
    images, context = torch.rand(2, 3, 32, 32), torch.rand(2, 3, 32, 32)
    mean, std = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1), torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    latent, deterministic = [torch.zeros(1, 2)] * 5, [torch.zeros(1, 2)] * 5
    labels = torch.zeros(2, 32, 32, dtype=torch.long)
    with torch.no_grad():
        outs = interface((images - mean) / std, latent, deterministic, x_context_in=(context - mean) / std,
                         labels_target_in=labels, labels_context_in=labels)
        features = student.extract(images)
        context_features = student.extract(context)
    pred = outs["pred"] if isinstance(outs, dict) else outs[0]
    expected = head.classify(features)
    if model_class is AugSegAuthorsModel:
        expected = upsample_logits(expected.unsqueeze(0), (32, 32), align_corners=True)[0]
    torch.testing.assert_close(pred[0], expected, atol=1e-5, rtol=1e-5)
    context_mean = outs["mean_c"] if isinstance(outs, dict) else outs[4]
    torch.testing.assert_close(context_mean, context_features.mean((2, 3)), atol=1e-5, rtol=1e-5)
    assert [m.shape for m in latent + deterministic] == [(1, 2)] * 10
    groups = [list(interface.encoder.parameters()), list(interface.decoder.parameters())]
    ids = [id(p) for group in groups for p in group]
    assert sorted(ids) == sorted(id(p) for p in authors.parameters()) and len(set(ids)) == len(ids)
    assert {id(p) for p in student.backbone.parameters()} == {id(p) for p in groups[0]}
    assert copied_lists(latent) == latent and copied_lists(latent) is not latent and copied_lists(images) is images


@pytest.mark.integration
@pytest.mark.parametrize("script", ["U2PL", "AugSeg"])
def test_authors_head_holds_the_projects_np_head_at_the_mini_cells_widths(script: str):
    """The authors' ``NP_HEAD`` of the checkout (skipped without one) built at the mini cell's sizes (latent 2, its
    decoder narrowed to the cell's 64 channels, memories of 2560) holds every parameter of the project's NP head of
    the seed (HEAD_MAP; the decoder's input reordered), and nothing else."""
    from test_official_side_by_side import official_root

    folder = checkout(official_root("Jianf-Wang/NP-SemiSeg"), "Jianf-Wang/NP-SemiSeg") / script
    config = project_config("np_u2pl" if script == "U2PL" else "np_augseg", data_seed=0, seed=0)
    student = initial_network(config)
    ours = {name: p.detach().clone() for name, p in student.head.named_parameters()}
    with official_imports(folder):
        module = importlib.import_module(f"{script.lower()}.models.np_head")
        authors = authors_model(AuthorsModel, module, student, config)
    head = authors.classifier1
    assert (head.latent_dim, head.memory_max_length, head.num_classes) == (2, 2560, config.num_classes)
    theirs = dict(head.named_parameters())
    assert len(theirs) == len(ours) == 2 * len(HEAD_MAP)
    for mapped, name in HEAD_MAP.items():
        for suffix in ("weight", "bias"):
            value = theirs[f"{name}.{suffix}"].detach()
            if mapped == "decoder.conv1" and suffix == "weight":
                value = reorder_decoder_input(value, head.input_dim, head.latent_dim, "ours")
            torch.testing.assert_close(value, ours[f"{mapped}.{suffix}"], rtol=0, atol=0)
    assert head.decoder.Conv_Decoder[3].weight.shape[:2] == (64, 64)


@pytest.mark.integration
def test_np_cfgs_are_the_authors_voc_configs_with_the_cells_settings(tmp_path: Path):
    """The authors' U2PL and AugSeg configs of the checkout (skipped without one) take the cell's settings as the
    plain scripts' do."""
    from test_official_side_by_side import official_root

    folder = checkout(official_root("Jianf-Wang/NP-SemiSeg"), "Jianf-Wang/NP-SemiSeg")
    config = project_config("np_u2pl", 0, 0, 30, tiny_u2pl_overrides())
    lists = export_official_layout(study_of(config), tmp_path / "data", layout="u2pl")
    cfg = u2pl_cfg(config, folder / "U2PL", lists, epochs=2, save_path=tmp_path / "run", config_file=NP_U2PL_CONFIG)
    assert (cfg["dataset"]["batch_size"], cfg["dataset"]["train"]["crop"]["size"], cfg["trainer"]["sup_only_epoch"],
            cfg["dataset"]["n_sup"]) == (4, [64, 64], 1, U2PL_VOC_TRAIN_SIZE - 60)
    config = project_config("np_augseg", 0, 0, 30, tiny_u2pl_overrides())
    cfg = augseg_cfg(config, folder / "AugSeg", lists, epochs=2, save_path=tmp_path / "run",
                     config_file=NP_AUGSEG_CONFIG)
    assert (cfg["dataset"]["train"]["batch_size"], cfg["trainer"]["evaluate_student"], cfg["net"]["ema_decay"]) == (
        4, False, config.framework_options["ema_decay"])
    # the authors' AugSeg config crops VOC's 500 px validation images to 513 x 513: here the cell's crop, not a
    # canvas 8 times the study's images (the plain AugSeg config evaluates whole images: no crop)
    assert cfg["dataset"]["val"]["crop"] == {"type": "center", "size": [64, 64]}
    plain = augseg_cfg(config, checkout(official_root("ZhenZHAO/AugSeg"), "ZhenZHAO/AugSeg"), lists, epochs=2,
                       save_path=tmp_path / "plain")
    assert "crop" not in plain["dataset"]["val"]


def test_an_official_process_leaves_cudnn_benchmark_and_the_working_directory_as_they_were(tmp_path: Path):
    """Every official script sets ``cudnn.benchmark = True``; after its process the flag, the working directory,
    ``sys.argv`` and ``LOCAL_RANK`` are what they were, so one official run cannot change the next test or run."""
    before = (torch.backends.cudnn.benchmark, Path.cwd(), list(sys.argv), os.environ.get("LOCAL_RANK"))
    with official_process(tmp_path, ["script.py", "--flag"], "tensorboardX", tmp_path):
        torch.backends.cudnn.benchmark = not before[0]
        assert Path.cwd() == tmp_path and sys.argv == ["script.py", "--flag"] and os.environ["LOCAL_RANK"] == "0"
    assert (torch.backends.cudnn.benchmark, Path.cwd(), list(sys.argv), os.environ.get("LOCAL_RANK")) == before


def drawn_items(labeled: list[str], unlabeled: list[str], batch: int) -> list[dict]:
    """Items in the order a loop takes them: per iteration a labeled batch, then an unlabeled one."""
    items = []
    for i in range(0, len(labeled), batch):
        items += [{"id": x, "stream": "labeled"} for x in labeled[i:i + batch]]
        items += [{"id": x, "stream": "unlabeled"} for x in unlabeled[i:i + batch]]
    return items


def test_draws_id_statistics_see_a_pairing_that_repeats_and_an_image_twice_in_a_batch():
    """The authors' samplers shuffle both lists with one permutation per epoch (a pairing that repeats) and the
    labeled list holds copies (a batch may hold an image twice); a new pairing every epoch and no copy read as such."""
    from official.draws import id_statistics

    unlabeled = ["u0", "u1", "u2", "u3"]
    repeating = drawn_items(["a", "a", "b", "c"] + ["c", "b", "a", "a"], unlabeled + unlabeled[::-1], batch=2)
    stats_repeating = id_statistics(repeating, batch=2, per_epoch=2)
    assert stats_repeating["same_partner_as_epoch_before"] == 1.0
    assert stats_repeating["labeled"]["batches_with_a_repeat"] == 0.5
    assert stats_repeating["unlabeled"]["order_correlation"] == pytest.approx(-1.0)
    fresh = drawn_items(["a", "b", "c", "d"] + ["a", "b", "c", "d"], unlabeled + ["u1", "u0", "u3", "u2"], batch=2)
    stats_fresh = id_statistics(fresh, batch=2, per_epoch=2)
    assert stats_fresh["same_partner_as_epoch_before"] == 0.0 and stats_fresh["labeled"]["batches_with_a_repeat"] == 0
    assert stats_fresh["labeled"]["seen_min"] == stats_fresh["labeled"]["seen_max"] == 1


def test_draws_summary_tells_equal_from_different_distributions():
    from official.draws import summary

    rng = np.random.default_rng(0)
    same = summary(rng.normal(size=2000), rng.normal(size=2000), "ks")
    shifted = summary(rng.normal(size=2000), rng.normal(0.3, size=2000), "ks")
    assert same["p"] > 0.01 and shifted["p"] < 1e-6 and shifted["project_mean"] == pytest.approx(0.3, abs=0.1)
    coins = summary(np.array([1.0, 0.0] * 500), np.array([1.0, 0.0, 0.0, 0.0] * 250), "chi2")
    assert coins["p"] < 1e-6 and coins["official_mean"] == 0.5 and coins["project_mean"] == 0.25


def test_in_official_order_gives_the_projects_streams_the_authors_ids():
    """The project's ``epoch_order`` patched to the authors' ids of each stream and epoch, mapped to the positions of
    the project's datasets; an epoch of another length is refused."""
    from npsemiseg.training import data_order
    from official.draws import in_official_order

    datasets = {"labeled": types.SimpleNamespace(stream="train", indices=[7, 3]),
                "unlabeled": types.SimpleNamespace(stream="train", indices=[1, 4, 9])}
    order = {"labeled": [["train_000003", "train_000003", "train_000007"]],
             "unlabeled": [["train_000009", "train_000001", "train_000004"]]}
    original = data_order.epoch_order
    with patched(in_official_order(order, datasets)):
        assert data_order.epoch_order(2, 3, seed=0, stream="labeled", epoch=0) == [1, 1, 0]
        assert data_order.epoch_order(3, 3, seed=0, stream="unlabeled", epoch=0) == [2, 0, 1]
        with pytest.raises(ValueError, match="unlabeled epoch 0: the project asks for 2 items"):
            data_order.epoch_order(3, 2, seed=0, stream="unlabeled", epoch=0)
    assert data_order.epoch_order is original


@pytest.mark.integration
def test_np_u2pl_draws_of_both_sides_agree_but_for_the_authors_samplers(tmp_path: Path):
    """Two epochs of the smoke study (64 images, batches of 4) drawn by both sides without training
    (:mod:`official.draws`): the transforms' and CutMix's draws agree (no test rejects at 0.01; measured at the mini
    study's size 2026-11-30 too), each image is seen as often per epoch; the authors' samplers pair each unlabeled
    image with the same labeled image every epoch, the project's do not; in the authors' order the project's streams
    deliver the authors' ids, batch for batch."""
    from test_official_side_by_side import official_root

    from official import draws

    folder = checkout(official_root("Jianf-Wang/NP-SemiSeg"), "Jianf-Wang/NP-SemiSeg")
    config = project_config("np_u2pl", 0, 0, 30, tiny_u2pl_overrides())
    lists = export_official_layout(study_of(config), tmp_path / "data", layout="u2pl")
    torch.set_num_threads(1)
    official = draws.official_batches(folder, config, lists, tmp_path / "official")
    project = draws.project_batches(with_overrides(config, {"data.order": "passes"}))  # the corrected streams
    report = draws.compare(official, project, config)
    assert draws.differing({"items": report["items"], "mix": report["mix"]}) == {}
    for side in ("official", "project"):
        assert report["ids"][side]["labeled"]["seen_min"] == report["ids"][side]["labeled"]["seen_max"] == 15
        assert report["ids"][side]["unlabeled"]["seen_max"] == 1
    assert report["ids"]["official"]["same_partner_as_epoch_before"] == 1.0
    assert report["ids"]["project"]["same_partner_as_epoch_before"] < 0.5
    ids = [(i["stream"], i["id"]) for i in official["items"]]
    assert config.data.order == "shared_sampled"  # released (switch official_data_order): the authors' ids, in order
    assert [(i["stream"], i["id"]) for i in draws.project_batches(config)["items"]] == ids
    order = draws.official_order(folder, config, lists, tmp_path / "official")
    corrected = with_overrides(config, {"data.order": "passes"})
    assert [(i["stream"], i["id"]) for i in draws.project_batches(corrected, order)["items"]] == ids
    assert not torch.distributed.is_initialized()


@pytest.mark.integration
def test_np_u2pl_checkpoint_evaluated_by_the_authors_validate_and_the_projects_path(tmp_path: Path):
    """The official side's network mapped back to the project's segmentor holds the project's weights (a round trip
    of the initial network); the authors' ``validate`` and the project's evaluation path give the same network
    (trained a little, so that its prediction is not one class) the same mIoU up to the T = 5 samples' noise
    (:mod:`official.np_evaluation`)."""
    from test_official_side_by_side import official_root

    from official import np_evaluation

    folder = checkout(official_root("Jianf-Wang/NP-SemiSeg"), "Jianf-Wang/NP-SemiSeg")
    config = project_config("np_u2pl", 0, 0, 30, tiny_u2pl_overrides())
    torch.set_num_threads(1)
    student = initial_network(config)
    with official_imports(folder / "U2PL"):
        network = np_evaluation.authors_network(importlib.import_module("u2pl.models.np_head"), student, config)
    mapped = np_evaluation.project_segmentor(network, config)
    mapped_state = mapped.state_dict()
    for name, ours in student.state_dict().items():
        assert torch.equal(ours, mapped_state[name]), name
    with torch.no_grad():  # another network: the head's weights moved (a wrong mapping would now show)
        for p in network.parameters():
            p.add_(0.05 * torch.randn_like(p))
    state = {f"module.{k}": v for k, v in network.state_dict().items()}
    lists = export_official_layout(study_of(config), tmp_path / "data", layout="u2pl")
    authors = np_evaluation.authors_validation(folder, config, lists, tmp_path / "official", state)
    project = np_evaluation.project_validation(folder, config, state, step=30)
    assert 0 < authors < 100 and project == pytest.approx(authors, abs=0.5)
    assert not torch.distributed.is_initialized()


@pytest.mark.integration
def test_np_u2pl_project_run_in_the_authors_order_writes_a_project_side_report(tmp_path: Path):
    """``official_draws.py --project-run`` trains the project's side on the authors' order and writes it as an
    ``official_runs.json`` with the project's side only, which ``--combine`` joins to official sides (the same
    regime)."""
    from test_official_side_by_side import official_root

    from official import draws

    root = official_root("Jianf-Wang/NP-SemiSeg")
    settings = [f"--set=data.options.{key}={value}" for key, value in tiny_u2pl_overrides()["data.options"].items()]
    report = draws.main(["--official-root", str(root), "--steps", "30", "--project-run", "--out", str(tmp_path),
                         "--set=schedule.batch_size=4", "--set=schedule.unlabeled_batch_size=4", *settings])
    written = json.loads((tmp_path / "official_runs.json").read_text())
    assert written == json.loads(json.dumps(report)) and written["regime"] == {} and written["data_order"] == "the authors'"
    row = written["runs"][0]
    assert row["official_miou"] is None and len(row["project_curve"]) == 2
    assert row["project_miou"] == max(row["project_curve"]) and "official_draws.py" in written["command"]
