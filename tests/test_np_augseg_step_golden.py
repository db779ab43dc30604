"""Two steps of AugSeg with the NP head under ``protocol: released`` are the NP-SemiSeg authors' first two iterations of
an epoch (``tests/golden/np_augseg_step_released.npz``, recorded by ``tests/golden/record_np_augseg_step_golden.py``:
Jianf-Wang/NP-SemiSeg@afd9672 ``AugSeg/train_semi.py`` ``train()`` with the authors' ``NP_HEAD``; source, command
and what was compared in ``np_augseg_step_released.json``).

``npsemiseg.training.step.train_step`` runs framework ``augseg`` with head ``np`` of the recorded cell twice (steps 0
and 1 of epoch 1) on the same network, batches and injected draws (CutMix per step, every latent noise per network).
Both sides run in float64 (networks with the NP head, pattern parameters and BN buffers, inputs, the initial
memories; ``record_augseg_step_golden.DTYPE``), except what the project computes in float32 by design: the loss path,
the NP head's attention over the memories, its latent samples (the recorded noise is float32) and its memories.
Compared as ``tests/test_augseg_step_golden.py``: each step's supervised, unsupervised and KL terms; after the second
step every gradient, the student's and the teacher's parameters and BN buffers and the NP memories' centers and rows.
What it guards: the context's own pass (switch ``np_context_pass``) and the memories as the authors' loop leaves them
(``augseg_np_memories``: the second step starts from the first step's memories with target and context exchanged).
``test_each_corrected_memory_or_context_moves_the_step_away`` shows the golden failing with the memories as the head
keeps them (reset every step under ``released``: rows differ, the second step's losses 1.2e-5 and gradients 1.0 of
their scale away) and with the context from the labeled slice (rows differ, losses 6.2e-4, gradients 9.6).

Tolerances from the measured spread (2026-11-29, 2-core AMD EPYC (Zen 4) VM, kernel paths emulated with
ATEN_CPU_CAPABILITY/DNNL_MAX_CPU_ISA/MKL_ENABLE_INSTRUCTIONS: native AVX-512 on 1 and 2 threads, ``avx2 AVX2 AVX2``,
``default SSE41 SSE4_2`` with OMP_NUM_THREADS=1; ``PYTHONPATH=$PWD .venv/bin/python -m pytest -q -s
tests/test_np_augseg_step_golden.py`` under each, which prints the differences; 2 threads: :func:`run_steps` after
``torch.set_num_threads(2)``). The authors' float64 iterations re-recorded under each path move by at most 1.1e-12
(gradients: round-off, 5.6e-7 of the bound's scale at a bias before a norm), with the latent noise drawn in float64
and rounded to float32 for that measurement: ``torch.randn``'s float32 draws differ in the last bit between vector
widths, so a re-recording on another CPU stores other noise (the test replays whatever was stored). Ours against the
record, worst over the paths: losses 2.7e-8, parameters 1.2e-8, BN
buffers 4.8e-8, NP centers 8.0e-8 (:data:`RTOL` 1e-6, margin 12); the second step's gradients 2.9e-5 of their
tensor's scale (a layer4 convolution; the float32 head and loss paths through two steps; 2.2e-5 natively),
:data:`GRAD_RTOL` 2e-4 (margin 7) with the floor :data:`GRAD_FLOOR` 1e-10. In float32 the same gradients moved by
3e-2 of their scale between one and two threads and were not compared.

Remainder: as the plain AugSeg golden, the teacher's ``num_batches_tracked`` and the all_reduce (one process); the
epoch's start from the zero-row memories is the first step's (each later epoch starts the same way).
"""

from __future__ import annotations

import json

import pytest
import torch

from golden_files import recorded, recorder, sidecar
from npsemiseg.frameworks.base import Batch, StepContext
from npsemiseg.training import build_framework
from npsemiseg.training.factories import build_optimizer
from npsemiseg.training.step import train_step
from test_augseg_step_golden import inject_cutmix
from test_np_u2pl_step_golden import inject_noise

REC = recorder("np_augseg_step")
DATA = recorded("np_augseg_step_released")
META = sidecar("np_augseg_step_released")
STEP = REC.step_recording
#: losses, parameters, buffers and memory centers: relative to max(1, the largest recorded |value|) (sums: to the
#: sum of |x|)
RTOL = 1e-6
#: the second step's gradients: relative to their tensor's scale, at least the floor
GRAD_RTOL, GRAD_FLOOR = 2e-4, 1e-10

pytestmark = pytest.mark.usefixtures("single_seeded_thread")


