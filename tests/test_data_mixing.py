"""Batch CutMix of U2PL, PS-MT and AugSeg against hand-computed cases."""

from __future__ import annotations

import math

import pytest
import torch

from npsemiseg.data.mixing import (
    adaptive_confidence,
    augseg_cutmix,
    box_mask,
    cutmix_boxes,
    mix_like,
    psmt_cutmix,
    sample_beta,
    u2pl_boxes,
    u2pl_cutmix,
)
from npsemiseg.heads.base import predictive_entropy


def encoded_batch(b: int, h: int, w: int, offset: int = 0):
    """Image value, label and confidence all encode the image index (i + offset)."""
    index = torch.arange(offset, offset + b)
    image = index.float().view(b, 1, 1, 1).expand(b, 3, h, w).clone()
    label = index.view(b, 1, 1).expand(b, h, w).clone()
    confidence = (index.float() / 100).view(b, 1, 1).expand(b, h, w).clone()
    return image, label, confidence


def assert_moved_together(result, confidence_of=lambda label: label.float() / 100):
    assert torch.equal(result.image[:, 0], result.label.float())
    assert torch.equal(result.image[:, 1], result.image[:, 2])
    assert torch.allclose(result.confidence, confidence_of(result.label))


def bounding_box(mask: torch.Tensor) -> tuple[int, int, int, int]:
    rows, cols = mask.any(1).nonzero().flatten(), mask.any(0).nonzero().flatten()
    return int(rows[0]), int(rows[-1]) + 1, int(cols[0]), int(cols[-1]) + 1


@pytest.mark.parametrize("h,w,areas", [
    (8, 8, {5: 30, 6: 30, 7: 35}),  # w * round(32 / w)
    (6, 8, {5: 25, 6: 24, 7: 21}),  # w * round(24 / w): exactly half for w = 6
])
def test_u2pl_box_is_half_the_image(h, w, areas):
    g = torch.Generator().manual_seed(0)
    seen = set()
    for _ in range(20):
        boxes = u2pl_boxes(4, h, w, g)
        masks = box_mask(boxes, h, w)
        for box, mask in zip(boxes.tolist(), masks):
            y0, y1, x0, x1 = box
            width = x1 - x0
            assert 0 <= y0 < y1 <= h and 0 <= x0 < x1 <= w
            assert int(mask.sum()) == areas[width] == (y1 - y0) * width
            assert bounding_box(mask) == (y0, y1, x0, x1)
            seen.add(width)
    assert seen == set(areas)


def test_u2pl_cutmix_takes_the_box_from_the_next_image():
    image, label, confidence = encoded_batch(3, 8, 8)
    result = u2pl_cutmix(image, label, confidence, p=1.0, generator=torch.Generator().manual_seed(1))
    own = torch.arange(3).view(3, 1, 1)
    assert torch.equal(result.source, torch.where(result.mask, (own + 1) % 3, own))
    for i in range(3):
        assert bool((result.label[i][result.mask[i]] == (i + 1) % 3).all())
        assert bool((result.label[i][~result.mask[i]] == i).all())
        assert int(result.mask[i].sum()) in (30, 35)
    assert_moved_together(result)
    assert torch.equal(label, encoded_batch(3, 8, 8)[1])  # inputs untouched
    unchanged = u2pl_cutmix(image, label, confidence, p=0.0)
    assert not bool(unchanged.mask.any()) and torch.equal(unchanged.label, label)
    g = torch.Generator().manual_seed(5)
    applied = sum(bool(u2pl_cutmix(image, label, None, generator=g).mask.any()) for _ in range(200))
    assert 70 < applied < 130  # p = 0.5 per batch


def test_u2pl_cutmix_is_reproducible_with_a_generator():
    image, label, confidence = encoded_batch(4, 16, 16)
    a = u2pl_cutmix(image, label, confidence, p=1.0, generator=torch.Generator().manual_seed(3))
    b = u2pl_cutmix(image, label, confidence, p=1.0, generator=torch.Generator().manual_seed(3))
    assert torch.equal(a.mask, b.mask) and torch.equal(a.image, b.image)


def test_cutmix_boxes_hand_computed():
    # lam = 0.75 -> side ratio sqrt(0.25) = 0.5 -> 8 of 16 rows, box [c - 4, c + 4) clipped, c in [2, 16)
    g = torch.Generator().manual_seed(4)
    boxes = cutmix_boxes(6, 16, 20, 0.75, g)
    replay = torch.Generator().manual_seed(4)
    cy, cx = torch.randint(2, 16, (6,), generator=replay), torch.randint(2, 20, (6,), generator=replay)
    expected = torch.stack([(cy - 4).clamp(0, 16), (cy + 4).clamp(0, 16), (cx - 5).clamp(0, 20), (cx + 5).clamp(0, 20)], 1)
    assert torch.equal(boxes, expected)  # width: int(20 * 0.5) = 10 -> half 5


def test_psmt_cutmix_voc_one_box_from_a_permuted_partner():
    image, label, confidence = encoded_batch(5, 16, 16)
    result = psmt_cutmix(image, label, confidence, generator=torch.Generator().manual_seed(2))
    partners = []
    for i in range(5):
        assert bool((result.source[i][~result.mask[i]] == i).all())
        if result.mask[i].any():
            partner = result.source[i][result.mask[i]].unique()
            assert len(partner) == 1  # one partner per image
            partners.append(int(partner))
            y0, y1, x0, x1 = bounding_box(result.mask[i])
            assert int(result.mask[i].sum()) == (y1 - y0) * (x1 - x0)  # one rectangle
    assert len(set(partners)) == len(partners)  # partners from a permutation
    assert_moved_together(result)
    logits = torch.randn(5, 4, 16, 16)
    mixed = mix_like(logits, result.source)
    for i in range(5):
        for y, x in ((0, 0), (7, 9), (15, 3)):
            assert torch.equal(mixed[i, :, y, x], logits[int(result.source[i, y, x]), :, y, x])


