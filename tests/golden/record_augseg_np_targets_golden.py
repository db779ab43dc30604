"""Record which targets NP-SemiSeg's AugSeg step gives its NP head: ``tests/golden/augseg_np_targets_released.npz``.

Usage (from the repository root; CHECKOUT is a checkout of the authors' NP-SemiSeg repository)::

    PYTHONPATH=$PWD python tests/golden/record_augseg_np_targets_golden.py CHECKOUT [--out tests/golden]

The official ``cut_mix_label_adaptive`` (``AugSeg/augseg/dataset/augs_ALIA.py`` 42-83) is imported from CHECKOUT at
run time and mixes a fixed batch; the lines of ``AugSeg/train_semi.py`` around it are written out here, as the step
runs them: the teacher's softmax averaged over its samples, its max and argmax (358-363), the per-image confidence
(366-371), the CutMix (376-387), and the targets passed to the model with the NP head, ``label_all =
torch.cat((label_l, label_u_aug))`` (405-408): the mixed argmax labels, unmasked. The threshold (0.95, line 354)
only masks the unsupervised CE (425-427). The teacher's logits (float32 values) are widened to float64 before the
softmax, so that the recorded confidences are the same on every CPU (a float32 softmax differs in its last bits
between vector widths). Stored: the teacher's logits, the labeled and unlabeled images and labels,
the per-image confidence, the mixed image, labels and confidences, and ``label_all``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import random
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script: its shared helpers
from recording import official_commit, recorder_arguments, save_golden  # noqa: E402

OFFICIAL_FILE = "AugSeg/augseg/dataset/augs_ALIA.py"
STEP_FILE = "AugSeg/train_semi.py"
B, K, H, W = 2, 8, 32, 32
SEED = 20267
THRESHOLD = 0.95


def official_cutmix(checkout: Path):
    spec = importlib.util.spec_from_file_location("augs_ALIA", checkout / OFFICIAL_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.cut_mix_label_adaptive


def inputs() -> dict[str, np.ndarray]:
    """Teacher logits ``[1, B, K, H, W]`` (one sample) sharp enough that part of the pixels pass the threshold,
    labeled and unlabeled images and labels."""
    gen = torch.Generator().manual_seed(SEED)
    logits = 4.0 * torch.randn(1, B, K, H, W, generator=gen)
    labels = torch.randint(0, K, (B, H, W), generator=gen)
    labels[:, :2] = 255
    return {"teacher_logits": logits.numpy(), "images_l": torch.rand(B, 3, H, W, generator=gen).numpy(),
            "labels_l": labels.numpy(), "images_u": torch.rand(B, 3, H, W, generator=gen).numpy()}


def record(checkout: Path) -> dict[str, np.ndarray]:
    cut_mix_label_adaptive = official_cutmix(checkout)
    data = inputs()
    image_l, label_l = torch.from_numpy(data["images_l"]), torch.from_numpy(data["labels_l"])
    image_u_aug = torch.from_numpy(data["images_u"]).clone()
    # train_semi.py 358-363
    pred_u = torch.softmax(torch.from_numpy(data["teacher_logits"]).double(), dim=2).mean(0)
    logits_u_aug, label_u_aug = torch.max(pred_u, dim=1)
    out = dict(data)
    out["teacher_confidence"], out["teacher_label"] = logits_u_aug.numpy().copy(), label_u_aug.numpy().copy()
    # 366-371
    entropy = -torch.sum(pred_u * torch.log(pred_u + 1e-10), dim=1) / np.log(K)
    confidence = ((1.0 - entropy) * logits_u_aug).mean(dim=[1, 2]).numpy().tolist()
    out["image_confidence"] = np.array(confidence)
    # 376-387 (the configs' use_cutmix and use_cutmix_adaptive; the trigger probability 1)
    random.seed(SEED)
    np.random.seed(SEED)
    torch.manual_seed(SEED)
    image_u_aug, label_u_aug, logits_u_aug = cut_mix_label_adaptive(image_u_aug, label_u_aug, logits_u_aug, image_l,
                                                                    label_l, confidence)
    out.update(mixed_image=image_u_aug.numpy(), mixed_label=label_u_aug.numpy(), mixed_confidence=logits_u_aug.numpy())
    # 405-406: the targets the NP head receives (labeled first)
    out["label_all"] = torch.cat((label_l, label_u_aug)).numpy()
    return out


def main(argv: list[str] | None = None) -> None:
    args = recorder_arguments(__doc__, "a checkout of NP-SemiSeg", argv)
    commit = args.commit or official_commit(args.checkout)
    arrays = record(args.checkout)
    sidecar = {
        "about": "The targets NP-SemiSeg's AugSeg step passes to its NP head (tests/test_augseg_np_targets_golden.py).",
        "repository": "https://github.com/Jianf-Wang/NP-SemiSeg",
        "commit": commit,
        "official_file_sha256": {f: hashlib.sha256((args.checkout / f).read_bytes()).hexdigest()
                                 for f in (OFFICIAL_FILE, STEP_FILE)},
        "sources": {
            "cutmix": f"{OFFICIAL_FILE} 10-83 (rand_bbox, cut_mix_label_adaptive; imported and run)",
            "pseudo_labels": f"{STEP_FILE} 358-363 (written out)",
            "image_confidence": f"{STEP_FILE} 366-371 (written out)",
            "targets_to_the_head": f"{STEP_FILE} 405-408 (label_all = cat(label_l, label_u_aug), unmasked)",
            "threshold_masks_the_unsupervised_ce_only": f"{STEP_FILE} 354, 425-427",
        },
        "command": f"PYTHONPATH=$PWD python tests/golden/record_augseg_np_targets_golden.py CHECKOUT --commit {commit}",
        "checkout": f"CHECKOUT holds the two files at the commit, e.g. git archive COMMIT {OFFICIAL_FILE} {STEP_FILE} "
                    "| tar -x -C CHECKOUT (a full clone works too)",
        "sizes": {"B": B, "K": K, "H": H, "W": W, "seed": SEED, "threshold": THRESHOLD},
        "dtype": "teacher_logits, images: float32 values; the softmax and everything after it in float64 (the "
                 "confidences: teacher_confidence, image_confidence, mixed_confidence)",
        "torch": torch.__version__,
        "numpy": np.__version__,
    }
    save_golden(args.out, "augseg_np_targets_released", arrays, sidecar)
    kept = float((arrays["mixed_confidence"] >= THRESHOLD).mean())
    print(f"fraction of unlabeled pixels at or above {THRESHOLD}: {kept:.3f}")


if __name__ == "__main__":
    main()
