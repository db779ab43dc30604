"""PS-MT's whole training step under ``protocol: released`` reproduces one iteration of the released loop
(``tests/golden/psmt_step_released.npz``, recorded by ``tests/golden/record_psmt_step_golden.py``; source, command
and what was compared in ``psmt_step_released.json``).

The official ``Trainer._train_epoch`` (PS-MT VocCode/train.py 189-311) ran one iteration with ``EntireModel.forward``
(two student passes, T-VAT, ``semi_ce_loss``), its SGD step on ``group_weight``'s groups, the ``Poly`` LR and the
EMA of the core teacher, on the project's tiny segmentors (the official ResNet-50 encoder needs the pretrained file;
see the recorder), in float64 (``REC.DTYPE``: models, images and T-VAT's starts; the official code fixes no dtype).
Here :func:`npsemiseg.training.step.train_step` takes the same step with framework ``psmt`` under ``released``
(switch ``psmt_split_passes`` among them): same float64 weights, inputs and injected draws (T-VAT's random starts, the
CutMix permutation and boxes). Compared: both losses, the LR, the teachers' logits, every student gradient, and every
parameter and buffer of the student and both teachers after the step (sum, sum |x| and sampled entries), each
relative to max(1, max |theirs|) and a gradient to its tensor's largest |entry| (its sum: its sum of |entries|, at
least 1e-3; ``tests/step_golden.py``), all within :data:`RTOL` = 1e-5: what remains is the project's loss path, which
computes in float32 by design (the teachers' logits and the losses are float32 values). Measured max relative
|difference| (2026-11-29, 2-core AMD EPYC (Zen 4) VM, kernel paths emulated with ATEN_CPU_CAPABILITY/DNNL_MAX_CPU_ISA/
MKL_ENABLE_INSTRUCTIONS; ``pytest -s tests/test_psmt_step_golden.py`` under each): 5.3e-7 native (AVX-512), AVX2
(``avx2``/``AVX2``/``AVX2``) and 2 threads, 5.4e-7 on the portable path (``default``/``SSE41``/``SSE4_2``, 1 thread),
always at a gradient entry; weights and buffers 1.3e-7, losses 2.3e-8, teachers' logits 4.4e-8. :data:`RTOL` leaves
a margin of 18. The official step itself moves by at most 1.1e-11 (relative to max(1, |x|)) between those paths.
The three changes below move a loss or a gradient sum by 29 to 167.

Not compared: the teachers' ``num_batches_tracked`` (the official EMA averages the integer counter and truncates it,
the project copies the student's; BN momentum is set, so the counter is never read); the Cityscapes loop
(``CityCode/``, a trainer of its own: three CutMix boxes, weight 3.0; not run here, its CutMix checked by
``tests/test_data_mixing.py``); the warm-up epochs (a supervised step per model, switch
``psmt_warmup_epochs``).

The golden fails when the behaviour it guards changes (:func:`test_each_change_moves_the_step_away_from_the_record`):
one joint student pass, the teachers in eval mode, or another unsupervised weight (0.6 for 1.5).
"""

from __future__ import annotations

import json

import pytest
import torch

import npsemiseg.frameworks.psmt as psmt_module
from golden_files import recorded, recorder
from step_golden import close, compare_gradients, compare_states, summary
from npsemiseg.config import compose, with_overrides
from npsemiseg.data.mixing import _paste, box_mask
from npsemiseg.frameworks.base import Batch, StepContext
from npsemiseg.training import build_framework
from npsemiseg.training.factories import build_optimizer
from npsemiseg.training.step import train_step

pytestmark = pytest.mark.usefixtures("single_seeded_thread")

REC = recorder("psmt_step")
DATA = recorded("psmt_step_released")
#: every compared quantity's relative difference (see the module's docstring for how it was measured)
RTOL = 1e-5


def _recorded_cutmix(image, label, confidence=None, **_):
    """The official draw: image i takes the box ``cutmix_boxes[i]`` (rows bbx1:bbx2, columns bby1:bby2) of image
    ``cutmix_perm[i]``."""
    boxes = torch.from_numpy(DATA["cutmix_boxes"])  # bbx1, bby1, bbx2, bby2
    mask = box_mask(boxes[:, [0, 2, 1, 3]], image.shape[-2], image.shape[-1])
    return _paste(image, label, confidence, mask, torch.from_numpy(DATA["cutmix_perm"]))


