"""Record two training iterations of the NP-SemiSeg authors' AugSeg: ``tests/golden/np_augseg_step_released.npz``.

Usage (from the repository root; CHECKOUT is a checkout of Jianf-Wang/NP-SemiSeg)::

    PYTHONPATH=$PWD python tests/golden/record_np_augseg_step_golden.py CHECKOUT [--commit SHA] [--out tests/golden]

What is official and what is not. ``AugSeg/train_semi.py`` is imported from CHECKOUT at run time and its ``train()``
runs the first two iterations of an epoch as written (lines 270-470: the teacher's eval-mode pseudo-labels from the
centers of the epoch's initial memories, the adaptive CutMix, the student's forward with its context whose returned
memory lists the loop carries to the next iteration (line 408), the KL, backward, the clipping at 5, the SGD step, the
EMA of parameters and buffers), with the stand-ins of :mod:`record_augseg_step_golden`. The authors' ``NP_HEAD``
(``AugSeg/augseg/models/np_head.py``) is imported and runs as the classifier; ``ModelBuilder.forward`` (no aux head,
``model_helper.py`` 100-125) and the decoder's forward (``decoder.py`` 55-88: encoder on the targets and on the
context, decoder on both, the NP head, logits upsampled per sample) are written out in :class:`AuthorsModel` over the
project's tiny encoder and AugSeg decoder of :data:`CELL` (pattern weights), with the head mapping of
:mod:`record_np_u2pl_step_golden` (same sizes). Two iterations, because what the second one starts from is the point:
the memories the first one wrote, with the roles of the two lists exchanged. Networks, inputs and the initial memories
run in float64 (:data:`record_augseg_step_golden.DTYPE`; the authors' head built under float64 as default dtype, so
the copied weights are exact); the latent noise is drawn in float32 and widened (the project's NP head samples in
float32 by design). ``torch.randn``'s float32 draws differ in the last bit between CPU vector widths: recorded on
another CPU, the noise, and so the golden, differ slightly (the test replays the stored noise, so either passes).

Stored: per iteration its inputs, CutMix draws, latent noise (per network), losses and KL term; after the second
iteration every gradient, the student's and the teacher's parameters and buffers and the memories' centers and rows.
"""

from __future__ import annotations

import importlib
import logging
import sys
import types
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script: its shared helpers
import record_augseg_step_golden as plain  # noqa: E402
import record_np_u2pl_step_golden as np_u2pl  # noqa: E402
import step_recording  # noqa: E402, F401 - the tests reach the shared helpers through this module
from step_recording import default_dtype, digest, load_pattern, record_and_save, sample_indices  # noqa: E402

OFFICIAL_FILES = ("AugSeg/train_semi.py", "AugSeg/augseg/models/np_head.py", "AugSeg/augseg/models/model_helper.py",
                  "AugSeg/augseg/models/decoder.py", "AugSeg/augseg/dataset/augs_ALIA.py")
CELL = dict(plain.CELL, head="np")
#: the NP head at the authors' sizes (as the NP U2PL recorder), the plain recorder's confidence threshold;
#: Q = 2048 (64 in the NP U2PL golden): more than a class's pixels in one step, so that what the first iteration
#: leaves in the memories is still there in the second (with fewer rows, a step's own pixels fill the FIFO)
OVERRIDES = {**plain.OVERRIDES, **{k: v for k, v in np_u2pl.OVERRIDES.items() if k.startswith("head.")},
             "head.options.memory_size": 2048}
#: the epoch, its first two iterations' seeds
EPOCH, SEEDS = 1, (31, 32)
LAMBDA_KL = 0.005  # AugSeg/train_semi.py 445


def cell_config(**overrides):
    return plain.cell_config(CELL, OVERRIDES, **overrides)


class AuthorsModel(np_u2pl.np_network.AugSegAuthorsModel, np_u2pl.AuthorsModel):
    """:class:`official.np_network.AugSegAuthorsModel` (the authors' AugSeg ``ModelBuilder`` around the project's
    encoder and decoder with the authors' ``NP_HEAD``) with what it holds under the project's names."""


def tiny_pair(module, smoke, noise: dict) -> tuple[AuthorsModel, AuthorsModel, dict]:
    """Student and teacher :class:`AuthorsModel` with pattern parameters and buffers, the latent noise recorded."""
    from npsemiseg.training import build_model

    models, indices = [], {}
    for role, salt in (("student", plain.STUDENT_SALT), ("teacher", plain.TEACHER_SALT)):
        segmentor = build_model(smoke).to(plain.DTYPE)
        load_pattern(segmentor, salt)
        indices = sample_indices(segmentor)
        with default_dtype(plain.DTYPE):  # the authors' head built in float64: the weights copied exactly
            head = np_u2pl.authors_head(module, segmentor, smoke)
        head.reparameterize = types.MethodType(np_u2pl.recording_reparameterize(noise.setdefault(role, [])), head)
        models.append(AuthorsModel(segmentor, head))
    for p in models[1].parameters():
        p.requires_grad_(False)
    return models[0], models[1], indices


