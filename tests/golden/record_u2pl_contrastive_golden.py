"""Record what U2PL's released contrastive loss computes on fixed small inputs with ignored pixels:
``tests/golden/u2pl_contrastive_released.npz``.

Usage (from the repository root; CHECKOUT is a checkout of U2PL, https://github.com/Haochen-Wang409/U2PL)::

    PYTHONPATH=$PWD python tests/golden/record_u2pl_contrastive_golden.py CHECKOUT [--commit SHA] [--out tests/golden]

``u2pl/utils/utils.py`` (``label_onehot``, ``dequeue_and_enqueue``) and ``u2pl/utils/loss_helper.py``
(``compute_contra_memobank_loss``) are imported from CHECKOUT at run time; nothing of them is kept here. What
they need and this machine lacks is replaced while they run: ``.cuda()`` returns the tensor itself, the
all-gather of ``dequeue_and_enqueue`` is one process's list, ``skimage`` (imported, unused here) is an empty
stub. The training loop around them (``train_semi.py``) is emulated in a few lines: labels are one-hot encoded at
label size by ``label_onehot`` (labeled and unlabeled parts separately) and resized to the feature size
(nearest), the reliable / unreliable masks are given (labeled: every non-ignored pixel), the memory bank starts
empty. Two steps share the bank. Every ``torch.randint`` draw of the loss (anchors, then negatives, per class)
is recorded with its bound so the test injects the same draws into ours.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script: its shared helpers
from recording import official_commit, recorder_arguments, save_golden  # noqa: E402


FILES = ("u2pl/utils/utils.py", "u2pl/utils/loss_helper.py")
#: labeled images BL, unlabeled BU, embedding E, feature map h x w, labels H x W, classes K
BL, BU, E, h, w, H, W, K = 2, 2, 8, 6, 6, 12, 12, 6
STEPS = 2
SEED = 20261
#: U2PL's contrastive settings (VOC configs), with fewer queries / negatives
CFG = dict(current_class_threshold=0.3, current_class_negative_threshold=1, low_rank=3, high_rank=20,
           temperature=0.5, num_queries=16, num_negatives=4)
QUEUE_SIZE, BACKGROUND_QUEUE_SIZE = 30000, 50000
IGNORED = 0.1  # fraction of ignored (255) label pixels


def inputs() -> dict[str, np.ndarray]:
    """Per step: ``labels_l [BL, H, W]`` (ground truth, 10 % 255), ``pseudo [BU, H, W]`` (pseudo-labels, 10 % 255),
    ``reliable_u`` / ``unreliable_u [BU, H, W]``, ``rep_student`` / ``rep_teacher [BL + BU, E, h, w]``,
    ``prob [BL + BU, K, h, w]`` (softmax of random logits). Class 0 is present in every image; the images hold
    different classes, so the released one-hot (image 0's slot only) differs from the right one."""
    gen = torch.Generator().manual_seed(SEED)
    out: dict[str, np.ndarray] = {}
    for step in range(1, STEPS + 1):
        labels = torch.randint(1, K, (BL + BU, H // 3, W // 3), generator=gen).repeat_interleave(3, 1)
        labels = labels.repeat_interleave(3, 2)
        labels[:, : H // 4] = 0
        labels[torch.rand(BL + BU, H, W, generator=gen) < IGNORED] = 255
        out[f"step{step}/labels_l"] = labels[:BL].numpy().astype(np.int64)
        out[f"step{step}/pseudo"] = labels[BL:].numpy().astype(np.int64)
        out[f"step{step}/reliable_u"] = (torch.rand(BU, H, W, generator=gen) < 0.6).numpy()
        out[f"step{step}/unreliable_u"] = (torch.rand(BU, H, W, generator=gen) < 0.5).numpy()
        out[f"step{step}/rep_student"] = torch.randn(BL + BU, E, h, w, generator=gen).numpy()
        out[f"step{step}/rep_teacher"] = torch.randn(BL + BU, E, h, w, generator=gen).numpy()
        out[f"step{step}/prob"] = torch.softmax(2.5 * torch.randn(BL + BU, K, h, w, generator=gen), dim=1).numpy()
    return out


def small(mask: torch.Tensor) -> torch.Tensor:
    """``[N, C, H, W]`` resized to the feature size, nearest (train_semi.py's ``F.interpolate(..., "nearest")``)."""
    return F.interpolate(mask.float(), size=(h, w), mode="nearest")


def load_official(checkout: Path) -> tuple[types.ModuleType, types.ModuleType]:
    """``u2pl.utils.utils`` and ``u2pl.utils.loss_helper`` from ``checkout``, with the stubs above."""
    if "skimage" not in sys.modules:
        try:
            importlib.import_module("skimage.measure")
        except ImportError:
            skimage = types.ModuleType("skimage")
            measure = types.ModuleType("skimage.measure")
            measure.label = measure.regionprops = None
            skimage.measure = measure
            sys.modules.update({"skimage": skimage, "skimage.measure": measure})
    sys.path.insert(0, str(checkout))
    try:
        utils = importlib.import_module("u2pl.utils.utils")
        loss_helper = importlib.import_module("u2pl.utils.loss_helper")
    finally:
        sys.path.remove(str(checkout))
    utils.gather_together = lambda data: [data]  # one process
    return utils, loss_helper


@contextmanager
def on_cpu_recording_randint(draws: list[tuple[int, np.ndarray]]):
    """``.cuda()`` as the identity and every ``torch.randint(high, size=...)`` recorded as ``(high, values)``."""
    cuda, randint = torch.Tensor.cuda, torch.randint

    def recording(high, size, **kwargs):
        values = randint(high, size, **kwargs)
        draws.append((int(high), values.numpy().copy()))
        return values

    torch.Tensor.cuda = lambda self, *args, **kwargs: self
    torch.randint = recording
    try:
        yield
    finally:
        torch.Tensor.cuda, torch.randint = cuda, randint


def record(checkout: Path) -> dict[str, np.ndarray]:
    utils, loss_helper = load_official(checkout)
    data = inputs()
    out: dict[str, np.ndarray] = dict(data)
    torch.manual_seed(0)
    memobank = [[torch.zeros(0, E)] for _ in range(K)]  # train_semi.py: one list per class, empty
    queue_ptrlis = [torch.zeros(1, dtype=torch.long) for _ in range(K)]
    queue_size = [BACKGROUND_QUEUE_SIZE] + [QUEUE_SIZE] * (K - 1)
    for step in range(1, STEPS + 1):
        labels_l = torch.from_numpy(data[f"step{step}/labels_l"])
        pseudo = torch.from_numpy(data[f"step{step}/pseudo"])
        rep = torch.from_numpy(data[f"step{step}/rep_student"])
        rep_teacher = torch.from_numpy(data[f"step{step}/rep_teacher"])
        prob = torch.from_numpy(data[f"step{step}/prob"])
        valid_l = labels_l != 255
        low_mask_all = small(torch.cat([valid_l, torch.from_numpy(data[f"step{step}/reliable_u"])])[:, None])
        high_mask_all = small(torch.cat([valid_l, torch.from_numpy(data[f"step{step}/unreliable_u"])])[:, None])
        draws: list[tuple[int, np.ndarray]] = []
        with on_cpu_recording_randint(draws):
            label_l_small = small(utils.label_onehot(labels_l, K))
            label_u_small = small(utils.label_onehot(pseudo, K))
            new_keys, loss = loss_helper.compute_contra_memobank_loss(
                rep, label_l_small.long(), label_u_small.long(), prob[:BL], prob[BL:], low_mask_all, high_mask_all,
                CFG, memobank, queue_ptrlis, queue_size, rep_teacher)
        out[f"step{step}/membership"] = torch.cat([label_l_small, label_u_small]).bool().numpy()
        out[f"step{step}/loss"] = np.float64(loss.item())
        out[f"step{step}/new_keys"] = np.array(new_keys, dtype=np.int64)
        for c in range(K):
            out[f"step{step}/queue/{c}"] = memobank[c][0].numpy().copy()
        out[f"step{step}/draw_highs"] = np.array([high for high, _ in draws], dtype=np.int64)
        for i, (_, values) in enumerate(draws):
            out[f"step{step}/draw/{i:03d}"] = values
    return out



def main(argv: list[str] | None = None) -> None:
    args = recorder_arguments(__doc__, "a checkout of U2PL", argv)
    arrays = record(args.checkout)
    sidecar = {
        "about": "What U2PL's released contrastive loss computes on fixed small inputs with ignored pixels "
                 "(tests/test_u2pl_contrastive_golden.py).",
        "repository": "https://github.com/Haochen-Wang409/U2PL",
        "commit": args.commit or official_commit(args.checkout),
        "official_files_sha256": {f: hashlib.sha256((args.checkout / f).read_bytes()).hexdigest() for f in FILES},
        "sources": {
            "label_onehot": "u2pl/utils/utils.py 50-59 (255 set to 0 at 54-55, scatter over dim 0 at 56, clearing "
                            "at 57)",
            "dequeue_and_enqueue": "u2pl/utils/utils.py 27-47",
            "contrastive_loss": "u2pl/utils/loss_helper.py 53-235 (compute_contra_memobank_loss)",
            "masks_and_onehot_in_the_loop": "train_semi.py 408-465 (masks, labeled: label != 255; label_onehot per "
                                            "part, resized nearest), 483-493 (the call)",
            "memory_bank": "train_semi.py 162-169 (one empty list per class; queue size 50000 for class 0, 30000 others)",
        },
        "command": "PYTHONPATH=$PWD python tests/golden/record_u2pl_contrastive_golden.py CHECKOUT"
                   + (f" --commit {args.commit}" if args.commit else ""),
        "checkout": "CHECKOUT holds the repository at the commit, e.g. git archive COMMIT | tar -x -C CHECKOUT",
        "sizes": dict(BL=BL, BU=BU, E=E, h=h, w=w, H=H, W=W, K=K, steps=STEPS, seed=SEED, ignored=IGNORED, **CFG),
        "torch": torch.__version__,
        "keys": sorted(arrays),
    }
    save_golden(args.out, "u2pl_contrastive_released", arrays, sidecar)


if __name__ == "__main__":
    main()
