"""Record one semi-supervised training iteration of PS-MT as its released loop runs it: ``tests/golden/psmt_step_released.npz``.

Usage (from the repository root; CHECKOUT is a checkout of PS-MT, https://github.com/yyliu01/PS-MT)::

    PYTHONPATH=$PWD python tests/golden/record_psmt_step_golden.py CHECKOUT [--commit SHA] [--out tests/golden]

What runs is official, imported from ``CHECKOUT/VocCode`` at run time: ``Trainer._train_epoch`` (``train.py``
189-311, one iteration: the teachers' train-mode predictions ``predict_with_out_grad`` 101-118, the assist mask
121-137, ``cut_mix`` / ``rand_bbox_1`` 63-99, the student's forward, backward, ``optimizer_s.step()``, the
``Poly`` scheduler's step and ``update_teachers`` 35-60, the EMA of the core teacher's whole state dict),
``EntireModel.forward`` (``EntireModel.py`` 55-100: two student passes, 60 and 64, ``semi_ce_loss`` and the cosine
``ConsistencyWeight`` of ``Utils/losses.py``), ``VATDecoderNetwork.forward`` / ``DecoderNetwork.forward`` with
``get_r_adv_t`` (``encoder_decoder.py`` 59-89, 119-154), the optimiser's groups (``Utils/helpers.py``
``group_weight``, as ``Base/base_trainer.py`` 88-111 builds them for the student: SGD, lr 1e-2, momentum 0.9,
weight decay 1e-4 on conv weights only) and ``Utils/lr_scheduler.py`` ``Poly``.

What is not official, and why. The official encoder (a ResNet-50 with its ``Head``) needs the pretrained file and
fixed 2048/256/304 widths, so each of the three models is the project's smoke segmentor of :data:`CELL` (backbone
``resnet_small``, the PS-MT decoder at widths 16/8, the baseline classifier without dropout under ``released``) with
pattern weights (:func:`record_mt_cps_golden.pattern_weights`; student, teacher 1, teacher 2 with salts 0, 1000,
2000; the teachers' last convolution by :func:`sharpen`), then widened to float64 (:data:`DTYPE`, as the images and
T-VAT's starts; the official code runs in the default dtype, set to float64 around the iteration, so that its own
``torch.rand`` / ``torch.zeros`` are float64 too): ``encoder_s`` / ``encoder1`` / ``encoder2`` are that
segmentor's backbone + decoder (its ``extract``), the ``upsample`` module of each official decoder is its classifier
head, upsampled to the crop with ``align_corners=True`` as ``upsample.forward`` (105-116). ``.cuda()`` is the
identity, ``np.int`` is ``int`` (removed from NumPy 1.24; ``rand_bbox_1`` uses it), the logger and wandb board are
no-ops, the loaders are one batch each (tensors, the augmentations drawn here), and every random draw is injected:
T-VAT's two random starts (``torch.rand``, labeled then unlabeled), CutMix's ``torch.randperm``, ``np.random.beta``
and the box centres (``np.random.randint``). The iteration is the first of epoch 8 (0-based epoch 7: teacher 2 is
the core, the ramp-up at iteration ``7 IPE``), with ``Poly`` advanced to that iteration. ``semi_ce_loss`` pads its
one-hot to 21 classes, so the cell has 21 (VOC).

Stored: the inputs and draws, the box coordinates, both losses and the unsupervised weight, the LR, the teachers'
logits (every ``LOGIT_STRIDE``-th), and for every parameter of the student its gradient, and for every parameter and
buffer of the student and both teachers after the iteration its sum, sum of |values| and ``SAMPLES`` entries.
"""

from __future__ import annotations

import hashlib
import importlib
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script: its shared helpers
from record_mt_cps_golden import digest, gradient_digest, load_pattern, sample_indices  # noqa: E402
from recording import default_dtype, official_commit, recorder_arguments, save_golden  # noqa: E402

BENCHMARKS = str(Path(__file__).resolve().parents[2] / "benchmarks")
if BENCHMARKS not in sys.path:  # the benchmarks' package: the project's network split into PS-MT's parts
    sys.path.append(BENCHMARKS)