def run_steps(monkeypatch, **overrides):
    """Two ``train_step`` s of the recorded cell; returns the framework and each step's logs."""
    config = REC.cell_config(**overrides)
    framework = build_framework(config)
    for role, salt in (("student", REC.plain.STUDENT_SALT), ("teacher", REC.plain.TEACHER_SALT)):
        STEP.load_pattern(getattr(framework, role).to(REC.plain.DTYPE), salt)
    noise = inject_noise(framework, DATA)
    optimizer = build_optimizer(config, framework.student)
    iters, logs = REC.plain.ITERS, []
    for s in range(len(REC.SEEDS)):
        data = {k[len(f"step{s}/"):]: v for k, v in DATA.items() if k.startswith(f"step{s}/")}
        boxes = inject_cutmix(monkeypatch, data)
        images = {k: torch.from_numpy(data[k]).to(REC.plain.DTYPE) for k in ("images_l", "images_u", "images_u_strong")}
        batch = Batch(labeled={"image": images["images_l"], "label": torch.from_numpy(data["labels_l"])},
                      unlabeled={"image": images["images_u"], "image_strong": images["images_u_strong"]})
        ctx = StepContext(step=REC.EPOCH * iters + s, total_steps=REC.plain.EPOCHS * iters, epoch=REC.EPOCH,
                          total_epochs=REC.plain.EPOCHS, iters_per_epoch=iters)
        logs.append(train_step(framework, batch, ctx, optimizer, config, torch.device("cpu"), 1))
        assert not boxes, "the official step drew more boxes than ours"
    assert not any(noise), "the authors' steps drew more latents than ours"
    return framework, logs


def compare(framework, logs) -> dict[str, float]:
    """Max relative |difference| per group of quantities (asserting each within :data:`RTOL`, gradients
    :data:`GRAD_RTOL`)."""
    diffs = {}
    for s, step_logs in enumerate(logs):
        for n in ("sup", "unsup", "kl"):
            diffs[f"step{s}/loss_{n}"] = STEP.close(step_logs[f"train/{n}"], DATA[f"step{s}/loss_{n}"], RTOL, n)
    diffs["grads"] = STEP.compare_digest(DATA, "grad", STEP.tensors(framework.student, "grads"), GRAD_RTOL,
                                         floor=GRAD_FLOOR)
    for role in ("student", "teacher"):
        model = getattr(framework, role)
        diffs[f"{role}/params"] = STEP.compare_digest(DATA, f"{role}/params", STEP.tensors(model, "params"), RTOL)
        keep = [(n, t) for n, t in STEP.tensors(model, "buffers") if not n.startswith("head.")
                and not (role == "teacher" and n.endswith("num_batches_tracked"))]
        recorded_buffers = {k: v for k, v in DATA.items() if not (role == "teacher" and k.endswith("num_batches_tracked"))}
        diffs[f"{role}/buffers"] = STEP.compare_digest(recorded_buffers, f"{role}/buffers", keep, RTOL)
    head = framework.student.head
    for name in ("target", "context"):
        assert getattr(head, f"{name}_count").tolist() == DATA[f"{name}_rows"].tolist(), f"{name} memory rows"
        diffs[f"{name}_centers"] = STEP.close(getattr(head, f"{name}_centers").numpy(), DATA[f"{name}_centers"], RTOL,
                                              f"{name} centers")
    return diffs


def test_the_released_protocol_runs_the_recorded_options():
    config = REC.cell_config()
    opts = config.framework_options
    assert {k: opts[k] for k in ("np_context", "np_memories", "np_targets")} == {
        "np_context": "pass", "np_memories": "swapped", "np_targets": "unfiltered"}
    assert config.optim.grad_clip == 5.0 and config.head.options["lambda_kl"] == REC.LAMBDA_KL
    assert config.head.options["persist_memories"] is False  # the head alone would reset them every step
    assert META["sizes"]["overrides"] == REC.OVERRIDES


def test_two_released_steps_match_the_authors_iterations(monkeypatch):
    diffs = compare(*run_steps(monkeypatch))
    print(json.dumps({k: f"{v:.1e}" for k, v in diffs.items()}), f"max {max(diffs.values()):.1e}")


@pytest.mark.parametrize("override", [{"framework_options.np_memories": "head"},
                                      {"framework_options.np_context": "slice"}])
def test_each_corrected_memory_or_context_moves_the_step_away(monkeypatch, override):
    """Memories reset at every step, or the context from the labeled slice, give other steps."""
    with pytest.raises(AssertionError):
        compare(*run_steps(monkeypatch, **override))
