"""Record one whole training iteration of U2PL as its ``train_semi.py`` runs it: ``tests/golden/u2pl_step_released.npz``.

Usage (from the repository root; CHECKOUT is a checkout of Haochen-Wang409/U2PL)::

    PYTHONPATH=$PWD python tests/golden/record_u2pl_step_golden.py CHECKOUT [--commit SHA] [--out tests/golden]

What is official and what is not. ``train_semi.py`` is imported from CHECKOUT at run time and its ``train()`` runs one
iteration as written (lines 260-560: the teacher reset of the first semi-supervised epoch, the eval-mode pseudo-labels,
the CutMix of ``u2pl/dataset/augmentation.py``, the student pass, the train-mode teacher pass, the entropy-filtered
unsupervised loss of ``u2pl/utils/loss_helper.py``, the contrastive loss with its memory bank, backward, the SGD step
and the EMA of parameters), then stops when the loader is asked for the second batch. ``u2pl/utils/lr_helper.py``'s
``get_optimizer`` / ``get_scheduler`` build the SGD optimiser (backbone at lr, the rest at 10 x lr, as
``train_semi.py`` 82-99) and the poly schedule. What it needs and this machine lacks is replaced: ``.cuda()`` is the
identity; ``torch.distributed`` is one process (``all_reduce`` the identity, recording the loss values it reduces;
``gather_together`` of the memory bank returns its own list); ``cv2``, ``skimage`` and ``einops`` (imported, unused in
this path) are empty stubs; the loaders yield one fixed batch. U2PL's ``ModelBuilder`` needs an ImageNet ResNet and
SyncBN (CUDA): instead student and teacher are the project's smoke segmentor of :data:`CELL` (tiny ResNet, U2PL
decoder, baseline classifier, representation head) with pattern parameters and BN buffers (the teacher's own), wrapped
to return ``{"pred", "rep"}`` as ``dec_deeplabv3_plus`` does. The config dict ``cfg`` holds the cell's values (the VOC
configs' drop percent 80, low_entropy_threshold 20, ranks 3/20, temperature 0.5; fewer queries, negatives and smaller
queues as the smoke cell).

Random draws recorded: the CutMix coin (``np.random.uniform``) and masks (``generate_cutout_mask``), every
``torch.randint`` of the contrastive loss, and every dropout mask of both networks (:mod:`step_recording`). Cases:
``first`` = step 0 of the first semi-supervised epoch (teacher reset: parameters shared with the student, its own BN
statistics; EMA decay 0), ``later`` = step 0 of the next epoch (EMA decay 1 - 1 / (ITERS + 1)), ``supervised`` = step 0
of a supervised-only epoch (lines 287-306: the student on the labeled images, the teacher in train mode on them, zero
unsupervised and contrastive terms). Stored per case: the
inputs, the draws, the three losses, every gradient, the student's and the teacher's parameters and buffers after the
step (sum, sum |x|, sampled entries) and the memory bank.

Precision: float64 (:data:`PRECISION`): the networks, the images (float32 draws widened), the dropout masks, the pattern
weights and BN buffers, the memory bank; the official ``train()`` runs under float64 as default dtype, so that what it
creates without a dtype (``torch.tensor(0.0)``, ``torch.zeros``) is float64 too. Its explicit ``.float()`` are on 0/1
masks, exact in either. In float32 the tiny BN networks turned the round-off of ATen's, oneDNN's and MKL's kernels
into gradient differences of 1e-2 between CPUs; in float64 the record is the same on any of them.
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
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script: its shared helpers
import step_recording  # noqa: E402, F401 - the tests reach the shared helpers through this module
from step_recording import (  # noqa: E402
    DropoutTape,
    default_dtype,
    digest,
    load_pattern,
    official_optimizer,
    record_and_save,
    sample_indices,
    stub_missing,
    tape_dropout,
    tensors,
)

OFFICIAL_FILES = ("train_semi.py", "u2pl/utils/loss_helper.py", "u2pl/utils/utils.py", "u2pl/dataset/augmentation.py",
                  "u2pl/utils/lr_helper.py")
CELL = dict(framework="u2pl", dataset="synthetic", partition="1/16", head="baseline", protocol="released")
B_L, B_U, SIZE = 2, 2, 32
ITERS, EPOCHS = 4, 3
STUDENT_SALT, TEACHER_SALT = 0, 1000
#: case -> (epoch, seed); the cell has no supervised-only epoch (sup_only_epochs 0), so epoch 0 is the first
#: semi-supervised one. Seeds chosen so that the CutMix coin mixes.
CASES = {"first": (0, 11), "later": (1, 12), "supervised": (0, 13)}
#: ``supervised``: step 0 of a supervised-only epoch, in the cell with one (as U2PL's VOC configs)
CASE_OVERRIDES = {"supervised": {"framework_options.sup_only_epochs": 1}}
#: the pattern network's probabilities stay near 1/K: a lower anchor threshold (delta_p, 0.3 in the configs) lets
#: the contrastive loss find anchors
OVERRIDES = {"framework_options.anchor_threshold": 0.1}
#: keys per class in the memory bank before the step
PREFILL = 6
STUBS = ("cv2", "skimage", "skimage.measure", "einops")
PRECISION = ("float64: networks, images (float32 draws widened), dropout masks, pattern weights and BN buffers, the "
             "memory bank; the official train() under float64 as default dtype (its .float() casts are of 0/1 masks)")


class EndOfStep(Exception):
    """Raised by the loaders when ``train()`` asks for the second batch."""


class OfficialInterface(nn.Module):
    """The project's segmentor answering as U2PL's ``ModelBuilder`` without aux head: ``{"pred": [B, K, h, w],
    "rep": [B, E, h, w]}``."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x):
        out = self.model(x)
        return {"pred": out.head.logits[0], "rep": out.representation}