from official.psmt_network import entire_model  # noqa: E402

OFFICIAL_FILES = ("VocCode/train.py", "VocCode/Model/Deeplabv3_plus/EntireModel.py",
                  "VocCode/Model/Deeplabv3_plus/encoder_decoder.py", "VocCode/Utils/losses.py",
                  "VocCode/Utils/helpers.py", "VocCode/Utils/lr_scheduler.py", "VocCode/Base/base_trainer.py")
#: the cell whose tiny network every model uses (21 classes: semi_ce_loss pads to 21)
CELL = dict(framework="psmt", dataset="pascal_blender", partition="1/16", head="baseline", protocol="released")
B_L, B_U, SIZE, K = 2, 2, 32, 21
SEED = 20263
#: iterations per epoch and epochs of the schedule; the iteration recorded is the first of (1-based) epoch 8
IPE, EPOCHS, EPOCH = 10, 80, 8
LR, MOMENTUM, WEIGHT_DECAY = 1e-2, 0.9, 1e-4
UNSUP_WEIGHT, RAMP_UP, GAMMA, THRESHOLD = 1.5, 12, 0.5, 0.6
SALTS = {"student": 0, "teacher1": 1000, "teacher2": 2000}
#: scale of the teachers' last 1x1 convolution (seeded normal weights, zero bias): part of the pixels pass 0.6
TEACHER_LOGIT_SCALE = 3.0
#: the teachers' logits ``[B_u, K, H, W]`` are stored at every LOGIT_STRIDE-th flat index
LOGIT_STRIDE = 16
#: the precision of both sides' step: the models (pattern weights and BN buffers set in float32, then widened),
#: the images (stored as float32 values, exact in float64) and T-VAT's random starts; in float32 the tiny BN
#: networks amplify round-off that differs between CPUs (vector width, oneDNN's convolution, MKL's GEMM) far
#: beyond any useful bound
DTYPE = torch.float64


def tiny_models() -> dict[str, nn.Module]:
    """The smoke segmentor of :data:`CELL` three times with pattern weights (:data:`SALTS`), in :data:`DTYPE`."""
    from npsemiseg.config import compose
    from npsemiseg.training import build_model

    config = compose("smoke", **CELL).config
    models = {name: build_model(config) for name in SALTS}
    for name, model in models.items():
        load_pattern(model, SALTS[name])
        if name != "student":
            sharpen(model, SALTS[name])
        model.to(DTYPE)
    return models


def sharpen(model: nn.Module, seed: int) -> None:
    """The teacher's last 1x1 convolution: normal weights x :data:`TEACHER_LOGIT_SCALE` (NumPy's generator seeded
    with ``seed``: the same values on every CPU, which ``torch.randn``'s vectorised draw is not), zero bias; with
    pattern weights alone every pixel's target is the same class below the threshold."""
    conv = model.head.classifier[-1]
    normal = np.random.default_rng(seed).standard_normal(tuple(conv.weight.shape))
    with torch.no_grad():
        conv.weight.copy_(torch.from_numpy(TEACHER_LOGIT_SCALE * normal))
        conv.bias.zero_()


