"""Frameworks ``unimatch_v2`` and ``fixmatch_v2`` take the official steps of UniMatch V2's repository
(``tests/golden/unimatch_v2_step.npz`` / ``fixmatch_v2_step.npz``, recorded by
``tests/golden/record_unimatch_v2_golden.py``; source, command and what was compared in their ``.json``).

The official loop bodies (unimatch_v2.py 170-226, fixmatch.py 171-217) ran one step at iteration 3 on the official
DPT at tiny sizes, with injected CutMix boxes and complementary-dropout draws. Here the frameworks run the same step on
the project's ``vit_tiny`` + DPT with a 1x1 classifier head (the official ``output_conv.2``; a test head, so that the
network is the official one layer for layer), the same pattern weights for student and EMA teacher, the same inputs
and draws (``draw_boxes`` / ``draw_masks`` return the recorded ones), AdamW with the recorded groups, then
``after_optimizer_step``. Both sides run in float64 (``REC.DTYPE``: networks, images, the Bernoulli draw; the
official code fixes float32 only in the position embedding's resize, ``dinov2.py`` 185, which the project's
``vit_tiny`` does alike); the project's losses and the teacher's confidences are float32 by design. Tolerance
:data:`RTOL_SCALE` = 1e-5 x max(1, max |theirs|) per quantity, plus, after the AdamW step, what its first step makes
of the gradients' differences where a gradient is near its eps (:func:`_adam_bounds`; a real gradient of 1e-9 to
1e-7, e.g. a final-norm weight's at 5e-8, known to 1e-7 of its tensor's scale through the float32 losses). Measured
(2026-11-29, 2-core AMD EPYC (Zen 4) VM, kernel paths emulated with ATEN_CPU_CAPABILITY/DNNL_MAX_CPU_ISA/
MKL_ENABLE_INSTRUCTIONS; ``pytest -s tests/test_unimatch_v2_golden.py`` prints them) on the native (AVX-512), AVX2
(``avx2``/``AVX2``/``AVX2``), portable (``default``/``SSE41``/``SSE4_2``, 1 thread) paths and with 2 threads, relative to
max(1, max |theirs|), the larger of unimatch_v2 and fixmatch_v2: losses 3.3e-8; the teacher's confidences 1.1e-7; gradients: sums
5.8e-7, sampled entries 1.6e-8; after the step, entries whose gradient exceeds 1e-6: student 5.5e-9, EMA teacher
1.4e-9; sums (qkv biases apart) 6.3e-7; qkv biases 6.1e-10, their key parts 3.6e-13; the rest within the AdamW
bound. Largest: 6.3e-7, a margin of 16 to :data:`RTOL_SCALE`. The official step itself moves by up to 2.7e-8 between
those paths (its float32 position-embedding resize, through AdamW at a near-eps gradient). Negative cases: without the
complementary masks UniMatch V2's first strong loss moves by 3.1e-3; a constant EMA ratio 0.996 (no warm-up) moves the
teacher's entries by 0.26; both far beyond the tolerance.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch import Tensor, nn

from golden_files import recorded, recorder, sidecar
from npsemiseg.frameworks.base import Batch, StepContext
from npsemiseg.frameworks import get_framework
from npsemiseg.frameworks.unimatch_v2 import UniMatchV2Options
from npsemiseg.heads import ClassifierHead, HeadOutput
from npsemiseg.models import build_segmentor

RTOL_SCALE = 1e-5

pytestmark = pytest.mark.usefixtures("single_seeded_thread")

REC = recorder("unimatch_v2")
DPT = recorder("dinov2_dpt")
RECORDS = {name: (recorded(f"{name}_step"), sidecar(f"{name}_step")) for name in ("unimatch_v2", "fixmatch_v2")}
DATA, META = RECORDS["unimatch_v2"]
SHAPES = sidecar("dinov2_dpt")["official_shapes"]
#: the recorded losses behind each loss term: ``term: (weight, recorded key)``
TERMS = {"unimatch_v2": {"sup": (0.5, "loss_x"), "unsup_s1": (0.25, "loss_u_s1"), "unsup_s2": (0.25, "loss_u_s2")},
         "fixmatch_v2": {"sup": (0.5, "loss_x"), "unsup": (0.5, "loss_u_s")}}


class ProjectionHead(ClassifierHead):
    """The official DPT's class projection (``output_conv.2``): a 1x1 conv, ``[B, C, h, w] -> [1, B, K, h, w]``."""

    def __init__(self, in_channels: int, num_classes: int) -> None:
        super().__init__(in_channels, num_classes)
        self.conv = nn.Conv2d(in_channels, num_classes, 1)

    def forward(self, features: Tensor, *, labels: Tensor | None = None, context_features: Tensor | None = None,
                context_labels: Tensor | None = None, num_samples: int | None = None) -> HeadOutput:
        self.check_features(features)
        return HeadOutput(self.conv(features)[None], self.zero_aux(features))


