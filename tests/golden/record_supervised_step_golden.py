"""Record one training iteration of U2PL's supervised baseline (``train_sup.py``): ``tests/golden/supervised_step_released.npz``.

Usage (from the repository root; CHECKOUT is a checkout of U2PL, https://github.com/Haochen-Wang409/U2PL)::

    PYTHONPATH=$PWD python tests/golden/record_supervised_step_golden.py CHECKOUT [--commit SHA] [--out tests/golden]

Why U2PL's: the project's ``supervised`` framework is the labeled-only reference of the U2PL-based study (the
NP-SemiSeg paper's code base): the ``u2pl`` DeepLabv3+ with its dropout, the head at 10x the backbone's LR on VOC
(1x on Cityscapes), CE on VOC and OHEM + 0.4 x the layer-3 auxiliary loss on Cityscapes, poly LR: U2PL's
``train_sup.py`` (its ``suponly`` experiments). UniMatch's ``supervised.py`` trains another network (its
DeepLabv3+ without dropout, ResNet-101 without multi-grid) at other settings, so it is not this framework's reference.

What runs is official, imported from CHECKOUT at run time: ``train()`` of ``train_sup.py`` (177-251) for one
iteration (the scheduler's ``get_lr`` / ``step``, the forward, the logits upsampled with ``align_corners=True``, the
criterion, ``zero_grad``, backward, ``optimizer.step()``, the loss all-reduced over one process), the optimiser and
scheduler as ``main()`` builds them (97-134: the backbone at ``lr``, the decoder and the auxiliary head at ``lr x
times``, ``get_optimizer`` twice and ``get_scheduler`` on the second, whose groups are the same dicts), and the
criterion of ``u2pl/utils/loss_helper.py`` (``get_criterion``: ``Criterion`` CE, or ``CriterionOhem`` with the
auxiliary term). What is not: ``ModelBuilder``'s ResNet-101 needs the pretrained file, so the network is the
project's smoke segmentor of each cell (backbone ``resnet_small``, the U2PL decoder at widths 16/8, the baseline
classifier with its two ``Dropout2d(0.1)``, on Cityscapes the layer-3 auxiliary head) with pattern weights and
BN buffers (:func:`step_recording.load_pattern`), wrapped as ``ModelBuilder``'s interface (``encoder``, ``decoder``,
``auxor``; ``{"pred", "aux"}``); the configuration dict holds the cell's values; ``cv2`` and ``skimage`` (imported,
not used) are stand-ins; ``.cuda()`` is the identity; the process group is gloo with one process; the loader is one
batch. Dropout masks are drawn here and injected: ``F.dropout2d`` is replaced by one that takes the next recorded
channel mask (kept channels scaled by ``1 / (1 - p)``), the same replacement in the test.

Precision: float64 throughout (the network, the images: float32 draws widened, the masks, the pattern weights and BN
buffers of :func:`step_recording.load_pattern`), so that the record is the same on any CPU's kernels (in float32 the
tiny BN network turned ATen's, oneDNN's and MKL's round-off into gradient differences of 1e-2 between CPUs). The
official criterion and loop fix no dtype.

Stored per cell (prefix ``voc/``, ``cityscapes/``): inputs, the masks, the loss, the LR of each group, and for every
parameter its gradient, and for every parameter and buffer after the step its sum, sum of |values| and sampled
entries.
"""

from __future__ import annotations

import hashlib
import importlib
import sys
import tempfile
import types
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script: its shared helpers
from record_mt_cps_golden import digest, gradient_digest, sample_indices  # noqa: E402
from recording import official_commit, recorder_arguments, save_golden  # noqa: E402
from step_recording import load_pattern  # noqa: E402

OFFICIAL_FILES = ("train_sup.py", "u2pl/utils/loss_helper.py", "u2pl/utils/lr_helper.py")
CELLS = {family: dict(framework="supervised", dataset=dataset, partition="1/16", head="baseline", protocol="released")
         for family, dataset in (("voc", "pascal_blender"), ("cityscapes", "cityscapes"))}
B, SIZE, SEED = 2, 32, 20264
#: the iteration recorded: epoch EPOCH of EPOCHS, one iteration per epoch (poly LR at EPOCH / EPOCHS)
EPOCH, EPOCHS = 3, 10
SALT = 0


def config_of(family: str):
    from npsemiseg.config import compose

    return compose("smoke", **CELLS[family]).config


