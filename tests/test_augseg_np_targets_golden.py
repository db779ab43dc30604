"""AugSeg with the NP head under ``protocol: released`` gives the head the targets NP-SemiSeg's AugSeg step gives it
(``tests/golden/augseg_np_targets_released.npz``, recorded by ``tests/golden/record_augseg_np_targets_golden.py``;
source and command in ``augseg_np_targets_released.json``).

The official step is inline script code (AugSeg/train_semi.py 355-408); its CutMix, ``cut_mix_label_adaptive``, is
the one official function on the path and was run by the recorder. Here the framework's step runs on the recorded
teacher logits and images, with the official CutMix's recorded output in place of the framework's own CutMix (whose
random draws differ), and the test checks what reaches the head: the pseudo-labels and confidences the step hands
the CutMix (labels exact, confidences within :data:`CONFIDENCE_ATOL`), the per-image confidence rho (within
:data:`RHO_ATOL`) and the targets of the student pass: released (``np_targets="unfiltered"``, switch
``np_unfiltered_targets``) the recorded ``label_all``, exactly; corrected the same with 255 where the mixed confidence
is below the threshold.

The recorder's softmax runs in float64 (on the stored float32 logits), the project's in float32 by design
(``prediction_from_logits``). Measured (2026-11-29, 2-core AMD EPYC (Zen 4) VM, kernel paths emulated with
ATEN_CPU_CAPABILITY/DNNL_MAX_CPU_ISA/MKL_ENABLE_INSTRUCTIONS: native AVX-512 on 1 and 2 threads, ``avx2 AVX2 AVX2``,
``default SSE41 SSE4_2`` with OMP_NUM_THREADS=1; ``PYTHONPATH=$PWD .venv/bin/python -m pytest -q
tests/test_augseg_np_targets_golden.py`` under each): confidences 2.5e-7 and rho 7.9e-9 from the record on every
path, labels and targets equal; the bounds leave a margin of about 10. (Recorded in float32, the confidences were
compared exactly, and a float32 softmax of another vector width differs in the last bits.)
"""

from __future__ import annotations


import numpy as np
import pytest
import torch

from golden_files import recorded, sidecar
from npsemiseg.config import compose
from npsemiseg.data.mixing import MixResult
from npsemiseg.frameworks import augseg as augseg_module
from npsemiseg.frameworks.base import Batch, StepContext
from npsemiseg.frameworks.pseudo_labels import prediction_from_logits
from npsemiseg.training import build_framework

DATA = recorded("augseg_np_targets_released")
META = sidecar("augseg_np_targets_released")
CELL = dict(framework="augseg", dataset="synthetic", partition="1/16", head="np")
#: the teacher's per-pixel confidences (the project's float32 softmax against the recorded float64 one)
CONFIDENCE_ATOL = 2e-6
#: the per-image confidence rho
RHO_ATOL = 1e-7

pytestmark = pytest.mark.usefixtures("single_seeded_thread")


def _targets(protocol: str, monkeypatch) -> tuple[torch.Tensor, dict]:
    config = compose("smoke", **CELL, protocol=protocol).config
    assert config.num_classes == META["sizes"]["K"] and config.framework_options["confidence_threshold"] == 0.95
    framework = build_framework(config)
    seen: dict = {}
    size = tuple(DATA["images_u"].shape[-2:])
    framework.predict_unlabeled = lambda teacher, unlabeled, **kw: prediction_from_logits(
        torch.from_numpy(DATA["teacher_logits"]), size, align_corners=config.model.align_corners)

    def official_mix(image, label, confidence, images_l, labels_l, rho, **kw):
        seen.update(label=label, confidence=confidence, rho=rho)
        mask = torch.zeros_like(label, dtype=torch.bool)
        return MixResult(torch.from_numpy(DATA["mixed_image"]), torch.from_numpy(DATA["mixed_label"]),
                         torch.from_numpy(DATA["mixed_confidence"]), mask, None)

    monkeypatch.setattr(augseg_module, "augseg_cutmix", official_mix)
    student_pass = framework.student_pass

    def spy(images_l, labels_l, images_u, labels_u):
        seen.update(labels_l=labels_l, labels_u=labels_u, images_u=images_u)
        return student_pass(images_l, labels_l, images_u, labels_u)

    framework.student_pass = spy
    images_u = torch.from_numpy(DATA["images_u"])
    batch = Batch(labeled={"image": torch.from_numpy(DATA["images_l"]), "label": torch.from_numpy(DATA["labels_l"])},
                  unlabeled={"image": images_u, "image_strong": images_u.clone()})
    framework.train_step(batch, StepContext(step=20, total_steps=40, epoch=1, total_epochs=2, iters_per_epoch=20))
    return torch.cat([seen["labels_l"], seen["labels_u"]]), seen


def test_the_step_hands_the_official_cutmix_the_official_pseudo_labels(monkeypatch):
    _, seen = _targets("released", monkeypatch)
    assert torch.equal(seen["label"], torch.from_numpy(DATA["teacher_label"]))
    diff = float(np.max(np.abs(seen["confidence"].double().numpy() - DATA["teacher_confidence"])))
    assert diff <= CONFIDENCE_ATOL, f"confidence: max |difference| {diff:.3g}"
    diff = float(np.max(np.abs(seen["rho"].double().numpy() - DATA["image_confidence"])))
    assert diff <= RHO_ATOL, f"rho: max |difference| {diff:.3g}"


def test_released_targets_are_the_official_unfiltered_ones(monkeypatch):
    targets, seen = _targets("released", monkeypatch)
    assert torch.equal(seen["images_u"], torch.from_numpy(DATA["mixed_image"]))
    assert torch.equal(targets, torch.from_numpy(DATA["label_all"]))


def test_corrected_targets_mask_the_unconfident_pixels(monkeypatch):
    targets, _ = _targets("corrected", monkeypatch)
    expected = torch.from_numpy(DATA["label_all"]).clone()
    b = DATA["labels_l"].shape[0]
    low = torch.from_numpy(DATA["mixed_confidence"]) < META["sizes"]["threshold"]
    expected[b:][low] = 255
    assert bool(low.any()) and bool((~low).any())
    assert torch.equal(targets, expected)
