"""The short-run rule and the mini-study spec (``jobs/specs/mini.yaml``) that applies it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from npsemiseg.frameworks import get_framework
from npsemiseg.short_run import (
    MIN_EMA_HORIZON,
    MIN_QUEUE,
    PAPER_VOC,
    RunLength,
    scale_pixel_settings,
    scale_time_settings,
)

MINI_SPEC = Path(__file__).resolve().parents[1] / "jobs" / "specs" / "mini.yaml"


def test_the_paper_run_is_unchanged_and_a_tenth_keeps_the_shares():
    options = {"sup_only_epochs": 1, "rampup_epochs": 12.0, "ema_decay": 0.999, "queue_size": 30000, "unsup_weight": 1.5}
    assert scale_time_settings(options, PAPER_VOC) == {}
    tenth = RunLength(steps=PAPER_VOC.steps // 10, epochs=8, pixels_per_step=PAPER_VOC.pixels_per_step // 10)
    scaled = scale_time_settings(options, tenth)
    assert scaled["rampup_epochs"] == pytest.approx(1.2)
    assert "sup_only_epochs" not in scaled  # round(0.1) = 0, but a phase the paper has keeps one epoch
    assert scaled["ema_decay"] == pytest.approx(1 - 1 / (1000 * (PAPER_VOC.steps // 10) / PAPER_VOC.steps), abs=1e-6)
    assert scaled["queue_size"] == 3000 and "unsup_weight" not in scaled


def test_pixel_settings_keep_their_size_relative_to_the_crop():
    assert scale_pixel_settings(PAPER_VOC) == {"blur_sigma": [0.1, 2.0]}
    mini = RunLength.of(steps=320, iters_per_epoch=8, images_per_step=16, crop_size=64)
    assert scale_pixel_settings(mini) == {"blur_sigma": [round(0.1 * 64 / 480, 4), round(2.0 * 64 / 480, 4)]}


def test_floors_keep_a_teacher_and_a_queue():
    tiny = RunLength(steps=10, epochs=1, pixels_per_step=100)
    scaled = scale_time_settings({"ema_decay": 0.99, "queue_size": 50000, "warmup_epochs": 0}, tiny)
    assert scaled == {"ema_decay": pytest.approx(1 - 1 / MIN_EMA_HORIZON), "queue_size": MIN_QUEUE}


def test_mini_spec_applies_exactly_the_rule():
    from semiseg_platform.sweeps.grid_spec import expand, load_spec

    configs = expand(load_spec(MINI_SPEC))
    # (7 frameworks x 3 heads + U2PL np_mean + supervised full + 2 supervised references on the PS-MT and AugSeg
    # networks, the latter FixMatch's and UniMatch's too) x 3 seeds
    assert len(configs) == (7 * 3 + 1 + 1 + 2) * 3 == 75 and {c.seed for c in configs} == {0, 1, 2}
    _assert_the_rule(configs, RunLength.of(steps=960, iters_per_epoch=64 // 8, images_per_step=16, crop_size=64))


def _assert_the_rule(configs, run: RunLength) -> None:
    """Every cell's pixel- and time-dependent settings are the rule's for ``run``."""
    pixel_settings = scale_pixel_settings(run)
    for config in configs:
        assert {k: config.data.augmentation[k] for k in pixel_settings} == pixel_settings, config.cell_name
        schedule = config.schedule
        assert (schedule.max_steps, schedule.batch_size + schedule.unlabeled_batch_size,
                schedule.crop_size) == (run.steps, 16, run.crop_size)
        paper = get_framework(config.framework).paper_options(config.dataset, config.partition)
        expected = {**paper, **scale_time_settings(paper, run)}
        assert json.loads(json.dumps(dict(config.framework_options))) == json.loads(json.dumps(expected)), config.cell_name


def test_the_mini_studys_vit_spec_applies_the_rule_to_its_network():
    """``mini_vit.yaml`` (UniMatch V2 x 3 heads and supervised on ``vit_mini``): its 960 steps of 56 px crops scale the
    blur and UniMatch V2's EMA, and its NP paths are narrowed for the DPT's 16 feature channels."""
    from npsemiseg.models.backbones import BACKBONES
    from npsemiseg.short_run import scale_np_widths
    from semiseg_platform.sweeps.grid_spec import expand, load_spec

    configs = expand(load_spec(MINI_SPEC.with_name("mini_vit.yaml")))
    assert sorted({(c.cell_name.split("/")[0], c.head.name) for c in configs}) == [
        ("supervised_unimatch_v2", "baseline"), ("unimatch_v2", "baseline"), ("unimatch_v2", "mc_dropout"),
        ("unimatch_v2", "np")]
    assert len(configs) == 12 and all(c.model.weights == "pretrained:vit_mini" for c in configs)
    _assert_the_rule(configs, RunLength.of(steps=960, iters_per_epoch=64 // 8, images_per_step=16, crop_size=56))
    latent = scale_np_widths(BACKBONES.get("vit_mini").dpt_features)["latent_dim"]
    assert all(c.head.options["latent_dim"] == latent == 1 for c in configs if c.head.name == "np")


def test_np_widths_keep_the_papers_share_of_the_np_decoders_input():
    from npsemiseg.models import feature_channels
    from npsemiseg.short_run import PAPER_NP_LATENT_DIM, scale_np_widths

    paper = feature_channels("u2pl")
    assert (paper, scale_np_widths(paper)) == (512, {"latent_dim": PAPER_NP_LATENT_DIM})  # 64 / 576, unchanged
    mini = feature_channels("u2pl", aspp_channels=16, low_level_channels=8)
    assert (mini, scale_np_widths(mini)) == (24, {"latent_dim": 2})  # 1.5 rounded half up: 4 / 28 (14 %)
    assert all(scale_np_widths(c)["latent_dim"] == d for c, d in ((1, 1), (16, 1), (23, 1), (48, 3), (256, 16)))
    with pytest.raises(ValueError):
        scale_np_widths(0)


def test_mini_spec_narrows_the_np_paths_by_the_rule():
    from npsemiseg.models import feature_channels
    from npsemiseg.short_run import scale_np_widths
    from semiseg_platform.sweeps.grid_spec import expand, load_spec

    np_cells = [c for c in expand(load_spec(MINI_SPEC)) if c.head.name == "np"]
    assert np_cells
    for config in np_cells:
        options = config.model.options
        width = feature_channels(config.model.decoder, aspp_channels=options["aspp_channels"],
                                 low_level_channels=options["low_level_channels"])
        assert config.head.options["latent_dim"] == scale_np_widths(width)["latent_dim"], config.cell_name