def official_cfg(config, family: str) -> dict:
    """U2PL's configuration dict (its ``suponly`` config.yaml layout) with the cell's values."""
    loss = config.loss
    cfg = {"dataset": {"type": "pascal" if family == "voc" else "cityscapes", "ignore_label": 255},
           "net": {"num_classes": config.num_classes, "sync_bn": False},
           "criterion": ({"type": "ohem", "kwargs": {"thresh": loss.ohem_thresh, "min_kept": loss.ohem_min_kept}}
                         if loss.ohem else {"type": "CELoss", "kwargs": {"use_weight": False}}),
           "trainer": {"epochs": EPOCHS, "optimizer": {"type": "SGD", "kwargs": {
               "lr": config.optim.lr, "momentum": config.optim.momentum, "weight_decay": config.optim.weight_decay}},
                       "lr_scheduler": {"mode": "poly", "kwargs": {"power": config.schedule.poly_power}}}}
    if config.model.aux_head:
        cfg["net"]["aux_loss"] = {"aux_plane": 0, "loss_weight": loss.aux_weight}
    return cfg


def inputs(family: str, num_classes: int) -> dict[str, np.ndarray]:
    gen = torch.Generator().manual_seed(SEED + (family == "cityscapes"))
    labels = torch.randint(0, num_classes, (B, SIZE, SIZE), generator=gen)
    labels[:, :3] = 255
    return {"image": torch.rand(B, 3, SIZE, SIZE, generator=gen).numpy(), "label": labels.numpy()}


class Decoder(nn.Module):
    """``ModelBuilder.decoder``'s place: the segmentor's decoder and classifier head (one parameter group)."""

    def __init__(self, segmentor: nn.Module) -> None:
        super().__init__()
        self.decoder, self.head = segmentor.decoder, segmentor.head


class Builder(nn.Module):
    """``ModelBuilder``'s interface (model_helper.py 9-66) around the segmentor: ``encoder``, ``decoder``,
    ``auxor`` (when the cell has the auxiliary head); the call returns ``{"pred": logits at feature size, "aux":
    the auxiliary logits}``."""

    def __init__(self, segmentor: nn.Module) -> None:
        super().__init__()
        self.encoder, self.decoder = segmentor.backbone, Decoder(segmentor)
        if segmentor.aux_head is not None:
            self.auxor = segmentor.aux_head
        object.__setattr__(self, "segmentor", segmentor)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        out = self.segmentor(x)
        outs = {"pred": out.head.logits[0]}
        if out.aux_logits is not None:
            outs["aux"] = out.aux_logits
        return outs


class OneBatch:
    """The loader of one batch: ``len`` 1, ``sampler.set_epoch``, an iterator with the Python 2 ``.next()``."""

    def __init__(self, batch) -> None:
        self.batch = batch
        self.sampler = types.SimpleNamespace(set_epoch=lambda epoch: None)

    def __len__(self) -> int:
        return 1

    def __iter__(self):
        return _Next(self.batch)


class _Next:
    """An iterator over one batch with the Python 2 ``.next()`` train_sup.py calls (208)."""

    def __init__(self, batch) -> None:
        self.batch = batch

    def __iter__(self):
        return self

    def __next__(self):
        return self.batch

    next = __next__


class Recorded(nn.Module):
    """The criterion, keeping the loss it returns."""

    def __init__(self, criterion: nn.Module) -> None:
        super().__init__()
        self.criterion, self.loss = criterion, None

    def forward(self, preds, target):
        self.loss = self.criterion(preds, target)
        return self.loss


def mask_dropout2d(masks: list[torch.Tensor], draw: torch.Generator | None):
    """``F.dropout2d`` taking channel masks ``[N, C]`` in order: drawn with ``draw`` (and appended to ``masks``) or,
    with ``draw`` None, popped from ``masks``; kept channels scaled by ``1 / (1 - p)``."""

    def dropout2d(input, p=0.5, training=True, inplace=False):
        if not training or p == 0.0:
            return input
        if draw is not None:
            masks.append((torch.rand(input.shape[:2], generator=draw) >= p).float())
            mask = masks[-1]
        else:
            mask = masks.pop(0)
            assert tuple(mask.shape) == tuple(input.shape[:2]), (tuple(mask.shape), tuple(input.shape))
        return input * (mask.to(input.dtype) / (1.0 - p))[:, :, None, None]

    return dropout2d


@contextmanager
def patched(obj, name: str, value) -> Iterator[None]:
    original = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, original)


def load_official(checkout: Path) -> types.ModuleType:
    """``train_sup`` from CHECKOUT, with stand-ins for ``cv2`` and ``skimage`` (imported by the data and utility
    modules, used by neither the step nor the criterion)."""
    stubs = {"cv2": types.ModuleType("cv2"), "skimage": types.ModuleType("skimage"),
             "skimage.measure": types.ModuleType("skimage.measure")}
    stubs["skimage.measure"].label = stubs["skimage.measure"].regionprops = None
    stubs["skimage"].measure = stubs["skimage.measure"]
    for name, module in stubs.items():
        sys.modules.setdefault(name, module)
    sys.path.insert(0, str(checkout))
    try:
        return importlib.import_module("train_sup")
    finally:
        sys.path.remove(str(checkout))