def test_psmt_cutmix_random_boxes_three_boxes():
    image, label, confidence = encoded_batch(4, 30, 30)
    g = torch.Generator().manual_seed(0)
    many_partners = 0
    for _ in range(10):
        result = psmt_cutmix(image, label, confidence, scheme="random_boxes", generator=g)
        area = result.mask.flatten(1).sum(1)
        # each box covers prop / 3 of the image, prop ~ U(0.25, 0.5): 75..150 of 900 pixels (+ rounding);
        # three of them cover at most 450 (+ rounding)
        assert bool((area >= 60).all()) and bool((area <= 480).all())
        assert_moved_together(result)
        assert torch.equal(result.label, result.source)  # label i encodes image i
        many_partners += any(len(result.source[i][result.mask[i]].unique()) > 1 for i in range(4))
    assert many_partners > 0  # boxes of one image come from different partners
    with pytest.raises(ValueError, match=r"scheme: expected one of \['beta_box', 'random_boxes'\], got 'cityscapes'"):
        psmt_cutmix(image, label, scheme="cityscapes")  # the schemes are named by their boxes, not a dataset


def test_adaptive_confidence_hand_computed():
    probs = torch.zeros(4, 2, 2, 2)
    probs[0, 0] = 1.0  # one-hot everywhere: rho = 1
    probs[1] = 0.5  # uniform: entropy log 2, rho = 0
    probs[2, 0], probs[2, 1] = 0.9, 0.1  # (1 - H(0.9, 0.1) / log 2) * 0.9
    probs[3, :, 0] = 0.5  # half uniform, half one-hot: rho = 0.5
    probs[3, 1, 1] = 1.0
    entropy = -(0.9 * math.log(0.9) + 0.1 * math.log(0.1)) / math.log(2)
    expected = torch.tensor([1.0, 0.0, (1 - entropy) * 0.9, 0.5])
    assert torch.allclose(adaptive_confidence(probs, predictive_entropy(probs)), expected, atol=1e-6)
    with pytest.raises(ValueError, match="probs"):
        adaptive_confidence(probs[0], predictive_entropy(probs)[0])
    with pytest.raises(ValueError, match="entropy"):
        adaptive_confidence(probs, predictive_entropy(probs)[0])


def test_augseg_cutmix_pastes_labeled_boxes_by_confidence():
    image, label, confidence = encoded_batch(4, 16, 16)
    labeled_image, labeled_label, _ = encoded_batch(4, 16, 16, offset=10)

    def conf_of(lab):  # labeled pixels carry confidence 1
        return torch.where(lab >= 10, torch.ones_like(lab, dtype=torch.float), lab.float() / 100)

    g = torch.Generator().manual_seed(0)
    sure = augseg_cutmix(image, label, confidence, labeled_image, labeled_label, torch.ones(4), generator=g)
    assert int(sure.label.max()) < 10  # rho = 1: never a labeled box
    assert_moved_together(sure, conf_of)
    unsure_runs = [augseg_cutmix(image, label, confidence, labeled_image, labeled_label, torch.zeros(4), generator=g)
                   for _ in range(10)]
    for result in unsure_runs:
        assert_moved_together(result, conf_of)
        assert bool(result.mask.any())
        # outside the stage-2 box every image is itself; inside, pixels of other images
        assert not bool(((result.label != torch.arange(4).view(4, 1, 1)) & ~result.mask).any())
        assert not bool(((result.label >= 10) & ~result.mask).any())
    # rho = 0: stage 1 always fires, so ground truth from the labeled batch reaches the output
    assert any(int(r.label.max()) >= 10 for r in unsure_runs)
    with pytest.raises(ValueError, match="rho"):
        augseg_cutmix(image, label, confidence, labeled_image, labeled_label, torch.ones(3))


def test_augseg_cutmix_reproducible():
    image, label, confidence = encoded_batch(3, 12, 12)
    lab_image, lab_label, _ = encoded_batch(2, 12, 12, offset=10)
    rho = torch.tensor([0.2, 0.5, 0.9])
    a = augseg_cutmix(image, label, confidence, lab_image, lab_label, rho, generator=torch.Generator().manual_seed(9))
    b = augseg_cutmix(image, label, confidence, lab_image, lab_label, rho, generator=torch.Generator().manual_seed(9))
    assert torch.equal(a.label, b.label) and torch.equal(a.confidence, b.confidence)


def test_sample_beta_moments():
    g = torch.Generator().manual_seed(0)
    for a, b in ((4.0, 4.0), (8.0, 2.0), (0.5, 0.5)):
        draws = torch.tensor([sample_beta(a, b, g) for _ in range(3000)])
        mean, var = a / (a + b), a * b / ((a + b) ** 2 * (a + b + 1))
        assert abs(float(draws.mean()) - mean) < 0.02
        assert abs(float(draws.var()) - var) < 0.02
        assert 0 <= float(draws.min()) and float(draws.max()) <= 1


def test_shape_checks():
    image, label, confidence = encoded_batch(2, 8, 8)
    with pytest.raises(ValueError, match="label"):
        u2pl_cutmix(image, label[:, :4], confidence)
    with pytest.raises(ValueError, match="confidence"):
        psmt_cutmix(image, label, confidence[:1])