def record(checkout: Path) -> dict[str, np.ndarray]:
    torch.set_num_threads(1)
    train_semi = plain.load_official(checkout / "AugSeg")
    module = importlib.import_module("augseg.models.np_head")
    smoke = cell_config()
    noise, seen = {}, []
    model, model_teacher, indices = tiny_pair(module, smoke, noise)
    forward = model.classifier1.forward

    def recording(*args, **kwargs):  # what the student's head returns in training, per iteration
        out = forward(*args, **kwargs)
        seen.append(dict(zip(("mean_t", "sigma_t", "mean_c", "sigma_c", "context_memory", "target_memory"), out[1:])))
        return out

    model.classifier1.forward = recording
    cfg = plain.config(smoke)
    optimizer, lr_scheduler = plain.official_optimizer("augseg", smoke, cfg, model.segmentor.backbone, model, EPOCH,
                                                       plain.ITERS)
    data = [plain.inputs(seed) for seed in SEEDS]
    initial = [[torch.zeros(1, 32, dtype=plain.DTYPE) for _ in range(smoke.num_classes)]  # train_semi.py 120-127
               for _ in range(2)]
    draws = run_iterations(train_semi, cfg, data, lambda loaders: train_semi.train(
        model, model_teacher, *initial, optimizer, lr_scheduler, sys.modules["augseg.utils.loss_helper"].get_criterion(cfg),
        *loaders, EPOCH, None, logging.getLogger("np_augseg_step_golden"), cfg))
    out = step_arrays(data, draws, noise, seen)
    out.update(digest("grad", model.project_tensors("grads"), indices))
    for role, network in (("student", model), ("teacher", model_teacher)):
        out.update(digest(f"{role}/params", network.project_tensors("params"), indices))
        out.update(digest(f"{role}/buffers", network.project_tensors("buffers"), indices))
    out.update({f"index/{k}": v for k, v in indices.items()})
    return out


def run_iterations(train_semi, cfg: dict, data: list[dict], call) -> dict:
    """The two iterations' batches (copies: the CutMix pastes in place), draws recorded, torch and numpy seeded."""
    batches_l = [(None, torch.tensor(d["images_l"], dtype=plain.DTYPE), torch.tensor(d["labels_l"])) for d in data]
    batches_u = [(None, torch.tensor(d["images_u"], dtype=plain.DTYPE), torch.tensor(d["images_u_strong"], dtype=plain.DTYPE),
                  None) for d in data]
    draws: dict = {"perm": [], "trigger": [], "coin": [], "box": [], "reduced": []}
    torch.manual_seed(SEEDS[0])
    np.random.seed(SEEDS[0])
    with plain.recording_draws(train_semi, draws):
        try:
            call((plain.plain.OneBatch(*batches_l), plain.plain.OneBatch(*batches_u)))
        except plain.plain.EndOfStep:
            pass
    return draws


def step_arrays(data: list[dict], draws: dict, noise: dict, seen: list[dict]) -> dict[str, np.ndarray]:
    """Per iteration ``step{s}/``: inputs, CutMix draws, losses (three ``all_reduce`` per iteration), the KL term;
    the latent noise per network; the memories after the second iteration (the head's naming: context, target)."""
    out: dict[str, np.ndarray] = {}
    for s, d in enumerate(data):
        prefix = f"step{s}"
        part = {"perm": [draws["perm"][s]], "coin": draws["coin"][2 * s: 2 * s + 2], "box": draws["box"][2 * s: 2 * s + 2],
                "reduced": draws["reduced"][3 * s: 3 * s + 3]}
        out.update({f"{prefix}/{k}": v for k, v in {**d, **plain.draw_arrays(part)}.items()})
        out[f"{prefix}/loss_kl"] = np.array(LAMBDA_KL * float(np_u2pl.authors_kl(seen[s]).mean()))
    out.update({f"noise/{role}/{i:03d}": eps for role, eps_list in noise.items() for i, eps in enumerate(eps_list)})
    for name in ("target", "context"):
        rows = seen[-1][f"{name}_memory"]
        out[f"{name}_centers"] = torch.stack([m.mean(0) for m in rows]).detach().numpy()
        out[f"{name}_rows"] = np.array([m.shape[0] for m in rows])
    return out


def main(argv: list[str] | None = None) -> None:
    arrays = record_and_save(
        argv, __doc__, "np_augseg_step_released", record, OFFICIAL_FILES,
        about="Two training iterations of the NP-SemiSeg authors' AugSeg (tests/test_np_augseg_step_golden.py).",
        repository="https://github.com/Jianf-Wang/NP-SemiSeg",
        sources={
            "iterations": "AugSeg/train_semi.py 270-470 (train(), imported and run for two iterations)",
            "memories": "AugSeg/train_semi.py 310-315, 408; augseg/models/model_helper.py 50 (lists returned swapped)",
            "context_pass": "AugSeg/augseg/models/model_helper.py 109-111, decoder.py 68-78 (written out)",
            "kl_clip": "AugSeg/train_semi.py 431-447, 451-452 (0.005 x KL, clip_grad_norm_ 5.0)",
            "np_head": "AugSeg/augseg/models/np_head.py (imported)",
        },
        compared="two iterations on the project's smoke encoder and AugSeg decoder with the authors' NP head: per "
                 "iteration the losses and the KL term; after the second student and teacher parameters and BN "
                 "buffers, the NP memories (centers, rows), every gradient of the second iteration; draws recorded "
                 "and injected",
        sizes={"cell": CELL, "overrides": OVERRIDES, "epoch": EPOCH, "seeds": SEEDS, "iters_per_epoch": plain.ITERS,
               "epochs": plain.EPOCHS},
        dtype="float64: networks (pattern parameters and BN buffers), the authors' NP head, inputs (stored as float32 "
              "values, exact in float64), the initial memories; the latent noise drawn in float32 and widened",
    )
    for s in range(len(SEEDS)):
        print(s, {k: float(arrays[f"step{s}/{k}"]) for k in ("loss_sup", "loss_unsup", "loss_kl")})


if __name__ == "__main__":
    main()