def _ours(name: str) -> str:
    """The project's name of an official parameter."""
    if name.startswith("backbone."):
        return "backbone.vit." + name.removeprefix("backbone.")
    if name.startswith("head.scratch.output_conv.2."):
        return "head.conv." + name.removeprefix("head.scratch.output_conv.2.")
    return "decoder." + name.removeprefix("head.")


def _load(model: nn.Module, salt: int) -> None:
    state = {_ours(k): v for k, v in DPT.pattern_state(SHAPES, salt).items() if k != "backbone.mask_token"}
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"mean", "std"}


def _close(ours, theirs, what: str) -> float:
    """``|ours - theirs| <= RTOL_SCALE x max(1, max |theirs|)``; returns the difference relative to that scale."""
    ours, theirs = np.asarray(ours, dtype=np.float64), np.asarray(theirs, dtype=np.float64)
    diff = float(np.max(np.abs(ours - theirs)))
    bound = RTOL_SCALE * max(1.0, float(np.max(np.abs(theirs))))
    assert diff <= bound, f"{what}: max |difference| {diff:.3g} > {bound:.3g}"
    return diff * RTOL_SCALE / bound


def _digest(tensors: dict[str, Tensor], data: dict = DATA, meta: dict = META) -> dict[str, np.ndarray]:
    names = meta["parameters"]["names"]
    flats = [tensors[_ours(n)].detach().double().flatten() for n in names]
    offsets = np.cumsum([0] + meta["parameters"]["samples"])
    at = [f[torch.from_numpy(data["index"][offsets[i]:offsets[i + 1]].astype(np.int64))].numpy()
          for i, f in enumerate(flats)]
    return {"sum": np.array([float(f.sum()) for f in flats]), "abs": np.array([float(f.abs().sum()) for f in flats]),
            "at": np.concatenate(at)}


