"""Record one training step of CPS's MeanTeacher as TorchSemiSeg runs it: ``tests/golden/mt_cps_step_released.npz``.

Usage (from the repository root; CHECKOUT is a checkout of charlesCXK/TorchSemiSeg)::

    PYTHONPATH=$PWD python tests/golden/record_mt_cps_golden.py CHECKOUT [--out tests/golden]

What is official and what is not. The official ``Network`` class (``exp.voc/voc8.res50v3+.MeanTeacher/network.py``)
is imported from CHECKOUT at run time and its ``forward`` and ``_update_ema_variables`` run the step: the student
and the no-grad teacher on one half, the teacher's EMA inside the call with ``step=1`` (lines 25-47). Its
``SingleNetwork`` needs a pretrained ResNet-50 and ``furnace``; instead both of its branches are the same tiny
network built on both sides from the same weights: the project's smoke segmentor (backbone ``resnet_small``, the
U2PL decoder at widths 16/8, the baseline classifier) with every ``Dropout2d`` replaced by an identity (the official
network has none), wrapped to return ``(features, logits upsampled to the image with align_corners=True)`` as
``SingleNetwork.forward`` (lines 70-80): ``Branch`` and ``mean_teacher_network`` of
``benchmarks/official/mt_cps_network.py``, which the official whole run uses too. ``config`` is a stub holding
``ema_decay`` read from the official ``config.py`` (line 74, 0.99); ``base_model`` is a stub (no ResNet is built).
The training step around the two calls is ``train.py`` 177-215 written out here (one process: the all_reduce over
one rank is the identity): CE on the student's labeled logits, ``unsup_weight`` (100, config.py line 73) x MSE
between the softmaxes of student and teacher over both halves, one SGD step of the student: the official optimiser
(train.py 90-104, ``group_weight`` of ``furnace/utils/init_func.py`` over backbone and business layers, momentum and
weight decay of config.py 99-100) at the LR train.py 206-211 sets (``WarmUpPolyLR`` of
``furnace/engine/lr_policy.py`` at ``CUR_ITER`` of ``TOTAL_ITERS``), both imported from CHECKOUT.

Weights are a deterministic pattern (:func:`pattern_weights`, also used by the test), the teacher's with another
salt than the student's so that the EMA's place in the step shows; the step is taken at iteration ``CUR_ITER`` = 3
(not 0, where the official forward copies the student into the teacher). Both networks, their weights and the
inputs are float64 (:data:`DTYPE`; the stored images are float32 values, exact in float64): in float32 the tiny BN
network amplifies round-off that differs between CPUs beyond any useful bound, in float64 a step comes out the same
on every kernel path to about 1e-15. What is stored: the inputs, both losses,
the teacher's probabilities on each half (BN statistics per half, the EMA between the halves), the LR, every
parameter's gradient of the student, and for every parameter and buffer of the updated student and teacher its sum,
its sum of absolute values and ``SAMPLES`` entries at stored flat indices (the models hold about a million values
each); the teacher's probabilities rounded to float32 (the project's are float32, ``mean_softmax``), all else float64.
"""

from __future__ import annotations

import hashlib
import re
import sys
import types
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script: its shared helpers
from recording import official_commit, recorder_arguments, save_golden, sine_pattern  # noqa: E402

BENCHMARKS = str(Path(__file__).resolve().parents[2] / "benchmarks")
if BENCHMARKS not in sys.path:  # the benchmarks' package: the project's networks behind the official Network
    sys.path.append(BENCHMARKS)
from official.mt_cps_network import mean_teacher_network  # noqa: E402

OFFICIAL_DIR = "exp.voc/voc8.res50v3+.MeanTeacher"
OFFICIAL_FILES = (f"{OFFICIAL_DIR}/network.py", f"{OFFICIAL_DIR}/train.py", f"{OFFICIAL_DIR}/config.py",
                  "furnace/utils/init_func.py", "furnace/engine/lr_policy.py")