def record_cell(train_sup: types.ModuleType, family: str) -> dict[str, np.ndarray]:
    from npsemiseg.training import build_model

    config = config_of(family)
    segmentor = build_model(config).double()
    load_pattern(segmentor, SALT)
    model = Builder(segmentor)
    cfg = official_cfg(config, family)
    train_sup.cfg = cfg
    data = inputs(family, config.num_classes)
    cfg_optim = cfg["trainer"]["optimizer"]
    times = 10 if "pascal" in cfg["dataset"]["type"] else 1  # train_sup.py 97-112
    modules_head = [model.auxor, model.decoder] if cfg["net"].get("aux_loss", False) else [model.decoder]
    params_list = [dict(params=model.encoder.parameters(), lr=cfg_optim["kwargs"]["lr"])]
    params_list += [dict(params=m.parameters(), lr=cfg_optim["kwargs"]["lr"] * times) for m in modules_head]
    optimizer = train_sup.get_optimizer(params_list, cfg_optim)
    optimizer_old = train_sup.get_optimizer(params_list, cfg_optim)  # 131-134
    lr_scheduler = train_sup.get_scheduler(cfg["trainer"], 1, optimizer_old, start_epoch=EPOCH)
    criterion = Recorded(train_sup.get_criterion(cfg))
    loader = OneBatch((torch.from_numpy(data["image"]).double(), torch.from_numpy(data["label"])))
    masks: list[torch.Tensor] = []
    with (patched(F, "dropout2d", mask_dropout2d(masks, torch.Generator().manual_seed(SEED + 7))),
          patched(torch.Tensor, "cuda", lambda self, *a, **k: self)):
        train_sup.train(model, optimizer, lr_scheduler, criterion, loader, EPOCH,
                        types.SimpleNamespace(add_scalar=lambda *a, **k: None))
    indices = sample_indices(segmentor)
    out = dict(data)
    out.update({f"mask{i}": m.numpy() for i, m in enumerate(masks)})
    out["loss"] = np.array(float(criterion.loss.detach()))
    out["lr"] = np.array([group["lr"] for group in optimizer.param_groups])
    out.update({f"index/{k}": v for k, v in indices.items()})
    out.update(gradient_digest("student", segmentor, indices))
    out.update(digest("student", segmentor, indices))
    return {f"{family}/{k}": v for k, v in out.items()}


def record(checkout: Path) -> dict[str, np.ndarray]:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    train_sup = load_official(checkout)
    with tempfile.TemporaryDirectory() as folder:
        dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=0, world_size=1)
        try:
            out: dict[str, np.ndarray] = {}
            for family in CELLS:
                out.update(record_cell(train_sup, family))
        finally:
            dist.destroy_process_group()
    return out


def main(argv: list[str] | None = None) -> None:
    args = recorder_arguments(__doc__, "a checkout of U2PL", argv)
    commit = args.commit or official_commit(args.checkout)
    arrays = record(args.checkout)
    sidecar = {
        "about": "One iteration of U2PL's supervised baseline, train_sup.py (tests/test_supervised_step_golden.py).",
        "repository": "https://github.com/Haochen-Wang409/U2PL",
        "commit": commit,
        "official_file_sha256": {f: hashlib.sha256((args.checkout / f).read_bytes()).hexdigest() for f in OFFICIAL_FILES},
        "sources": {
            "loop_body": "train_sup.py 177-251 (train(), imported and run for one iteration)",
            "optimizer_scheduler": "train_sup.py 97-134, u2pl/utils/lr_helper.py 12-113 (imported and run)",
            "criterion": "u2pl/utils/loss_helper.py 238-360 (get_criterion, Criterion, CriterionOhem; imported and run)",
            "configs": "experiments/pascal/1464/suponly/config.yaml, experiments/cityscapes/744/suponly/config.yaml "
                       "(layout; the values are the cell's)",
        },
        "compared": "the official loop body on the project's tiny segmentor (not the official ResNet-101 DeepLabv3+): "
                    "the loss, the LR, every gradient, every parameter and BN buffer after the step (sum, sum |x|, "
                    "sampled entries), VOC (CE) and Cityscapes (OHEM + 0.4 aux) cells",
        "precision": "float64: network, images (float32 draws widened), dropout masks, pattern weights and BN buffers; "
                     "the official loop and criterion fix no dtype",
        "command": f"PYTHONPATH=$PWD python tests/golden/record_supervised_step_golden.py CHECKOUT --commit {commit}",
        "checkout": "CHECKOUT holds train_sup.py and u2pl/ at the commit, e.g. git archive COMMIT train_sup.py u2pl | "
                    "tar -x -C CHECKOUT",
        "sizes": {"B": B, "size": SIZE, "seed": SEED, "epoch": EPOCH, "epochs": EPOCHS, "salt": SALT, "cells": CELLS},
        "torch": torch.__version__,
    }
    save_golden(args.out, "supervised_step_released", arrays, sidecar)
    print(" ".join(f"{f} loss {float(arrays[f'{f}/loss']):.6f}" for f in CELLS))


if __name__ == "__main__":
    main()
