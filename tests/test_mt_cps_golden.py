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
step: same weights and inputs, the run's optimiser (``build_optimizer``) at the poly LR of the step. Compared: both
losses, the LR, the teacher's probabilities, every student gradient, and every parameter and buffer of the updated
student and teacher (``tests/step_golden.py``: float32 round-off, ``1e-5 * max(1, max |theirs|)`` per quantity;
gradients ``5e-5`` of their tensor's scale). Seen: losses 0; the teacher's probabilities 3.0e-7; gradients 2.4e-5
of their tensor's largest entry; weights and buffers 4.4e-6 (relative, a BN running mean's sum of |x|). The
corrected behaviours (one pass; the EMA after the optimiser step) are checked to be far from the record (teacher
probabilities 4.4e-3 and 2.6e-3 away), so the comparison tells them apart.
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
DATA = recorded("mt_cps_step_released")
META = sidecar("mt_cps_step_released")


def _step(**overrides):
    """Framework ``mt_cps`` of the recorded cell, pattern weights, one step on the recorded inputs."""
    config = compose("smoke", **REC.CELL).config
    if overrides:
        config = with_overrides(config, overrides)
    framework = build_framework(config)
    REC.load_pattern(framework.student, REC.STUDENT_SALT)
    REC.load_pattern(framework.teacher, REC.TEACHER_SALT)
    batch = Batch(labeled={"image": torch.from_numpy(DATA["images_l"]), "label": torch.from_numpy(DATA["labels_l"])},
                  unlabeled={"image": torch.from_numpy(DATA["images_u"])})
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
    diffs = {"loss_sup": close(logs["train/sup"], DATA["loss_sup"], "sup"),
             "loss_unsup": close(logs["train/unsup"], DATA["loss_unsup"], "unsup"),
             "lr": close(logs["train/lr"], DATA["lr"], "lr"),
             "teacher_probs": close(probs.numpy(), DATA["teacher_probs"], "teacher probabilities")}
    diffs.update(compare_gradients(framework.student, DATA))
    diffs.update(compare_states({"student": framework.student, "teacher": framework.teacher}, DATA))
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