class OneBatch:
    """A loader of ``ITERS`` batches that yields ``batches`` (one by default) and then raises :class:`EndOfStep`."""

    def __init__(self, *batches) -> None:
        self.batches = batches
        self.sampler = types.SimpleNamespace(set_epoch=lambda epoch: None)

    def __len__(self) -> int:
        return ITERS

    def __iter__(self):
        return _Batches(list(self.batches))


class _Batches:
    """The iterator of :class:`OneBatch` (``.next()`` as the official loop calls it)."""

    def __init__(self, batches: list) -> None:
        self.batches = batches

    def __iter__(self):
        return self

    def __next__(self):
        if not self.batches:
            raise EndOfStep
        return self.batches.pop(0)

    next = __next__


def config(smoke) -> dict:
    """U2PL's ``cfg`` with the values of the cell's composed config ``smoke``."""
    opts, optim = smoke.framework_options, smoke.optim
    return {
        "net": {"ema_decay": opts["ema_decay"], "num_classes": smoke.num_classes},
        "dataset": {"n_sup": B_L, "ignore_label": 255},
        "criterion": {"type": "CELoss", "kwargs": {"use_weight": False}},
        "trainer": {
            "epochs": EPOCHS, "sup_only_epoch": opts["sup_only_epochs"],
            "optimizer": {"type": "SGD", "kwargs": {"lr": optim.lr, "momentum": optim.momentum,
                                                    "weight_decay": optim.weight_decay}},
            "lr_scheduler": {"mode": "poly", "kwargs": {"power": smoke.schedule.poly_power}},
            "unsupervised": {"TTA": False, "drop_percent": opts["drop_percent"], "apply_aug": "cutmix",
                             "loss_weight": opts["unsup_weight"]},
            "contrastive": {"negative_high_entropy": True, "low_rank": opts["low_rank"], "high_rank": opts["high_rank"],
                            "current_class_threshold": opts["anchor_threshold"], "current_class_negative_threshold": 1,
                            "unsupervised_entropy_ignore": opts["drop_percent"], "low_entropy_threshold": opts["alpha_0"],
                            "num_negatives": opts["num_negatives"], "num_queries": opts["num_queries"],
                            "temperature": opts["temperature"], "loss_weight": opts["contrastive_weight"]},
        },
    }


def load_official(checkout: Path) -> types.ModuleType:
    """``train_semi`` from CHECKOUT with the stubs of the docstring."""
    stub_missing(STUBS, {"skimage.measure": ("label", "regionprops")})
    sys.path.insert(0, str(checkout))
    try:
        train_semi = importlib.import_module("train_semi")
    finally:
        sys.path.remove(str(checkout))
    sys.modules["u2pl.utils.utils"].gather_together = lambda data: [data]  # one process
    return train_semi


def prefilled_queues(seed: int, num_classes: int, dim: int) -> dict[str, np.ndarray]:
    """``PREFILL`` random keys ``[PREFILL, dim]`` per class: the memory bank of a run past its first steps (an empty
    bank makes U2PL's contrastive loss skip every class)."""
    gen = torch.Generator().manual_seed(seed + 100)
    return {f"queue_before/{c}": torch.randn(PREFILL, dim, generator=gen).numpy() for c in range(num_classes)}


