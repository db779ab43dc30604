"""Record what the authors' NP head computes on fixed small inputs: ``tests/golden/np_head_released.npz``.

Usage (from the repository root; CHECKOUT is a checkout of the authors' NP-SemiSeg repository)::

    PYTHONPATH=$PWD python tests/golden/record_np_head_golden.py CHECKOUT [--out tests/golden]

The authors' module ``U2PL/u2pl/models/np_head.py`` is imported from CHECKOUT at run time; nothing of it is kept
here. The training loop around it (``U2PL/train_semi.py``) is emulated in a few lines: every class's memory
starts as one zero row of 32 values, the KL is the loop's closed form (sigma used as a variance), and the
memories are recorded two ways:

- ``released``: each step starts from the initial one-zero-row memories (what the lists passed through the DDP
  forward amount to: the head's assignments land in a copy), and inference uses the centers of the initial
  memories (all zero);
- ``persist``: step 2 starts from the memories step 1 returned (the same lists without DDP).

Weights are a deterministic pattern (:func:`pattern_weights`, also used by the test) rather than stored; each
parameter's sum of absolute values is stored to check that both sides hold the same weights. The latent
samples' noise ``eps [T, B, D]`` is stored and injected into the authors' ``reparameterize`` (one ``[B, D]``
slice per sample, in order). The sidecar JSON names the source and this command.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
import types
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script: its shared helpers
from recording import official_commit, recorder_arguments, save_golden, sine_pattern  # noqa: E402


OFFICIAL_FILE = "U2PL/u2pl/models/np_head.py"
#: sizes of the recorded problem: target images B (the first M are the labelled context), feature channels C,
#: feature map h x w, label map H x W (square, as the authors' head requires), K classes, latent D, memory Q, T
B, M, C, h, w, H, W, K, D, Q, T = 3, 1, 8, 5, 5, 13, 13, 5, 32, 24, 3
SEED = 20260
STEPS = 2


def pattern_weights(shape: tuple[int, ...], salt: int) -> torch.Tensor:
    """Deterministic weights of ``shape``: ``bound * sin(1 + 0.7 i + salt)`` over the flat index i, bound the
    Xavier-uniform bound of the shape (biases: 0.1). Computed in float64, returned float32."""
    return torch.from_numpy(sine_pattern(shape, salt)).float()


def inputs() -> dict[str, np.ndarray]:
    """Features ``step{s}_features [B, C, h, w]``, labels ``step{s}_labels [B, H, W]`` (255 = ignore) and the
    noise ``step{s}_eps`` / ``infer_eps [T, B, D]``. Class 3 is rare (a few pixels of image 0), class 4 absent, class 0
    common, so some classes keep their zero row and others overflow Q."""
    gen = torch.Generator().manual_seed(SEED)
    out: dict[str, np.ndarray] = {}
    for step in range(1, STEPS + 1):
        out[f"step{step}_features"] = torch.randn(B, C, h, w, generator=gen).numpy()
        labels = torch.randint(0, 3, (B, H, W), generator=gen)
        labels[:, : H // 3] = 0
        labels[torch.rand(B, H, W, generator=gen) < 0.1] = 255
        labels[0, -2:, -2 - step :] = 3
        out[f"step{step}_labels"] = labels.numpy().astype(np.int64)
        out[f"step{step}_eps"] = torch.randn(T, B, D, generator=gen).numpy()
    out["infer_eps"] = torch.randn(T, B, D, generator=gen).numpy()
    return out


def load_official(checkout: Path) -> types.ModuleType:
    """The authors' np_head module from ``checkout`` (imported under a private name)."""
    path = checkout / OFFICIAL_FILE
    spec = importlib.util.spec_from_file_location("official_np_head", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def official_parameters(head: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    """The authors' parameters in the order their pattern weights are salted."""
    return list(head.named_parameters())


def set_pattern_weights(head: torch.nn.Module) -> dict[str, np.ndarray]:
    """Fill every parameter of the authors' head with :func:`pattern_weights`; returns ``{name: sum |w|}``."""
    sums = {}
    with torch.no_grad():
        for salt, (name, param) in enumerate(official_parameters(head)):
            param.copy_(pattern_weights(tuple(param.shape), salt))
            sums[name] = np.float64(param.double().abs().sum())
    return sums


def authors_kl(mean_t, sigma_t, mean_c, sigma_c) -> torch.Tensor:
    """The training loop's KL per image ``[B]`` (sigma in the place of a variance)."""
    diff = mean_c - mean_t
    return (0.5 * torch.log(sigma_c / sigma_t).sum(1) - 0.5 * mean_t.shape[1] + 0.5 * (sigma_t / sigma_c).sum(1)
            + 0.5 * (diff * diff / sigma_c).sum(1))


def record(checkout: Path) -> dict[str, np.ndarray]:
    module = load_official(checkout)
    torch.manual_seed(0)
    head = module.NP_HEAD(input_dim=C, latent_dim=D, num_classes=K, memory_max_length=Q)
    sums = set_pattern_weights(head)
    head.train()
    data = inputs()
    out: dict[str, np.ndarray] = dict(data)
    out.update({f"weight_abs_sum/{name}": value for name, value in sums.items()})
    queue: list[torch.Tensor] = []

    def reparameterize(self, mean, std):  # the injected noise instead of randn_like
        return queue.pop(0) * std + mean

    head.reparameterize = types.MethodType(reparameterize, head)
    initial = lambda: [torch.zeros(1, D) for _ in range(K)]  # noqa: E731 (train_semi's per-class zero rows)
    for variant in ("released", "persist"):
        latent_memory, deterministic_memory = initial(), initial()
        for step in range(1, STEPS + 1):
            if variant == "released":  # the DDP forward's copy: every step sees the initial lists
                latent_memory, deterministic_memory = initial(), initial()
            features = torch.from_numpy(data[f"step{step}_features"])
            labels = torch.from_numpy(data[f"step{step}_labels"])
            queue[:] = list(torch.from_numpy(data[f"step{step}_eps"]))
            with torch.no_grad():
                logits, mean_t, sigma_t, mean_c, sigma_c, deterministic_memory, latent_memory = head(
                    features, deterministic_memory, latent_memory, x_context_in=features[:M],
                    labels_target_in=labels, labels_context_in=labels[:M], forward_times=T, phase_train=True)
            prefix = f"{variant}/step{step}"
            out[f"{prefix}/target_centers"] = torch.stack([m.mean(0) for m in latent_memory]).numpy()
            out[f"{prefix}/context_centers"] = torch.stack([m.mean(0) for m in deterministic_memory]).numpy()
            out[f"{prefix}/target_rows"] = np.array([m.shape[0] for m in latent_memory])
            out[f"{prefix}/context_rows"] = np.array([m.shape[0] for m in deterministic_memory])
            for name, value in (("mean_t", mean_t), ("sigma_t", sigma_t), ("mean_c", mean_c), ("sigma_c", sigma_c)):
                out[f"{prefix}/{name}"] = value.numpy()
            out[f"{prefix}/kl"] = authors_kl(mean_t, sigma_t, mean_c, sigma_c).numpy()
            out[f"{prefix}/logits"] = logits.numpy()
        if variant == "released":  # inference: the centers of the memories the loop holds (the initial ones)
            held = initial()
        else:
            held = latent_memory
        centers = torch.stack([m.mean(0) for m in held])
        context_centers = torch.stack([m.mean(0) for m in (initial() if variant == "released" else deterministic_memory)])
        features = torch.from_numpy(data["step2_features"])
        queue[:] = list(torch.from_numpy(data["infer_eps"]))
        with torch.no_grad():
            logits = head(features, context_centers, centers, forward_times=T, phase_train=False)
        out[f"{variant}/infer/logits"] = logits.numpy()
    return out



def main(argv: list[str] | None = None) -> None:
    args = recorder_arguments(__doc__, "a checkout of the authors' NP-SemiSeg repository", argv)
    arrays = record(args.checkout)
    official = (args.checkout / OFFICIAL_FILE).read_bytes()
    sidecar = {
        "about": "What the authors' NP head computes on fixed small inputs (tests/test_np_head_golden.py).",
        "repository": "https://github.com/Jianf-Wang/NP-SemiSeg",
        "commit": args.commit or official_commit(args.checkout),
        "official_file_sha256": hashlib.sha256(official).hexdigest(),
        "sources": {
            "head": f"{OFFICIAL_FILE} 112-261 (NP_HEAD)",
            "features_upsampled_to_label_size": f"{OFFICIAL_FILE} 149-163",
            "memories_masked_select_last_q_rows": f"{OFFICIAL_FILE} 166-181",
            "centers": f"{OFFICIAL_FILE} 183-189",
            "attention_latent_decoder": f"{OFFICIAL_FILE} 196-256",
            "zero_row_memories": "U2PL/train_semi.py 126-133 (a zeros(1, 32) row per class)",
            "inference_centers": "U2PL/train_semi.py 304-310 (centers of the held memories), 368",
            "kl": "U2PL/train_semi.py 442-448",
        },
        "command": "PYTHONPATH=$PWD python tests/golden/record_np_head_golden.py CHECKOUT"
                   + (f" --commit {args.commit}" if args.commit else ""),
        "checkout": "CHECKOUT holds the two files at the commit, e.g. git archive COMMIT U2PL/u2pl/models/np_head.py "
                    "U2PL/train_semi.py | tar -x -C CHECKOUT (a full clone works too)",
        "sizes": dict(B=B, M=M, C=C, h=h, w=w, H=H, W=W, K=K, D=D, Q=Q, T=T, seed=SEED),
        "torch": torch.__version__,
        "keys": sorted(arrays),
    }
    save_golden(args.out, "np_head_released", arrays, sidecar)


if __name__ == "__main__":
    main()
