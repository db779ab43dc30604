"""A whole step of U2PL with the NP head under ``protocol: released`` is the NP-SemiSeg authors' iteration
(``tests/golden/np_u2pl_step_released.npz``, recorded by ``tests/golden/record_np_u2pl_step_golden.py``:
Jianf-Wang/NP-SemiSeg@afd9672 ``U2PL/train_semi.py`` ``train()`` run for one iteration with the authors' ``NP_HEAD``;
source, command and what was compared in ``np_u2pl_step_released.json``).

``npsemiseg.training.step.train_step`` runs framework ``u2pl`` with head ``np`` of the recorded cell (the released
switches; the head at the authors' sizes) on the same network (the project's NP head holding the weights the recorder
mapped onto the authors' head), batch, memory bank and injected draws (as ``tests/test_u2pl_step_golden.py``, and
every latent noise of the NP head). Compared: the supervised, unsupervised, contrastive and KL terms, every gradient
(after the clipping at 5), the student's and the teacher's parameters and BN buffers after the step, the NP memories'
centers and row counts written by the step, the memory bank. Cases ``first`` (teacher reset), ``later`` and
``supervised`` (a supervised-only epoch: student and train-mode teacher with the labeled images as targets and
context, no KL).

Both sides run in float64 as in ``tests/test_u2pl_step_golden.py`` (the authors' NP head too; its latent noise drawn in
float32 and widened, as the project's head draws it), so that no CPU's kernels move the step: what remains is the
project's float32-by-design parts (the losses, the contrastive memory, the NP attention and memory rows). Tolerances
from the measured spread (2026-11-29, 2-core AMD EPYC (Zen 4) VM, kernel paths emulated with
ATEN_CPU_CAPABILITY/DNNL_MAX_CPU_ISA/MKL_ENABLE_INSTRUCTIONS; ``PYTHONPATH=$PWD .venv/bin/python -m pytest -s
tests/test_np_u2pl_step_golden.py -k matches`` natively (AVX-512), under ``ATEN_CPU_CAPABILITY=avx2
DNNL_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2``, under ``ATEN_CPU_CAPABILITY=default DNNL_MAX_CPU_ISA=SSE41
MKL_ENABLE_INSTRUCTIONS=SSE4_2 OMP_NUM_THREADS=1`` and with 2 threads): gradients relative to their tensor's scale
(floor 1e-9: the biases before an InstanceNorm or BN have round-off gradients of about 1e-15) at most 1.6e-6,
:data:`GRAD_RTOL` = 1e-5; the NP query network's gradients, about 1e-7 and back through the float32 attention, at
most 2.7e-5, :data:`ATTENTION_GRAD_RTOL` = 2e-4; losses, parameters, buffers, centers and the memory bank relative to
max(1, max |x|) at most 1.1e-7 (the supervised loss), :data:`RTOL` = 1e-6.

What it guards besides the plain golden: the NP context from its own pass over the labeled images (switch
``np_context_pass``), the entropy of the softmax of the mean logits (``u2pl_entropy_mean_logits``), the teacher's own
BN statistics. ``test_each_slice_or_probability_entropy_moves_the_step_away`` shows that the golden fails with the
context taken from the labeled slice of the one pass, or with the entropy of the mean softmax.

Remainder not compared: the DDP copy of the memory lists is emulated (the recorder's model hands the head copies, as
the loop's DDP forward does), not run.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from golden_files import recorded, recorder, sidecar
from npsemiseg.frameworks.base import Batch, StepContext
from npsemiseg.training import build_framework
from npsemiseg.training.factories import build_optimizer
from npsemiseg.training.step import train_step
from test_u2pl_step_golden import case_data, inject_draws

REC = recorder("np_u2pl_step")
DATA = recorded("np_u2pl_step_released")
META = sidecar("np_u2pl_step_released")
STEP = REC.step_recording
#: losses, parameters, buffers, NP centers, memory bank: relative to max(1, max |recorded|)
RTOL = 1e-6
#: gradients: relative to their tensor's scale, at least the floor
GRAD_RTOL, GRAD_FLOOR = 1e-5, 1e-9
#: the NP head's query network: its gradients come back through the attention, float32 by design
ATTENTION = "head.query_net."
ATTENTION_GRAD_RTOL = 2e-4

pytestmark = pytest.mark.usefixtures("single_seeded_thread")


def inject_noise(framework, data: dict[str, np.ndarray]) -> list:
    """Each network's ``NPHead.sample`` with its recorded noise: T draws ``[B, D]`` of the authors' ``reparameterize``
    per call, in that network's call order. Returns the queues (empty once all were taken)."""
    queues = []
    for role in ("student", "teacher"):
        queue = [data[k] for k in sorted(k for k in data if k.startswith(f"noise/{role}/"))]

        def sample(mean, sigma, num_samples, queue=queue, role=role):
            assert len(queue) >= num_samples, f"the {role} samples more latents than in the authors' step"
            eps = torch.from_numpy(np.stack([queue.pop(0) for _ in range(num_samples)]))
            assert eps.shape[1:] == mean.shape, f"a latent draw of shape {tuple(eps.shape[1:])} for {tuple(mean.shape)}"
            return mean.float() + sigma.float() * eps

        getattr(framework, role).head.sample = sample
        queues.append(queue)
    return queues


