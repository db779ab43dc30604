"""Record one whole training iteration of the NP-SemiSeg authors' U2PL: ``tests/golden/np_u2pl_step_released.npz``.

Usage (from the repository root; CHECKOUT is a checkout of Jianf-Wang/NP-SemiSeg)::

    PYTHONPATH=$PWD python tests/golden/record_np_u2pl_step_golden.py CHECKOUT [--commit SHA] [--out tests/golden]

What is official and what is not. ``U2PL/train_semi.py`` is imported from CHECKOUT at run time and its ``train()`` runs
one iteration as written (lines 280-660: teacher reset, the NP teacher's eval-mode pseudo-labels from the memories'
centers, CutMix, the student's forward with its context, the KL of lines 447-448, the train-mode teacher pass whose
mean logits give the entropy, the unsupervised and contrastive losses, backward, the gradient clipping at 5, the SGD
step and the EMA of parameters), with the stand-ins of :mod:`record_u2pl_step_golden` (one process, ``.cuda()`` the
identity, loaders of one batch). The authors' ``NP_HEAD`` (``U2PL/u2pl/models/np_head.py``) is imported and runs as
the classifier; ``ModelBuilder.forward`` and ``dec_deeplabv3_plus.forward`` (``model_helper.py`` 48-95,
``decoder.py`` 111-156: encoder on the targets, encoder on the context, decoder on both, the NP head, the
representation on the targets) are written out in :class:`AuthorsModel` over the project's tiny encoder, decoder and
representation head of :data:`CELL` (the authors' ResNet-101 needs ImageNet weights and SyncBN on CUDA). The NP
head's weights are the project head's pattern weights mapped onto the authors' parameters (:data:`HEAD_MAP`; their
decoder's first convolution reads ``[z, x, r]``, ours ``[x, z, r]``); everything recorded per parameter is stored
under the project's names and layout. The head options are the released ones at the authors' sizes: latent 32 (the
loop's ``zeros(1, 32)`` memories), decoder width 256, T = 5 (``forward_times``), every pixel enqueued, Q = 64.

Random draws recorded besides those of the plain recorder: every latent noise ``eps`` of the authors'
``reparameterize``, per network in call order (the project's step runs the teacher's statistics pass before the
student, the authors' after it: the draws are injected per network). Stored per case: as the plain
recorder, and the KL term (``0.005 * kl.mean()``, its formula as the loop's 447-448) and the memories' centers and
row counts after the student's forward (what the head returns; as the loop's DDP forward, :class:`AuthorsModel`
hands the head copies of the lists). Cases: the plain recorder's (``first``, ``later``) and ``supervised`` (step 0 of a
supervised-only epoch, the cell with one as on VOC: the student and the train-mode teacher each run with the labeled
images as targets and context, ``train_semi.py`` 327-356).

Precision: float64 as :mod:`record_u2pl_step_golden` (:data:`PRECISION`), the authors' NP head and its initial
memories (``train_semi.py`` 126-133: ``torch.zeros(1, 32)``) too; the latent noise is drawn in float32 (the project's
head draws its noise in float32 by design) and widened, so both sides take the same values.
"""

from __future__ import annotations

import importlib
import logging
import sys
import types
from pathlib import Path

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script: its shared helpers
import record_u2pl_step_golden as plain  # noqa: E402
import step_recording  # noqa: E402, F401 - the tests reach the shared helpers through this module
from step_recording import DropoutTape, digest, load_pattern, record_and_save, sample_indices, tape_dropout, tensors  # noqa: E402

BENCHMARKS = str(Path(__file__).resolve().parents[2] / "benchmarks")
if BENCHMARKS not in sys.path:  # the benchmarks' package: the project's NP head mapped onto the authors'
    sys.path.append(BENCHMARKS)
from official import np_network  # noqa: E402
from official.np_network import HEAD_MAP, authors_head, reorder_decoder_input  # noqa: E402, F401

OFFICIAL_FILES = ("U2PL/train_semi.py", "U2PL/u2pl/models/np_head.py", "U2PL/u2pl/models/model_helper.py",
                  "U2PL/u2pl/models/decoder.py", "U2PL/u2pl/utils/loss_helper.py")
CELL = dict(plain.CELL, head="np")
#: the plain recorder's cases (``supervised``: step 0 of a supervised-only epoch, in the cell with one as on VOC)
CASES, CASE_OVERRIDES = plain.CASES, plain.CASE_OVERRIDES
#: the authors' sizes (see the docstring) and the plain recorder's lower anchor threshold
OVERRIDES = {**plain.OVERRIDES, "head.options.latent_dim": 32, "head.options.hidden_channels": 256,
             "head.options.enqueue_per_class": None, "head.options.training_samples": 5, "head.options.memory_size": 64}
