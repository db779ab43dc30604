"""The blur kernel a released PS-MT cell's strong view draws is the one PS-MT's released ``data_aug`` draws from
the same uniform number (``tests/golden/psmt_blur_kernel_released.json``, recorded by
``tests/golden/record_psmt_blur_kernel_golden.py``, with source and command).

Theirs draws u with ``random.random``, ours with ``torch.rand``: the record maps given numbers (a grid and both
sides of each boundary) to kernels, and ours is given the same numbers. Tolerance: exact (integers).
"""

from __future__ import annotations

import json

import torch
from golden_files import sidecar

from npsemiseg.config import cell_config
from npsemiseg.data import transforms as transforms_module
from npsemiseg.data.transforms import RandomGaussianBlur, psmt_blur_kernel_size
from npsemiseg.training import train_transforms

RECORD = sidecar("psmt_blur_kernel_released")


def test_the_released_protocol_draws_psmt_kernels():
    cell = dict(framework="psmt", dataset="pascal_blender", partition="662", head="baseline")
    released = cell_config("paper", protocol="released", **cell)
    assert released.data.augmentation["blur_kernel"] == "psmt"
    assert cell_config("paper", protocol="corrected", **cell).data.augmentation["blur_kernel"] == "sigma"
    strong = train_transforms(released)["unlabeled"].strong
    assert [t.kernel for t in strong.transforms if isinstance(t, RandomGaussianBlur)] == ["psmt"]


def test_released_kernel_draw_reproduces_psmt_data_aug(monkeypatch):
    ours = []
    for u in RECORD["uniforms"]:
        monkeypatch.setattr(transforms_module.torch, "rand", lambda *args, u=u, **kwargs: torch.tensor(u))
        ours.append(psmt_blur_kernel_size())
    assert ours == RECORD["kernels"]
    assert set(ours) == {1, 3, 5}
    print(json.dumps({"max |difference|": max(abs(a - b) for a, b in zip(ours, RECORD["kernels"], strict=True))}))

