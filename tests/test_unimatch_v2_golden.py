"""Frameworks ``unimatch_v2`` and ``fixmatch_v2`` take the official steps of UniMatch V2's repository
(``tests/golden/unimatch_v2_step.npz`` / ``fixmatch_v2_step.npz``, recorded by
``tests/golden/record_unimatch_v2_golden.py``; source, command and what was compared in their ``.json``).

The official loop bodies (unimatch_v2.py 170-226, fixmatch.py 171-217) ran one step at iteration 3 on the official
DPT at tiny sizes, on the batch the project's data pipeline makes for the released cell (two strong views, each its
own photometric draw; one padded unlabeled crop, its padding 255 in the official ``ignore_mask``), with injected
CutMix boxes (the project's draw) and complementary-dropout draws. Here the frameworks run the same step on the
project's ``vit_tiny`` + DPT with the released baseline head (``block="projection"``, switch
``unimatch_v2_projection_head``: the official ``output_conv.2``, so that the network is the official one layer for
layer), the same pattern weights for student and EMA teacher, the same batch (the keys ``Framework.unlabeled_views``
asks for) and draws (``draw_boxes`` / ``draw_masks`` return the recorded ones), AdamW with the recorded groups, then
``after_optimizer_step``. Both sides run in float64 (``REC.DTYPE``: networks, images, the Bernoulli draw; the
official code fixes float32 only in the position embedding's resize, ``dinov2.py`` 185, which the project's
``vit_tiny`` does alike); the project's losses and the teacher's confidences are float32 by design. Tolerance
:data:`RTOL_SCALE` = 1e-5 x max(1, max |theirs|) per quantity, plus, after the AdamW step, what its first step makes
of the gradients' differences where a gradient is near its eps (:func:`_adam_bounds`); the updated parameters' sums
are compared over the entries whose official gradient exceeds 1e-5 (``REC.RESOLVED``): the pipeline's flat image
regions and padding leave a few gradients per tensor near eps, where AdamW's first step turns the float32 losses'
round-off into lr-sized moves (one such entry moved a sum by 3.5e-4 of 0.04 x 40: beyond the tolerance). Measured
(2026-11-29, 2-core AMD EPYC (Zen 4) VM, kernel paths emulated with ATEN_CPU_CAPABILITY/DNNL_MAX_CPU_ISA/
MKL_ENABLE_INSTRUCTIONS; ``pytest -s tests/test_unimatch_v2_golden.py`` prints them) on the native (AVX-512), AVX2
(``avx2``/``AVX2``/``AVX2``) and portable (``default``/``SSE41``/``SSE4_2``, 1 thread) paths, relative to max(1, max
|theirs|), the larger of unimatch_v2 and fixmatch_v2: losses 2.6e-8; mask ratio 6.1e-9; the teacher's confidences
1.1e-7; gradients: sums 1.05e-6 (portable; native and AVX2 8.7e-7), sampled entries 5.9e-8; after the step,
entries whose gradient exceeds 1e-6: student 2.2e-8, EMA teacher 5.8e-9; resolved sums 9.6e-10; qkv biases 5.0e-10,
their key parts 1.3e-12; the rest within the AdamW bound. Largest: 1.05e-6, a margin of 9.5 to :data:`RTOL_SCALE`.
Negative cases (the gradients, relative to their tensor's largest entry): the first strong view reused for the second
1.0; the padding left out (every pixel counted) 8.5 (UniMatch V2) and 30 (FixMatch V2); without the complementary
masks 6.2; a constant EMA ratio 0.996 (no warm-up) moves the teacher's entries by 0.26; all far beyond the tolerance.
"""


from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch import Tensor, nn

from golden_files import recorded, recorder, sidecar
from npsemiseg.config import compose
from npsemiseg.frameworks.base import Batch, StepContext
from npsemiseg.frameworks import get_framework
from npsemiseg.data.transforms import strong_key
from npsemiseg.frameworks.unimatch_v2 import UniMatchV2Options
from npsemiseg.heads import build_head
from npsemiseg.models import build_segmentor

RTOL_SCALE = 1e-5

pytestmark = pytest.mark.usefixtures("single_seeded_thread")

REC = recorder("unimatch_v2")
DPT = recorder("dinov2_dpt")
RECORDS = {name: (recorded(f"{name}_step"), sidecar(f"{name}_step")) for name in ("unimatch_v2", "fixmatch_v2")}
DATA, META = RECORDS["unimatch_v2"]
SHAPES = sidecar("dinov2_dpt")["official_shapes"]
#: the baseline head's options under ``released`` (switch ``unimatch_v2_projection_head``; the test below checks
#: that the released cells compose them)
RELEASED_HEAD = {"block": "projection"}
#: the recorded losses behind each loss term: ``term: (weight, recorded key)``
TERMS = {"unimatch_v2": {"sup": (0.5, "loss_x"), "unsup_s1": (0.25, "loss_u_s1"), "unsup_s2": (0.25, "loss_u_s2")},
         "fixmatch_v2": {"sup": (0.5, "loss_x"), "unsup": (0.5, "loss_u_s")}}


def _ours(name: str) -> str:
    """The project's name of an official parameter (the class projection ``output_conv.2``: the released baseline
    head's ``classifier``)."""
    if name.startswith("backbone."):
        return "backbone.vit." + name.removeprefix("backbone.")
    if name.startswith("head.scratch.output_conv.2."):
        return "head.classifier." + name.removeprefix("head.scratch.output_conv.2.")
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