def _step(framework: str = "unimatch_v2", *, masks: bool = True, ema_decay: float | None = None):
    """The recorded step through ``framework``: (framework, step result, teacher prediction, gradients)."""
    data = RECORDS[framework][0]
    factory = lambda: build_segmentor(num_classes=DPT.NUM_CLASSES, head=ProjectionHead(DPT.FEATURES, DPT.NUM_CLASSES),  # noqa: E731
                                      backbone=DPT.BACKBONE, align_corners=True)
    options = UniMatchV2Options(confidence_threshold=REC.CONF_THRESH, ema_decay=REC.EMA_CAP)
    fw = get_framework(framework)(options, factory, num_classes=DPT.NUM_CLASSES)
    _load(fw.student, REC.STUDENT_SALT)
    _load(fw.teacher, REC.TEACHER_SALT)
    fw.student.to(REC.DTYPE)
    fw.teacher.to(REC.DTYPE)
    boxes = [torch.from_numpy(data[k]).bool() for k in ("box1", "box2")][:len(fw.strong_weights)]
    mask = torch.from_numpy(data["dropout_mask"]) if "dropout_mask" in data else None
    mask = mask if masks or mask is None else torch.ones_like(mask)
    fw.draw_boxes = lambda batch, height, width, device: boxes  # type: ignore[method-assign]
    fw.draw_masks = lambda pairs, widths, device: [mask]  # type: ignore[method-assign]
    predictions = []
    original = fw.predict
    fw.predict = lambda teacher, images, **kw: predictions.append(original(teacher, images, **kw)) or predictions[-1]
    groups = fw.student.parameter_groups()
    optimizer = torch.optim.AdamW([{"params": groups[0]["params"], "lr": REC.LR},
                                   {"params": groups[1]["params"], "lr": REC.LR * REC.LR_MULTI}],
                                  lr=REC.LR, betas=REC.BETAS, weight_decay=REC.WEIGHT_DECAY)
    image = lambda key: torch.from_numpy(data[key]).to(REC.DTYPE)  # noqa: E731
    batch = Batch(labeled={"image": image("images_l"), "label": torch.from_numpy(data["labels_l"].astype(np.int64))},
                  unlabeled={"image": image("images_w"), "image_strong": image("images_s")})
    ctx = StepContext(step=REC.ITERS, total_steps=10, epoch=0, total_epochs=1, iters_per_epoch=10)
    fw.student.train()
    result = fw.train_step(batch, ctx)
    optimizer.zero_grad()
    result.total.backward()
    grads = {n: p.grad.clone() for n, p in fw.student.named_parameters() if p.grad is not None}
    optimizer.step()
    if ema_decay is not None:
        fw.ema(fw.teacher, ema_decay)
    else:
        fw.after_optimizer_step(ctx)
    return fw, result, predictions[0], grads


@pytest.mark.parametrize("framework", list(RECORDS))
def test_the_losses_and_the_teachers_pseudo_labels_equal_the_official_step(framework):
    data = RECORDS[framework][0]
    _, result, teacher, _ = _step(framework)
    losses = {k: float(v.detach()) for k, v in result.losses.items()}
    assert set(losses) == set(TERMS[framework])
    seen = {"losses": max(_close(losses[term], weight * data[key], f"{weight} {key}")
                          for term, (weight, key) in TERMS[framework].items())}
    seen["loss"] = _close(float(result.total.detach()), data["loss"], "loss")
    seen["mask_ratio"] = _close(float(result.logs["mask_ratio"]), data["mask_ratio"], "mask ratio")
    seen["confidences"] = _close(teacher.confidence, data["conf_u_w"], "the EMA teacher's confidences")
    assert torch.equal(teacher.label, torch.from_numpy(data["mask_u_w"].astype(np.int64)))
    print(json.dumps({framework: {k: f"{v:.2e}" for k, v in seen.items()}}))


def _key_bias(tensor: Tensor | np.ndarray) -> np.ndarray:
    """``[..., 3D] -> [..., D]``: the key third of attention ``qkv`` biases."""
    d = np.asarray(tensor).shape[-1] // 3
    return np.asarray(tensor)[..., d:2 * d]


def _rest(tensor: Tensor | np.ndarray) -> np.ndarray:
    d = np.asarray(tensor).shape[-1] // 3
    return np.concatenate([np.asarray(tensor)[..., :d], np.asarray(tensor)[..., 2 * d:]], axis=-1)


#: torch's AdamW default eps, the official optimiser's
ADAM_EPS = 1e-8


def _adam_bounds(names: list[str], samples: list[int], ours: np.ndarray, theirs: np.ndarray, scale: float) -> np.ndarray:
    """Per sampled entry with gradients ``ours`` / ``theirs``, how far AdamW's first step (``lr x g / (|g| + eps)``)
    can move it apart on the two sides: ``lr x |g - g'| x eps / (min(|g|, |g'|) + eps)^2``, x ``scale`` (the EMA's
    share). Negligible where a gradient is far above eps; up to ``lr x |g - g'| / eps`` where it is round-off."""
    lrs = np.concatenate([np.full(n, REC.LR if name.startswith("backbone.") else REC.LR * REC.LR_MULTI)
                          for name, n in zip(names, samples)])
    smallest = np.minimum(np.abs(ours), np.abs(theirs))
    return scale * lrs * np.abs(ours - theirs) * ADAM_EPS / (smallest + ADAM_EPS) ** 2


