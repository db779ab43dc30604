"""``benchmarks/official_views.py``: the regions of a crop, the strong views' statistics over them, and the project's
unlabeled views with the padding filled as the official code fills it."""

from __future__ import annotations

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
