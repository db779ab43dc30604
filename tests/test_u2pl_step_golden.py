"""A whole U2PL step under ``protocol: released`` is the official iteration (``tests/golden/u2pl_step_released.npz``,
recorded by ``tests/golden/record_u2pl_step_golden.py``: U2PL@ab3d2be ``train_semi.py`` ``train()`` run for one
iteration; source, command and what was compared in ``u2pl_step_released.json``).

``npsemiseg.training.step.train_step`` runs framework ``u2pl`` of the recorded cell on the same tiny network (pattern
parameters and BN buffers, the teacher's its own), the same batch, memory bank and injected draws (CutMix coin and
boxes, the contrastive loss's ``torch.randint``, every dropout mask of student and teacher), with the project's SGD
optimiser and poly LR. Compared: the three losses, every gradient, the student's and the teacher's parameters and
buffers after the step, the memory bank. Cases: ``first`` (the first semi-supervised epoch: teacher reset, EMA
decay 0), ``later`` (the next epoch) and ``supervised`` (a supervised-only epoch: the train-mode teacher's BN update
and the zero terms, switch ``u2pl_sup_only_zero_terms``).

Both sides run in float64 (networks, images, dropout masks, pattern weights and BN buffers; the official loop under
float64 as default dtype, so its ``torch.zeros`` / ``torch.tensor(0.0)`` and memory bank are float64 too), so that no
CPU's kernels move the step: what remains is the project's losses and contrastive memory, float32 by design, against
the official float64 ones. Tolerances from the measured spread (2026-11-29, 2-core AMD EPYC (Zen 4) VM, kernel paths
emulated with ATEN_CPU_CAPABILITY/DNNL_MAX_CPU_ISA/MKL_ENABLE_INSTRUCTIONS; ``PYTHONPATH=$PWD .venv/bin/python -m
pytest -s tests/test_u2pl_step_golden.py -k matches`` natively (AVX-512), under ``ATEN_CPU_CAPABILITY=avx2
DNNL_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2``, under ``ATEN_CPU_CAPABILITY=default DNNL_MAX_CPU_ISA=SSE41
MKL_ENABLE_INSTRUCTIONS=SSE4_2 OMP_NUM_THREADS=1`` and with 2 threads): gradients relative to their tensor's scale
(largest |entry|; sums: sum of |entries|) at most 3.4e-7 (``later``; every path), :data:`GRAD_RTOL` = 3e-6,
with a floor of 1e-9 (the biases before a BN have a round-off gradient of about 1e-16 on both sides); losses,
parameters, buffers and the memory bank relative to max(1, max |x|) at most 1.2e-7 (the contrastive loss on the SSE
path), :data:`RTOL` = 1e-6; BN buffers 1e-14 (the kernels' float64 round-off).

Remainder not compared: the all_gather of the memory bank and the all_reduce of the contrastive loss (one process:
identities); U2PL's ResNet-101 ``ModelBuilder`` (needs ImageNet weights and SyncBN on CUDA; the step logic runs on
the project's segmentor on both sides). With this network no new key enters the bank (no unlabeled pixel's
pseudo-label ranks low enough in the teacher's train-mode probabilities), so the bank check is that none does.

The golden fails when a guarded behaviour changes (``test_each_corrected_teacher_moves_the_step_away``): the corrected
teacher reset (a full copy of parameters and buffers) moves the teacher's BN buffers of the ``first`` case by 0.28 of
their scale, averaging them (``ema_buffers=ema``) those of the ``later`` case by 0.11. (With this network the
pseudo-labels do not change with them: its predictions hardly depend on the statistics.)
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from golden_files import recorded, recorder, sidecar
from npsemiseg.data import mixing
from npsemiseg.frameworks.base import Batch, StepContext
from npsemiseg.training import build_framework
from npsemiseg.training.factories import build_optimizer
from npsemiseg.training.step import train_step

REC = recorder("u2pl_step")
DATA = recorded("u2pl_step_released")
META = sidecar("u2pl_step_released")
STEP = REC.step_recording
#: losses, parameters, buffers, memory bank: relative to max(1, max |recorded|)
RTOL = 1e-6
#: gradients: relative to their tensor's scale, at least the floor
GRAD_RTOL, GRAD_FLOOR = 3e-6, 1e-9

pytestmark = pytest.mark.usefixtures("single_seeded_thread")


def case_data(case: str, data: dict[str, np.ndarray] = DATA) -> dict[str, np.ndarray]:
    """The arrays of one case of a step golden, without the case's prefix."""
    return {k[len(case) + 1:]: v for k, v in data.items() if k.startswith(case + "/")}