@pytest.mark.parametrize("framework", list(RECORDS))
def test_gradients_the_adamw_step_and_the_ema_teacher_equal_the_official_step(framework):
    """Gradients within the tolerance; after the step each sampled entry within it plus what AdamW's first step makes
    of the gradients' differences there (:func:`_adam_bounds`: it matters where a gradient is near eps, e.g. a
    final-norm weight's at 5e-8); sums within it but for the ``qkv`` biases, checked in full: the key parts' gradient
    is 0 in exact arithmetic (a key bias shifts every attention logit of a query alike), in float64 round-off below
    1e-14, so that AdamW moves them by less than lr x 1e-6, and they are compared as the rest."""
    data, meta = RECORDS[framework]
    fw, _, _, grads = _step(framework)
    names, samples = meta["parameters"]["names"], meta["parameters"]["samples"]
    qkv = [i for i, n in enumerate(names) if n.endswith("attn.qkv.bias")]
    grads_at = _digest(grads, data, meta)["at"]
    ema_share = 1 - min(1 - 1 / (REC.ITERS + 1), REC.EMA_CAP)
    seen = {}
    for prefix, tensors, scale in (("grad", grads, 0.0), ("student", dict(fw.student.named_parameters()), 1.0),
                                   ("ema", dict(fw.teacher.named_parameters()), ema_share)):
        ours = _digest(tensors, data, meta)
        keep = [i for i in range(len(names)) if prefix == "grad" or i not in qkv]
        seen[f"{prefix}/sums"] = max(_close(ours[key][keep], data[f"{prefix}/{key}"][keep], f"{prefix} {key}")
                                     for key in ("sum", "abs"))
        theirs = data[f"{prefix}/at"]
        unit = max(1.0, float(np.abs(theirs).max()))
        bound = RTOL_SCALE * unit + _adam_bounds(names, samples, grads_at, data["grad/at"], scale)
        worst = int(np.argmax(np.abs(ours["at"] - theirs) - bound))
        assert np.abs(ours["at"] - theirs)[worst] <= bound[worst], f"{prefix} entry {worst}: beyond its bound"
        resolved = np.abs(data["grad/at"]) > 1e-6  # where AdamW's first step is lr x sign(g), round-off aside
        seen[f"{prefix}/entries"] = float(np.abs(ours["at"] - theirs)[resolved].max()) / unit
        biases = np.stack([tensors[_ours(names[i])].detach().numpy() for i in qkv])
        seen[f"{prefix}/query_value_biases"] = _close(_rest(biases), _rest(data[f"{prefix}/qkv_bias"]),
                                                      f"{prefix} query and value biases")
        if prefix == "grad":  # round-off: in float64 so far below eps that AdamW moves them by < lr x 1e-8
            assert np.abs(_key_bias(biases)).max() < 1e-14 and np.abs(_key_bias(data["grad/qkv_bias"])).max() < 1e-14
        else:
            seen[f"{prefix}/key_biases"] = _close(_key_bias(biases), _key_bias(data[f"{prefix}/qkv_bias"]),
                                                  f"{prefix} key biases")
    print(json.dumps({framework: {k: f"{v:.2e}" for k, v in seen.items()}}))


@pytest.mark.parametrize("framework", list(RECORDS))
def test_the_golden_tells_a_missing_mask_and_a_cold_ema_apart(framework):
    data, meta = RECORDS[framework]
    if framework == "unimatch_v2":
        _, result, _, _ = _step(framework, masks=False)
        moved = abs(float(result.losses["unsup_s1"].detach()) - 0.25 * float(data["loss_u_s1"]))
        print(json.dumps({framework: {"masks_left_out": f"{moved:.2e}"}}))
        assert moved > 100 * RTOL_SCALE
    fw, _, _, _ = _step(framework, ema_decay=REC.EMA_CAP)
    ema = _digest(dict(fw.teacher.named_parameters()), data, meta)
    moved = float(np.max(np.abs(ema["at"] - data["ema/at"])))
    print(json.dumps({framework: {"cold_ema": f"{moved:.2e}"}}))
    assert moved > 100 * RTOL_SCALE
