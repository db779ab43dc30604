"""The supervised reference's whole training step under ``protocol: released`` reproduces one iteration of U2PL's
supervised baseline (``tests/golden/supervised_step_released.npz``, recorded by
``tests/golden/record_supervised_step_golden.py``, which says why U2PL's ``train_sup.py`` is the reference; source,
command and what was compared in ``supervised_step_released.json``).

The official ``train()`` of ``train_sup.py`` ran one iteration (poly LR, forward, CE or OHEM + 0.4 x the auxiliary
loss on logits upsampled with ``align_corners=True``, backward, SGD with the head at 10x on VOC) on the project's
tiny segmentor; here :func:`npsemiseg.training.step.train_step` with framework ``supervised`` takes the same step on
the same weights, inputs and dropout masks (``F.dropout2d`` replays the recorded channel masks), with the run's
optimiser. Compared per cell (VOC, Cityscapes): the loss (the sum of our terms), the LR of each group, every
gradient, every parameter and BN buffer after the step (``tests/step_golden.py``).

Both sides run in float64 (network, inputs, dropout masks, pattern weights and BN buffers), so that no CPU's kernels
move the step: what remains is the project's loss, float32 by design (``npsemiseg.frameworks.losses``), against the
official one in float64. Tolerances from the measured spread: 2026-11-29, 2-core AMD EPYC (Zen 4) VM, kernel paths
emulated with ATEN_CPU_CAPABILITY/DNNL_MAX_CPU_ISA/MKL_ENABLE_INSTRUCTIONS: ``PYTHONPATH=$PWD .venv/bin/python -m
pytest -s tests/test_supervised_step_golden.py -k matches`` natively (AVX-512), under ``ATEN_CPU_CAPABILITY=avx2
DNNL_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2``, under ``ATEN_CPU_CAPABILITY=default DNNL_MAX_CPU_ISA=SSE41
MKL_ENABLE_INSTRUCTIONS=SSE4_2 OMP_NUM_THREADS=1`` and with 2 threads. Largest relative differences over the four:
gradients 1.02e-6 (Cityscapes, ``backbone.layer1.0.conv3.weight``; the kernel paths move it by 1e-8), parameters and
buffers 6.5e-8, the loss 7.5e-8; the biases before a BN (a round-off gradient of about 1e-16 on both sides) differ
by 3e-17. :data:`GRAD_RTOL` = 5e-6 (5x), :data:`GRAD_FLOOR` = 1e-9, :data:`RTOL` = 1e-6 (13x).

The golden fails when the behaviour it guards changes (:func:`test_each_change_moves_the_step_away_from_the_record`):
the head at the backbone's LR on VOC, the auxiliary loss weight on Cityscapes, or the student in eval mode.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from golden_files import recorded, recorder
from npsemiseg.config import with_overrides
from npsemiseg.frameworks.base import Batch, StepContext
from npsemiseg.training import build_framework
from npsemiseg.training.factories import build_optimizer
from npsemiseg.training.step import train_step
from step_golden import close, compare_gradients, compare_states, summary

pytestmark = pytest.mark.usefixtures("single_seeded_thread")

REC = recorder("supervised_step")
DATA = recorded("supervised_step_released")
#: the loss, the LR, every parameter and buffer: relative to max(1, max |recorded|)
RTOL = 1e-6
#: every gradient: relative to its tensor's largest recorded |entry| (sums: to its sum of |entries|), at least the floor
GRAD_RTOL, GRAD_FLOOR = 5e-6, 1e-9


def _cell(family: str) -> dict[str, np.ndarray]:
    prefix = f"{family}/"
    return {k.removeprefix(prefix): v for k, v in DATA.items() if k.startswith(prefix)}


def _step(monkeypatch, family: str, overrides=None, *, eval_mode: bool = False):
    """Framework ``supervised`` of the recorded cell, pattern weights, one ``train_step`` with the recorded masks."""
    data = _cell(family)
    config = REC.config_of(family)
    if overrides:
        config = with_overrides(config, overrides)
    framework = build_framework(config)
    framework.student.double()
    REC.load_pattern(framework.student, REC.SALT)
    masks = [torch.from_numpy(data[f"mask{i}"]) for i in range(sum(k.startswith("mask") for k in data))]
    monkeypatch.setattr(F, "dropout2d", REC.mask_dropout2d(masks, None))
    batch = Batch(labeled={"image": torch.from_numpy(data["image"]).double(), "label": torch.from_numpy(data["label"])})
    ctx = StepContext(step=REC.EPOCH, total_steps=REC.EPOCHS, epoch=REC.EPOCH, total_epochs=REC.EPOCHS,
                      iters_per_epoch=1)
    framework.student.train(not eval_mode)
    optimizer = build_optimizer(config, framework.student)
    logs = train_step(framework, batch, ctx, optimizer, config, torch.device("cpu"), 1)
    assert not masks or eval_mode, "every recorded dropout mask is used"
    monkeypatch.undo()
    return framework, logs, data, [g["lr"] for g in optimizer.torch_optimizer.param_groups]


@pytest.mark.parametrize("family", REC.CELLS)
def test_the_released_protocol_runs_the_recorded_options(family):
    config = REC.config_of(family)
    assert config.model.decoder == "u2pl" and config.head.name == "baseline" and config.model.align_corners
    assert config.optim.parameter_groups == "backbone_head"
    assert config.optim.head_lr_mult == (10.0 if family == "voc" else 1.0)  # train_sup.py 100
    assert config.loss.ohem == config.model.aux_head == (family == "cityscapes")


@pytest.mark.parametrize("family", REC.CELLS)
def test_one_released_step_matches_the_official_step(monkeypatch, family):
    framework, logs, data, lrs = _step(monkeypatch, family)
    total = sum(v for k, v in logs.items() if k in ("train/sup", "train/aux"))
    diffs = {"loss": close(total, data["loss"], "loss", RTOL),
             "lr": close(sorted(set(lrs)), sorted(set(data["lr"].tolist())), "LR of the groups", RTOL)}
    diffs.update(compare_gradients(framework.student, data, rtol=GRAD_RTOL, floor=GRAD_FLOOR))
    diffs.update(compare_states({"student": framework.student}, data, rtol=RTOL))
    assert len(diffs) > 100
    print(json.dumps({family: {**summary(diffs), "loss": f"{diffs['loss']:.2e}"}}))


@pytest.mark.parametrize(("family", "overrides", "eval_mode"), [
    ("voc", {"optim.head_lr_mult": 1.0}, False),
    ("cityscapes", {"loss.aux_weight": 0.2}, False),
    ("voc", None, True),
])
def test_each_change_moves_the_step_away_from_the_record(monkeypatch, family, overrides, eval_mode):
    """The head's LR multiplier, the auxiliary weight, or the student in eval mode (BN on running statistics, no
    dropout): a loss, a weight or a gradient moves by far more than the tolerance."""
    framework, logs, data, _ = _step(monkeypatch, family, overrides, eval_mode=eval_mode)
    total = sum(v for k, v in logs.items() if k in ("train/sup", "train/aux"))
    moved = [abs(total - float(data["loss"]))]
    moved += [abs(float(p.detach().double().sum()) - float(data[f"student/sum/{n}"]))
              for n, p in framework.student.named_parameters()]
    print(json.dumps({"moved": f"{max(moved):.2e}"}))
    assert max(moved) > 1e-4
