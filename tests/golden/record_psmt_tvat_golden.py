"""Record what PS-MT's released T-VAT search computes on fixed small inputs: ``tests/golden/psmt_tvat_released.npz``.

Usage (from the repository root; CHECKOUT is a checkout of PS-MT, https://github.com/yyliu01/PS-MT)::

    PYTHONPATH=$PWD python tests/golden/record_psmt_tvat_golden.py CHECKOUT [--commit SHA] [--out tests/golden]

``get_r_adv_t`` is imported from ``VocCode/Model/Deeplabv3_plus/encoder_decoder.py`` of CHECKOUT at run time;
nothing of it is kept here. The released student decoder calls it once on the labeled and once on the unlabeled
feature map (``EntireModel.py`` 60, 64 through ``VATDecoderNetwork.forward``, ``encoder_decoder.py`` 148-151,
``it=1, xi=1e-6, eps=2.0``); both calls are recorded (``per_batch``), and one call on the whole batch
(``joint``, what a single search computes). The two teachers' decoders are small stand-ins built here
(:func:`teacher_decoder`: conv 3x3, BN in eval mode, ReLU, conv 1x1, bilinear upsampling to the crop size with
``align_corners=True``, as PS-MT's ``upsample`` module) with deterministic weights; the test builds the same.
The random start of each call (``torch.rand(x.shape)``) is drawn here and injected, in the order of the calls.
Recorded in float64 (:data:`DTYPES`): features, decoders, and the random starts (the official start is
``torch.rand`` in the default dtype, set to float64 around the calls; the values drawn here are float32 ones, exact in
float64). The official code fixes no dtype, and only in float64 is the gradient at xi = 1e-6 resolved: in float32
(the released training's precision) it is rounding noise amplified about 1e8 times (``npsemiseg/frameworks/tvat.py``),
which another CPU's kernels (vector width, oneDNN's convolution) turn into another perturbation (measured
2026-11-29: under ``ATEN_CPU_CAPABILITY=avx2 DNNL_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2`` the float32
result moved by 0.74 of its largest entry), so a float32 record would tell nothing on any machine but this one.
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
from recording import default_dtype, official_commit, recorder_arguments, save_golden  # noqa: E402


OFFICIAL_FILE = "VocCode/Model/Deeplabv3_plus/encoder_decoder.py"
#: labeled images BL, unlabeled BU, feature channels C, feature map h x w, crop H x W, classes K, hidden channels
BL, BU, C, h, w, H, W, K, HIDDEN = 2, 2, 16, 5, 5, 17, 17, 5, 8
XI, EPS = 1e-6, 2.0
SEED = 20262
#: the precisions recorded (keys ``<dtype>/per_batch``, ``<dtype>/joint``)
DTYPES = ("float64",)


def pattern(shape: tuple[int, ...], salt: int, scale: float) -> torch.Tensor:
    """``scale * sin(1 + 0.7 i + salt)`` over the flat index i, float64."""
    values = scale * np.sin(1.0 + 0.7 * np.arange(int(np.prod(shape)), dtype=np.float64) + float(salt))
    return torch.from_numpy(values.reshape(shape))


class TeacherDecoder(nn.Module):
    """A teacher decoder: conv 3x3 (no bias), BN, ReLU, conv 1x1, upsampled to the crop (align_corners)."""

    def __init__(self, salt: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(C, HIDDEN, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(HIDDEN)
        self.classifier = nn.Conv2d(HIDDEN, K, 1)
        with torch.no_grad():
            self.conv.weight.copy_(pattern(tuple(self.conv.weight.shape), salt, 0.3))
            self.bn.weight.copy_(1.0 + pattern((HIDDEN,), salt + 1, 0.2))
            self.bn.bias.copy_(pattern((HIDDEN,), salt + 2, 0.1))
            self.bn.running_mean.copy_(pattern((HIDDEN,), salt + 3, 0.2))
            self.bn.running_var.copy_(1.0 + pattern((HIDDEN,), salt + 4, 0.3).abs())
            self.classifier.weight.copy_(pattern(tuple(self.classifier.weight.shape), salt + 5, 0.8))
            self.classifier.bias.copy_(pattern((K,), salt + 6, 0.1))

    def logits_small(self, f: torch.Tensor) -> torch.Tensor:
        return self.classifier(F.relu(self.bn(self.conv(f))))

    def forward(self, f: torch.Tensor) -> torch.Tensor:
        return F.interpolate(self.logits_small(f), size=(H, W), mode="bilinear", align_corners=True)


def teachers(dtype: torch.dtype) -> tuple[TeacherDecoder, TeacherDecoder]:
    return TeacherDecoder(0).to(dtype), TeacherDecoder(10).to(dtype)


def inputs() -> dict[str, np.ndarray]:
    """``features [BL + BU, C, h, w]`` (float64; the float32 case rounds them) and the uniform random starts of
    the calls: ``start_labeled``, ``start_unlabeled`` (per batch, in that order) and ``start_joint`` (the same
    two, concatenated: the joint search differs only by being joint)."""
    gen = torch.Generator().manual_seed(SEED)
    features = (2.0 * torch.randn(BL + BU, C, h, w, generator=gen, dtype=torch.float64)).numpy()
    labeled, unlabeled = torch.rand(BL, C, h, w, generator=gen).numpy(), torch.rand(BU, C, h, w, generator=gen).numpy()
    return {"features": features, "start_labeled": labeled, "start_unlabeled": unlabeled,
            "start_joint": np.concatenate([labeled, unlabeled])}


def load_official(checkout: Path) -> types.ModuleType:
    """``Model.Deeplabv3_plus.encoder_decoder`` from ``checkout/VocCode``."""
    root = str(checkout / "VocCode")
    sys.path.insert(0, root)
    try:
        return importlib.import_module("Model.Deeplabv3_plus.encoder_decoder")
    finally:
        sys.path.remove(root)


@contextmanager
def injected_rand(starts: list[np.ndarray]):
    """``torch.rand(shape)`` returns the next of ``starts`` (checking its shape)."""
    original = torch.rand

    def replay(*size, **kwargs):
        shape = tuple(size[0]) if len(size) == 1 and not isinstance(size[0], int) else tuple(size)
        start = starts.pop(0)
        assert shape == start.shape, (shape, start.shape)
        return torch.from_numpy(start.copy()).to(torch.get_default_dtype())  # the values drawn, at the run's dtype

    torch.rand = replay
    try:
        yield
    finally:
        torch.rand = original


def record(checkout: Path) -> dict[str, np.ndarray]:
    module = load_official(checkout)
    torch.set_num_threads(1)  # as the test (tests/conftest.py single_seeded_thread): the same reductions
    data = inputs()
    out: dict[str, np.ndarray] = dict(data)
    for name in DTYPES:
        dtype = getattr(torch, name)
        features = torch.from_numpy(data["features"]).to(dtype)
        decoder1, decoder2 = teachers(dtype)
        starts = [data["start_labeled"], data["start_unlabeled"], data["start_joint"]]
        with default_dtype(dtype), injected_rand(starts):
            r_l = module.get_r_adv_t(features[:BL], decoder1, decoder2, it=1, xi=XI, eps=EPS)
            r_u = module.get_r_adv_t(features[BL:], decoder1, decoder2, it=1, xi=XI, eps=EPS)
            r_joint = module.get_r_adv_t(features, decoder1, decoder2, it=1, xi=XI, eps=EPS)
        assert not starts
        out[f"{name}/per_batch"] = torch.cat([r_l, r_u]).detach().numpy()
        out[f"{name}/joint"] = r_joint.detach().numpy()
    return out



def main(argv: list[str] | None = None) -> None:
    args = recorder_arguments(__doc__, "a checkout of PS-MT", argv)
    arrays = record(args.checkout)
    sidecar = {
        "about": "What PS-MT's released T-VAT search computes on fixed small inputs (tests/test_psmt_tvat_golden.py).",
        "repository": "https://github.com/yyliu01/PS-MT",
        "commit": args.commit or official_commit(args.checkout),
        "official_file_sha256": hashlib.sha256((args.checkout / OFFICIAL_FILE).read_bytes()).hexdigest(),
        "sources": {
            "get_r_adv_t": f"{OFFICIAL_FILE} 53-89 (_l2_normalize 53-56, the search 59-89)",
            "student_decoder_call": f"{OFFICIAL_FILE} 148-151 (it=1, xi=1e-6, eps=2.0)",
            "two_calls": "VocCode/Model/Deeplabv3_plus/EntireModel.py 60 (labeled), 64 (unlabeled)",
            "teacher_decoder_upsampling": f"{OFFICIAL_FILE} 105-116 (logits upsampled to the crop, align_corners)",
        },
        "command": "PYTHONPATH=$PWD python tests/golden/record_psmt_tvat_golden.py CHECKOUT"
                   + (f" --commit {args.commit}" if args.commit else ""),
        "checkout": "CHECKOUT holds VocCode/Model and VocCode/Utils at the commit, e.g. git archive COMMIT "
                    "VocCode/Model VocCode/Utils | tar -x -C CHECKOUT",
        "sizes": dict(BL=BL, BU=BU, C=C, h=h, w=w, H=H, W=W, K=K, hidden=HIDDEN, xi=XI, eps=EPS, seed=SEED),
        "dtype": "float64: features, decoders, the random starts (float32 values, exact in float64) and the default "
                 "dtype of the official calls; no float32 record (at xi = 1e-6 its gradient is rounding noise that "
                 "differs between CPUs)",
        "torch": torch.__version__,
        "keys": sorted(arrays),
    }
    save_golden(args.out, "psmt_tvat_released", arrays, sidecar)


if __name__ == "__main__":
    main()
