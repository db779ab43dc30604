"""UniMatch V2's pieces (npsemiseg.frameworks.unimatch_v2): the complementary channel masks and where they act.
The whole step is compared with the official loop in tests/test_unimatch_v2_golden.py."""

from __future__ import annotations

import pytest
import torch

from npsemiseg.frameworks.unimatch_v2 import complementary_masks, masked_encoding
from npsemiseg.models import BackboneFeatures

pytestmark = pytest.mark.usefixtures("single_seeded_thread")


@pytest.mark.parametrize("pairs, kept", [(4, 0.5), (5, 0.5), (3, 0.0), (2, 1.0)])
def test_complementary_masks_pair_a_mask_with_its_complement_and_keep_int_pairs_times_kept_whole(pairs, kept):
    low, high = complementary_masks(pairs, [6, 40], kept_fraction=kept, generator=torch.Generator().manual_seed(3))
    for mask in (low, high):
        first, second = mask[:pairs], mask[pairs:]
        assert set(mask.unique().tolist()) <= {0.0, 1.0, 2.0}
        assert torch.equal(first + second, torch.full_like(first, 2.0))  # complementary: every channel once
    whole = {i for i in range(pairs) if bool((high[i] == 1).all())}
    assert len(whole) == int(pairs * kept)
    assert whole == {i for i in range(pairs) if bool((low[i] == 1).all())}  # the same pairs kept for every width
    dropped = high[[i for i in range(pairs) if i not in whole]]
    assert dropped.numel() == 0 or set(dropped.unique().tolist()) == {0.0, 2.0}


def test_a_vit_mask_acts_on_all_four_maps_and_a_resnet_pair_per_map():
    d, n = 3, 4
    encoded = BackboneFeatures(torch.ones(n, 3 * d, 2, 2), torch.ones(n, d, 2, 2), torch.ones(n, d, 2, 2))
    mask = torch.tensor([[0.0, 2.0, 1.0]] * n)
    vit = masked_encoding(encoded, [mask], vit=True)
    assert torch.equal(vit.low_level[0, :, 0, 0], torch.tensor([0.0, 2.0, 1.0] * 3))
    assert torch.equal(vit.layer3[0, :, 0, 0], mask[0]) and torch.equal(vit.high_level[0, :, 0, 0], mask[0])
    low, high = torch.full((n, 3 * d), 2.0), torch.zeros(n, d)
    resnet = masked_encoding(encoded, [low, high], vit=False)
    assert bool((resnet.low_level == 2).all()) and bool((resnet.high_level == 0).all())
    assert torch.equal(resnet.layer3, encoded.layer3)