def inject_draws(monkeypatch, data: dict[str, np.ndarray]) -> list:
    """The recorded CutMix coin and boxes (U2PL's masks keep image i outside the box) and ``torch.randint`` draws;
    returns the queue of draws not yet taken."""
    if "coin" in data:  # a semi-supervised step
        keep = torch.from_numpy(data["cutout"]) == 1
        boxes = []
        for inside in ~keep:
            rows, cols = inside.any(1).nonzero()[:, 0], inside.any(0).nonzero()[:, 0]
            boxes.append([int(rows[0]), int(rows[-1]) + 1, int(cols[0]), int(cols[-1]) + 1])
        monkeypatch.setattr(mixing, "_rand", lambda generator, *shape: torch.tensor(float(data["coin"])))
        monkeypatch.setattr(mixing, "u2pl_boxes", lambda b, h, w, generator=None: torch.tensor(boxes))
    queue = [(int(h), data[f"draw/{i:03d}"]) for i, h in enumerate(data["draw_highs"])]

    def replay(high, size, **kwargs):
        assert queue, "ours draws more than the official step"
        bound, values = queue.pop(0)
        assert (int(high), tuple(size)) == (bound, values.shape), "a draw of another bound or size"
        return torch.from_numpy(values)

    monkeypatch.setattr(torch, "randint", replay)
    return queue


def run_step(monkeypatch, case: str, **overrides):
    """``train_step`` of the recorded cell on the case's batch, network, bank and draws."""
    data = case_data(case)
    epoch, _ = REC.CASES[case]
    config = REC.cell_config(**{**REC.CASE_OVERRIDES.get(case, {}), **overrides})
    framework = build_framework(config)
    tape = STEP.DropoutTape.from_arrays(data, "dropout")
    for role, salt in (("student", REC.STUDENT_SALT), ("teacher", REC.TEACHER_SALT)):
        model = getattr(framework, role).double()
        STEP.load_pattern(model, salt)
        STEP.tape_dropout(model, tape, role)
    for c in range(config.num_classes):
        framework.queues.keys[c] = torch.from_numpy(data[f"queue_before/{c}"]).clone()
    draws = inject_draws(monkeypatch, data)
    batch = Batch(labeled={"image": torch.from_numpy(data["images_l"]).double(), "label": torch.from_numpy(data["labels_l"])},
                  unlabeled={"image": torch.from_numpy(data["images_u"]).double()})
    ctx = StepContext(step=epoch * REC.ITERS, total_steps=REC.EPOCHS * REC.ITERS, epoch=epoch,
                      total_epochs=REC.EPOCHS, iters_per_epoch=REC.ITERS)
    logs = train_step(framework, batch, ctx, build_optimizer(config, framework.student), config, torch.device("cpu"), 1)
    assert not draws and not tape.unused(), "the official step drew more than ours"
    return framework, logs, data


def compare(framework, logs, data) -> dict[str, float]:
    """Max relative |difference| per group of quantities (asserting each within :data:`RTOL`, gradients
    :data:`GRAD_RTOL`)."""
    student, teacher = framework.student, framework.teacher
    diffs = {f"loss_{n}": STEP.close(logs.get(f"train/{n}", 0.0), data[f"loss_{n}"], RTOL, n)
             for n in ("sup", "unsup", "contrastive")}
    diffs["grads"] = STEP.compare_digest(data, "grad", STEP.tensors(student, "grads"), GRAD_RTOL, GRAD_FLOOR)
    for role, model in (("student", student), ("teacher", teacher)):
        for what in ("params", "buffers"):
            diffs[f"{role}/{what}"] = STEP.compare_digest(data, f"{role}/{what}", STEP.tensors(model, what), RTOL)
    diffs["queues"] = max(STEP.close(framework.queues.keys[c].numpy(), data[f"queue/{c}"], RTOL, f"queue {c}")
                          for c in range(len(framework.queues.keys)))
    return diffs


def test_the_released_protocol_runs_the_recorded_options():
    opts = REC.cell_config().framework_options
    assert {k: opts[k] for k in ("ema_buffers", "teacher_reset", "teacher_train_mode")} == {
        "ema_buffers": "none", "teacher_reset": "share", "teacher_train_mode": True}
    assert META["sizes"]["cases"] == {k: list(v) for k, v in REC.CASES.items()}


@pytest.mark.parametrize("case", list(REC.CASES))
def test_one_released_step_matches_the_official_iteration(monkeypatch, case):
    diffs = compare(*run_step(monkeypatch, case))
    print(case, json.dumps({k: f"{v:.1e}" for k, v in diffs.items()}), f"max {max(diffs.values()):.1e}")


@pytest.mark.parametrize(("case", "override"), [("first", {"framework_options.teacher_reset": "copy"}),
                                                ("later", {"framework_options.ema_buffers": "ema"})])
def test_each_corrected_teacher_moves_the_step_away(monkeypatch, case, override):
    """The corrected reset (full copy) or averaged teacher buffers give another step: the golden tells them apart."""
    framework, logs, data = run_step(monkeypatch, case, **override)
    with pytest.raises(AssertionError):
        compare(framework, logs, data)
