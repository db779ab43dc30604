"""CPS's MeanTeacher step under ``protocol: released`` reproduces the official step
(``tests/golden/mt_cps_step_released.npz``, recorded by ``tests/golden/record_mt_cps_golden.py``; source, command
and what was compared in ``mt_cps_step_released.json``).

The official ``Network.forward`` / ``_update_ema_variables`` (TorchSemiSeg MeanTeacher network.py 25-47) ran the
recorded step with the training step of train.py 177-215 around it, on a tiny network built on both sides from the
same pattern weights (the project's smoke segmentor without dropout; the official ResNet-50 network needs pretrained
weights and furnace). Here framework ``mt_cps`` with the released options (switches ``mt_cps_split_passes``,
``mt_cps_ema_before_unlabeled``, ``mt_cps_no_dropout``) takes the same step: same weights, same inputs, SGD at the
same LR and momentum. Tolerance: float32 round-off, ``|ours - theirs| <= 1e-5 * max(1, max |theirs|)`` per quantity
(seen: losses 0; the teacher's probabilities 3.0e-7; the updated student's sampled entries 7.5e-9 and sums 4.0e-8; the
updated teacher's sampled entries 5.4e-7, its sums at most 4.4e-6 relative, a BN running mean's sum of |x|). The
corrected behaviours (one pass; the EMA after the optimiser step) are checked to be far from the record (teacher
probabilities 4.4e-3 and 2.6e-3 away), so the comparison tells them apart.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from golden_files import recorded, recorder, sidecar
from npsemiseg.config import compose, with_overrides
from npsemiseg.frameworks.base import Batch, StepContext
from npsemiseg.training import build_framework

RTOL_SCALE = 1e-5

pytestmark = pytest.mark.usefixtures("single_seeded_thread")



REC = recorder("mt_cps")
DATA = recorded("mt_cps_step_released")
META = sidecar("mt_cps_step_released")


def _close(ours, theirs, what: str) -> float:
    ours, theirs = np.asarray(ours, dtype=np.float64), np.asarray(theirs, dtype=np.float64)
    diff = float(np.max(np.abs(ours - theirs))) if theirs.size else 0.0
    bound = RTOL_SCALE * max(1.0, float(np.max(np.abs(theirs))) if theirs.size else 1.0)
    assert diff <= bound, f"{what}: max |difference| {diff:.3g} > {bound:.3g}"
    return diff


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
    optimizer = torch.optim.SGD(framework.student.parameters(), lr=REC.LR, momentum=REC.MOMENTUM, weight_decay=0.0)
    ctx = StepContext(step=REC.CUR_ITER, total_steps=10, epoch=0, total_epochs=1, iters_per_epoch=10)
    predictions = []
    original = framework.predict
    framework.predict = lambda teacher, images, **kw: predictions.append(original(teacher, images, **kw)) or predictions[-1]
    result = framework.train_step(batch, ctx)
    optimizer.zero_grad()
    result.total.backward()
    optimizer.step()
    framework.after_optimizer_step(ctx)
    probs = torch.cat([p.probs for p in predictions]).detach()
    return framework, config, result, probs


def test_the_released_protocol_runs_the_recorded_options():
    config = compose("smoke", **REC.CELL).config
    assert config.framework == "mt_cps" and config.model.align_corners is True
    assert {k: config.framework_options[k] for k in ("passes", "ema_timing", "train_dropout", "ema_decay",
                                                      "mse_weight")} == {
        "passes": "split", "ema_timing": "before_unlabeled", "train_dropout": False,
        "ema_decay": META["official_values"]["ema_decay"], "mse_weight": META["official_values"]["unsup_weight"]}
    assert config.loss.ohem is False and config.head.name == "baseline"
    framework = build_framework(config)
    assert not any(type(m) is torch.nn.Dropout2d for model in framework.modules().values() for m in model.modules())


def test_one_released_step_matches_the_official_step():
    framework, _, result, probs = _step()
    diffs = {"loss_sup": _close(float(result.losses["sup"].detach()), DATA["loss_sup"], "sup"),
             "loss_unsup": _close(float(result.losses["unsup"].detach()), DATA["loss_unsup"], "unsup"),
             "teacher_probs": _close(probs.numpy(), DATA["teacher_probs"], "teacher probabilities")}
    for prefix, model in (("student", framework.student), ("teacher", framework.teacher)):
        for name, t in (*model.named_parameters(), *model.named_buffers()):
            flat = t.detach().double().flatten()
            diffs[f"{prefix}/{name}"] = max(
                _close(float(flat.sum()), DATA[f"{prefix}/sum/{name}"], f"{prefix} {name} sum"),
                _close(float(flat.abs().sum()), DATA[f"{prefix}/abs/{name}"], f"{prefix} {name} sum |x|"),
                _close(flat[torch.from_numpy(DATA[f"index/{name}"]).long()].numpy(), DATA[f"{prefix}/at/{name}"],
                       f"{prefix} {name} entries"))
    assert len(diffs) > 100  # every parameter and buffer of both models was compared
    print(json.dumps({"max": f"{max(diffs.values()):.2e}", "teacher_probs": f"{diffs['teacher_probs']:.2e}"}))


@pytest.mark.parametrize("override", [{"framework_options.passes": "joint"},
                                      {"framework_options.ema_timing": "after_step"}])
def test_each_corrected_behaviour_moves_the_step_away_from_the_record(override):
    """One pass (BN statistics over both halves) or the EMA after the optimiser step gives another step: the
    golden tells each released behaviour apart."""
    framework, _, result, probs = _step(**override)
    far = abs(float(result.losses["unsup"].detach()) - float(DATA["loss_unsup"])) > 1e-4 * float(DATA["loss_unsup"])
    far = far or float(np.max(np.abs(probs.numpy() - DATA["teacher_probs"]))) > 1e-4
    teacher_sum = sum(float(p.detach().double().sum()) for p in framework.teacher.parameters())
    recorded = sum(float(DATA[f"teacher/sum/{n}"]) for n, _ in framework.teacher.named_parameters())
    assert far or abs(teacher_sum - recorded) > 1e-4