def _unlabeled(data: dict, views: int, change: str | None) -> dict[str, Tensor]:
    """The recorded unlabeled batch as the pipeline gives it to a framework with ``views`` strong views; ``change``:
    ``one_view`` (the first strong view in place of the second, as the step once built both) or ``no_padding`` (no
    padded pixel, as the step once counted every pixel)."""
    image = lambda key: torch.from_numpy(data[key]).to(REC.DTYPE)  # noqa: E731
    strong = [image("images_s1"), image("images_s1" if change == "one_view" else "images_s2")]
    padding = torch.from_numpy(data["padding"]).bool()
    return {"image": image("images_w"), **{strong_key(i): strong[i] for i in range(views)},
            "padding": padding & False if change == "no_padding" else padding}


def _step(framework: str = "unimatch_v2", *, masks: bool = True, ema_decay: float | None = None,
          change: str | None = None):
    """The recorded step through ``framework`` (with the released baseline head: the official class projection);
    ``change``: :func:`_unlabeled`'s. Returns (framework, step result, teacher prediction, gradients)."""
    data = RECORDS[framework][0]
    head = lambda: build_head("baseline", DPT.FEATURES, DPT.NUM_CLASSES, **RELEASED_HEAD)  # noqa: E731
    factory = lambda: build_segmentor(num_classes=DPT.NUM_CLASSES, head=head(), backbone=DPT.BACKBONE,  # noqa: E731
                                      align_corners=True)
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
    views = fw.unlabeled_views(options.model_dump())["strong_views"]
    batch = Batch(labeled={"image": image("images_l"), "label": torch.from_numpy(data["labels_l"].astype(np.int64))},
                  unlabeled=_unlabeled(data, views, change))
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


def _resolved(data: dict, meta: dict, tensors: dict[str, Tensor]) -> list[Tensor]:
    """Per recorded parameter, the mask of its entries whose official gradient is resolved (``grad/resolved``)."""
    numels = [tensors[_ours(n)].numel() for n in meta["parameters"]["names"]]
    bits = torch.from_numpy(np.unpackbits(data["grad/resolved"])[:sum(numels)].astype(bool))
    return list(bits.split(numels))


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
    resolved_masks = _resolved(data, meta, grads)
    ema_share = 1 - min(1 - 1 / (REC.ITERS + 1), REC.EMA_CAP)
    seen = {}
    for prefix, tensors, scale in (("grad", grads, 0.0), ("student", dict(fw.student.named_parameters()), 1.0),
                                   ("ema", dict(fw.teacher.named_parameters()), ema_share)):
        ours = _digest(tensors, data, meta)
        if prefix == "grad":
            seen["grad/sums"] = max(_close(ours[key], data[f"grad/{key}"], f"grad {key}") for key in ("sum", "abs"))
        else:  # over the entries with a resolved gradient: below it AdamW's first step turns round-off into lr-sized moves
            flats = [tensors[_ours(n)].detach().double().flatten()[mask] for n, mask in zip(names, resolved_masks)]
            seen[f"{prefix}/sums"] = max(_close([float(f.sum()) for f in flats], data[f"{prefix}/resolved_sum"],
                                                f"{prefix} sums"),
                                         _close([float(f.abs().sum()) for f in flats], data[f"{prefix}/resolved_abs"],
                                                f"{prefix} sums of |x|"))
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


def _moved(framework: str, **changed) -> dict[str, float]:
    """How far the step with ``changed`` (:func:`_step`'s keywords) is from the recorded one: the total loss relative
    to max(1, |loss|), the gradients relative to their tensor's largest entry (the largest over the tensors)."""
    data = RECORDS[framework][0]
    _, result, _, grads = _step(framework, **changed)
    _, _, _, right = _step(framework)
    return {"loss": abs(float(result.total.detach()) - float(data["loss"])) / max(1.0, abs(float(data["loss"]))),
            "gradients": max(float((grads[n] - right[n]).abs().max() / right[n].abs().max().clamp_min(1e-30))
                             for n in right)}


@pytest.mark.parametrize("framework", list(RECORDS))
def test_the_golden_tells_a_missing_mask_and_a_cold_ema_apart(framework):
    data, meta = RECORDS[framework]
    if framework == "unimatch_v2":
        moved = _moved(framework, masks=False)
        print(json.dumps({framework: {"masks_left_out": {k: f"{v:.2e}" for k, v in moved.items()}}}))
        assert moved["gradients"] > 1000 * RTOL_SCALE
    fw, _, _, _ = _step(framework, ema_decay=REC.EMA_CAP)
    ema = _digest(dict(fw.teacher.named_parameters()), data, meta)
    moved = float(np.max(np.abs(ema["at"] - data["ema/at"])))
    print(json.dumps({framework: {"cold_ema": f"{moved:.2e}"}}))
    assert moved > 100 * RTOL_SCALE


def test_the_released_cells_baseline_head_is_the_one_the_golden_runs():
    for framework in RECORDS:
        config = compose("paper", framework=framework, dataset="synthetic", partition="1/16", head="baseline",
                         protocol="released", overrides={"model.weights": None, "model.backbone": "vit_tiny"}).config
        assert config.head.options == RELEASED_HEAD


@pytest.mark.parametrize(("framework", "change"), [("unimatch_v2", "one_view"), ("unimatch_v2", "no_padding"),
                                                   ("fixmatch_v2", "no_padding")])
def test_one_strong_view_for_both_or_counted_padding_moves_the_step(framework, change):
    """The two defects the pipeline's batch shows: the first strong view reused for the second, or padded pixels
    counted in the strong terms and the mask ratio; each moves the step far beyond the tolerance."""
    moved = _moved(framework, change=change)
    print(json.dumps({framework: {change: {k: f"{v:.2e}" for k, v in moved.items()}}}))
    assert moved["gradients"] > 1000 * RTOL_SCALE
