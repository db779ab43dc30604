"""The reliability metrics (equal-mass ECE, AUPR, AURC, the class-balanced PAvPU) against hand-computed cases,
and the streaming accumulator against torchmetrics and exact sorting on sampled pixels.

Why the accumulator stays rather than torchmetrics: torchmetrics' exact ``BinaryAUROC`` /
``BinaryAveragePrecision`` (``thresholds=None``) and ``MulticlassCalibrationError`` keep every pixel's score and
label until ``compute`` (at 10^9 pixels, a Cityscapes validation pass at T samples, about 12 GB per rank for
AUROC alone, then a sort), whereas ``Calibration`` holds about 160 KB of histograms whatever the pixel count,
sums over DDP ranks with one all-reduce per tensor, and serves all seven metrics from them; torchmetrics' binned
variants (``thresholds=int``) have constant memory but equal-width thresholds only and one state per metric.
"""

from __future__ import annotations

import math

import pytest
import torch
from torchmetrics.classification import BinaryAUROC, BinaryAveragePrecision, MulticlassCalibrationError

from npsemiseg.evaluation import Calibration, PAvPU
from npsemiseg.evaluation.calibration import log_bin_edges, log_bin_index
from npsemiseg.evaluation.evaluator import curves_data
from npsemiseg.evaluation.metrics import pavpu_balanced_from_counts, pavpu_from_counts


@pytest.fixture(autouse=True)
def _one_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def _two_class(confidence: list[float], correct: list[bool], uncertainty: list[float], **options) -> Calibration:
    """A Calibration (K = 2) fed one pixel per value: class 0 predicted with ``confidence``, labelled 0 when
    ``correct``, else 1."""
    conf = torch.tensor(confidence, dtype=torch.float64)
    probs = torch.stack([conf, 1 - conf])[None, :, None, :].float()  # [1, 2, 1, N]
    target = torch.tensor([0 if ok else 1 for ok in correct])[None, None, :]
    calibration = Calibration(2, uncertainty_max=1.0, **options)
    calibration.update(probs, target, torch.tensor(uncertainty)[None, None, :])
    return calibration


# ---------------------------------------------------------------- known answers


def test_equal_mass_and_equal_width_ece_known_answer():
    # confidences 0.6, 0.7 | 0.9, 0.95 (two equal-mass bins), correct: no, yes | yes, yes
    cal = _two_class([0.6, 0.7, 0.9, 0.95], [False, True, True, True], [0.1, 0.2, 0.3, 0.4], num_bins=2)
    result = cal.compute()
    # equal-mass: (|0.6 + 0.7 - 1| + |0.9 + 0.95 - 2|) / 4 = (0.3 + 0.15) / 4
    assert result["ece_adaptive"] == pytest.approx(0.1125, abs=1e-7)
    # equal-width (0, 0.5], (0.5, 1]: every pixel in the upper bin, |3.15 - 3| / 4
    assert result["ece"] == pytest.approx(0.0375, abs=1e-7)


def test_error_detection_known_answers():
    # uncertainties: wrong pixels 0.9 and 0.5, right pixels 0.7 and 0.1 (distinct bins)
    cal = _two_class([0.8, 0.8, 0.8, 0.8], [False, False, True, True], [0.9, 0.5, 0.7, 0.1])
    result = cal.compute()
    # wrong above right in 3 of the 4 (wrong, right) pairs
    assert result["auroc"] == pytest.approx(0.75, abs=1e-12)
    # most uncertain first: W R W R -> recall 1/2 at precision 1, recall 1 at precision 2/3
    assert result["aupr"] == pytest.approx(0.5 * 1 + 0.5 * 2 / 3, abs=1e-12)
    # most certain first: R W R W -> risks 0, 1/2, 1/3, 2/4 at coverages 1/4 .. 4/4
    assert result["aurc"] == pytest.approx((0 + 1 / 2 + 1 / 3 + 2 / 4) / 4, abs=1e-12)
    curve = cal.risk_coverage()
    assert curve["coverage"].tolist() == pytest.approx([0.25, 0.5, 0.75, 1.0])
    assert curve["risk"].tolist() == pytest.approx([0.0, 0.5, 1 / 3, 0.5])


def test_a_perfect_ranking_has_auroc_and_aupr_one_and_the_lowest_aurc():
    cal = _two_class([0.8] * 4, [True, True, False, False], [0.1, 0.2, 0.6, 0.7])
    result = cal.compute()
    assert result["auroc"] == 1.0 and result["aupr"] == 1.0
    # the two right pixels first (risk 0), then 1/3 and 2/4
    assert result["aurc"] == pytest.approx((0 + 0 + 1 / 3 + 1 / 2) / 4, abs=1e-12)