def inputs() -> dict[str, np.ndarray]:
    """Images in [0, 1] (both views of both parts), labels (some 255), the unlabeled truth (only for the official
    loop's metrics) and every random draw of the step: T-VAT's starts, the CutMix permutation, lambda, centres."""
    gen = torch.Generator().manual_seed(SEED)
    labels = torch.randint(0, K, (B_L, SIZE, SIZE), generator=gen)
    labels[:, :3] = 255
    data = {"images_l_weak": torch.rand(B_L, 3, SIZE, SIZE, generator=gen),
            "images_l": torch.rand(B_L, 3, SIZE, SIZE, generator=gen), "labels_l": labels,
            "images_u_weak": torch.rand(B_U, 3, SIZE, SIZE, generator=gen),
            "images_u": torch.rand(B_U, 3, SIZE, SIZE, generator=gen),
            "truth_u": torch.randint(0, K, (B_U, SIZE, SIZE), generator=gen)}
    data = {k: v.numpy() for k, v in data.items()}
    rng = np.random.default_rng(SEED)
    data["cutmix_perm"] = np.array([1, 0], dtype=np.int64)
    data["cutmix_lambda"] = np.array(float(rng.beta(4, 4)))
    data["cutmix_cx"] = rng.integers(SIZE // 8, SIZE, size=B_U)
    data["cutmix_cy"] = rng.integers(SIZE // 8, SIZE, size=B_U)
    return data


def tvat_starts(features_shape: tuple[int, ...]) -> dict[str, np.ndarray]:
    """T-VAT's uniform random starts (``torch.rand(x.shape)``) of the labeled and the unlabeled call."""
    gen = torch.Generator().manual_seed(SEED + 1)
    return {"start_l": torch.rand(B_L, *features_shape, generator=gen).numpy(),
            "start_u": torch.rand(B_U, *features_shape, generator=gen).numpy()}


class Parallel(nn.Module):
    """``DataParallel``'s interface on one process: ``.module`` and the call."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, **kwargs):
        return self.module(**kwargs)


class NoBoard:
    """The wandb board and logger: every method a no-op."""

    def __getattr__(self, name):
        return lambda *args, **kwargs: None


def load_official(checkout: Path) -> dict[str, types.ModuleType]:
    root = str(checkout / "VocCode")
    sys.path.insert(0, root)
    try:
        names = ("train", "Model.Deeplabv3_plus.EntireModel", "Model.Deeplabv3_plus.encoder_decoder", "Utils.losses",
                 "Utils.helpers", "Utils.lr_scheduler")
        return {name.split(".")[-1]: importlib.import_module(name) for name in names}
    finally:
        sys.path.remove(root)


def official_model(mods: dict[str, types.ModuleType], models: dict[str, nn.Module]) -> nn.Module:
    """``EntireModel`` whose encoders and decoders are the tiny segmentors' halves
    (``benchmarks/official/psmt_network.py``, the split the official whole run uses too)."""
    losses = mods["losses"]
    model = entire_model(mods["EntireModel"].EntireModel, mods["encoder_decoder"], models, [SIZE, SIZE])
    model.mode, model.ignore_index, model.sup_loss = "semi", 255, losses.CE_loss
    model.unsuper_loss = losses.semi_ce_loss
    model.unsup_loss_w = losses.ConsistencyWeight(final_w=UNSUP_WEIGHT, iters_per_epoch=IPE, rampup_starts=0,
                                                  rampup_ends=RAMP_UP, ramp_type="cosine_rampup")
    return model


def official_trainer(mods: dict[str, types.ModuleType], model: nn.Module, data: dict[str, np.ndarray]):
    """A ``Trainer`` for one process (its attributes as ``Trainer.__init__`` / ``BaseTrainer.__init__`` set them)
    with the student's optimiser and scheduler advanced to iteration ``(EPOCH - 1) IPE``."""
    trainer = mods["train"].Trainer.__new__(mods["train"].Trainer)
    t = {k: torch.from_numpy(v).to(DTYPE) if k.startswith("images") else torch.from_numpy(v) for k, v in data.items()}
    trainer.model = Parallel(model)
    trainer.args = types.SimpleNamespace(local_rank=0, ddp=False, architecture="deeplabv3+", semi_p_th=THRESHOLD,
                                         semi_n_th=0.0, batch_size=B_U)
    trainer.supervised_loader = [(t["images_l_weak"], t["images_l"], t["labels_l"])]
    trainer.unsupervised_loader = [(t["images_u_weak"], t["images_u"], t["truth_u"])]
    trainer.tensor_board, trainer.logger = NoBoard(), NoBoard()
    trainer.mode, trainer.gamma, trainer.num_classes, trainer.ignore_index = "semi", GAMMA, K, 255
    trainer.log_step, trainer.iter_per_epoch = 1, IPE
    params = mods["helpers"].group_weight([], model.encoder_s.backbone, nn.BatchNorm2d, LR)
    for module in (model.encoder_s.decoder, model.decoder_s.upsample.head):  # business layers (base_trainer 100-104)
        params = mods["helpers"].group_weight(params, module, nn.BatchNorm2d, LR)
    trainer.optimizer_s = torch.optim.SGD(params, lr=LR, weight_decay=WEIGHT_DECAY, momentum=MOMENTUM)
    trainer.lr_scheduler_s = mods["lr_scheduler"].Poly(optimizer=trainer.optimizer_s, num_epochs=EPOCHS,
                                                       iters_per_epoch=IPE)
    for epoch in range(EPOCH - 1):  # the steps of the epochs before, as _train_epoch takes them
        for _ in range(IPE):
            trainer.lr_scheduler_s.step(epoch=epoch)
    return trainer


@contextmanager
def patched(obj, name: str, value) -> Iterator[None]:
    original = getattr(obj, name, None)
    setattr(obj, name, value)
    try:
        yield
    finally:
        if original is None:
            delattr(obj, name)
        else:
            setattr(obj, name, original)


@contextmanager
def injected(data: dict[str, np.ndarray], starts: list[np.ndarray], seen: dict) -> Iterator[None]:
    """The step's random draws replayed (``torch.rand`` of T-VAT, ``torch.randperm``, ``np.random.beta`` and
    ``np.random.randint`` of CutMix), ``.cuda()`` the identity, ``np.int`` = ``int``; ``seen`` receives the boxes."""
    centres = [data["cutmix_cx"], data["cutmix_cy"]]

    def rand(*size, **kwargs):
        shape = tuple(size[0]) if len(size) == 1 and not isinstance(size[0], int) else tuple(size)
        start = starts.pop(0)
        assert shape == start.shape, (shape, start.shape)
        return torch.from_numpy(start.copy()).to(torch.get_default_dtype())  # the values drawn, at the run's dtype

    def randint(size, low, high):
        value = centres.pop(0)
        assert len(value) == size[0] and low <= value.min() and value.max() < high, (value, low, high)
        return value.copy()

    with (patched(torch, "rand", rand), patched(torch.Tensor, "cuda", lambda self, *a, **k: self),
          patched(torch, "randperm", lambda n, **k: torch.from_numpy(data["cutmix_perm"][:n].copy())),
          patched(np.random, "beta", lambda a, b: float(data["cutmix_lambda"])),
          patched(np.random, "randint", randint), patched(np, "int", int)):
        yield
    assert not starts and not centres, "every injected draw is used"


def record(checkout: Path) -> tuple[dict[str, np.ndarray], dict]:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    mods = load_official(checkout)
    models = tiny_models()
    data = inputs()
    with torch.no_grad():  # the feature map's shape, in eval mode: no BN statistics move
        feature_shape = tuple(models["student"].eval().extract(torch.from_numpy(data["images_l"]).to(DTYPE)).shape[1:])
    models["student"].train()
    data.update(tvat_starts(feature_shape))
    model = official_model(mods, models)
    trainer = official_trainer(mods, model, data)
    lr = [group["lr"] for group in trainer.optimizer_s.param_groups]
    seen: dict = {}
    trainer_cls = mods["train"].Trainer
    original_bbox, original_update = trainer_cls.rand_bbox_1, trainer.__class__._update_losses
    original_predict = trainer_cls.predict_with_out_grad

    def bbox(size, lam=None):
        seen["boxes"] = np.stack(original_bbox(size, lam=lam), axis=1)
        return tuple(seen["boxes"].T)

    def update_losses(self, cur_losses):
        seen["losses"] = {k: float(v) for k, v in cur_losses.items() if k in ("loss_sup", "loss_unsup")}
        return original_update(self, cur_losses)

    def predict(self, image):
        seen["teacher_logits"] = original_predict(self, image)
        return seen["teacher_logits"]

    with (default_dtype(DTYPE), injected(data, [data["start_l"], data["start_u"]], seen),
          patched(trainer_cls, "rand_bbox_1", staticmethod(bbox)), patched(trainer_cls, "_update_losses", update_losses),
          patched(trainer_cls, "predict_with_out_grad", predict)):
        trainer._train_epoch(EPOCH, id=2 if EPOCH % 2 == 0 else 1)
    weight = model.unsup_loss_w(epoch=EPOCH - 1, curr_iter=0)
    indices = sample_indices(models["student"])
    out = dict(data)
    out.update(loss_sup=np.array(seen["losses"]["loss_sup"]), loss_unsup=np.array(seen["losses"]["loss_unsup"]),
               unsup_weight=np.array(float(weight)), lr=np.array(lr), cutmix_boxes=seen["boxes"].astype(np.int64),
               teacher1_logits=seen["teacher_logits"][0].flatten()[::LOGIT_STRIDE].numpy(),
               teacher2_logits=seen["teacher_logits"][1].flatten()[::LOGIT_STRIDE].numpy())
    out.update({f"index/{k}": v for k, v in indices.items()})
    out.update(gradient_digest("student", models["student"], indices))
    for name, m in models.items():
        out.update(digest(name, m, indices))
    return out, {"lr_groups": len(lr), "unsup_weight": float(weight)}


def main(argv: list[str] | None = None) -> None:
    args = recorder_arguments(__doc__, "a checkout of PS-MT", argv)
    commit = args.commit or official_commit(args.checkout)
    arrays, meta = record(args.checkout)
    sidecar = {
        "about": "One semi-supervised iteration of PS-MT's released loop (tests/test_psmt_step_golden.py).",
        "repository": "https://github.com/yyliu01/PS-MT",
        "commit": commit,
        "official_file_sha256": {f: hashlib.sha256((args.checkout / f).read_bytes()).hexdigest() for f in OFFICIAL_FILES},
        "sources": {
            "loop_body": "VocCode/train.py 189-311 (Trainer._train_epoch, imported and run for one iteration)",
            "teachers_assist_cutmix_ema": "VocCode/train.py 35-60, 63-99, 101-137",
            "two_student_passes_and_losses": "VocCode/Model/Deeplabv3_plus/EntireModel.py 55-100",
            "tvat": "VocCode/Model/Deeplabv3_plus/encoder_decoder.py 53-89, 136-154",
            "optimizer_groups": "VocCode/Base/base_trainer.py 88-111, VocCode/Utils/helpers.py 38-77",
            "schedule_and_weight": "VocCode/Utils/lr_scheduler.py (Poly), VocCode/Utils/losses.py 6-25, 35-89",
        },
        "compared": "the official loop body on the project's tiny segmentors (not the official ResNet-50 encoder): "
                    "losses, the teachers' logits, every student gradient, and every parameter and buffer of the "
                    "student and both teachers after the step (sum, sum |x|, sampled entries)",
        "command": f"PYTHONPATH=$PWD python tests/golden/record_psmt_step_golden.py CHECKOUT --commit {commit}",
        "checkout": "CHECKOUT holds VocCode at the commit, e.g. git archive COMMIT VocCode | tar -x -C CHECKOUT",
        "sizes": {"B_l": B_L, "B_u": B_U, "size": SIZE, "classes": K, "seed": SEED, "ipe": IPE, "epochs": EPOCHS,
                  "epoch": EPOCH, "lr": LR, "momentum": MOMENTUM, "weight_decay": WEIGHT_DECAY, "salts": SALTS,
                  "cell": CELL},
        "dtype": "float64: the three models (pattern weights set in float32, then widened), the images "
                 "(stored as float32 values, exact in float64), T-VAT's starts and the default dtype of the official "
                 "iteration; the stored teachers' logits, losses and digests are float64",
        "official_values": meta,
        "torch": torch.__version__,
    }
    save_golden(args.out, "psmt_step_released", arrays, sidecar)
    print(f"loss_sup {float(arrays['loss_sup']):.6f} loss_unsup {float(arrays['loss_unsup']):.6f} "
          f"weight {meta['unsup_weight']:.6f}")


if __name__ == "__main__":
    main()
