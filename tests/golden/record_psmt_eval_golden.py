"""Record what PS-MT's released VOC evaluation predicts on fixed small images: ``tests/golden/psmt_eval_released.npz``.

Usage (from the repository root; CHECKOUT is a checkout of PS-MT, https://github.com/yyliu01/PS-MT)::

    PYTHONPATH=$PWD python tests/golden/record_psmt_eval_golden.py CHECKOUT [--commit SHA] [--out tests/golden]

``Trainer._valid_epoch`` and ``Trainer.predict_with_out_grad`` are imported from ``VocCode/train.py`` of CHECKOUT
at run time (nothing of them is kept here) and run on a stand-in trainer: its validation loader is the images
below (one per batch, as PS-MT's VOC ``val_loader``), its two teachers small stand-ins built here
(:class:`Teacher`: encoder conv 3x3 stride 8, decoder conv 1x1 upsampled to the asked size, bilinear with
``align_corners=True``, as PS-MT's ``upsample`` module in eval mode) with deterministic weights. ``.cuda()``
returns the tensor itself; ``eval_metrics`` (``VocCode/Utils/metrics.py``) is wrapped to keep the logits it
receives, which are the evaluation's output: both teachers' logits at the image resized to multiples of 8,
averaged and resized back to the image size (train.py 324-337). The test builds the same teachers.
"""

from __future__ import annotations

import hashlib
import importlib
import sys
import types
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script: its shared helpers
from recording import official_commit, recorder_arguments, save_golden  # noqa: E402


OFFICIAL_FILE = "VocCode/train.py"
#: feature channels C, classes K; image sizes (H, W), one not a multiple of 8, one that is
C, K = 6, 4
SIZES = ((21, 30), (16, 24))
SEED = 20263


def pattern(shape: tuple[int, ...], salt: int, scale: float) -> torch.Tensor:
    """``scale * sin(1 + 0.7 i + salt)`` over the flat index i, float32."""
    values = scale * np.sin(1.0 + 0.7 * np.arange(int(np.prod(shape)), dtype=np.float64) + float(salt))
    return torch.from_numpy(values.reshape(shape)).float()


class Teacher(nn.Module):
    """``encoder`` (conv 3x3, stride 8: features at 1/8 of a multiple-of-8 size) and ``decoder`` (conv 1x1 to K
    logits, :meth:`decode` upsamples them to ``data_shape`` bilinear with ``align_corners=True``)."""

    def __init__(self, salt: int) -> None:
        super().__init__()
        self.encoder = nn.Conv2d(3, C, 3, stride=8, padding=1)
        self.decoder = nn.Conv2d(C, K, 1)
        with torch.no_grad():
            self.encoder.weight.copy_(pattern(tuple(self.encoder.weight.shape), salt, 0.5))
            self.encoder.bias.copy_(pattern((C,), salt + 1, 0.1))
            self.decoder.weight.copy_(pattern(tuple(self.decoder.weight.shape), salt + 2, 0.8))
            self.decoder.bias.copy_(pattern((K,), salt + 3, 0.1))

    def decode(self, features: torch.Tensor, data_shape=None) -> torch.Tensor:
        logits = self.decoder(features)
        return F.interpolate(logits, size=tuple(data_shape), mode="bilinear", align_corners=True)


def teachers() -> tuple[Teacher, Teacher]:
    return Teacher(0).eval(), Teacher(10).eval()


def inputs() -> dict[str, np.ndarray]:
    """``image{i} [1, 3, H, W]`` and ``label{i} [1, H, W]`` per size of :data:`SIZES`."""
    gen = torch.Generator().manual_seed(SEED)
    out = {}
    for i, (height, width) in enumerate(SIZES):
        out[f"image{i}"] = torch.rand(1, 3, height, width, generator=gen).numpy()
        out[f"label{i}"] = torch.randint(0, K, (1, height, width), generator=gen).numpy().astype(np.int64)
    return out


def load_official(checkout: Path) -> types.ModuleType:
    """``train`` from ``checkout/VocCode`` (its own imports resolved there)."""
    root = str(checkout / "VocCode")
    sys.path.insert(0, root)
    try:
        return importlib.import_module("train")
    finally:
        sys.path.remove(root)