def _step(monkeypatch, **overrides):
    """Framework ``psmt`` of the recorded cell, the recorder's weights, one ``train_step`` on the recorded inputs."""
    config = compose("smoke", **REC.CELL).config
    if overrides:
        config = with_overrides(config, overrides)
    framework = build_framework(config)
    for name, model in framework.modules().items():
        salt = REC.SALTS["student" if name == "student" else name]
        REC.load_pattern(model, salt)
        if name != "student":
            REC.sharpen(model, salt)
        model.to(REC.DTYPE)
    starts = [DATA["start_l"], DATA["start_u"]]  # T-VAT per part in both pass forms (switch psmt_tvat_per_batch)

    def rand_like(t, **_):
        start = starts.pop(0)
        assert tuple(t.shape) == start.shape, (tuple(t.shape), start.shape)
        return torch.from_numpy(start.copy()).to(t.dtype)

    monkeypatch.setattr(torch, "rand_like", rand_like)
    monkeypatch.setattr(psmt_module, "psmt_cutmix", _recorded_cutmix)
    teacher_logits = []
    original = framework.predict_unlabeled
    monkeypatch.setattr(framework, "predict_unlabeled", lambda *a, **k: teacher_logits.append(original(*a, **k)) or
                        teacher_logits[-1])
    t = {k: torch.from_numpy(DATA[k]).to(REC.DTYPE) for k in ("images_l_weak", "images_l", "images_u_weak", "images_u")}
    t["labels_l"] = torch.from_numpy(DATA["labels_l"])
    batch = Batch(labeled={"image": t["images_l_weak"], "image_strong": t["images_l"], "label": t["labels_l"]},
                  unlabeled={"image": t["images_u_weak"], "image_strong": t["images_u"]})
    ctx = StepContext(step=REC.IPE * (REC.EPOCH - 1), total_steps=REC.IPE * REC.EPOCHS, epoch=REC.EPOCH - 1,
                      total_epochs=REC.EPOCHS, iters_per_epoch=REC.IPE)
    framework.student.train()
    optimizer = build_optimizer(config, framework.student)
    logs = train_step(framework, batch, ctx, optimizer, config, torch.device("cpu"), 1)
    assert not starts
    monkeypatch.undo()
    return framework, logs, [p.raw_logits.detach() for p in teacher_logits]


def test_the_released_protocol_runs_the_recorded_options():
    config = compose("smoke", **REC.CELL).config
    assert config.framework_options["student_passes"] == "split" and config.framework_options["teacher_train_mode"]
    assert config.optim.parameter_groups == "single_lr" and config.optim.lr == REC.LR
    assert (config.optim.momentum, config.optim.weight_decay) == (REC.MOMENTUM, REC.WEIGHT_DECAY)
    assert config.num_classes == REC.K and config.model.align_corners is True


def test_one_released_step_matches_the_official_step(monkeypatch):
    framework, logs, teacher_logits = _step(monkeypatch)
    diffs = {"loss_sup": close(logs["train/sup"], DATA["loss_sup"], "sup"),
             "loss_unsup": close(logs["train/unsup"], DATA["loss_unsup"], "unsup"),
             "lr": close(logs["train/lr"], DATA["lr"][0], "lr"),
             "teacher_logits": max(close(teacher_logits[i].flatten()[::REC.LOGIT_STRIDE].numpy(),
                                         DATA[f"teacher{i + 1}_logits"], f"teacher {i + 1}") for i in range(2))}
    diffs.update(compare_gradients(framework.student, DATA))
    teachers_counters = [f"{t}/{n}" for t in ("teacher1", "teacher2") for n, _ in framework.student.named_buffers()
                         if n.endswith("num_batches_tracked")]
    diffs.update(compare_states(framework.modules(), DATA, skip=teachers_counters))
    assert len(diffs) > 200
    worst = max(diffs, key=diffs.get)
    assert diffs[worst] <= RTOL, f"{worst}: relative |difference| {diffs[worst]:.3g} > {RTOL}"
    print(json.dumps({**summary(diffs), "losses": f"{max(diffs['loss_sup'], diffs['loss_unsup']):.2e}",
                      "teacher_logits": f"{diffs['teacher_logits']:.2e}"}))


@pytest.mark.parametrize("override", [{"framework_options.student_passes": "joint"},
                                      {"framework_options.teacher_train_mode": False},
                                      {"framework_options.unsup_weight": 0.6}])
def test_each_change_moves_the_step_away_from_the_record(monkeypatch, override):
    """One joint student pass (one BN batch), the teachers in eval mode, or another unsupervised weight: the
    recorded step tells each apart (a loss or a student gradient moves by far more than the tolerance)."""
    framework, logs, _ = _step(monkeypatch, **override)
    moved = [abs(logs["train/sup"] - float(DATA["loss_sup"])), abs(logs["train/unsup"] - float(DATA["loss_unsup"]))]
    moved += [abs(float(p.grad.double().sum()) - float(DATA[f"student/grad_sum/{n}"]))
              for n, p in framework.student.named_parameters()]
    print(json.dumps({"moved": f"{max(moved):.2e}"}))
    assert max(moved) > 1e-3