LAMBDA_KL = 0.005  # U2PL/train_semi.py 621
PRECISION = (plain.PRECISION + "; the authors' NP head and its initial memories float64, its latent noise drawn in "
             "float32 and widened (the project's head draws float32 noise by design)")


#: the NP decoder's classifier weights are scaled by this: the pattern network's predictions are otherwise so near
#: uniform that entropies lie within float32 round-off of the drop percentile's threshold
SHARPEN = 8.0


@torch.no_grad()
def load_weights(segmentor: nn.Module, salt: int) -> None:
    """:func:`step_recording.load_pattern`, the NP classifier scaled by :data:`SHARPEN` (the test loads the same)."""
    load_pattern(segmentor, salt)
    segmentor.head.decoder.tail[5].weight.mul_(SHARPEN)


def cell_config(**overrides):
    from npsemiseg.config import compose, with_overrides

    return with_overrides(compose("smoke", **CELL).config, {**OVERRIDES, **overrides})


class AuthorsModel(np_network.AuthorsModel):
    """:class:`official.np_network.AuthorsModel` (the authors' ``ModelBuilder`` around the project's encoder, decoder
    and representation head with the authors' ``NP_HEAD``) with what it holds under the project's names."""

    def project_tensors(self, what: str) -> list[tuple[str, torch.Tensor]]:
        """``params`` / ``grads`` / ``buffers`` under the project's names and layout (buffers: the segmentor's)."""
        items = tensors(self.segmentor, what)
        if what == "buffers":
            return items
        head = dict(self.classifier1.named_parameters())
        for ours, theirs in HEAD_MAP.items():
            for suffix in ("weight", "bias"):
                p = head[f"{theirs}.{suffix}"]
                t = p.detach() if what == "params" else p.grad
                if ours == "decoder.conv1" and suffix == "weight":
                    t = reorder_decoder_input(t, self.classifier1.input_dim, self.classifier1.latent_dim, "ours")
                items.append((f"head.{ours}.{suffix}", t))
        return items


def tiny_pair(module, smoke, tape: DropoutTape, noise: dict) -> tuple[AuthorsModel, AuthorsModel, dict]:
    """Student and teacher :class:`AuthorsModel` (pattern parameters and buffers, dropout on the tape, latent noise
    recorded in ``noise[role]``) and the sampled indices of the project's names."""
    from npsemiseg.training import build_model

    models, indices = [], {}
    for role, salt in (("student", plain.STUDENT_SALT), ("teacher", plain.TEACHER_SALT)):
        draws = noise.setdefault(role, [])
        segmentor = build_model(smoke).double()
        load_weights(segmentor, salt)
        indices = sample_indices(segmentor)
        tape_dropout(segmentor, tape, role)
        head = authors_head(module, segmentor, smoke)

        head.reparameterize = types.MethodType(recording_reparameterize(draws), head)
        models.append(AuthorsModel(segmentor, head))
    for p in models[1].parameters():
        p.requires_grad_(False)
    return models[0], models[1], indices


def recording_reparameterize(draws: list):
    """The authors' ``reparameterize`` (np_head.py 128-132) with its draw appended to ``draws``: drawn in float32 (the
    project's NP head draws its noise in float32 by design), widened to ``std``'s dtype."""

    def reparameterize(self, mean, std):
        eps = torch.randn(std.shape, dtype=torch.float32)
        draws.append(eps.numpy().copy())
        return eps.to(std.dtype) * std + mean

    return reparameterize


def record_memories(model: AuthorsModel, seen: dict) -> None:
    """Keep what the student's NP head returns in training (its memories and latent statistics)."""
    forward = model.classifier1.forward

    def recording(*args, **kwargs):
        out = forward(*args, **kwargs)
        if kwargs.get("phase_train", True):
            seen.update(zip(("mean_t", "sigma_t", "mean_c", "sigma_c", "context_memory", "target_memory"), out[1:]))
        return out

    model.classifier1.forward = recording


