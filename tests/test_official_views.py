"""``benchmarks/official_views.py``: the regions of a crop, the strong views' statistics over them, and the project's
unlabeled views with the padding filled as the official code fills it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from benchmark_scripts import load_benchmark

views = load_benchmark("official_views")


def test_regions_split_a_padded_crop_into_valid_edge_and_padding():
    padding = torch.zeros(8, 8, dtype=torch.bool)
    padding[:, 6:] = True  # two padded columns on the right, as a bottom-right padding leaves them
    masks = views.region_masks(padding)
    assert masks["padding"].sum() == 16 and masks["valid"].sum() == 48
    assert masks["edge"].sum() == 8 * 3 and bool(masks["edge"][:, 3:6].all()) and not masks["edge"][:, :3].any()
    assert masks["valid_padded_items"].equal(masks["valid"]) and not masks["valid_unpadded_items"].any()
    unpadded = views.region_masks(torch.zeros(8, 8, dtype=torch.bool))
    assert unpadded["valid_unpadded_items"].all() and not unpadded["edge"].any() and not unpadded["padding"].any()


def test_statistics_measure_the_strong_views_against_the_weak_one_by_region():
    """Item 0 unpadded, strong = weak + 0.1; item 1 with its right half padded, strong = weak - 0.2 everywhere:
    the changes, means and padded fractions come back per region."""
    def draw(i: int):
        weak = torch.full((3, 4, 4), 0.5)
        padding = torch.zeros(4, 4, dtype=torch.bool)
        if i == 1:
            padding[:, 2:] = True
        change = 0.1 if i == 0 else -0.2
        return weak, torch.stack([weak + change, weak + change]), padding

    out = views.statistics(draw, 2)
    assert out["padded_pixel_fraction"] == pytest.approx(8 / 32) and out["padded_item_fraction"] == 0.5
    regions = out["regions"]
    assert regions["valid_unpadded_items"]["strong_minus_weak"] == pytest.approx([0.1] * 3)
    assert regions["valid_padded_items"]["abs_change"] == pytest.approx([0.2] * 3)
    assert regions["valid"]["pixels"] == 2 * (16 + 8) and regions["padding"]["mean"] == pytest.approx([0.3] * 3)
    assert regions["valid"]["abs_change_item_mean"] == pytest.approx(0.15)
    # valid pixels: 2 x 16 at 0.6 (item 0), 2 x 8 at 0.3 (item 1): mean 0.5, variance 0.27 - 0.25
    assert regions["valid"]["mean"] == pytest.approx([0.5] * 3) and regions["valid"]["std"] == pytest.approx([0.02 ** 0.5] * 3)


def test_project_views_fill_the_padding_as_asked_and_draw_the_official_views():
    """The project's unlabeled stream of the official-run cell gives the weak view, UniMatch's two strong views and the
    padding mask; with ``crop_fill`` zero the padded pixels of the weak view are black, with the default the ImageNet
    mean."""
    torch.manual_seed(0)
    mean_fill, black_fill = views.project_views(0, 0), views.project_views(0, 0, "zero")
    for _ in range(40):  # a padded crop comes about one draw in three
        state = torch.get_rng_state()
        weak, strong, padding = mean_fill(0)
        if padding.any():
            break
    else:
        pytest.fail("no padded crop in 40 draws")
    torch.set_rng_state(state)
    black, _, black_padding = black_fill(0)
    assert strong.shape == (2, *weak.shape) and padding.shape == weak.shape[1:] and black_padding.equal(padding)
    assert black[:, padding].abs().max() == 0
    assert weak[:, padding].mean(1) == pytest.approx(torch.tensor(views.IMAGENET_MEAN), abs=1e-6)
    assert black[:, ~padding].equal(weak[:, ~padding])


class _ChannelLogits(torch.nn.Module):
    """A stand-in for a trained network: class k's logit is 10 x the image's channel k (two classes), one sample."""

    def forward(self, images):
        logits = 10.0 * images[:, :2][None]
        return type("Output", (), {"head": type("Head", (), {"logits": logits})()})()


def test_network_statistics_measure_fixmatch_s_mask_loss_and_agreement_on_the_valid_pixels():
    """Weak views say class 0 with confidence 1 - 4.5e-5; the strong view says class 0 on item 0 and class 1 on item 1's
    valid left half (cross-entropy 10 + log(1 + e^-10) against the weak class); item 1's right half is padding, out of
    every measure. The mixed measures depend on the boxes drawn: only their range is checked."""
    weak = torch.zeros(3, 4, 4)
    weak[0] = 1.0
    strong_1 = torch.zeros(3, 4, 4)
    strong_1[1, :, :2] = 1.0  # class 1 on the valid half
    strong_1[0, :, 2:] = 1.0  # class 0 on the padding: counted, it would halve the loss and the disagreement
    padding = [torch.zeros(4, 4, dtype=torch.bool), torch.zeros(4, 4, dtype=torch.bool)]
    padding[1][:, 2:] = True
    items = [(weak, weak[None].clone(), padding[0]), (weak, strong_1[None], padding[1])]
    out = views.network_statistics(items.__getitem__, 2, _ChannelLogits(), threshold=0.95, batch=2)
    assert out["mask_ratio"] == pytest.approx([1.0, 1.0]) and out["agreement"] == pytest.approx([1.0, 0.0])
    cross_entropy = 10 + float(torch.log1p(torch.exp(torch.tensor(-10.0))))
    assert out["loss"][0] == pytest.approx(4.54e-5, rel=1e-2)  # log(1 + e^-10) in float32
    assert out["loss"][1] == pytest.approx(cross_entropy, rel=1e-6)
    assert all(0.0 <= r <= 1.0 for r in out["mask_ratio_mixed"]) and len(out["loss_mixed"]) == 2


def test_network_summary_pairs_each_project_pipeline_with_the_official_one_item_by_item():
    """A constant shift of +0.1 on every item is a paired difference of 0.1 with a tiny p-value even where the items
    spread far more than 0.1."""
    official = [float(v) for v in range(10)]
    measures = {"official": dict.fromkeys(views.NETWORK_MEASURES, official),
                "project": dict.fromkeys(views.NETWORK_MEASURES, [v + 0.1 + 1e-3 * (i % 2) for i, v in enumerate(official)])}
    table = views.network_summary(measures)["loss"]
    assert table["official"]["mean"] == pytest.approx(4.5) and "paired_p" not in table["official"]
    assert table["project"]["minus_official"] == pytest.approx(0.1005) and table["project"]["paired_p"] < 1e-10


def test_checkpoint_network_loads_an_official_run_s_ema_weights_into_the_project_s_network(tmp_path):
    """An official UniMatch V2 run saves its DDP-wrapped DPT interface, the project's network as ``module.student``
    (and the backbone again as ``module.backbone``): the EMA's weights come back, and ``model``'s where no EMA is."""
    network = views.checkpoint_network("fixmatch_v2", 0, 0, _saved(tmp_path / "ema.pth", "model_ema", 0.5))
    first = next(iter(network.state_dict()))
    assert not network.training
    reference = views.initial_network(views.project_config("fixmatch_v2", 0, 0)).state_dict()
    assert network.state_dict()[first].equal(reference[first] + 0.5)
    plain = views.checkpoint_network("fixmatch_v2", 0, 0, _saved(tmp_path / "model.pth", "model", -1.0))
    assert plain.state_dict()[first].equal(reference[first] - 1.0)


def _saved(path, key, shift):
    state = views.initial_network(views.project_config("fixmatch_v2", 0, 0)).state_dict()
    wrapped = {f"module.student.{k}": v + shift if v.is_floating_point() else v for k, v in state.items()}
    wrapped.update({f"module.backbone.{k}": v for k, v in state.items() if k.startswith("backbone.")})
    torch.save({key: wrapped, "epoch": 3, "previous_best": np.float64(27.5)}, path)  # as UniMatch V2's best.pth
    return path
