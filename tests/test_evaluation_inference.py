"""Inference modes, evaluate, figures and timing on tiny real segmentors (resnet_small)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from PIL import Image

from npsemiseg.evaluation import (
    SLIDING_SCHEMES,
    SlidingScheme,
    center_crop,
    evaluate,
    miou,
    predict,
    save_uncertainty_figure,
    sliding_windows,
    time_interleaved,
)
from npsemiseg.evaluation.calibration import Calibration
from npsemiseg.evaluation.inference import window_starts
from npsemiseg.evaluation.visualize import IGNORE_COLOUR, save_reliability_diagram
from npsemiseg.heads import predictive
from npsemiseg.models import IMAGENET_MEAN, build_segmentor, upsample_logits

K = 3


@pytest.fixture(autouse=True)
def _one_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def _segmentor(head: str, **head_options):
    torch.manual_seed(0)
    model = build_segmentor(
        num_classes=K, head=head, backbone="resnet_small", aspp_channels=16, low_level_channels=8,
        head_options=head_options or None,
    )
    if head == "np":  # fill the memories with one training-mode step, as training would
        images = torch.rand(2, 3, 32, 32)
        labels = torch.randint(0, K, (2, 32, 32))
        model.train()
        model(images, labels=labels, num_context=1)
    return model.eval()


@pytest.fixture(scope="module")
def baseline():
    return _segmentor("baseline")


@pytest.fixture(scope="module")
def mc_dropout():
    return _segmentor("mc_dropout", training_samples=3)


@pytest.fixture(scope="module")
def np_model():
    return _segmentor("np", training_samples=3, hidden_channels=16, memory_size=64, enqueue_per_class=64)


def _images(height, width, batch=2, seed=1):
    return torch.rand(batch, 3, height, width, generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------- windows


def test_named_schemes_on_cityscapes_size():
    u2pl, augseg = SLIDING_SCHEMES["u2pl"], SLIDING_SCHEMES["augseg"]
    assert (u2pl.window, u2pl.stride, augseg.window, augseg.stride) == (769, 513, 800, 533)
    assert window_starts(1024, 769, 513, "shift") == [0, 255]
    assert window_starts(2048, 769, 513, "shift") == [0, 513, 1026, 1279]
    assert window_starts(1024, 800, 533, "clip") == [0, 533]
    assert window_starts(2048, 800, 533, "clip") == [0, 533, 1066, 1599]
    windows = sliding_windows(1024, 2048, augseg)
    assert len(windows) == 8 and windows[-1] == (slice(533, 1024), slice(1599, 2048))


@pytest.mark.parametrize("placement", ["shift", "clip"])
@pytest.mark.parametrize("height, width, window, stride", [(37, 45, 16, 11), (33, 17, 9, 9), (7, 40, 13, 5)])
def test_windows_cover_every_pixel_and_stay_inside(placement, height, width, window, stride):
    count = torch.zeros(height, width)
    for rows, cols in sliding_windows(height, width, SlidingScheme(window, stride, placement)):
        assert 0 <= rows.start < rows.stop <= height and 0 <= cols.start < cols.stop <= width
        if placement == "shift":  # shifted windows are full-size wherever the image allows
            assert rows.stop - rows.start == min(window, height) and cols.stop - cols.start == min(window, width)
        count[rows, cols] += 1
    assert count.min() >= 1


def test_bad_scheme_and_mode_raise(baseline):
    with pytest.raises(ValueError, match="stride"):
        SlidingScheme(10, 11)
    with pytest.raises(ValueError, match="scheme"):
        predict(baseline, _images(8, 8), mode="sliding", scheme="mmseg")
    with pytest.raises(ValueError, match="mode"):
        predict(baseline, _images(8, 8), mode="tiles")
    with pytest.raises(ValueError, match="images"):
        predict(baseline, torch.rand(3, 8, 8))


# ---------------------------------------------------------------- modes


def test_whole_is_the_predictive_of_upsampled_logits(mc_dropout):
    images = _images(29, 35)
    torch.manual_seed(3)
    probs, entropy = predict(mc_dropout, images, num_samples=4)
    torch.manual_seed(3)
    logits = upsample_logits(mc_dropout(images, num_samples=4).head.logits, (29, 35))
    assert logits.shape[0] == 4
    expected_probs, expected_entropy = predictive(logits)
    assert torch.allclose(probs, expected_probs) and torch.allclose(entropy, expected_entropy)
    assert torch.allclose(probs.sum(1), torch.ones(2, 29, 35))


@pytest.mark.parametrize("scheme", ["u2pl", "augseg"])
@pytest.mark.parametrize("model_name", ["baseline", "mc_dropout", "np_model"])
def test_sliding_with_window_covering_the_image_equals_whole(request, scheme, model_name):
    """One window covering the image is the whole prediction (``augseg`` needs the stride past the image too:
    its windows start at every multiple of the stride below the side)."""
    model = request.getfixturevalue(model_name)
    images = _images(27, 30)
    torch.manual_seed(4)
    whole = predict(model, images, mode="whole")
    torch.manual_seed(4)
    sliding = predict(model, images, mode="sliding", scheme=scheme, crop_size=32, stride=32)
    assert torch.allclose(whole[0], sliding[0], atol=1e-6) and torch.allclose(whole[1], sliding[1], atol=1e-5)


def test_clipped_windows_start_at_every_stride_below_the_side_even_inside_one_window():
    """AugSeg's and UniMatch's loops (``while row < h: ...; row += stride``): a side between the stride and the
    window gets a second window, cut at the border; shifted windows give it one."""
    assert window_starts(27, 32, 22, "clip") == [0, 22]
    assert window_starts(27, 32, 22, "shift") == [0]
    assert window_starts(22, 32, 22, "clip") == [0]
    windows = sliding_windows(27, 30, SlidingScheme(32, 22, "clip", "probs"))
    assert windows == [(slice(0, 27), slice(0, 30)), (slice(0, 27), slice(22, 30)),
                       (slice(22, 27), slice(0, 30)), (slice(22, 27), slice(22, 30))]


def test_sliding_logits_scheme_averages_logits_by_count(baseline):
    images = _images(21, 26)
    scheme = SlidingScheme(16, 8, "shift", "logits")
    probs, _ = predict(baseline, images, mode="sliding", scheme=scheme)
    total, count = torch.zeros(1, 2, K, 21, 26), torch.zeros(21, 26)
    for top in (0, 5):
        for left in (0, 8, 10):
            window = images[..., top : top + 16, left : left + 16]
            total[..., top : top + 16, left : left + 16] += upsample_logits(baseline(window).head.logits, (16, 16))
            count[top : top + 16, left : left + 16] += 1
    assert torch.allclose(probs, predictive(total / count)[0], atol=1e-6)


def test_sliding_probs_scheme_averages_predictive_probs(mc_dropout):
    images = _images(20, 20, batch=1)
    torch.manual_seed(5)
    probs, entropy = predict(mc_dropout, images, mode="sliding", scheme=SlidingScheme(16, 12, "clip", "probs"))
    torch.manual_seed(5)
    total, count = torch.zeros(1, K, 20, 20), torch.zeros(20, 20)
    for top in (0, 12):
        for left in (0, 12):
            window = images[..., top : top + 16, left : left + 16]
            h, w = window.shape[-2:]
            total[..., top : top + h, left : left + w] += predictive(
                upsample_logits(mc_dropout(window).head.logits, (h, w))
            )[0]
            count[top : top + h, left : left + w] += 1
    expected = total / count
    assert torch.allclose(probs, expected, atol=1e-6)
    assert torch.allclose(entropy, -(expected * expected.log()).sum(1), atol=1e-5)


def test_center_crop_pads_a_small_image_with_the_mean_and_crops_back(baseline):
    images = _images(17, 22)
    probs, entropy = predict(baseline, images, mode="center_crop", crop_size=32)
    padded = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1).repeat(2, 1, 32, 32)
    top, left = (32 - 17) // 2, (32 - 22) // 2  # U2PL: pad // 2 before, the rest after
    padded[..., top : top + 17, left : left + 22] = images
    whole_probs, whole_entropy = predict(baseline, padded, mode="whole")
    assert probs.shape == (2, K, 17, 22)
    assert torch.allclose(probs, whole_probs[..., top : top + 17, left : left + 22], atol=1e-6)
    assert torch.allclose(entropy, whole_entropy[..., top : top + 17, left : left + 22], atol=1e-5)
    # padding changes the prediction near the border, so center_crop is not just whole
    assert not torch.allclose(probs, predict(baseline, images, mode="whole")[0], atol=1e-4)


def test_center_crop_of_a_larger_image_keeps_the_center(baseline):
    images = _images(40, 20)
    probs, _ = predict(baseline, images, mode="center_crop", crop_size=24)
    assert probs.shape == (2, K, 24, 20)
    region = images[..., 8:32, :]
    assert torch.equal(center_crop(images, 24), region)
    padded = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1).repeat(2, 1, 24, 24)
    padded[..., :, 2:22] = region
    assert torch.allclose(probs, predict(baseline, padded)[0][..., 2:22], atol=1e-6)


# ---------------------------------------------------------------- sliding_global


def test_sliding_global_decodes_every_window_with_one_latent(np_model):
    images = _images(40, 44)
    seen = []
    hook = np_model.head.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append(kwargs.get("latent")), with_kwargs=True
    )
    try:
        torch.manual_seed(6)
        probs, _ = predict(np_model, images, mode="sliding_global", crop_size=24, stride=16, num_samples=4)
        seen_global = list(seen)
        seen.clear()
        predict(np_model, images, mode="sliding", crop_size=24, stride=16, num_samples=4)
    finally:
        hook.remove()
    windows = len(sliding_windows(40, 44, SlidingScheme(24, 16)))
    assert windows == 2 * 3 and len(seen_global) == windows
    assert all(latent is seen_global[0] for latent in seen_global)
    assert seen_global[0].z.shape == (4, 2, np_model.head.latent_dim)
    assert seen == [None] * windows  # plain sliding: each window infers its own latent

    # the same latent, inferred by hand from the image downscaled to one window's area
    torch.manual_seed(6)
    scale = math.sqrt(24 * 24 / (40 * 44))
    small = torch.nn.functional.interpolate(
        images, size=(round(40 * scale), round(44 * scale)), mode="bilinear", antialias=True
    )
    latent = np_model.head.infer_latent(np_model.extract(small), 4)
    total, count = torch.zeros(4, 2, K, 40, 44), torch.zeros(40, 44)
    for rows, cols in sliding_windows(40, 44, SlidingScheme(24, 16)):
        window = images[..., rows, cols]
        total[..., rows, cols] += upsample_logits(np_model(window, latent=latent).head.logits, window.shape[-2:])
        count[rows, cols] += 1
    assert torch.allclose(probs, predictive(total / count)[0], atol=1e-5)


def test_sliding_global_with_full_scale_single_window_equals_whole(np_model):
    images = _images(25, 31)
    torch.manual_seed(7)
    whole = predict(np_model, images, num_samples=3)
    torch.manual_seed(7)
    global_ = predict(np_model, images, mode="sliding_global", crop_size=32, num_samples=3, global_scale=1.0)
    assert torch.allclose(whole[0], global_[0], atol=1e-6)


def test_sliding_global_needs_an_np_head(mc_dropout):
    with pytest.raises(ValueError, match="infer_latent"):
        predict(mc_dropout, _images(20, 20), mode="sliding_global", crop_size=16)


# ---------------------------------------------------------------- evaluate


def test_evaluate_matches_metrics_of_predict_and_restores_mode(mc_dropout):
    images = _images(24, 28, batch=3, seed=8)
    labels = torch.randint(0, K, (3, 24, 28), generator=torch.Generator().manual_seed(9))
    labels[:, :3] = 255
    batches = [{"image": images[:2], "label": labels[:2]}, {"image": images[2:], "label": labels[2:]}]
    mc_dropout.train()
    torch.manual_seed(10)
    metrics = evaluate(mc_dropout, batches, num_classes=K, num_samples=2, class_names=["a", "b", "c"])
    assert mc_dropout.training
    mc_dropout.eval()
    torch.manual_seed(10)
    probs = torch.cat([predict(mc_dropout, b["image"], num_samples=2)[0] for b in batches])
    expected_miou, per_class = miou(probs.argmax(1), labels, K)
    assert metrics["miou"] == pytest.approx(expected_miou)
    assert [metrics[f"iou/{n}"] for n in "abc"] == pytest.approx(per_class.tolist())
    calibration = Calibration(K)
    calibration.update(probs, labels, predictive(probs.log()[None])[1])
    for key, value in calibration.compute().items():
        assert metrics[key] == pytest.approx(value, nan_ok=True)
    assert {"pavpu", "pavpu_normalized", "pavpu_balanced", "pavpu_normalized_balanced", "pixel_acc",
            "num_images"} <= set(metrics)
    assert metrics["num_images"] == 3


def test_evaluate_a_dataset_center_crop_with_max_images_and_figures(baseline, tmp_path):
    class Items(torch.utils.data.Dataset):
        def __len__(self):
            return 5

        def __getitem__(self, index):
            gen = torch.Generator().manual_seed(index)
            return {"image": torch.rand(3, 20 + index, 18, generator=gen),
                    "label": torch.randint(0, K, (20 + index, 18), generator=gen)}

    metrics = evaluate(
        baseline, Items(), num_classes=K, mode="center_crop", crop_size=21, max_images=3,
        figure_dir=tmp_path, num_figures=3,
    )
    assert metrics["num_images"] == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["reliability.png", "reliability_curves.json",
                                                          "risk_coverage.png", "uncertainty_maps.png"]
    # items 0, 1, 2 are 20, 21, 22 x 18: center crop 21 keeps the first two whole (their padding is
    # cut off again) and 21 rows of the third; the width 18 is padded, never cut
    assert Image.open(tmp_path / "uncertainty_maps.png").size == (4 * 18 + 3 * 4, 20 + 4 + 21 + 4 + 21)


def test_evaluate_rejects_bad_data(baseline):
    with pytest.raises(ValueError, match="'image' and 'label'"):
        evaluate(baseline, [{"image": torch.rand(1, 3, 8, 8)}], num_classes=K)
    with pytest.raises(ValueError, match="no image"):
        evaluate(baseline, [], num_classes=K)
    with pytest.raises(ValueError, match="class_names"):
        evaluate(baseline, [], num_classes=K, class_names=["a"])


# ---------------------------------------------------------------- figures, timing


def test_uncertainty_figure_layout_and_grey_scale(tmp_path):
    image = torch.zeros(3, 6, 5)
    prediction = torch.tensor([[0, 1, 2, 0, 1]] * 6)
    target = prediction.clone()
    target[0, 0] = 255
    entropy = torch.zeros(6, 5)
    entropy[:, 4] = math.log(K)
    path = save_uncertainty_figure(tmp_path / "f.png", image, prediction, target, entropy, num_classes=K)
    panel = np.asarray(Image.open(path))
    assert panel.shape == (6, 4 * 5 + 3 * 4, 3)
    entropy_panel = panel[:, 3 * (5 + 4) :, 0]
    assert (entropy_panel[:, 4] == 255).all() and (entropy_panel[:, :4] == 0).all()
    target_panel = panel[:, 5 + 4 : 2 * 5 + 4]
    assert tuple(target_panel[0, 0]) == IGNORE_COLOUR
    assert tuple(target_panel[0, 1]) == (128, 0, 0)  # VOC colour of class 1


def test_reliability_diagram_is_written(tmp_path):
    calibration = Calibration(K)
    probs = torch.softmax(torch.randn(1, K, 8, 8), 1)
    calibration.update(probs, torch.randint(0, K, (1, 8, 8)), torch.zeros(1, 8, 8))
    path = save_reliability_diagram(tmp_path / "r.png", calibration.reliability())
    assert Image.open(path).size[0] > 100


def test_time_interleaved_warms_up_and_rotates_the_order():
    calls, rounds = [], []
    timings = time_interleaved(
        {"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, repeats=3, warmup=1,
        on_round=lambda index, so_far: rounds.append((index, len(so_far["a"].seconds))),
    )
    assert calls == ["a", "b", "a", "b", "b", "a", "a", "b"]
    assert rounds == [(0, 1), (1, 2), (2, 3)]
    assert len(timings["a"].seconds) == len(timings["a"].cpu_seconds) == 3
    assert timings["b"].median >= 0 and timings["b"].cpu_median >= 0