def test_tied_pixels_share_one_bin_and_count_half():
    # every pixel at the same uncertainty: no ranking at all
    cal = _two_class([0.8] * 4, [True, False, True, False], [0.3] * 4)
    result = cal.compute()
    assert result["auroc"] == 0.5
    assert result["aupr"] == pytest.approx(0.5)  # the base rate of wrong pixels
    assert result["aurc"] == pytest.approx(0.5)  # one point: coverage 1 at risk 1/2


def test_all_right_leaves_detection_undefined_but_aurc_zero():
    cal = _two_class([0.9, 0.8], [True, True], [0.1, 0.2])
    result = cal.compute()
    assert math.isnan(result["auroc"]) and math.isnan(result["aupr"]) and result["aurc"] == 0.0


def test_log_bins_are_monotone_and_tell_close_small_values_apart():
    values = torch.tensor([0.0, 1e-5, 1.1e-5, 0.5, 0.502, 1.0], dtype=torch.float64)
    index = log_bin_index(values, 1.0, 4096)
    assert index.tolist() == sorted(index.tolist()) and len(set(index.tolist())) == len(values)
    edges = log_bin_edges(1.0, 4096)
    assert edges[0] == 0 and edges[-1] == pytest.approx(1.0)
    # every value lies in the bin its edges say
    assert all(edges[i] - 1e-12 <= v <= edges[i + 1] + 1e-12 for i, v in zip(index.tolist(), values.tolist()))


def test_balanced_pavpu_known_answer_and_undefined_without_inaccurate_patches():
    counts = torch.tensor([6, 2, 1, 1])  # n_ac, n_au, n_ic, n_iu
    assert pavpu_from_counts(counts) == pytest.approx(0.7)
    assert pavpu_balanced_from_counts(counts) == pytest.approx(0.5 * (6 / 8 + 1 / 2))
    assert math.isnan(pavpu_balanced_from_counts(torch.tensor([9, 1, 0, 0])))


def test_balanced_pavpu_does_not_reward_a_head_that_is_certain_everywhere():
    # 1 x 1 patches: 9 accurate pixels, 1 inaccurate one, and a head certain everywhere (entropy 0)
    pred = torch.zeros(1, 1, 10, dtype=torch.long)
    target = pred.clone()
    target[0, 0, 9] = 1
    patches = PAvPU(2, window=1)
    patches.update(pred, target, torch.zeros(1, 1, 10))
    result = patches.compute()
    assert result["pavpu"] == pytest.approx(0.9)  # PAvPU: 9 accurate-certain of 10
    assert result["pavpu_balanced"] == pytest.approx(0.5)  # no inaccurate patch found: chance


def test_curves_data_is_json_ready_and_thinned():
    cal = _two_class([0.6, 0.9], [False, True], [0.5, 0.1])
    data = curves_data(cal.reliability(), cal.risk_coverage())
    assert data["risk_coverage"] == {"coverage": [0.5, 1.0], "risk": [0.0, 0.5]}
    assert data["reliability"]["accuracy"][0] is None  # an empty bin: NaN becomes null
    many = {"coverage": torch.linspace(0.001, 1, 1000, dtype=torch.float64), "risk": torch.zeros(1000)}
    assert len(curves_data(cal.reliability(), many)["risk_coverage"]["coverage"]) <= 257


# ---------------------------------------------------------------- against torchmetrics and exact sorting


