"""PS-MT's VOC evaluation under the released options reproduces what PS-MT's released ``_valid_epoch`` predicted on
the same images (``tests/golden/psmt_eval_released.npz``, recorded by ``tests/golden/record_psmt_eval_golden.py``;
source and command in ``psmt_eval_released.json``).

Same images and teachers (the recorder's :class:`Teacher`), through our ``predict`` (mode ``whole``,
``resize_multiple`` 8) and PS-MT's teacher ensemble averaging logits (``eval_average="logits"``). Compared: our
predictive probabilities with the softmax of their logits. Tolerance: float32 round-off,
``|ours - theirs| <= 1e-5`` (probabilities; ours averages the teachers' logits before the bilinear upsampling,
theirs after: the same up to round-off, upsampling being linear).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch import nn

from golden_files import recorded, recorder
from npsemiseg.config import compose, with_overrides
from npsemiseg.evaluation.inference import predict
from npsemiseg.frameworks.psmt import TeacherEnsemble
from npsemiseg.heads.base import HeadOutput
from npsemiseg.models import SegmentorOutput

ATOL = 1e-5

pytestmark = pytest.mark.usefixtures("single_seeded_thread")



REC = recorder("psmt_eval")
DATA = recorded("psmt_eval_released")


class _Member(nn.Module):
    """A recorder teacher as a Segmentor: logits ``[1, B, K, h, w]`` at feature size, upsampled by ``predict``
    with ``align_corners=True`` (as every official model, switch ``align_corners``)."""

    align_corners = True
    head = None  # a deterministic head: no ``stochastic`` attribute read as stochastic by the evaluation

    def __init__(self, teacher) -> None:
        super().__init__()
        self.teacher = teacher

    def forward(self, images, *, num_samples=None, latent=None):
        features = self.teacher.encoder(images)
        logits = self.teacher.decoder(features).unsqueeze(0)
        return SegmentorOutput(features, HeadOutput(logits, logits.new_zeros(()), {}), None, None)


def _ensemble() -> TeacherEnsemble:
    return TeacherEnsemble([_Member(t) for t in REC.teachers()], average="logits").eval()


def test_the_released_protocol_sets_these_options():
    """Released PS-MT VOC cells evaluate whole images resized to multiples of 8, averaging the teachers' logits;
    corrected ones keep the dataset's center crop at the image size; Cityscapes cells are untouched."""
    cell = dict(framework="psmt", dataset="pascal_blender", partition="662", head="baseline")
    released = compose("paper", **cell, protocol="released").config
    assert (released.evaluation.mode, released.evaluation.resize_multiple) == ("whole", 8)
    assert released.framework_options["eval_average"] == "logits"
    corrected = compose("paper", **cell, protocol="corrected").config
    assert (corrected.evaluation.mode, corrected.evaluation.resize_multiple) == ("center_crop", None)
    city = dict(cell, dataset="cityscapes", partition="744")
    assert compose("paper", **city, protocol="released").config.evaluation.resize_multiple is None


def test_released_evaluation_reproduces_psmt_valid_epoch():
    model = _ensemble()
    deviations = {}
    for i, size in enumerate(REC.SIZES):
        image = torch.from_numpy(DATA[f"image{i}"])
        probs, _ = predict(model, image, mode="whole", resize_multiple=8)
        theirs = torch.softmax(torch.from_numpy(DATA[f"logits{i}"]), dim=1).numpy()
        assert probs.shape == theirs.shape == (1, REC.K, *size)
        diff = float(np.abs(probs.numpy() - theirs).max())
        deviations[f"image{i}"] = diff
        assert diff <= ATOL, f"image {i} {size}: max |difference| {diff:.3g}"
    print(json.dumps({k: f"{v:.2e}" for k, v in deviations.items()}))


def test_the_golden_tells_the_resize_apart():
    """Without the resize, the image whose sides are not multiples of 8 gets another prediction; the one whose
    sides are gets the same (the resize is then the identity)."""
    model = _ensemble()
    for i, size in enumerate(REC.SIZES):
        probs, _ = predict(model, torch.from_numpy(DATA[f"image{i}"]), mode="whole")
        theirs = torch.softmax(torch.from_numpy(DATA[f"logits{i}"]), dim=1).numpy()
        diff = float(np.abs(probs.numpy() - theirs).max())
        if size[0] % 8 or size[1] % 8:
            assert diff > 1e-3, f"image {i}: the resize changes nothing ({diff:.3g})"
        else:
            assert diff <= ATOL


def test_resize_multiple_needs_mode_whole():
    with pytest.raises(ValueError, match="resize_multiple"):
        predict(_ensemble(), torch.from_numpy(DATA["image0"]), mode="center_crop", resize_multiple=8)


def test_a_released_run_evaluates_as_psmt():
    """The run's evaluation (``evaluate_model`` with a released PS-MT cell's config) resizes as the golden: its
    pixel accuracy is that of their logits' argmax (and another one without the resize)."""
    from npsemiseg.training.artifacts import evaluate_model

    config = compose("smoke", framework="psmt", dataset="synthetic", partition="1/16", head="baseline",
                     protocol="released", overrides={"data.options": {"num_classes": REC.K}}).config
    assert (config.evaluation.mode, config.evaluation.resize_multiple) == ("whole", 8)
    val = [{"image": torch.from_numpy(DATA[f"image{i}"]), "label": torch.from_numpy(DATA[f"label{i}"])}
           for i in range(len(REC.SIZES))]
    metrics = evaluate_model(_ensemble(), val, config, step=0, device=torch.device("cpu"))
    correct = sum(int((DATA[f"logits{i}"].argmax(1) == DATA[f"label{i}"]).sum()) for i in range(len(REC.SIZES)))
    pixels = sum(DATA[f"label{i}"].size for i in range(len(REC.SIZES)))
    assert metrics["pixel_acc"] == pytest.approx(correct / pixels, abs=1e-9)
    unresized = with_overrides(config, {"evaluation.resize_multiple": None})
    other = evaluate_model(_ensemble(), val, unresized, step=0, device=torch.device("cpu"))["pixel_acc"]
    assert other != pytest.approx(correct / pixels, abs=1e-9)


def test_the_golden_tells_align_corners_apart(monkeypatch):
    """Switch ``align_corners`` on its own: released PS-MT cells upsample logits with ``align_corners=True``; the
    same evaluation upsampling the teachers' logits with ``align_corners=False`` (corrected) and nothing else
    changed is far from the record on every image."""
    cell = dict(framework="psmt", dataset="pascal_blender", partition="662", head="baseline")
    assert compose("paper", **cell, protocol="released").config.model.align_corners is True
    assert compose("paper", **cell, protocol="corrected").config.model.align_corners is False
    monkeypatch.setattr(_Member, "align_corners", False)
    model = _ensemble()
    for i, size in enumerate(REC.SIZES):
        probs, _ = predict(model, torch.from_numpy(DATA[f"image{i}"]), mode="whole", resize_multiple=8)
        theirs = torch.softmax(torch.from_numpy(DATA[f"logits{i}"]), dim=1).numpy()
        diff = float(np.abs(probs.numpy() - theirs).max())
        assert diff > 1e-3, f"image {i} {size}: align_corners=False changes nothing ({diff:.3g})"
