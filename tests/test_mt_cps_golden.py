"""CPS's MeanTeacher step under ``protocol: released`` reproduces the official step
(``tests/golden/mt_cps_step_released.npz``, recorded by ``tests/golden/record_mt_cps_golden.py``; source, command
and what was compared in ``mt_cps_step_released.json``).

The official ``Network.forward`` / ``_update_ema_variables`` (TorchSemiSeg MeanTeacher network.py 25-47) ran the
recorded step with the training step of train.py 177-215 around it and the official optimiser (train.py 90-104:
``group_weight``, momentum 0.9, weight decay 1e-4 on conv weights; the LR of ``WarmUpPolyLR`` at the step, 206-211),
on a tiny network built on both sides from the same pattern weights (the project's smoke segmentor without dropout;
the official ResNet-50 network needs pretrained weights and furnace). Here
:func:`npsemiseg.training.step.train_step` with framework ``mt_cps`` and the released options (switches
``mt_cps_split_passes``, ``mt_cps_ema_before_unlabeled``, ``mt_cps_no_dropout``, ``mt_single_lr``) takes the same
step: same weights and inputs, the run's optimiser (``build_optimizer``) at the poly LR of the step. Both sides run
in float64 (networks, pattern weights, BN buffers, inputs; ``record_mt_cps_golden.DTYPE``), except the project's loss
path, float32 by design (``mean_softmax``, the CE: the teacher's probabilities, both losses and the gradient at the
logits). Compared: both losses, the LR, the teacher's probabilities, every student gradient, and every parameter and
buffer of the updated student and teacher (``tests/step_golden.py``): :data:`RTOL` of ``max(1, max |theirs|)`` per
quantity, gradients :data:`GRAD_RTOL` of their tensor's scale.

Tolerances from the measured spread (2026-11-29, 2-core AMD EPYC (Zen 4) VM, kernel paths emulated with
ATEN_CPU_CAPABILITY/DNNL_MAX_CPU_ISA/MKL_ENABLE_INSTRUCTIONS: native AVX-512 on 1 and 2 threads, ``avx2 AVX2 AVX2``,
``default SSE41 SSE4_2`` with OMP_NUM_THREADS=1; ``PYTHONPATH=$PWD .venv/bin/python -m pytest -q -s
tests/test_mt_cps_golden.py`` under each, which prints the worst differences; 2 threads: :func:`_step` after
``torch.set_num_threads(2)``). The official float64 step re-recorded under each path moves by at most
2.3e-12 (gradients) and 4.3e-14 (weights, buffers). Ours against the record, worst over the paths: gradients 6.8e-7
of their scale (a BN weight of layer1: the float32 loss path), losses 6.3e-8, the teacher's probabilities 4.5e-8
(stored in float32), weights and buffers 5.5e-9; bounds with a margin of about 15: :data:`RTOL` 1e-6,
:data:`GRAD_RTOL` 1e-5. The corrected behaviours (one pass; the EMA after the optimiser step) are checked to be far
from the record (unsupervised loss 2.5e-2 and 3.1e-2 relative, teacher probabilities 4.4e-3 and 2.6e-3 away), so the
comparison tells them apart.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from golden_files import recorded, recorder, sidecar
from step_golden import close, compare_gradients, compare_states, summary
from npsemiseg.config import compose, with_overrides
from npsemiseg.frameworks.base import Batch, StepContext
from npsemiseg.training import build_framework
from npsemiseg.training.factories import build_optimizer
from npsemiseg.training.step import train_step

pytestmark = pytest.mark.usefixtures("single_seeded_thread")

REC = recorder("mt_cps")
#: losses, LR, teacher probabilities, weights and buffers, relative to max(1, the largest recorded |value|)
RTOL = 1e-6
#: gradients, relative to their tensor's scale (``step_golden.close_grad``)
GRAD_RTOL = 1e-5
DATA = recorded("mt_cps_step_released")
META = sidecar("mt_cps_step_released")


def _step(**overrides):
    """Framework ``mt_cps`` of the recorded cell, pattern weights, one step on the recorded inputs."""
    config = compose("smoke", **REC.CELL).config
    if overrides:
        config = with_overrides(config, overrides)
    framework = build_framework(config)
    for model, salt in ((framework.student, REC.STUDENT_SALT), (framework.teacher, REC.TEACHER_SALT)):
        REC.load_pattern(model.to(REC.DTYPE), salt, REC.DTYPE)
    images = {k: torch.from_numpy(DATA[k]).to(REC.DTYPE) for k in ("images_l", "images_u")}
    batch = Batch(labeled={"image": images["images_l"], "label": torch.from_numpy(DATA["labels_l"])},
                  unlabeled={"image": images["images_u"]})
    ctx = StepContext(step=REC.CUR_ITER, total_steps=REC.TOTAL_ITERS, epoch=0, total_epochs=1,
                      iters_per_epoch=REC.TOTAL_ITERS)
    predictions = []
    original = framework.predict
    framework.predict = lambda teacher, images, **kw: predictions.append(original(teacher, images, **kw)) or predictions[-1]
    framework.student.train()
    logs = train_step(framework, batch, ctx, build_optimizer(config, framework.student), config, torch.device("cpu"), 1)
    probs = torch.cat([p.probs for p in predictions]).detach()
    return framework, config, logs, probs


def test_the_released_protocol_runs_the_recorded_options():
    config = compose("smoke", **REC.CELL).config
    assert config.framework == "mt_cps" and config.model.align_corners is True
    assert {k: config.framework_options[k] for k in ("passes", "ema_timing", "train_dropout", "ema_decay",
                                                      "mse_weight")} == {
        "passes": "split", "ema_timing": "before_unlabeled", "train_dropout": False,
        "ema_decay": META["official_values"]["ema_decay"], "mse_weight": META["official_values"]["unsup_weight"]}
    assert config.loss.ohem is False and config.head.name == "baseline"
    assert config.optim.parameter_groups == "single_lr" and config.optim.lr == REC.LR
    assert (config.optim.momentum, config.optim.weight_decay, config.schedule.poly_power) == (
        META["official_values"]["momentum"], META["official_values"]["weight_decay"], META["official_values"]["lr_power"])
    framework = build_framework(config)
    assert not any(type(m) is torch.nn.Dropout2d for model in framework.modules().values() for m in model.modules())


def test_one_released_step_matches_the_official_step():
    framework, _, logs, probs = _step()
    diffs = {"loss_sup": close(logs["train/sup"], DATA["loss_sup"], "sup", RTOL),
             "loss_unsup": close(logs["train/unsup"], DATA["loss_unsup"], "unsup", RTOL),
             "lr": close(logs["train/lr"], DATA["lr"], "lr", RTOL),
             "teacher_probs": close(probs.numpy(), DATA["teacher_probs"], "teacher probabilities", RTOL)}
    diffs.update(compare_gradients(framework.student, DATA, rtol=GRAD_RTOL))
    diffs.update(compare_states({"student": framework.student, "teacher": framework.teacher}, DATA, rtol=RTOL))
    assert len(diffs) > 100  # every gradient, parameter and buffer of both models was compared
    print(json.dumps({**summary(diffs), "teacher_probs": f"{diffs['teacher_probs']:.2e}"}))


@pytest.mark.parametrize("override", [{"framework_options.passes": "joint"},
                                      {"framework_options.ema_timing": "after_step"}])
def test_each_corrected_behaviour_moves_the_step_away_from_the_record(override):
    """One pass (BN statistics over both halves) or the EMA after the optimiser step gives another step: the
    golden tells each released behaviour apart."""
    framework, _, logs, probs = _step(**override)
    far = abs(logs["train/unsup"] - float(DATA["loss_unsup"])) > 1e-4 * float(DATA["loss_unsup"])
    far = far or float(np.max(np.abs(probs.numpy() - DATA["teacher_probs"]))) > 1e-4
    teacher_sum = sum(float(p.detach().double().sum()) for p in framework.teacher.parameters())
    recorded = sum(float(DATA[f"teacher/sum/{n}"]) for n, _ in framework.teacher.named_parameters())
    assert far or abs(teacher_sum - recorded) > 1e-4