@contextmanager
def on_cpu():
    cuda = torch.Tensor.cuda
    torch.Tensor.cuda = lambda self, *args, **kwargs: self
    try:
        yield
    finally:
        torch.Tensor.cuda = cuda


def stand_in_trainer(train: types.ModuleType, loader: list) -> types.SimpleNamespace:
    """What ``_valid_epoch`` reads of its trainer: the loader, the model's teachers, logging and metrics."""
    t1, t2 = teachers()
    module = types.SimpleNamespace(encoder1=t1.encoder, decoder1=t1.decode, encoder2=t2.encoder, decoder2=t2.decode)
    model = types.SimpleNamespace(module=module, eval=lambda: None, train=lambda: None)
    trainer = types.SimpleNamespace(
        val_loader=loader, model=model, ignore_index=255, num_classes=K,
        logger=types.SimpleNamespace(info=lambda *args, **kwargs: None),
        tensor_board=types.SimpleNamespace(upload_wandb_info=lambda *args, **kwargs: None),
        args=types.SimpleNamespace(local_rank=0, ddp=False))
    trainer.predict_with_out_grad = types.MethodType(train.Trainer.predict_with_out_grad, trainer)
    return trainer


def record(checkout: Path) -> dict[str, np.ndarray]:
    train = load_official(checkout)
    torch.set_num_threads(1)  # as the test (tests/conftest.py single_seeded_thread)
    data = inputs()
    out: dict[str, np.ndarray] = dict(data)
    seen: list[torch.Tensor] = []
    eval_metrics = train.eval_metrics

    def keeping(output, target, *args, **kwargs):
        seen.append(output.detach().clone())
        return eval_metrics(output, target, *args, **kwargs)

    train.eval_metrics = keeping
    loader = [(torch.from_numpy(data[f"image{i}"]), torch.from_numpy(data[f"label{i}"])) for i in range(len(SIZES))]
    try:
        with on_cpu():
            train.Trainer._valid_epoch(stand_in_trainer(train, loader), epoch=1, id=1)
    finally:
        train.eval_metrics = eval_metrics
    assert len(seen) == len(SIZES)
    for i, logits in enumerate(seen):
        out[f"logits{i}"] = logits.numpy()
    return out



def main(argv: list[str] | None = None) -> None:
    args = recorder_arguments(__doc__, "a checkout of PS-MT", argv)
    arrays = record(args.checkout)
    sidecar = {
        "about": "What PS-MT's released VOC evaluation predicts on fixed small images (tests/test_psmt_eval_golden.py).",
        "repository": "https://github.com/yyliu01/PS-MT",
        "commit": args.commit or official_commit(args.checkout),
        "official_file_sha256": hashlib.sha256((args.checkout / OFFICIAL_FILE).read_bytes()).hexdigest(),
        "sources": {
            "valid_epoch": f"{OFFICIAL_FILE} 313-370 (_valid_epoch)",
            "resize_to_multiples_of_8": f"{OFFICIAL_FILE} 324-330",
            "teachers_logits": f"{OFFICIAL_FILE} 101-118 (predict_with_out_grad), 332-333 (averaged logits)",
            "resized_back": f"{OFFICIAL_FILE} 334-337",
            "whole_images": "VocCode/configs/config_deeplab_v3+.json 61-68 (val_loader: batch 1, no crop, no "
                            "base_size), VocCode/Base/base_dataset.py 155-162 (_val_augmentation)",
        },
        "command": "PYTHONPATH=$PWD python tests/golden/record_psmt_eval_golden.py CHECKOUT"
                   + (f" --commit {args.commit}" if args.commit else ""),
        "checkout": "CHECKOUT holds VocCode/train.py, VocCode/Base, VocCode/Utils and VocCode/Model at the commit, "
                    "e.g. git archive COMMIT VocCode/train.py VocCode/Base VocCode/Utils VocCode/Model | tar -x -C "
                    "CHECKOUT",
        "sizes": dict(C=C, K=K, images=[list(s) for s in SIZES], seed=SEED),
        "torch": torch.__version__,
        "keys": sorted(arrays),
    }
    save_golden(args.out, "psmt_eval_released", arrays, sidecar)


if __name__ == "__main__":
    main()
