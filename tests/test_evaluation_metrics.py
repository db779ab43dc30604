"""mIoU, PAvPU and calibration metrics against hand-computed cases and direct formulas."""

from __future__ import annotations

import itertools
import math
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from npsemiseg.evaluation import Calibration, ConfusionMatrix, PAvPU, evaluate, miou, pavpu
from npsemiseg.evaluation.metrics import confusion_matrix, pavpu_balanced_from_counts, pavpu_counts

IGN = 255


@pytest.fixture(autouse=True)
def _one_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


# ---------------------------------------------------------------- mIoU


def test_miou_hand_computed_with_ignore_and_absent_class():
    # 4 classes; class 3 appears in neither prediction nor target
    target = torch.tensor([[[0, 0, 1, 1], [2, 2, IGN, IGN]]])
    pred = torch.tensor([[[0, 1, 1, 1], [2, 0, 2, 0]]])
    # valid pixels: (t,p) = (0,0) (0,1) (1,1) (1,1) (2,2) (2,0); the two ignored pixels are dropped
    # class 0: I=1, U = target 2 + pred 2 - 1 = 3  -> 1/3
    # class 1: I=2, U = 2 + 3 - 2 = 3               -> 2/3
    # class 2: I=1, U = 2 + 1 - 1 = 2               -> 1/2
    value, per_class = miou(pred, target, num_classes=4)
    assert per_class[:3].tolist() == pytest.approx([1 / 3, 2 / 3, 1 / 2])
    assert math.isnan(per_class[3].item())
    assert value == pytest.approx((1 / 3 + 2 / 3 + 1 / 2) / 3)


def test_class_only_in_prediction_counts_with_iou_zero():
    target = torch.tensor([[[0, 0], [0, 0]]])
    pred = torch.tensor([[[0, 0], [0, 1]]])
    value, per_class = miou(pred, target, num_classes=3)
    assert per_class[0].item() == pytest.approx(3 / 4)
    assert per_class[1].item() == 0.0
    assert math.isnan(per_class[2].item())
    assert value == pytest.approx(3 / 8)


def test_confusion_rows_are_targets_and_ignored_pixels_do_not_count():
    target = torch.tensor([[0, 1, IGN]])
    pred = torch.tensor([[1, 1, 0]])
    assert confusion_matrix(pred, target, 2).tolist() == [[0, 1], [0, 1]]


def test_accumulation_over_batches_equals_one_shot():
    gen = torch.Generator().manual_seed(0)
    target = torch.randint(0, 5, (6, 9, 11), generator=gen)
    target[torch.rand(target.shape, generator=gen) < 0.2] = IGN
    pred = torch.randint(0, 5, (6, 9, 11), generator=gen)
    acc = ConfusionMatrix(5)
    for i in range(0, 6, 2):
        acc.update(pred[i : i + 2], target[i : i + 2])
    result = acc.compute()
    one_shot, per_class = miou(pred, target, 5)
    assert result["miou"] == pytest.approx(one_shot)
    assert torch.allclose(result["per_class_iou"], per_class, equal_nan=True)
    valid = target != IGN
    assert result["pixel_acc"] == pytest.approx(((pred == target) & valid).sum().item() / valid.sum().item())


@pytest.mark.parametrize(
    "pred, target, match",
    [
        (torch.zeros(1, 2, 2, dtype=torch.long), torch.zeros(1, 2, 3, dtype=torch.long), "same shape"),
        (torch.zeros(1, 2, 2), torch.zeros(1, 2, 2, dtype=torch.long), "pred: expected an integer"),
        (torch.full((1, 2, 2), 3), torch.zeros(1, 2, 2, dtype=torch.long), r"pred: expected classes in \[0, 3\)"),
        (torch.zeros(1, 2, 2, dtype=torch.long), torch.full((1, 2, 2), 7), "target: expected classes"),
    ],
)
def test_bad_maps_raise_value_error(pred, target, match):
    with pytest.raises(ValueError, match=match):
        miou(pred, target, num_classes=3)


# ---------------------------------------------------------------- PAvPU


