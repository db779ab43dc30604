"""PS-MT's T-VAT under the released options reproduces what PS-MT's released ``get_r_adv_t`` computed on the
same inputs (``tests/golden/psmt_tvat_released.npz``, recorded by ``tests/golden/record_psmt_tvat_golden.py``;
source and command in ``psmt_tvat_released.json``).

Same features, teacher decoders (built by the recorder's :class:`TeacherDecoder`) and injected random starts, all
in float64 on both sides (the official code fixes no dtype; in float32 its gradient at xi = 1e-6 is rounding noise
amplified about 1e8 times, a different perturbation on each CPU's kernels: the recorder says why none is recorded).
Tolerance :data:`RTOL` relative to the perturbation's size, ``|ours - theirs| <= RTOL * max |theirs|`` (the
perturbation is ~5e-5 here, so an absolute bound would say nothing). The gradient at xi = 1e-6 is a difference of
nearly equal probabilities, resolved in float64 to about 1e-9 of its size. Measured max |difference| relative to max
|theirs| (2026-11-29, 2-core AMD EPYC (Zen 4) VM, kernel paths emulated with ATEN_CPU_CAPABILITY/DNNL_MAX_CPU_ISA/
MKL_ENABLE_INSTRUCTIONS; ``pytest -s tests/test_psmt_tvat_golden.py`` under each): 2.5e-16 native (AVX-512), AVX2
(``avx2``/``AVX2``/``AVX2``) and 2 threads, 6.2e-9 on the portable path (``default``/``SSE41``/``SSE4_2``, 1 thread);
the corrected direction 6.9e-10 absolute (eps = 2). The official calls themselves move by as much (6.2e-9) between those paths:
another reduction order in the teachers' convolutions, amplified by 1 / xi. :data:`RTOL` = 1e-6 leaves a margin of
160 for reduction orders not seen here; a joint search, the other normalisation or the float32 noise move the
perturbation by 0.1 to 1 of its size.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from golden_files import recorded, recorder
from npsemiseg.config import compose
from npsemiseg.frameworks.tvat import at_size, l2_normalize, tvat_perturbation

RTOL = 1e-6
#: the released T-VAT options (switches psmt_tvat_per_batch, psmt_tvat_released, psmt_tvat_crop_kl)
RELEASED = dict(tvat_per_batch=True, tvat_released_normalization=True, tvat_kl_at_crop_size=True)

pytestmark = pytest.mark.usefixtures("single_seeded_thread")



REC = recorder("psmt_tvat")
DATA = recorded("psmt_tvat_released")


@pytest.mark.parametrize("dataset", ["pascal_blender", "cityscapes"])
def test_the_released_protocol_sets_these_options(dataset):
    cell = dict(framework="psmt", dataset=dataset, partition="744" if dataset == "cityscapes" else "662",
                head="baseline")
    released = compose("paper", **cell, protocol="released").config.framework_options
    assert {k: released[k] for k in RELEASED} == RELEASED
    corrected = compose("paper", **cell, protocol="corrected").config.framework_options
    assert not any(corrected[k] for k in RELEASED)


def _ours(monkeypatch, *, parts, released_normalization: bool, starts: list[str]) -> np.ndarray:
    """Our search in float64 with the recorded random starts (``torch.rand_like`` replays them in order)."""
    queue = [DATA[name] for name in starts]

    def replay(tensor, **kwargs):
        start = queue.pop(0)
        assert tuple(tensor.shape) == start.shape
        return torch.from_numpy(start).to(tensor.dtype)

    monkeypatch.setattr(torch, "rand_like", replay)
    decoders = [d.eval() for d in REC.teachers(torch.float64)]  # PS-MT stops the teachers' BN
    classifiers = [at_size(lambda f, d=d: d.logits_small(f).unsqueeze(0), (REC.H, REC.W), align_corners=True)
                   for d in decoders]
    features = torch.from_numpy(DATA["features"])
    r = tvat_perturbation(features, classifiers, xi=REC.XI, eps=REC.EPS, iterations=1,
                          released_normalization=released_normalization, parts=parts)
    assert not queue
    return r.double().numpy()


def _close(name: str, ours: np.ndarray, theirs: np.ndarray) -> float:
    diff = float(np.abs(ours - theirs).max())
    scale = float(np.abs(theirs).max())
    assert diff <= RTOL * scale, f"{name}: max |difference| {diff:.3g} (max |theirs| {scale:.3g})"
    return diff / scale


def test_released_tvat_reproduces_the_two_released_calls(monkeypatch):
    """``parts`` (labeled, unlabeled) with the released normalisation = their two calls; one search = their call
    on the whole batch."""
    assert REC.DTYPES == ("float64",)
    per_batch = _ours(monkeypatch, parts=(REC.BL, REC.BU), released_normalization=True,
                      starts=["start_labeled", "start_unlabeled"])
    joint = _ours(monkeypatch, parts=None, released_normalization=True, starts=["start_joint"])
    deviations = {"per_batch": _close("per_batch", per_batch, DATA["float64/per_batch"]),
                  "joint": _close("joint", joint, DATA["float64/joint"])}
    print(json.dumps({k: f"{v:.2e}" for k, v in deviations.items()}))
    # the golden tells the two apart: a joint search gives a perturbation of another size
    assert float(np.abs(joint - DATA["float64/per_batch"]).max()) > 0.1 * float(np.abs(per_batch).max())


def test_per_batch_and_joint_differ_by_the_batchmean_factor():
    """In float64 (the gradient resolved at xi = 1e-6) their joint search is their per-batch one times
    B_part / B: the released normalisation keeps the KL's 1 / B."""
    assert REC.BL == REC.BU
    ratio = DATA["float64/joint"] / DATA["float64/per_batch"]
    assert np.allclose(ratio, REC.BL / (REC.BL + REC.BU), rtol=1e-3)


def test_corrected_tvat_is_the_released_direction_at_norm_eps(monkeypatch):
    """``corrected`` (one search on the whole batch, exact per-image normalisation) is the released per-batch
    direction scaled to norm eps per image: searching the batches together changes nothing there (float64,
    where the direction is resolved)."""
    corrected = _ours(monkeypatch, parts=None, released_normalization=False, starts=["start_joint"])
    theirs = torch.from_numpy(DATA["float64/per_batch"])
    expected = (REC.EPS * l2_normalize(theirs)).numpy()
    diff = float(np.abs(corrected - expected).max())
    print(json.dumps({"corrected": f"{diff:.2e}"}))
    assert diff <= RTOL * REC.EPS, f"corrected: max |difference| {diff:.3g}"
    assert np.allclose(np.linalg.norm(corrected.reshape(corrected.shape[0], -1), axis=1), REC.EPS)
