"""Record one training step of UniMatch V2 as its official loop runs it: ``tests/golden/unimatch_v2_step.npz``.

Usage (from the repository root; CHECKOUT is a checkout of LiheYoung/UniMatch-V2)::

    PYTHONPATH=$PWD python tests/golden/record_unimatch_v2_golden.py CHECKOUT [--out tests/golden]

What is official and what is not. The network is the official ``DPT`` (``model/semseg/dpt.py``, imported from
CHECKOUT and run, ``comp_drop`` included) at tiny sizes, as ``record_dinov2_dpt_golden.py`` builds it: the official
ViT constructor at width 32, 4 blocks, the DPT at features 16; student and EMA model from the same pattern with
other salts. The loop body of ``unimatch_v2.py`` 170-226 is written out here (it is no function), without its
``.cuda()`` calls, on one process: the EMA model's weak-view prediction, CutMix of both strong views with the
flipped batch, the supervised CE (Pascal's ``CELoss``, ignore 255), the two strong terms with their valid-pixel
normalisation, ``(loss_x + (s1 + s2) / 2) / 2``, one AdamW step (betas and weight decay of lines 67-73, a backbone
group and a head group at ``lr x lr_multi``), then the EMA over parameters and buffers with
``min(1 - 1 / (iters + 1), 0.996)`` at ``iters`` = 3. The LR of the step is set on both sides (the official loop
sets it after the previous step).

Injected draws: the CutMix boxes (hand-made ``[B, H, W]`` 0/1 masks; the official ones come from the dataset) and
the complementary dropout's draws: ``DPT.binomial.sample`` returns a recorded Bernoulli tensor (its ``.cuda()`` a
no-op) and ``torch.randperm`` inside the strong pass is recorded as it runs; the mask the official code built
(``dropout_mask [2 B_u, D]``) is stored. The two strong views are one image (the project makes one strong view per
unlabeled image; the views differ by box and mask). Images are stored in [0, 1] and normalised with the ImageNet
mean and std for the official network (the project's segmentor normalises inside).

Stored: inputs and draws, the four losses and the mask ratio, the EMA model's confidences and pseudo-labels, and
for every parameter of the student (in the order of the sidecar's ``parameters.names``; the unused mask token left
out) its gradient and updated value and of the EMA model its updated value, each as sum, sum of |x| and up to
``SAMPLES`` entries at stored indices (``index``, concatenated in that order); the attention's ``qkv`` biases also in
full (``<prefix>/qkv_bias [blocks, 3D]``): the key bias has no gradient in exact arithmetic (it shifts every
attention logit of a query alike), so its float gradient is round-off that AdamW's first step divides by
``|g| + 1e-8``, and the test compares those entries by what that step can do.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script: its shared helpers
from record_dinov2_dpt_golden import NUM_CLASSES, official_dpt  # noqa: E402
from recording import official_commit, official_sidecar, recorder_arguments, save_golden  # noqa: E402

OFFICIAL_FILES = ("unimatch_v2.py", "model/semseg/dpt.py", "configs/pascal.yaml")
STEM = "unimatch_v2_step"
B_L, B_U, SIZE = 2, 2, 42
SEED = 20263
ITERS = 3
LR, LR_MULTI, WEIGHT_DECAY, BETAS = 1e-3, 40.0, 0.01, (0.9, 0.999)
CONF_THRESH = 0.5  # Pascal's 0.95 would keep no pixel of a tiny untrained network; both sides use this value
EMA_CAP = 0.996
SAMPLES = 24
STUDENT_SALT, TEACHER_SALT = 0, 500
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def inputs() -> dict[str, np.ndarray]:
    """Images in [0, 1], labels (255 in the top rows), hand-made boxes and the Bernoulli draw of the masks."""
    gen = torch.Generator().manual_seed(SEED)
    labels = torch.randint(0, NUM_CLASSES, (B_L, SIZE, SIZE), generator=gen)
    labels[:, :4] = 255
    box1, box2 = torch.zeros(B_U, SIZE, SIZE, dtype=torch.int64), torch.zeros(B_U, SIZE, SIZE, dtype=torch.int64)
    box1[0, 5:30, 10:26] = 1  # image 1 of view 1: no box
    box2[0, 20:41, 0:17] = 1
    box2[1, 2:20, 15:40] = 1
    return {"images_l": torch.rand(B_L, 3, SIZE, SIZE, generator=gen).numpy(), "labels_l": labels.numpy(),
            "images_w": torch.rand(B_U, 3, SIZE, SIZE, generator=gen).numpy(),
            "images_s": torch.rand(B_U, 3, SIZE, SIZE, generator=gen).numpy(),
            "box1": box1.numpy(), "box2": box2.numpy(),
            "bernoulli": torch.bernoulli(torch.full((B_U, 32), 0.5), generator=gen).numpy()}


def normalise(images: torch.Tensor) -> torch.Tensor:
    return (images - torch.tensor(MEAN).view(1, 3, 1, 1)) / torch.tensor(STD).view(1, 3, 1, 1)


class _Draw:
    """What ``Binomial.sample`` returns here: the recorded draw, ``.cuda()`` a no-op."""

    def __init__(self, value: torch.Tensor) -> None:
        self.value = value

    def cuda(self) -> torch.Tensor:
        return self.value.clone()


class _Binomial:
    def __init__(self, value: torch.Tensor) -> None:
        self.value = value

    def sample(self, shape: tuple[int, ...]) -> _Draw:
        assert tuple(shape) == tuple(self.value.shape), (shape, self.value.shape)
        return _Draw(self.value)


def sample_indices(model: nn.Module) -> dict[str, np.ndarray]:
    gen = np.random.default_rng(SEED)
    out = {}
    for name, t in model.named_parameters():
        n = t.numel()
        out[name] = (np.arange(n) if n <= SAMPLES else np.sort(gen.choice(n, SAMPLES, replace=False))).astype(np.int32)
    return out


def digest(tensors: dict[str, torch.Tensor], names: list[str], indices: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Per parameter of ``names`` (in that order): ``sum [P]``, ``abs [P]`` (sum of |x|) and the entries at its
    indices, concatenated (``at``), as float64."""
    flats = [tensors[name].detach().double().flatten() for name in names]
    return {"sum": np.array([float(f.sum()) for f in flats]), "abs": np.array([float(f.abs().sum()) for f in flats]),
            "at": np.concatenate([f[torch.from_numpy(indices[n])].numpy() for f, n in zip(flats, names)])}