def inputs(seed: int) -> dict[str, np.ndarray]:
    gen = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 8, (B_L, SIZE // 4, SIZE // 4), generator=gen).repeat_interleave(4, 1).repeat_interleave(4, 2)
    labels[:, :3] = 255
    return {"images_l": torch.rand(B_L, 3, SIZE, SIZE, generator=gen).numpy(), "labels_l": labels.numpy(),
            "images_u": torch.rand(B_U, 3, SIZE, SIZE, generator=gen).numpy()}


@contextmanager
def recording_draws(train_semi: types.ModuleType, draws: dict):
    """Record the CutMix coin and masks and every ``torch.randint``; ``.cuda()`` the identity; one process."""
    augmentation = sys.modules["u2pl.dataset.augmentation"]
    saved = (torch.Tensor.cuda, torch.randint, np.random.uniform, augmentation.generate_cutout_mask, train_semi.dist)
    cuda, randint, uniform, cutout, _ = saved

    def rec_randint(high, size, **kwargs):
        values = randint(high, size, **kwargs)
        draws["randint"].append((int(high), values.numpy().copy()))
        return values

    def rec_uniform(*args, **kwargs):
        draws["coin"].append(uniform(*args, **kwargs))
        return draws["coin"][-1]

    def rec_cutout(*args, **kwargs):
        draws["cutout"].append(cutout(*args, **kwargs))
        return draws["cutout"][-1]

    def all_reduce(tensor, *args, **kwargs):
        draws["reduced"].append(float(tensor.detach()))

    torch.Tensor.cuda = lambda self, *args, **kwargs: self
    torch.randint, np.random.uniform, augmentation.generate_cutout_mask = rec_randint, rec_uniform, rec_cutout
    train_semi.dist = types.SimpleNamespace(get_rank=lambda: 0, get_world_size=lambda: 1, all_reduce=all_reduce)
    try:
        yield
    finally:
        torch.Tensor.cuda, torch.randint, np.random.uniform, augmentation.generate_cutout_mask, train_semi.dist = saved


def tiny_pair(smoke, tape: DropoutTape) -> tuple[nn.Module, nn.Module]:
    """Student and teacher: the cell's segmentor with pattern parameters and buffers, dropout on the tape."""
    from npsemiseg.training import build_model

    student, teacher = build_model(smoke).double(), build_model(smoke).double()
    load_pattern(student, STUDENT_SALT)
    load_pattern(teacher, TEACHER_SALT)
    tape_dropout(student, tape, "student")
    tape_dropout(teacher, tape, "teacher")
    for p in teacher.parameters():
        p.requires_grad_(False)
    return student, teacher


def run_case(train_semi, smoke, case: str) -> dict[str, np.ndarray]:
    """One iteration of the official ``train()`` at the case's epoch; the arrays stored under ``case/``."""
    epoch, seed = CASES[case]
    smoke = cell_config(**CASE_OVERRIDES.get(case, {}))
    tape = DropoutTape(dtype=torch.float64)
    student, teacher = tiny_pair(smoke, tape)
    model, model_teacher = OfficialInterface(student), OfficialInterface(teacher)
    cfg = config(smoke)
    optimizer, lr_scheduler = official_optimizer("u2pl", smoke, cfg, student.backbone, model, epoch, ITERS)
    data = inputs(seed)
    memobank, queue_ptrlis, queue_size = memory_bank(data, seed, smoke)
    draws = run_iteration(train_semi, cfg, seed, lambda loaders: train_semi.train(
        model, model_teacher, optimizer, lr_scheduler, sys.modules["u2pl.utils.loss_helper"].get_criterion(cfg),
        *loaders, epoch, types.SimpleNamespace(add_scalar=lambda *a: None), logging.getLogger("u2pl_step_golden"),
        memobank, queue_ptrlis, queue_size), data, mixes=case not in CASE_OVERRIDES)
    out = {**data, **draw_arrays(draws, tape)}
    indices = sample_indices(student)
    out.update(digest("grad", tensors(student, "grads"), indices))
    for role, network in (("student", student), ("teacher", teacher)):
        out.update(digest(f"{role}/params", tensors(network, "params"), indices))
        out.update(digest(f"{role}/buffers", tensors(network, "buffers"), indices))
    out.update({f"queue/{c}": bank[0].numpy() for c, bank in enumerate(memobank)})
    out.update({f"index/{k}": v for k, v in indices.items()})
    return out



def memory_bank(data: dict, seed: int, smoke) -> tuple[list, list, list]:
    """U2PL's memory bank (``train_semi.py`` 103-110) holding :func:`prefilled_queues` (added to ``data``)."""
    dim, k = smoke.model.options["representation_dim"], smoke.num_classes
    data.update(prefilled_queues(seed, k, dim))
    memobank = [[torch.from_numpy(data[f"queue_before/{c}"]).double()] for c in range(k)]
    queue_ptrlis = [torch.full((1,), PREFILL, dtype=torch.long) for _ in range(k)]
    opts = smoke.framework_options
    return memobank, queue_ptrlis, [opts["background_queue_size"]] + [opts["queue_size"]] * (k - 1)


def run_iteration(train_semi, cfg: dict, seed: int, call, data: dict, mixes: bool = True) -> dict:
    """Seed torch and numpy, record the draws and run ``call((loader_l, loader_u))`` until the second batch."""
    train_semi.cfg, train_semi.prototype = cfg, None
    loaders = (OneBatch((torch.from_numpy(data["images_l"]).double(), torch.tensor(data["labels_l"]))),  # copies
               OneBatch((torch.from_numpy(data["images_u"]).double(), torch.zeros(B_U, SIZE, SIZE, dtype=torch.long))))
    draws: dict = {"randint": [], "coin": [], "cutout": [], "reduced": []}
    torch.manual_seed(seed)
    np.random.seed(seed)
    with recording_draws(train_semi, draws), default_dtype(torch.float64):
        try:
            call(loaders)
        except EndOfStep:
            pass
    if mixes:  # a semi-supervised step
        assert draws["coin"] and draws["coin"][0] < 0.5, f"seed {seed}: the CutMix coin did not mix; pick another seed"
    return draws


def draw_arrays(draws: dict, tape: DropoutTape) -> dict[str, np.ndarray]:
    """The recorded draws and the three logged losses (``all_reduce`` order in ``train()``: the contrastive loss
    inside, then the logged sup, unsup and contrastive values)."""
    out = {"draw_highs": np.array([h for h, _ in draws["randint"]], dtype=np.int64)}
    if draws["coin"]:  # a semi-supervised step
        out.update(coin=np.array(draws["coin"][0]), cutout=torch.stack(draws["cutout"]).numpy().astype(np.int64))
    out.update({f"draw/{i:03d}": v for i, (_, v) in enumerate(draws["randint"])})
    out.update(tape.arrays("dropout"))
    out["loss_sup"], out["loss_unsup"], out["loss_contrastive"] = (np.array(v) for v in draws["reduced"][-3:])
    return out


def cell_config(**overrides):
    """The composed config of :data:`CELL` with :data:`OVERRIDES` (and ``overrides``)."""
    from npsemiseg.config import compose, with_overrides

    return with_overrides(compose("smoke", **CELL).config, {**OVERRIDES, **overrides})


def record(checkout: Path) -> dict[str, np.ndarray]:
    return record_cases(load_official(checkout), cell_config(), CASES, run_case)


def record_cases(train_semi, smoke, cases: dict, run) -> dict[str, np.ndarray]:
    """``run(train_semi, smoke, case)`` for every case on one thread, its arrays under ``<case>/``."""
    torch.set_num_threads(1)
    out: dict[str, np.ndarray] = {}
    for case in cases:
        out.update({f"{case}/{k}": v for k, v in run(train_semi, smoke, case).items()})
    return out


def main(argv: list[str] | None = None) -> None:
    arrays = record_and_save(
        argv, __doc__, "u2pl_step_released", record, OFFICIAL_FILES,
        about="One whole training iteration of U2PL as train_semi.py runs it (tests/test_u2pl_step_golden.py).",
        repository="https://github.com/Haochen-Wang409/U2PL",
        sources={
            "iteration": "train_semi.py 260-560 (train(), imported and run for one iteration)",
            "teacher_reset": "train_semi.py 309-315 (teacher parameters share the student's storage; buffers its own)",
            "ema": "train_semi.py 543-548 (parameters only)",
            "losses": "u2pl/utils/loss_helper.py 27-48 (unsupervised), 51-230 (contrastive)",
            "cutmix": "u2pl/dataset/augmentation.py 471-541",
            "optimizer_schedule": "train_semi.py 82-99, u2pl/utils/lr_helper.py",
        },
        compared="one iteration on the project's smoke segmentor (pattern parameters and BN buffers, not U2PL's "
                 "ResNet-101 ModelBuilder): the three losses, every gradient, the student's and teacher's parameters "
                 "and buffers after the step, the memory bank; draws recorded and injected",
        precision=PRECISION,
        sizes={"B_l": B_L, "B_u": B_U, "size": SIZE, "iters_per_epoch": ITERS, "epochs": EPOCHS, "cases": CASES,
               "student_salt": STUDENT_SALT, "teacher_salt": TEACHER_SALT, "cell": CELL},
    )
    for case in CASES:
        print(case, {k: float(arrays[f"{case}/{k}"]) for k in ("loss_sup", "loss_unsup", "loss_contrastive")})


if __name__ == "__main__":
    main()