def run_step(monkeypatch, case: str, **overrides):
    data = case_data(case, DATA)
    epoch, _ = REC.CASES[case]
    config = REC.cell_config(**{**REC.CASE_OVERRIDES.get(case, {}), **overrides})
    framework = build_framework(config)
    tape = STEP.DropoutTape.from_arrays(data, "dropout")
    for role, salt in (("student", REC.plain.STUDENT_SALT), ("teacher", REC.plain.TEACHER_SALT)):
        model = getattr(framework, role).double()
        REC.load_weights(model, salt)
        STEP.tape_dropout(model, tape, role)
    for c in range(config.num_classes):
        framework.queues.keys[c] = torch.from_numpy(data[f"queue_before/{c}"]).clone()
    draws, noise = inject_draws(monkeypatch, data), inject_noise(framework, data)
    batch = Batch(labeled={"image": torch.from_numpy(data["images_l"]).double(), "label": torch.from_numpy(data["labels_l"])},
                  unlabeled={"image": torch.from_numpy(data["images_u"]).double()})
    plan = REC.plain
    ctx = StepContext(step=epoch * plan.ITERS, total_steps=plan.EPOCHS * plan.ITERS, epoch=epoch,
                      total_epochs=plan.EPOCHS, iters_per_epoch=plan.ITERS)
    logs = train_step(framework, batch, ctx, build_optimizer(config, framework.student), config, torch.device("cpu"), 1)
    assert not draws and not any(noise) and not tape.unused(), "the authors' step drew more than ours"
    return framework, logs, data


def _part(data: dict[str, np.ndarray], prefix: str, items: list, attention: bool) -> tuple[dict, str, list]:
    """``(data, prefix, items)`` for :func:`step_recording.compare_digest` of the items of the query network
    (``attention``) or of all others, the record's ``<prefix>/<kind>/<name>`` entries cut to the same names."""
    picked = [(n, t) for n, t in items if n.startswith(ATTENTION) == attention]
    names = {n for n, _ in picked}
    part = {k: v for k, v in data.items() if not k.startswith(prefix + "/") or k.split("/", 2)[2] in names}
    return part, prefix, picked


def compare(framework, logs, data) -> dict[str, float]:
    """Max relative |difference| per group of quantities (asserting each within :data:`RTOL`, gradients
    :data:`GRAD_RTOL`, the query network's :data:`ATTENTION_GRAD_RTOL`)."""
    student, teacher = framework.student, framework.teacher
    # a term the step does not have (the supervised-only epoch's unsup and contrastive) is 0 in the official loop
    diffs = {f"loss_{n}": STEP.close(logs.get(f"train/{n}", 0.0), data[f"loss_{n}"], RTOL, n)
             for n in ("sup", "unsup", "contrastive", "kl")}
    grads = STEP.tensors(student, "grads")
    diffs["grads"] = STEP.compare_digest(*_part(data, "grad", grads, False), GRAD_RTOL, GRAD_FLOOR)
    diffs["grads_attention"] = STEP.compare_digest(*_part(data, "grad", grads, True), ATTENTION_GRAD_RTOL, GRAD_FLOOR)
    for role, model in (("student", student), ("teacher", teacher)):
        diffs[f"{role}/params"] = STEP.compare_digest(data, f"{role}/params", STEP.tensors(model, "params"), RTOL)
        bn = [(n, t) for n, t in STEP.tensors(model, "buffers") if not n.startswith("head.")]
        diffs[f"{role}/buffers"] = STEP.compare_digest(data, f"{role}/buffers", bn, RTOL)
    head = student.head
    for name in ("target", "context"):
        assert getattr(head, f"{name}_count").tolist() == data[f"{name}_rows"].tolist(), f"{name} memory rows"
        diffs[f"{name}_centers"] = STEP.close(getattr(head, f"{name}_centers").numpy(), data[f"{name}_centers"], RTOL,
                                              f"{name} centers")
    diffs["queues"] = max(STEP.close(framework.queues.keys[c].numpy(), data[f"queue/{c}"], RTOL, f"queue {c}")
                          for c in range(len(framework.queues.keys)))
    return diffs


def test_the_released_protocol_runs_the_recorded_options():
    config = REC.cell_config()
    opts = config.framework_options
    assert {k: opts[k] for k in ("np_context", "teacher_entropy", "ema_buffers", "teacher_reset", "np_targets")} == {
        "np_context": "pass", "teacher_entropy": "mean_logits", "ema_buffers": "none", "teacher_reset": "share",
        "np_targets": "unfiltered"}
    assert config.optim.grad_clip == 5.0 and config.head.options["lambda_kl"] == REC.LAMBDA_KL
    assert META["sizes"]["overrides"] == REC.OVERRIDES


@pytest.mark.parametrize("case", list(REC.CASES))
def test_one_released_step_matches_the_authors_iteration(monkeypatch, case):
    diffs = compare(*run_step(monkeypatch, case))
    print(case, json.dumps({k: f"{v:.1e}" for k, v in diffs.items()}), f"max {max(diffs.values()):.1e}")


@pytest.mark.parametrize("override", [{"framework_options.np_context": "slice"},
                                      {"framework_options.teacher_entropy": "mean_probs"}])
def test_each_slice_or_probability_entropy_moves_the_step_away(monkeypatch, override):
    """The context from the one pass's labeled slice, or the entropy of the mean softmax, gives another step: the
    first leaves the context pass's dropout masks untaken, the second draws contrastive anchors from other counts."""
    with pytest.raises(AssertionError):
        compare(*run_step(monkeypatch, "later", **override))


def test_the_supervised_only_step_decays_the_representation(monkeypatch):
    """Without the official zero terms (``sup_only_zero_terms=False``, corrected) the representation head gets no
    gradient, so no weight decay: its parameters after the step differ from the record."""
    framework, logs, data = run_step(monkeypatch, "supervised", **{"framework_options.sup_only_zero_terms": False})
    assert not any(p.grad is not None for p in framework.student.representation_head.parameters())
    with pytest.raises(AssertionError, match="representation_head"):
        compare(framework, logs, data)