def record(checkout: Path) -> tuple[dict[str, np.ndarray], list[str]]:
    torch.set_num_threads(1)
    torch.manual_seed(SEED)  # dpt.py 155's randperm draws from the global generator
    data = inputs()
    model, model_ema = official_dpt(checkout, STUDENT_SALT), official_dpt(checkout, TEACHER_SALT)
    model.train()
    model_ema.eval()
    for param in model_ema.parameters():  # unimatch_v2.py 88-91
        param.requires_grad = False
    model.binomial = _Binomial(torch.from_numpy(data["bernoulli"]))
    optimizer = torch.optim.AdamW(  # unimatch_v2.py 67-73
        [{"params": [p for p in model.backbone.parameters() if p.requires_grad], "lr": LR},
         {"params": [p for n, p in model.named_parameters() if "backbone" not in n], "lr": LR * LR_MULTI}],
        lr=LR, betas=BETAS, weight_decay=WEIGHT_DECAY)
    criterion_l = nn.CrossEntropyLoss(ignore_index=255)
    criterion_u = nn.CrossEntropyLoss(reduction="none")
    img_x, mask_x = normalise(torch.from_numpy(data["images_l"])), torch.from_numpy(data["labels_l"])
    img_u_w = normalise(torch.from_numpy(data["images_w"]))
    img_u_s1, img_u_s2 = normalise(torch.from_numpy(data["images_s"])), normalise(torch.from_numpy(data["images_s"]))
    ignore_mask = torch.zeros(B_U, SIZE, SIZE, dtype=torch.int64)
    cutmix_box1, cutmix_box2 = torch.from_numpy(data["box1"]), torch.from_numpy(data["box2"])

    # unimatch_v2.py 170-208
    with torch.no_grad():
        pred_u_w = model_ema(img_u_w).detach()
        conf_u_w = pred_u_w.softmax(dim=1).max(dim=1)[0]
        mask_u_w = pred_u_w.argmax(dim=1)
    img_u_s1[cutmix_box1.unsqueeze(1).expand(img_u_s1.shape) == 1] = img_u_s1.flip(0)[cutmix_box1.unsqueeze(1).expand(img_u_s1.shape) == 1]  # noqa: E501
    img_u_s2[cutmix_box2.unsqueeze(1).expand(img_u_s2.shape) == 1] = img_u_s2.flip(0)[cutmix_box2.unsqueeze(1).expand(img_u_s2.shape) == 1]  # noqa: E501
    pred_x = model(img_x)
    kept: list[torch.Tensor] = []
    randperm = torch.randperm
    torch.randperm = lambda *a, **k: kept.append(randperm(*a, **k)) or kept[-1]  # record dpt.py 155's draw
    try:
        pred_u_s1, pred_u_s2 = model(torch.cat((img_u_s1, img_u_s2)), comp_drop=True).chunk(2)
    finally:
        torch.randperm = randperm
    mask_u_w_cutmixed1, conf_u_w_cutmixed1, ignore_mask_cutmixed1 = mask_u_w.clone(), conf_u_w.clone(), ignore_mask.clone()
    mask_u_w_cutmixed2, conf_u_w_cutmixed2, ignore_mask_cutmixed2 = mask_u_w.clone(), conf_u_w.clone(), ignore_mask.clone()
    mask_u_w_cutmixed1[cutmix_box1 == 1] = mask_u_w.flip(0)[cutmix_box1 == 1]
    conf_u_w_cutmixed1[cutmix_box1 == 1] = conf_u_w.flip(0)[cutmix_box1 == 1]
    ignore_mask_cutmixed1[cutmix_box1 == 1] = ignore_mask.flip(0)[cutmix_box1 == 1]
    mask_u_w_cutmixed2[cutmix_box2 == 1] = mask_u_w.flip(0)[cutmix_box2 == 1]
    conf_u_w_cutmixed2[cutmix_box2 == 1] = conf_u_w.flip(0)[cutmix_box2 == 1]
    ignore_mask_cutmixed2[cutmix_box2 == 1] = ignore_mask.flip(0)[cutmix_box2 == 1]
    loss_x = criterion_l(pred_x, mask_x)
    loss_u_s1 = criterion_u(pred_u_s1, mask_u_w_cutmixed1)
    loss_u_s1 = loss_u_s1 * ((conf_u_w_cutmixed1 >= CONF_THRESH) & (ignore_mask_cutmixed1 != 255))
    loss_u_s1 = loss_u_s1.sum() / (ignore_mask_cutmixed1 != 255).sum().item()
    loss_u_s2 = criterion_u(pred_u_s2, mask_u_w_cutmixed2)
    loss_u_s2 = loss_u_s2 * ((conf_u_w_cutmixed2 >= CONF_THRESH) & (ignore_mask_cutmixed2 != 255))
    loss_u_s2 = loss_u_s2.sum() / (ignore_mask_cutmixed2 != 255).sum().item()
    loss_u_s = (loss_u_s1 + loss_u_s2) / 2.0
    loss = (loss_x + loss_u_s) / 2.0
    optimizer.zero_grad()
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    optimizer.step()
    mask_ratio = ((conf_u_w >= CONF_THRESH) & (ignore_mask != 255)).sum().item() / (ignore_mask != 255).sum()
    # unimatch_v2.py 221-226
    ema_ratio = min(1 - 1 / (ITERS + 1), EMA_CAP)
    with torch.no_grad():
        for param, param_ema in zip(model.parameters(), model_ema.parameters()):
            param_ema.copy_(param_ema * ema_ratio + param.detach() * (1 - ema_ratio))
        for buffer, buffer_ema in zip(model.buffers(), model_ema.buffers()):
            buffer_ema.copy_(buffer_ema * ema_ratio + buffer.detach() * (1 - ema_ratio))

    (perm,) = kept
    mask1 = torch.from_numpy(data["bernoulli"]) * 2.0
    mask2 = 2.0 - mask1
    num_kept = int(B_U * (1 - 0.5))  # dpt.py 151-159 with bs // 2 = B_U
    mask1[perm[:num_kept]], mask2[perm[:num_kept]] = 1.0, 1.0
    indices = sample_indices(model)
    names = [n for n, _ in model.named_parameters() if n in grads]  # every parameter but the unused mask token
    out = dict(data, labels_l=data["labels_l"].astype(np.int16), box1=data["box1"].astype(np.uint8),
               box2=data["box2"].astype(np.uint8))
    out.update(kept=perm.numpy(), dropout_mask=torch.cat((mask1, mask2)).numpy(), conf_u_w=conf_u_w.numpy(),
               mask_u_w=mask_u_w.numpy().astype(np.int16), mask_ratio=np.array(float(mask_ratio)),
               **{k: np.array(float(v.detach())) for k, v in (("loss_x", loss_x), ("loss_u_s1", loss_u_s1),
                                                              ("loss_u_s2", loss_u_s2), ("loss", loss))})
    out["index"] = np.concatenate([indices[n] for n in names])
    for prefix, tensors in (("grad", grads), ("student", dict(model.named_parameters())),
                            ("ema", dict(model_ema.named_parameters()))):
        out.update({f"{prefix}/{k}": v for k, v in digest(tensors, names, indices).items()})
        out[f"{prefix}/qkv_bias"] = torch.stack([tensors[n].detach() for n in names if n.endswith("attn.qkv.bias")]).numpy()
    return out, names