def _sampled(seed: int = 0, pixels: int = 20_000, classes: int = 5):
    """Pixels of a plausible segmentation output: sharp softmaxes (most confidences near 1), labels drawn
    from them (so the probabilities are roughly calibrated) and the entropy as the uncertainty."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(pixels, classes, generator=gen, dtype=torch.float64) * 4
    probs = torch.softmax(logits, 1)
    labels = torch.multinomial(probs, 1, generator=gen).squeeze(1)
    entropy = -(probs * probs.clamp_min(1e-30).log()).sum(1)
    cal = Calibration(classes)
    cal.update(probs.float().T[None, :, None, :], labels[None, None, :], entropy.float()[None, None, :])
    wrong = (probs.float().argmax(1) != labels).long()
    # the entropy / log K as the scores torchmetrics sees (in [0, 1], the same order)
    return cal, probs.float(), labels, entropy.float() / math.log(classes), wrong


def _binned(cal: Calibration, entropy: torch.Tensor) -> torch.Tensor:
    """The bin of each pixel as a score in [0, 1] (torchmetrics takes scores outside [0, 1] for logits)."""
    return log_bin_index(entropy, cal.uncertainty_max, cal.uncertainty_bins).double() / cal.uncertainty_bins


def test_ece_equals_torchmetrics_multiclass_calibration_error():
    cal, probs, labels, _, _ = _sampled()
    expected = MulticlassCalibrationError(num_classes=5, n_bins=15, norm="l1")(probs, labels)
    # the same 15 equal-width bins; torchmetrics sums in float32, the accumulator in float64
    assert cal.compute()["ece"] == pytest.approx(float(expected), abs=1e-5)


def test_auroc_and_aupr_equal_torchmetrics_on_the_binned_scores_and_stay_within_the_ties_bound():
    cal, _, _, entropy, wrong = _sampled(seed=1)
    result = cal.compute()
    binned = _binned(cal, entropy * math.log(5))
    # the accumulator's definition: the exact values on the bin indices
    assert result["auroc"] == pytest.approx(float(BinaryAUROC()(binned, wrong)), abs=1e-6)
    assert result["aupr"] == pytest.approx(float(BinaryAveragePrecision()(binned, wrong)), abs=1e-6)
    # on the raw entropies: AUROC moves by at most half the share of (wrong, right) pairs tied in a bin
    right_hist, wrong_hist = cal.uncertainty_histograms.double()
    tied_pairs = float((right_hist * wrong_hist).sum() / (right_hist.sum() * wrong_hist.sum()))
    assert abs(result["auroc"] - float(BinaryAUROC()(entropy, wrong))) <= tied_pairs / 2 + 1e-6
    # AUPR: a wrong pixel of bin b gets the precision at the bin's end; within the bin the precision moves by at
    # most (pixels of b) / (pixels flagged before b + 1)
    count = (right_hist + wrong_hist).flip(0)
    before = torch.cumsum(count, 0) - count
    bound = float(((wrong_hist.flip(0) / wrong_hist.sum()) * (count / (before + 1)).clamp(max=1)).sum())
    assert abs(result["aupr"] - float(BinaryAveragePrecision()(entropy, wrong))) <= bound + 1e-6


def test_aurc_and_equal_mass_ece_match_exact_sorting_within_one_bin():
    cal, probs, labels, entropy, wrong = _sampled(seed=2)
    result = cal.compute()
    # AURC exactly: sort by uncertainty, the error rate of the k most certain pixels, averaged over k
    order = torch.sort(entropy.double(), stable=True).indices  # entropy / log K: the same order
    risks = torch.cumsum(wrong[order].double(), 0) / torch.arange(1, len(order) + 1, dtype=torch.float64)
    right_hist, wrong_hist = cal.uncertainty_histograms.double()
    count = right_hist + wrong_hist
    before = torch.cumsum(count, 0) - count
    # a pixel of bin b gets the risk at the bin's end: off by at most (pixels of b) / (pixels before b + 1)
    bound = float(((count / count.sum()) * (count / (before + 1)).clamp(max=1)).sum())
    assert abs(result["aurc"] - float(risks.mean())) <= bound + 1e-9
    # equal-mass ECE exactly: 15 chunks of equal count in order of confidence
    confidence, prediction = probs.double().max(1)
    correct = (prediction == labels).double()
    order = torch.sort(confidence, stable=True).indices
    exact = sum(abs(float(c.sum() - k.sum())) for c, k in zip(confidence[order].tensor_split(15),
                                                               correct[order].tensor_split(15))) / len(order)
    # a fine bin goes whole to one group: each of the 14 boundaries moves at most one fine bin's pixels,
    # each moved pixel changing two groups' gaps by at most 1
    largest_fine_bin = float(cal.confidence_histogram[0].max())
    assert abs(result["ece_adaptive"] - exact) <= 2 * 14 * largest_fine_bin / len(order) + 1e-6


def test_the_cost_benchmark_switches_the_calibration_off_and_times_four_cases_per_head():
    from benchmark_scripts import load_benchmark

    bench = load_benchmark("reliability_cost")
    args = bench.argparse.Namespace(heads=["baseline"], backbone="resnet_small", num_classes=3, samples=2)
    data = bench.Images(1, 32, 3)
    cases = bench.build_cases(args, data, torch.device("cpu"))
    assert sorted(cases) == ["baseline/calibration", "baseline/full", "baseline/no_calibration", "baseline/predict"]
    full, bare = cases["baseline/full"](), cases["baseline/no_calibration"]()
    assert {"ece", "ece_adaptive", "aurc"} <= set(full) and not {"ece", "aurc"} & set(bare)
    assert bare["miou"] == full["miou"]  # the rest of the evaluation is untouched
    assert cases["baseline/calibration"]()["ece"] == pytest.approx(full["ece"])
