"""Record one whole training iteration of AugSeg as its ``train_semi.py`` runs it: ``tests/golden/augseg_step_released.npz``.

Usage (from the repository root; CHECKOUT is a checkout of ZhenZHAO/AugSeg)::

    PYTHONPATH=$PWD python tests/golden/record_augseg_step_golden.py CHECKOUT [--commit SHA] [--out tests/golden]

What is official and what is not. ``train_semi.py`` is imported from CHECKOUT at run time and its ``train()`` runs one
iteration as written (lines 249-455: the eval-mode teacher's pseudo-labels and per-image confidence, the adaptive
CutMix of ``augseg/dataset/augs_ALIA.py``, the student pass over labeled + mixed strong images, the supervised loss and
``compute_unsupervised_loss_by_threshold`` of ``augseg/utils/loss_helper.py``, backward, the SGD step, the EMA of
parameters *and buffers*), then stops when the loader is asked for the second batch; ``augseg/utils/lr_helper.py``
builds the optimiser and the poly schedule. Stand-ins as in :mod:`record_u2pl_step_golden` (one process, ``.cuda()``
the identity, loaders of one batch; ``torch.utils.tensorboard``, ``cv2``, ``skimage`` stubbed where absent). AugSeg's
``ModelBuilder`` needs an ImageNet ResNet: student and teacher are the project's smoke segmentor of :data:`CELL` (tiny
ResNet, AugSeg decoder, baseline classifier without dropout, as the released switch ``classifier_dropout``) with
pattern parameters and BN buffers, wrapped to return ``(logits upsampled to the image, None)`` as AugSeg's
``ModelBuilder.forward`` without aux head (model_helper.py 68-74). Networks and inputs run in float64 (:data:`DTYPE`).

Random draws recorded: the CutMix trigger (``np.random.uniform``), the permutation (``torch.randperm``), the two boxes
(``rand_bbox``, whose ``np.random.beta`` and ``np.random.randint`` draws they carry) and the per-image coins
(``np.random.random``). Cases: ``first`` (epoch 0: EMA decay 0) and ``later`` (epoch 1: decay 1 - 1 / (ITERS + 1)).
Stored per case: inputs, draws, both losses, every gradient, the student's and the teacher's parameters and buffers
after the step (sum, sum |x|, sampled entries).
"""

from __future__ import annotations

import importlib
import logging
import sys
import types
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script: its shared helpers
import record_u2pl_step_golden as plain  # noqa: E402
import step_recording  # noqa: E402, F401 - the tests reach the shared helpers through this module
from step_recording import (  # noqa: E402
    digest,
    load_pattern,
    official_optimizer,
    record_and_save,
    sample_indices,
    stub_missing,
    tensors,
)

OFFICIAL_FILES = ("train_semi.py", "augseg/dataset/augs_ALIA.py", "augseg/utils/loss_helper.py",
                  "augseg/utils/lr_helper.py")
CELL = dict(framework="augseg", dataset="synthetic", partition="1/16", head="baseline", protocol="released")
B_L, B_U, SIZE, ITERS, EPOCHS = plain.B_L, plain.B_U, plain.SIZE, plain.ITERS, plain.EPOCHS
STUDENT_SALT, TEACHER_SALT = plain.STUDENT_SALT, plain.TEACHER_SALT
#: case -> (epoch, seed)
CASES = {"first": (0, 21), "later": (1, 22)}
STUBS = ("cv2", "skimage", "skimage.measure", "torch.utils.tensorboard")
#: the pattern network's confidences stay below 0.25 (AugSeg's threshold is 0.95): at 0.5 no recorded confidence is
#: within 0.25 of the threshold, so float32 round-off of another machine cannot move a pixel across it; the
#: unsupervised loss then covers the pixels pasted from labeled images (confidence 1), the pseudo-labels reach the step
#: through the per-image confidence (the CutMix's coins) and, with the NP head, the NP targets
OVERRIDES = {"framework_options.confidence_threshold": 0.5}
#: student, teacher (their pattern in float64) and the inputs run in float64 (the stored images are float32 values,
#: exact in float64): in float32 the tiny BN networks amplify round-off that differs between CPUs (vector
#: width, oneDNN's convolution, MKL's GEMM) beyond any useful bound
DTYPE = torch.float64