def test_pavpu_hand_computed_patches_edges_and_empty():
    # a 5x6 map with window 3 -> patches rows [0:3],[3:5] x cols [0:3],[3:6]
    target = torch.zeros(1, 5, 6, dtype=torch.long)
    pred = torch.zeros(1, 5, 6, dtype=torch.long)
    unc = torch.zeros(1, 5, 6)
    # patch A (rows 0-2, cols 0-2): 9 valid, 5 wrong -> inaccurate; mean unc 0.75 -> uncertain (iu)
    pred[0, 0, 0:3] = 1
    pred[0, 1, 0:2] = 1
    unc[0, 0:3, 0:3] = 0.75
    # patch B (rows 0-2, cols 3-5): all ignored -> excluded, whatever pred/unc say
    target[0, 0:3, 3:6] = IGN
    unc[0, 0:3, 3:6] = 1.0
    # patch C (edge, rows 3-4, cols 0-2): 6 pixels, 3 ignored, of the 3 valid 1 wrong -> accurate;
    # uncertainty high only on ignored pixels -> mean over valid = 0.0 -> certain (ac)
    target[0, 3, 0:3] = IGN
    unc[0, 3, 0:3] = 2.0
    pred[0, 4, 0] = 1
    # patch D (edge, rows 3-4, cols 3-5): 6 valid, exactly 3 correct (accuracy 0.5 -> accurate by >=),
    # mean uncertainty exactly 0.5 with threshold 0.5 -> uncertain (au)
    pred[0, 3, 3:6] = 1
    unc[0, 3:5, 3:6] = 0.5
    counts = pavpu_counts(pred, target, unc, window=3, uncertainty_threshold=0.5)
    assert counts.tolist() == [1, 1, 0, 1]  # n_ac, n_au, n_ic, n_iu
    assert pavpu(pred, target, unc, window=3, uncertainty_threshold=0.5) == pytest.approx(2 / 3)
    # just above the patch D uncertainty, D becomes certain: (ac=2, iu=1) -> 3/3
    assert pavpu(pred, target, unc, window=3, uncertainty_threshold=0.5000001) == pytest.approx(1.0)
    # an accuracy threshold just above 1/2 makes D inaccurate (and still uncertain): A iu, C ac, D iu
    assert pavpu_counts(pred, target, unc, window=3, accuracy_threshold=0.51, uncertainty_threshold=0.5).tolist() == [
        1,
        0,
        0,
        2,
    ]


def test_pavpu_default_threshold_equality_at_0_4():
    target = torch.zeros(1, 64, 64, dtype=torch.long)
    pred = torch.zeros(1, 64, 64, dtype=torch.long)
    at_threshold = torch.full((1, 64, 64), 0.4)
    # accurate and (mean uncertainty == 0.4) uncertain -> au -> PAvPU 0
    assert pavpu(pred, target, at_threshold) == 0.0
    assert pavpu(pred, target, torch.full((1, 64, 64), 0.39)) == 1.0


def test_pavpu_counts_pool_over_batch_and_match_accumulator():
    gen = torch.Generator().manual_seed(1)
    target = torch.randint(0, 3, (3, 70, 130), generator=gen)
    target[:, :, :40] = IGN
    pred = torch.where(torch.rand(target.shape, generator=gen) < 0.6, target.clamp_max(2), 0)
    entropy = torch.rand(target.shape, generator=gen) * math.log(3)
    acc = PAvPU(3)
    for i in range(3):
        acc.update(pred[i : i + 1], target[i : i + 1], entropy[i : i + 1])
    assert acc.compute()["pavpu"] == pytest.approx(pavpu(pred, target, entropy))
    counts = pavpu_counts(pred, target, entropy)
    assert acc.compute()["pavpu_balanced"] == pytest.approx(pavpu_balanced_from_counts(counts), nan_ok=True)
    normalized = PAvPU(3, normalize=True)
    normalized.update(pred, target, entropy)
    assert set(normalized.compute()) == {"pavpu_normalized", "pavpu_normalized_balanced"}
    assert normalized.compute()["pavpu_normalized"] == pytest.approx(pavpu(pred, target, entropy / math.log(3)))