#: the cell whose tiny network both sides use
CELL = dict(framework="mt", dataset="synthetic", partition="1/16", head="baseline", protocol="released")
B_L, B_U, SIZE = 2, 2, 32
SEED = 20261
CUR_ITER = 3
#: the schedule's iterations (``config.nepochs * config.niters_per_epoch`` of train.py 122)
TOTAL_ITERS = 10
#: base LR (the project's smoke LR; the official one is a script's environment value); momentum and weight decay
#: are read from the official config.py (99-100) and checked equal to these
LR, MOMENTUM, WEIGHT_DECAY, LR_POWER = 0.01, 0.9, 1e-4, 0.9
SAMPLES = 32
#: both networks, their pattern weights and the inputs: float64 (the stored images are float32 values, exact in
#: float64); in float32 the tiny BN network amplifies round-off that differs between CPUs (vector width, oneDNN's
#: convolution, MKL's GEMM) far beyond the comparison's bounds
DTYPE = torch.float64
STUDENT_SALT, TEACHER_SALT = 0, 1000


def pattern_weights(shape: tuple[int, ...], salt: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Deterministic weights of ``shape``: ``bound * sin(1 + 0.7 i + salt)`` over the flat index i, bound the
    Xavier-uniform bound of the shape (1-d parameters: 0.1). ``dtype``: float32 as the NP head golden, float64 for
    the float64 step goldens."""
    return torch.from_numpy(sine_pattern(shape, salt)).to(dtype)


def tiny_model(salt: int) -> nn.Module:
    """The smoke segmentor of :data:`CELL` in :data:`DTYPE` with pattern weights (parameter ``i`` gets salt
    ``salt + i``) and no ``Dropout2d``; buffers at their initial values."""
    from npsemiseg.config import compose
    from npsemiseg.training import build_model

    model = build_model(compose("smoke", **CELL).config).to(DTYPE)
    strip_dropout(model)
    load_pattern(model, salt, DTYPE)
    return model


def load_pattern(model: nn.Module, salt: int, dtype: torch.dtype = torch.float32) -> None:
    """Parameter ``i`` <- :func:`pattern_weights` in ``dtype`` with salt ``salt + i`` (copied into the parameter's
    own dtype)."""
    with torch.no_grad():
        for i, (_, p) in enumerate(model.named_parameters()):
            p.copy_(pattern_weights(tuple(p.shape), salt + i, dtype))


def strip_dropout(model: nn.Module) -> None:
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if type(child) is nn.Dropout2d:
                setattr(module, name, nn.Identity())


def inputs() -> dict[str, np.ndarray]:
    gen = torch.Generator().manual_seed(SEED)
    labels = torch.randint(0, 8, (B_L, SIZE, SIZE), generator=gen)
    labels[:, :3] = 255
    return {"images_l": torch.rand(B_L, 3, SIZE, SIZE, generator=gen).numpy(),
            "labels_l": labels.numpy(),
            "images_u": torch.rand(B_U, 3, SIZE, SIZE, generator=gen).numpy()}


def sample_indices(model: nn.Module) -> dict[str, np.ndarray]:
    """``SAMPLES`` flat indices per parameter and buffer (all of them for smaller tensors)."""
    gen = np.random.default_rng(SEED)
    out = {}
    for name, t in (*model.named_parameters(), *model.named_buffers()):
        n = t.numel()
        out[name] = (np.arange(n) if n <= SAMPLES else np.sort(gen.choice(n, SAMPLES, replace=False))).astype(np.int32)
    return out


def digest(prefix: str, model: nn.Module, indices: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Sum, sum of |values| and the sampled entries of every parameter and buffer, as float64."""
    out = {}
    for name, t in (*model.named_parameters(), *model.named_buffers()):
        flat = t.detach().double().flatten()
        out[f"{prefix}/sum/{name}"] = np.array(float(flat.sum()))
        out[f"{prefix}/abs/{name}"] = np.array(float(flat.abs().sum()))
        out[f"{prefix}/at/{name}"] = flat[torch.from_numpy(indices[name])].numpy()
    return out


def gradient_digest(prefix: str, model: nn.Module, indices: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Sum, sum of |values| and the sampled entries of every parameter's gradient (zeros where it has none), float64."""
    out = {}
    for name, p in model.named_parameters():
        flat = (p.grad if p.grad is not None else torch.zeros_like(p)).detach().double().flatten()
        out[f"{prefix}/grad_sum/{name}"] = np.array(float(flat.sum()))
        out[f"{prefix}/grad_abs/{name}"] = np.array(float(flat.abs().sum()))
        out[f"{prefix}/grad_at/{name}"] = flat[torch.from_numpy(indices[name])].numpy()
    return out


def official_network(checkout: Path) -> type:
    """The official ``Network`` class, imported with stubs for ``config`` (ema_decay read from config.py) and
    ``base_model``."""
    folder = checkout / OFFICIAL_DIR
    text = (folder / "config.py").read_text()
    ema_decay = float(re.search(r"^C\.ema_decay\s*=\s*([0-9.]+)", text, re.M).group(1))
    config = types.ModuleType("config")
    config.config = types.SimpleNamespace(ema_decay=ema_decay)
    base_model = types.ModuleType("base_model")
    base_model.resnet50 = None
    saved = {k: sys.modules.get(k) for k in ("config", "base_model", "network")}
    sys.modules.update(config=config, base_model=base_model)
    sys.modules.pop("network", None)
    sys.path.insert(0, str(folder))
    try:
        import network  # noqa: PLC0415 - the official file, from CHECKOUT
    finally:
        sys.path.remove(str(folder))
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
    return network.Network, ema_decay


def config_value(checkout: Path, name: str) -> float:
    """``C.<name>`` of the official config.py (a number assigned at the start of a line)."""
    text = (checkout / OFFICIAL_DIR / "config.py").read_text()
    return float(re.search(rf"^C\.{name}\s*=\s*([0-9.e-]+)", text, re.M).group(1))


def official_optimizer(checkout: Path, net: nn.Module) -> torch.optim.Optimizer:
    """The student's SGD as train.py 90-104 builds it (``group_weight`` of furnace/utils/init_func.py over the
    backbone and the business layers: the decoder and the head here; conv weights decayed, biases and BN not), its LR
    set as train.py 206-211 sets it (``WarmUpPolyLR`` of furnace/engine/lr_policy.py at ``CUR_ITER``, no warm-up)."""
    furnace = str(checkout / "furnace")
    sys.path.insert(0, furnace)
    try:
        from engine.lr_policy import WarmUpPolyLR  # noqa: PLC0415 - the official files, from CHECKOUT
        from utils.init_func import group_weight  # noqa: PLC0415
    finally:
        sys.path.remove(furnace)
    values = (config_value(checkout, "momentum"), config_value(checkout, "weight_decay"), config_value(checkout, "lr_power"))
    assert values == (MOMENTUM, WEIGHT_DECAY, LR_POWER), values
    student = net.branch1.model
    params = group_weight([], student.backbone, nn.BatchNorm2d, LR)
    for module in (student.decoder, student.head):
        params = group_weight(params, module, nn.BatchNorm2d, LR)
    optimizer = torch.optim.SGD(params, lr=LR, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY)
    lr = WarmUpPolyLR(LR, LR_POWER, TOTAL_ITERS, 0).get_lr(CUR_ITER)
    for group in optimizer.param_groups:
        group["lr"] = lr
    return optimizer


def record(checkout: Path) -> tuple[dict[str, np.ndarray], dict]:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    Network, ema_decay = official_network(checkout)
    weight = config_value(checkout, "unsup_weight")
    student, teacher = tiny_model(STUDENT_SALT), tiny_model(TEACHER_SALT)
    net = mean_teacher_network(Network, student, teacher)
    data = inputs()
    imgs, unsup_imgs = (torch.from_numpy(data[k]).to(DTYPE) for k in ("images_l", "images_u"))
    gts = torch.from_numpy(data["labels_l"])
    optimizer = official_optimizer(checkout, net)
    criterion = nn.CrossEntropyLoss(reduction="mean", ignore_index=255)
    criterion_csst = nn.MSELoss(reduction="mean")
    net.train()
    # train.py 177-215 (one process)
    optimizer.zero_grad()
    s_sup_pred, t_sup_pred = net(imgs, step=1, cur_iter=CUR_ITER)
    s_unsup_pred, t_unsup_pred = net(unsup_imgs, step=2, cur_iter=CUR_ITER)
    s_pred = torch.cat([s_sup_pred, s_unsup_pred], dim=0)
    t_pred = torch.cat([t_sup_pred, t_unsup_pred], dim=0)
    softmax_pred_s, softmax_pred_t = F.softmax(s_pred, 1), F.softmax(t_pred, 1)
    csst_loss = criterion_csst(softmax_pred_s, softmax_pred_t.detach()) * weight
    loss_sup = criterion(s_sup_pred, gts)
    loss = loss_sup + csst_loss
    loss.backward()
    optimizer.step()
    indices = sample_indices(student)
    out = dict(data)
    out["loss_sup"] = np.array(float(loss_sup.detach()))
    out["loss_unsup"] = np.array(float(csst_loss.detach()))
    out["lr"] = np.array(optimizer.param_groups[0]["lr"])
    out["teacher_probs"] = softmax_pred_t.detach().float().numpy()  # the project's are float32 (mean_softmax)
    out.update({f"index/{k}": v for k, v in indices.items()})
    out.update(gradient_digest("student", student, indices))
    out.update(digest("student", student, indices))
    out.update(digest("teacher", teacher, indices))
    meta = {"ema_decay": ema_decay, "unsup_weight": weight, "momentum": MOMENTUM, "weight_decay": WEIGHT_DECAY,
            "lr_power": LR_POWER}
    return out, meta


def main(argv: list[str] | None = None) -> None:
    args = recorder_arguments(__doc__, "a checkout of TorchSemiSeg", argv)
    commit = args.commit or official_commit(args.checkout)
    arrays, meta = record(args.checkout)
    sidecar = {
        "about": "One training step of CPS's MeanTeacher as TorchSemiSeg runs it (tests/test_mt_cps_golden.py).",
        "repository": "https://github.com/charlesCXK/TorchSemiSeg",
        "commit": commit,
        "official_file_sha256": {f: hashlib.sha256((args.checkout / f).read_bytes()).hexdigest()
                                 for f in OFFICIAL_FILES},
        "sources": {
            "network_forward_ema": f"{OFFICIAL_DIR}/network.py 25-47 (imported and run: Network.forward, "
                                   "_update_ema_variables)",
            "no_dropout": f"{OFFICIAL_DIR}/network.py 49-201 (SingleNetwork, ASPP, Head: no dropout)",
            "two_calls_and_losses": f"{OFFICIAL_DIR}/train.py 177-215 (written out in the recorder)",
            "ema_decay_unsup_weight": f"{OFFICIAL_DIR}/config.py 73-74",
            "optimizer": f"{OFFICIAL_DIR}/train.py 90-104, 122-123, 206-213 (group_weight of furnace/utils/init_func.py, "
                         "WarmUpPolyLR of furnace/engine/lr_policy.py, imported and run), config.py 98-100",
        },
        "compared": "the step logic on a tiny network built on both sides from the same pattern weights (not the "
                    "official ResNet-50 DeepLabv3+): losses, the teacher's probabilities on both halves, the LR, "
                    "every student gradient, and sum, sum |x| and sampled entries of every parameter and buffer of the "
                    "updated student and teacher",
        "command": f"PYTHONPATH=$PWD python tests/golden/record_mt_cps_golden.py CHECKOUT --commit {commit}",
        "checkout": "CHECKOUT holds these folders at the commit (init_func.py imports furnace/seg_opr), e.g. git "
                    f"archive COMMIT {OFFICIAL_DIR} furnace/utils furnace/seg_opr furnace/engine | tar -x -C CHECKOUT "
                    "(a full clone works too)",
        "sizes": {"B_l": B_L, "B_u": B_U, "size": SIZE, "seed": SEED, "cur_iter": CUR_ITER, "total_iters": TOTAL_ITERS, "lr": LR,
                  "momentum": MOMENTUM, "samples": SAMPLES, "student_salt": STUDENT_SALT,
                  "teacher_salt": TEACHER_SALT, "cell": CELL},
        "dtype": "float64: both networks, their pattern weights, BN buffers and the inputs (images stored as float32 "
                 "values, exact in float64); stored teacher_probs rounded to float32 (the project computes them in "
                 "float32); the official step computes everything in float64",
        "official_values": meta,
        "torch": torch.__version__,
    }
    save_golden(args.out, "mt_cps_step_released", arrays, sidecar)
    print(f"loss_sup {float(arrays['loss_sup']):.6f} loss_unsup {float(arrays['loss_unsup']):.6f}")


if __name__ == "__main__":
    main()