def cell_config(cell: dict | None = None, overrides: dict | None = None, **extra):
    from npsemiseg.config import compose, with_overrides

    return with_overrides(compose("smoke", **(cell or CELL)).config, {**(overrides or OVERRIDES), **extra})


class OfficialInterface(nn.Module):
    """The project's segmentor answering as AugSeg's ``ModelBuilder`` without aux head: ``(logits [B, K, H, W]
    upsampled with align_corners=True, None)``."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x, flag_use_fdrop=False):
        out = self.model(x)
        return F.interpolate(out.head.logits[0], x.shape[-2:], mode="bilinear", align_corners=True), None


def config(smoke) -> dict:
    opts, optim = smoke.framework_options, smoke.optim
    return {
        "net": {"ema_decay": opts["ema_decay"], "num_classes": smoke.num_classes},
        "dataset": {"ignore_label": 255},
        "criterion": {"type": "CELoss", "kwargs": {"use_weight": False}},
        "trainer": {
            "epochs": EPOCHS, "sup_only_epoch": 0,
            "optimizer": {"type": "SGD", "kwargs": {"lr": optim.lr, "momentum": optim.momentum,
                                                    "weight_decay": optim.weight_decay}},
            "lr_scheduler": {"mode": "poly", "kwargs": {"power": smoke.schedule.poly_power}},
            "unsupervised": {"flag_extra_weak": False, "threshold": opts["confidence_threshold"],
                             "loss_weight": opts["unsup_weight"], "use_cutmix": True, "use_cutmix_adaptive": True,
                             "use_cutmix_trigger_prob": 1.0},
        },
    }


def load_official(folder: Path) -> types.ModuleType:
    """``train_semi`` of an AugSeg folder (ZhenZHAO/AugSeg or NP-SemiSeg's ``AugSeg``) with the stubs above."""
    stub_missing(STUBS, {"torch.utils.tensorboard": ("SummaryWriter",), "skimage.measure": ("label", "regionprops")})
    sys.path.insert(0, str(folder))
    try:
        return importlib.import_module("train_semi")
    finally:
        sys.path.remove(str(folder))


def inputs(seed: int) -> dict[str, np.ndarray]:
    data = plain.inputs(seed)
    gen = torch.Generator().manual_seed(seed + 7)
    data["images_u_strong"] = torch.rand(B_U, 3, SIZE, SIZE, generator=gen).numpy()
    return data


@contextmanager
def recording_draws(train_semi: types.ModuleType, draws: dict):
    """Record the CutMix's draws; ``.cuda()`` the identity; one process (``all_reduce`` records the losses)."""
    augs = sys.modules["augseg.dataset.augs_ALIA"]
    saved = (torch.Tensor.cuda, torch.randperm, np.random.uniform, np.random.random, augs.rand_bbox, train_semi.dist)
    cuda, randperm, uniform, random, rand_bbox, _ = saved

    def keep(name, function):
        def recorded(*args, **kwargs):
            value = function(*args, **kwargs)
            draws[name].append(value)
            return value
        return recorded

    torch.Tensor.cuda = lambda self, *args, **kwargs: self
    torch.randperm, np.random.uniform = keep("perm", randperm), keep("trigger", uniform)
    np.random.random, augs.rand_bbox = keep("coin", random), keep("box", rand_bbox)
    train_semi.dist = types.SimpleNamespace(get_rank=lambda: 0, get_world_size=lambda: 1,
                                            all_reduce=lambda t, *a, **k: draws["reduced"].append(float(t)))
    try:
        yield
    finally:
        torch.Tensor.cuda, torch.randperm, np.random.uniform, np.random.random, augs.rand_bbox, train_semi.dist = saved


def run_iteration(train_semi, cfg: dict, seed: int, call, data: dict) -> dict:
    """Seed torch and numpy, record the draws and run ``call((loader_l, loader_u))`` until the second batch."""
    # copies: the official CutMix pastes into the batch in place
    image_l, label_l = torch.tensor(data["images_l"], dtype=DTYPE), torch.tensor(data["labels_l"])
    weak, strong = (torch.tensor(data[k], dtype=DTYPE) for k in ("images_u", "images_u_strong"))
    loaders = (plain.OneBatch((None, image_l, label_l)), plain.OneBatch((None, weak, strong, None)))
    draws: dict = {"perm": [], "trigger": [], "coin": [], "box": [], "reduced": []}
    torch.manual_seed(seed)
    np.random.seed(seed)
    with recording_draws(train_semi, draws):
        try:
            call(loaders)
        except plain.EndOfStep:
            pass
    return draws


def draw_arrays(draws: dict) -> dict[str, np.ndarray]:
    """The CutMix's draws (boxes as project boxes ``[B, 4]`` y0, y1, x0, x1: AugSeg's ``bbx`` indexes rows) and the
    logged losses (``all_reduce`` order: sup, unsup, the high-confidence ratio)."""
    (perm,), coins = draws["perm"], np.array(draws["coin"], dtype=np.float64)
    boxes = [np.stack([b[0], b[2], b[1], b[3]], axis=1).astype(np.int64) for b in draws["box"]]
    out = {"perm": perm.numpy(), "boxes_l": boxes[0], "boxes_u": boxes[1], "coins": coins}
    out["loss_sup"], out["loss_unsup"], out["high_ratio"] = (np.array(v) for v in draws["reduced"][-3:])
    return out


def run_case(train_semi, smoke, case: str) -> dict[str, np.ndarray]:
    epoch, seed = CASES[case]
    student, teacher = (plain_model(smoke, salt) for salt in (STUDENT_SALT, TEACHER_SALT))
    for p in teacher.parameters():
        p.requires_grad_(False)
    model, model_teacher = OfficialInterface(student), OfficialInterface(teacher)
    cfg = config(smoke)
    optimizer, lr_scheduler = official_optimizer("augseg", smoke, cfg, student.backbone, model, epoch, ITERS)
    data = inputs(seed)
    draws = run_iteration(train_semi, cfg, seed, lambda loaders: train_semi.train(
        model, model_teacher, optimizer, lr_scheduler, sys.modules["augseg.utils.loss_helper"].get_criterion(cfg),
        *loaders, epoch, None, logging.getLogger("augseg_step_golden"), cfg), data)
    out = {**data, **draw_arrays(draws)}
    indices = sample_indices(student)
    out.update(digest("grad", tensors(student, "grads"), indices))
    for role, network in (("student", student), ("teacher", teacher)):
        out.update(digest(f"{role}/params", tensors(network, "params"), indices))
        out.update(digest(f"{role}/buffers", tensors(network, "buffers"), indices))
    out.update({f"index/{k}": v for k, v in indices.items()})
    return out


def plain_model(smoke, salt: int) -> nn.Module:
    """The project's model of ``smoke`` with the pattern of ``salt`` (parameters and BN buffers), in :data:`DTYPE`."""
    from npsemiseg.training import build_model

    model = build_model(smoke).to(DTYPE)
    load_pattern(model, salt)
    return model



def record(checkout: Path) -> dict[str, np.ndarray]:
    return plain.record_cases(load_official(checkout), cell_config(), CASES, run_case)


def main(argv: list[str] | None = None) -> None:
    arrays = record_and_save(
        argv, __doc__, "augseg_step_released", record, OFFICIAL_FILES,
        about="One whole training iteration of AugSeg as train_semi.py runs it (tests/test_augseg_step_golden.py).",
        repository="https://github.com/ZhenZHAO/AugSeg",
        sources={"iteration": "train_semi.py 249-455 (train(), imported and run for one iteration)",
                 "ema": "train_semi.py 398-416 (parameters and buffers)",
                 "cutmix": "augseg/dataset/augs_ALIA.py 10-83", "losses": "augseg/utils/loss_helper.py 310-315"},
        compared="one iteration on the project's smoke segmentor (pattern parameters and BN buffers, not AugSeg's "
                 "ResNet ModelBuilder): both losses, every gradient, the student's and teacher's parameters and "
                 "buffers after the step; draws recorded and injected",
        sizes={"cases": CASES, "cell": CELL, "overrides": OVERRIDES, "iters_per_epoch": ITERS, "epochs": EPOCHS},
        dtype="float64: student, teacher (pattern parameters and BN buffers) and the "
              "inputs (stored as float32 values, exact in float64); the official iteration computes everything in "
              "float64",
    )
    for case in CASES:
        print(case, {k: float(arrays[f"{case}/{k}"]) for k in ("loss_sup", "loss_unsup", "high_ratio")})


if __name__ == "__main__":
    main()