def test_pavpu_matches_a_loop_over_patches():
    gen = torch.Generator().manual_seed(2)
    target = torch.randint(0, 2, (2, 23, 17), generator=gen)
    target[torch.rand(target.shape, generator=gen) < 0.3] = IGN
    target[0, :8, :8] = IGN
    pred = torch.randint(0, 2, target.shape, generator=gen)
    unc = torch.rand(target.shape, generator=gen)
    good = total = 0
    for b, r, c in itertools.product(range(2), range(0, 23, 8), range(0, 17, 8)):
        t, p, u = target[b, r : r + 8, c : c + 8], pred[b, r : r + 8, c : c + 8], unc[b, r : r + 8, c : c + 8]
        valid = t != IGN
        if not valid.any():
            continue
        accurate = (p[valid] == t[valid]).double().mean() >= 0.5
        uncertain = u[valid].double().mean() >= 0.4
        good += int(accurate != uncertain)
        total += 1
    assert pavpu(pred, target, unc, window=8) == pytest.approx(good / total)


# ---------------------------------------------------------------- calibration


def _random_probs(gen, shape):
    return torch.softmax(torch.randn(shape, generator=gen) * 2, dim=1)


def test_ece_nll_brier_match_direct_formulas_and_accumulate():
    gen = torch.Generator().manual_seed(3)
    probs = _random_probs(gen, (4, 5, 6, 7))
    target = torch.randint(0, 5, (4, 6, 7), generator=gen)
    target[:, 0, :] = IGN
    entropy = -(probs * probs.log()).sum(1)
    cal = Calibration(5)
    for i in range(4):
        cal.update(probs[i : i + 1], target[i : i + 1], entropy[i : i + 1])
    result = cal.compute()

    valid = target != IGN
    p = probs.movedim(1, -1)[valid].double()
    y = target[valid]
    conf, pred = p.max(1)
    correct = (pred == y).double()
    ece = 0.0
    for b in range(15):
        in_bin = (conf > b / 15) & (conf <= (b + 1) / 15)
        if in_bin.any():
            ece += in_bin.double().mean() * (conf[in_bin].mean() - correct[in_bin].mean()).abs()
    onehot = torch.nn.functional.one_hot(y, 5).double()
    assert result["ece"] == pytest.approx(float(ece))
    assert result["nll"] == pytest.approx(float(-p[torch.arange(len(y)), y].log().mean()))
    assert result["brier"] == pytest.approx(float(((p - onehot) ** 2).sum(1).mean()))
    rel = cal.reliability()
    assert rel["count"].sum().item() == valid.sum().item()
    assert torch.isnan(rel["accuracy"][0])  # max prob of 5 classes is never <= 1/15


def test_perfectly_confident_and_right_is_perfectly_calibrated():
    target = torch.tensor([[[0, 1], [1, 0]]])
    probs = torch.nn.functional.one_hot(target, 2).movedim(-1, 1).float()
    cal = Calibration(2)
    cal.update(probs, target, torch.zeros(1, 2, 2))
    result = cal.compute()
    assert result["ece"] == 0.0 and result["brier"] == 0.0 and result["nll"] == pytest.approx(0.0, abs=1e-9)
    assert math.isnan(result["auroc"])  # no wrong pixel


def _pairwise_auroc(wrong_scores, right_scores):
    wins = 0.0
    for w in wrong_scores:
        for r in right_scores:
            wins += 1.0 if w > r else 0.5 if w == r else 0.0
    return wins / (len(wrong_scores) * len(right_scores))


def test_auroc_matches_brute_force_pairs_with_ties():
    gen = torch.Generator().manual_seed(4)
    # uncertainties on a grid of 1/16 steps in [0, log 3): distinct values never share a (log-spaced) bin, ties exist
    levels = torch.arange(16, dtype=torch.float64) / 16 * math.log(3)
    unc = levels[torch.randint(0, 16, (2, 5, 6), generator=gen)].float()
    target = torch.randint(0, 3, (2, 5, 6), generator=gen)
    target[0, 0, :3] = IGN
    probs = _random_probs(gen, (2, 3, 5, 6))
    cal = Calibration(3)
    cal.update(probs, target, unc)
    valid = target != IGN
    wrong = probs.argmax(1) != target
    wrong_scores = unc[valid & wrong].tolist()
    right_scores = unc[valid & ~wrong].tolist()
    assert wrong_scores and right_scores
    assert cal.compute()["auroc"] == pytest.approx(_pairwise_auroc(wrong_scores, right_scores))