def _numels(checkout: Path, names: list[str]) -> list[int]:
    params = dict(official_dpt(checkout).named_parameters())
    return [params[n].numel() for n in names]


def main(argv: list[str] | None = None) -> None:
    args = recorder_arguments(__doc__, "a checkout of UniMatch-V2", argv)
    commit = args.commit or official_commit(args.checkout)
    arrays, names = record(args.checkout)
    sidecar = {
        **official_sidecar("One training step of UniMatch V2 as its official loop runs it "
                           "(tests/test_unimatch_v2_golden.py).", "https://github.com/LiheYoung/UniMatch-V2",
                           args.checkout, commit, OFFICIAL_FILES),
        "sources": {
            "loop_body": "unimatch_v2.py 170-208 (written out in the recorder), 221-226 (EMA, written out)",
            "optimizer": "unimatch_v2.py 67-73 (AdamW: two groups, betas (0.9, 0.999), weight decay 0.01)",
            "comp_drop": "model/semseg/dpt.py 148-167 (imported and run; Binomial draw injected, randperm recorded)",
            "network": "tests/golden/record_dinov2_dpt_golden.py (the official DPT at tiny sizes)",
        },
        "compared": "losses, mask ratio, the EMA model's confidences and pseudo-labels, and sum, sum |x| and sampled "
                    "entries of the student's gradients and updated parameters and the EMA model's parameters",
        "command": f"PYTHONPATH=$PWD python tests/golden/record_unimatch_v2_golden.py CHECKOUT --commit {commit}",
        "sizes": {"B_l": B_L, "B_u": B_U, "size": SIZE, "seed": SEED, "iters": ITERS, "lr": LR, "lr_multi": LR_MULTI,
                  "weight_decay": WEIGHT_DECAY, "betas": list(BETAS), "conf_thresh": CONF_THRESH, "ema_cap": EMA_CAP,
                  "samples": SAMPLES, "student_salt": STUDENT_SALT, "teacher_salt": TEACHER_SALT},
        "parameters": {"names": names, "samples": [int(min(SAMPLES, n)) for n in _numels(args.checkout, names)]},
        "torch": torch.__version__,
    }
    save_golden(args.out, STEM, arrays, sidecar)
    print(f"loss {float(arrays['loss']):.6f} x {float(arrays['loss_x']):.6f} s1 {float(arrays['loss_u_s1']):.6f} "
          f"s2 {float(arrays['loss_u_s2']):.6f} mask ratio {float(arrays['mask_ratio']):.3f}")


if __name__ == "__main__":
    main()
