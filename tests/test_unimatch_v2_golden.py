"""Framework ``unimatch_v2`` takes the official UniMatch V2 step (``tests/golden/unimatch_v2_step.npz``, recorded by
``tests/golden/record_unimatch_v2_golden.py``; source, command and what was compared in ``unimatch_v2_step.json``).

The official loop body (unimatch_v2.py 170-226) ran one step at iteration 3 on the official DPT at tiny sizes, with
injected CutMix boxes and complementary-dropout draws. Here the framework runs the same step on the project's
``vit_tiny`` + DPT with a 1x1 classifier head (the official ``output_conv.2``; a test head, so that the network is
the official one layer for layer), the same pattern weights for student and EMA teacher, the same inputs and draws
(``draw_boxes`` / ``draw_masks`` return the recorded ones), AdamW with the recorded groups, then
``after_optimizer_step``. Tolerance: float32 round-off, ``1e-5 x max(1, max |theirs|)`` per quantity (seen on
2026-11-27: losses 6.0e-8; the teacher's confidences 9.5e-7; gradients: sampled entries 8.3e-8, sums 2.1e-6 of sums up
to 2.4; after the AdamW step: student entries 1.7e-6 and sums 7.6e-5 of sums up to 32, EMA teacher entries 4.4e-7 and
sums 1.9e-5); the attention's key biases, whose gradient is round-off (< 1e-8, AdamW's eps), moved by at most 9.8e-5
(lr 1e-3). Negative cases: without the complementary masks the strong losses move by 3.1e-3 and 8.4e-4; a constant
EMA ratio 0.996 (no warm-up) moves the teacher's entries by 0.26; both far beyond the tolerance.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import Tensor, nn

from golden_files import recorded, recorder, sidecar
from npsemiseg.frameworks.base import Batch, StepContext
from npsemiseg.frameworks.unimatch_v2 import UniMatchV2, UniMatchV2Options
from npsemiseg.heads import ClassifierHead, HeadOutput
from npsemiseg.models import build_segmentor

RTOL_SCALE = 1e-5

pytestmark = pytest.mark.usefixtures("single_seeded_thread")

REC = recorder("unimatch_v2")
DPT = recorder("dinov2_dpt")
DATA = recorded("unimatch_v2_step")
META = sidecar("unimatch_v2_step")
SHAPES = sidecar("dinov2_dpt")["official_shapes"]


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
    ours, theirs = np.asarray(ours, dtype=np.float64), np.asarray(theirs, dtype=np.float64)
    diff = float(np.max(np.abs(ours - theirs)))
    bound = RTOL_SCALE * max(1.0, float(np.max(np.abs(theirs))))
    assert diff <= bound, f"{what}: max |difference| {diff:.3g} > {bound:.3g}"
    return diff


def _digest(tensors: dict[str, Tensor]) -> dict[str, np.ndarray]:
    names = META["parameters"]["names"]
    flats = [tensors[_ours(n)].detach().double().flatten() for n in names]
    offsets = np.cumsum([0] + META["parameters"]["samples"])
    at = [f[torch.from_numpy(DATA["index"][offsets[i]:offsets[i + 1]].astype(np.int64))].numpy()
          for i, f in enumerate(flats)]
    return {"sum": np.array([float(f.sum()) for f in flats]), "abs": np.array([float(f.abs().sum()) for f in flats]),
            "at": np.concatenate(at)}


def _step(*, masks: bool = True, ema_decay: float | None = None):
    """The recorded step through framework ``unimatch_v2``: (framework, losses, teacher confidences/labels, grads)."""
    factory = lambda: build_segmentor(num_classes=DPT.NUM_CLASSES, head=ProjectionHead(DPT.FEATURES, DPT.NUM_CLASSES),  # noqa: E731
                                      backbone=DPT.BACKBONE, align_corners=True)
    options = UniMatchV2Options(confidence_threshold=REC.CONF_THRESH, ema_decay=REC.EMA_CAP)
    fw = UniMatchV2(options, factory, num_classes=DPT.NUM_CLASSES)
    _load(fw.student, REC.STUDENT_SALT)
    _load(fw.teacher, REC.TEACHER_SALT)
    boxes = [torch.from_numpy(DATA[k]).bool() for k in ("box1", "box2")]
    mask = torch.from_numpy(DATA["dropout_mask"]) if masks else torch.ones_like(torch.from_numpy(DATA["dropout_mask"]))
    fw.draw_boxes = lambda batch, height, width, device: boxes  # type: ignore[method-assign]
    fw.draw_masks = lambda pairs, widths, device: [mask]  # type: ignore[method-assign]
    predictions = []
    original = fw.predict
    fw.predict = lambda teacher, images, **kw: predictions.append(original(teacher, images, **kw)) or predictions[-1]
    groups = fw.student.parameter_groups()
    optimizer = torch.optim.AdamW([{"params": groups[0]["params"], "lr": REC.LR},
                                   {"params": groups[1]["params"], "lr": REC.LR * REC.LR_MULTI}],
                                  lr=REC.LR, betas=REC.BETAS, weight_decay=REC.WEIGHT_DECAY)
    batch = Batch(labeled={"image": torch.from_numpy(DATA["images_l"]),
                           "label": torch.from_numpy(DATA["labels_l"].astype(np.int64))},
                  unlabeled={"image": torch.from_numpy(DATA["images_w"]), "image_strong": torch.from_numpy(DATA["images_s"])})
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


def test_the_losses_and_the_teachers_pseudo_labels_equal_the_official_step():
    _, result, teacher, _ = _step()
    losses = {k: float(v.detach()) for k, v in result.losses.items()}
    assert set(losses) == {"sup", "unsup_s1", "unsup_s2"}
    _close(losses["sup"], 0.5 * DATA["loss_x"], "0.5 loss_x")
    _close(losses["unsup_s1"], 0.25 * DATA["loss_u_s1"], "0.25 loss_u_s1")
    _close(losses["unsup_s2"], 0.25 * DATA["loss_u_s2"], "0.25 loss_u_s2")
    _close(float(result.total.detach()), DATA["loss"], "loss")
    _close(float(result.logs["mask_ratio"]), DATA["mask_ratio"], "mask ratio")
    _close(teacher.confidence, DATA["conf_u_w"], "the EMA teacher's confidences")
    assert torch.equal(teacher.label, torch.from_numpy(DATA["mask_u_w"].astype(np.int64)))


def _key_bias(tensor: Tensor | np.ndarray) -> np.ndarray:
    """``[..., 3D] -> [..., D]``: the key third of attention ``qkv`` biases."""
    d = np.asarray(tensor).shape[-1] // 3
    return np.asarray(tensor)[..., d:2 * d]


def _rest(tensor: Tensor | np.ndarray) -> np.ndarray:
    d = np.asarray(tensor).shape[-1] // 3
    return np.concatenate([np.asarray(tensor)[..., :d], np.asarray(tensor)[..., 2 * d:]], axis=-1)


def test_gradients_the_adamw_step_and_the_ema_teacher_equal_the_official_step():
    """Every parameter at round-off, but the attention's key biases after the step: their gradient is 0 in exact
    arithmetic and round-off (< 1e-8, AdamW's eps) on both sides, which AdamW's first step turns into moves of up to
    ``lr``; those entries are checked to be such round-off and to move by at most ``lr`` (x 0.25 in the teacher)."""
    fw, _, _, grads = _step()
    names = META["parameters"]["names"]
    qkv = [i for i, n in enumerate(names) if n.endswith("attn.qkv.bias")]
    at_qkv = np.concatenate([np.arange(o, o + n) for i, (o, n) in enumerate(zip(np.cumsum([0] + META["parameters"]["samples"]),
                                                                                 META["parameters"]["samples"])) if i in qkv])
    for prefix, tensors in (("grad", grads), ("student", dict(fw.student.named_parameters())),
                            ("ema", dict(fw.teacher.named_parameters()))):
        ours = _digest(tensors)
        exact = prefix == "grad"
        keep_sum = [i for i in range(len(names)) if exact or i not in qkv]
        keep_at = np.setdiff1d(np.arange(len(ours["at"])), [] if exact else at_qkv)
        for key, keep in (("sum", keep_sum), ("abs", keep_sum), ("at", keep_at)):
            _close(ours[key][keep], DATA[f"{prefix}/{key}"][keep], f"{prefix} {key}")
        biases = np.stack([tensors[_ours(names[i])].detach().numpy() for i in qkv])
        _close(_rest(biases), _rest(DATA[f"{prefix}/qkv_bias"]), f"{prefix} query and value biases")
        if exact:
            assert np.abs(_key_bias(biases)).max() < 1e-8 and np.abs(_key_bias(DATA["grad/qkv_bias"])).max() < 1e-8
        else:
            bound = REC.LR * (1.0 if prefix == "student" else 1 - min(1 - 1 / (REC.ITERS + 1), REC.EMA_CAP))
            assert np.abs(_key_bias(biases) - _key_bias(DATA[f"{prefix}/qkv_bias"])).max() <= 2 * bound * 1.01


def test_the_golden_tells_a_missing_mask_and_a_cold_ema_apart():
    _, result, _, _ = _step(masks=False)
    moved = abs(float(result.losses["unsup_s1"].detach()) - 0.25 * float(DATA["loss_u_s1"]))
    assert moved > 100 * RTOL_SCALE
    fw, _, _, _ = _step(ema_decay=REC.EMA_CAP)
    ema = _digest(dict(fw.teacher.named_parameters()))
    assert float(np.max(np.abs(ema["at"] - DATA["ema/at"]))) > 100 * RTOL_SCALE