def run_case(train_semi, module, smoke, case: str) -> dict[str, np.ndarray]:
    epoch, seed = CASES[case]
    smoke = cell_config(**CASE_OVERRIDES.get(case, {}))
    tape, noise, seen = DropoutTape(dtype=torch.float64), {}, {}
    model, model_teacher, indices = tiny_pair(module, smoke, tape, noise)
    record_memories(model, seen)
    cfg = plain.config(smoke)
    optimizer, lr_scheduler = plain.official_optimizer("u2pl", smoke, cfg, model.segmentor.backbone, model, epoch,
                                                       plain.ITERS)
    data = plain.inputs(seed)
    memobank, queue_ptrlis, queue_size = plain.memory_bank(data, seed, smoke)
    initial = [[torch.zeros(1, 32, dtype=torch.float64) for _ in range(smoke.num_classes)]  # train_semi.py 126-133
               for _ in range(2)]
    draws = plain.run_iteration(train_semi, cfg, seed, lambda loaders: train_semi.train(
        model, model_teacher, *initial, optimizer, lr_scheduler, sys.modules["u2pl.utils.loss_helper"].get_criterion(cfg),
        *loaders, epoch, types.SimpleNamespace(add_scalar=lambda *a: None), logging.getLogger("np_u2pl_step_golden"),
        memobank, queue_ptrlis, queue_size), data, mixes=case not in CASE_OVERRIDES)
    out = {**data, **plain.draw_arrays(draws, tape)}
    out.update({f"noise/{role}/{i:03d}": eps for role, draws in noise.items() for i, eps in enumerate(draws)})
    # the loop's KL term; 0 in the supervised-only epochs (train_semi.py 355)
    out["loss_kl"] = np.array(0.0 if case in CASE_OVERRIDES else LAMBDA_KL * float(authors_kl(seen).mean()))
    for name in ("target", "context"):
        rows = seen[f"{name}_memory"]
        out[f"{name}_centers"] = torch.stack([m.mean(0) for m in rows]).detach().numpy()
        out[f"{name}_rows"] = np.array([m.shape[0] for m in rows])
    out.update(digest("grad", model.project_tensors("grads"), indices))
    for role, network in (("student", model), ("teacher", model_teacher)):
        out.update(digest(f"{role}/params", network.project_tensors("params"), indices))
        out.update(digest(f"{role}/buffers", network.project_tensors("buffers"), indices))
    out.update({f"queue/{c}": bank[0].numpy() for c, bank in enumerate(memobank)})
    out.update({f"index/{k}": v for k, v in indices.items()})
    return out


def authors_kl(seen: dict) -> torch.Tensor:
    """The loop's KL per image (``train_semi.py`` 440-448: sigma in the place of a variance)."""
    mean_t, sigma_t, mean_c, sigma_c = (seen[k].detach() for k in ("mean_t", "sigma_t", "mean_c", "sigma_c"))
    diff = mean_c - mean_t
    return (0.5 * torch.log(sigma_c / sigma_t).sum(1) - 0.5 * mean_t.shape[1] + 0.5 * (sigma_t / sigma_c).sum(1)
            + 0.5 * (diff * diff / sigma_c).sum(1))


def record(checkout: Path) -> dict[str, np.ndarray]:
    train_semi = plain.load_official(checkout / "U2PL")
    module = importlib.import_module("u2pl.models.np_head")
    return plain.record_cases(train_semi, cell_config(), CASES,
                              lambda train_semi, smoke, case: run_case(train_semi, module, smoke, case))


def main(argv: list[str] | None = None) -> None:
    arrays = record_and_save(
        argv, __doc__, "np_u2pl_step_released", record, OFFICIAL_FILES,
        about="One whole training iteration of the NP-SemiSeg authors' U2PL (tests/test_np_u2pl_step_golden.py).",
        repository="https://github.com/Jianf-Wang/NP-SemiSeg",
        sources={
            "iteration": "U2PL/train_semi.py 280-660 (train(), imported and run for one iteration)",
            "context_pass": "U2PL/u2pl/models/model_helper.py 78, 89-91; decoder.py 124-134 (written out in AuthorsModel)",
            "entropy": "U2PL/train_semi.py 468-480 (pred_all_teacher = out_t['pred'].mean(0)), 489-492, 510-512",
            "teacher_reset_ema": "U2PL/train_semi.py 357-363, 637-652 (parameters only)",
            "kl_clip": "U2PL/train_semi.py 440-448, 621-626 (0.005 x KL, clip_grad_norm_ 5.0)",
            "np_head": "U2PL/u2pl/models/np_head.py (imported)",
        },
        compared="one iteration on the project's smoke encoder/decoder with the authors' NP head: the losses and the "
                 "KL term, every gradient, student and teacher parameters and BN buffers after the step, the NP "
                 "memories written by the step (centers, rows), the memory bank; draws recorded and injected",
        precision=PRECISION,
        sizes={"cases": CASES, "cell": CELL, "overrides": OVERRIDES, "iters_per_epoch": plain.ITERS,
               "epochs": plain.EPOCHS},
    )
    for case in CASES:
        print(case, {k: float(arrays[f"{case}/{k}"]) for k in ("loss_sup", "loss_unsup", "loss_contrastive", "loss_kl")})


if __name__ == "__main__":
    main()