def test_calibration_rejects_mismatched_shapes():
    cal = Calibration(3)
    with pytest.raises(ValueError, match="probs: expected"):
        cal.update(torch.rand(1, 4, 2, 2), torch.zeros(1, 2, 2, dtype=torch.long), torch.zeros(1, 2, 2))
    with pytest.raises(ValueError, match="target, uncertainty"):
        cal.update(torch.rand(1, 3, 2, 2), torch.zeros(1, 2, 3, dtype=torch.long), torch.zeros(1, 2, 2))


# ---------------------------------------------------------------- DDP


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Items(torch.utils.data.Dataset):
    """Three small images with labels, generated from their index."""

    def __len__(self):
        return 3

    def __getitem__(self, index):
        gen = torch.Generator().manual_seed(index)
        return {"image": torch.rand(3, 24, 20 + index, generator=gen),
                "label": torch.randint(0, 3, (24, 20 + index), generator=gen)}


def _tiny_segmentor():
    from npsemiseg.models import build_segmentor

    torch.manual_seed(0)
    return build_segmentor(
        num_classes=3, head="baseline", backbone="resnet_small", aspp_channels=16, low_level_channels=8
    ).eval()


def _ddp_worker(rank, world_size, port, pred, target, entropy, queue):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        confusion, patches = ConfusionMatrix(4), PAvPU(4)
        calibration = Calibration(4)
        if rank == 0:  # rank 1 sees no data at all and must still take part
            confusion.update(pred, target)
            patches.update(pred, target, entropy)
            calibration.update(_one_hot_probs(pred), target, entropy)
        for acc in (confusion, patches, calibration):
            acc.all_reduce()
        evaluated = evaluate(_tiny_segmentor(), _Items(), num_classes=3)  # rank 0: items 0, 2; rank 1: item 1
        queue.put((rank, confusion.confusion.tolist(), patches.compute(), calibration.compute(), evaluated))
    finally:
        dist.destroy_process_group()


def _one_hot_probs(pred):
    return torch.nn.functional.one_hot(pred, 4).movedim(-1, 1).float() * 0.7 + 0.075


@pytest.mark.integration  # two spawned processes importing torch: ~10 s on the shared CPU
def test_all_reduce_over_two_gloo_processes():
    gen = torch.Generator().manual_seed(5)
    target = torch.randint(0, 4, (2, 8, 8), generator=gen)
    pred = torch.randint(0, 4, (2, 8, 8), generator=gen)
    entropy = torch.rand(2, 8, 8, generator=gen)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [
        ctx.Process(target=_ddp_worker, args=(rank, 2, port, pred, target, entropy, queue)) for rank in range(2)
    ]
    for p in procs:
        p.start()
    results = sorted((queue.get(timeout=180) for _ in procs), key=lambda r: r[0])
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    expected = confusion_matrix(pred, target, 4).tolist()
    assert results[0][1] == results[1][1] == expected
    assert results[0][2]["pavpu"] == results[1][2]["pavpu"] == pavpu(pred, target, entropy, window=64)
    assert results[0][2] == pytest.approx(results[1][2], nan_ok=True)
    single = Calibration(4)
    single.update(_one_hot_probs(pred), target, entropy)
    for rank_result in results:
        assert rank_result[3] == pytest.approx(single.compute(), nan_ok=True)
    alone = evaluate(_tiny_segmentor(), _Items(), num_classes=3, distributed=False)
    for rank_result in results:
        evaluated = dict(rank_result[4], seconds_per_image=alone["seconds_per_image"])
        assert evaluated == pytest.approx(alone, nan_ok=True)
