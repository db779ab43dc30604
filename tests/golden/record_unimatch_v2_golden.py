"""Record one training step of UniMatch V2 and of its repository's FixMatch as the official loops run them:
``tests/golden/unimatch_v2_step.npz`` and ``tests/golden/fixmatch_v2_step.npz``.

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
sets it after the previous step). The repository's ``fixmatch.py`` 171-199 likewise (one strong view with box 1,
labeled and strong images in one pass, ``(loss_x + loss_s) / 2``; its optimiser and EMA are the same lines as
UniMatch V2's: 68-73, 212-217).

The batch is the one the project's data pipeline makes (:func:`inputs`): the released ``unimatch_v2`` cell's
transforms (``npsemiseg.training.factories.train_transforms``: resize, flip, crop with its padding, the two strong
views' photometric draws) on the synthetic dataset, seeded, one padded and one unpadded unlabeled crop; the official
loop gets ``image_strong`` as ``img_u_s1``, ``image_strong2`` as ``img_u_s2`` and ``ignore_mask`` = 255 where the
crop padded (``dataset/semi.py`` 64-68), so the strong terms and the mask ratio leave padded pixels out.

Injected draws: the CutMix boxes (the project's ``unimatch_boxes``, the distribution of the official
``obtain_cutmix_box``, seeded by :data:`BOX_SEED`; the official ones come from the dataset) and the complementary dropout's draws:
``DPT.binomial.sample`` returns a recorded Bernoulli tensor (its ``.cuda()`` a no-op) and ``torch.randperm`` inside
the strong pass is recorded as it runs; the mask the official code built (``dropout_mask [2 B_u, D]``) is stored.
Images are stored in [0, 1] and normalised with the ImageNet mean and std for the official network (the project's
segmentor normalises inside).

Stored: inputs and draws, the losses and the mask ratio, the EMA model's confidences and pseudo-labels, and
for every parameter of the student (in the order of the sidecar's ``parameters.names``; the unused mask token left
out) its gradient and updated value and of the EMA model its updated value, each as sum, sum of |x| and up to
``SAMPLES`` entries at stored indices (``index``, concatenated in that order); the updated values also as sum and sum
of |x| over the entries whose gradient exceeds :data:`RESOLVED` (their mask, bit-packed: ``grad/resolved``); the
attention's ``qkv`` biases also in full (``<prefix>/qkv_bias [blocks, 3D]``): the key bias has no gradient in exact
arithmetic (it shifts every attention logit of a query alike), so its float gradient is round-off that AdamW's first
step divides by ``|g| + 1e-8`` (in float32 an lr-sized move, in float64 a negligible one).

Precision (:data:`DTYPE`): both networks, the images and the Bernoulli draw are float64 and the official step runs
with float64 as the default dtype; float32 only where the official code fixes it (the position embedding's resize,
``dinov2.py`` 185) and in the ImageNet constants of :func:`normalise` (the project's segmentor holds them as float32
buffers). The stored images and draws are float32 values, exact in float64; the digests are float64.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script: its shared helpers
from record_dinov2_dpt_golden import NUM_CLASSES, official_dpt  # noqa: E402
from recording import default_dtype, official_commit, official_sidecar, recorder_arguments, save_golden  # noqa: E402

OFFICIAL_FILES = ("unimatch_v2.py", "model/semseg/dpt.py", "configs/pascal.yaml")
B_L, B_U, SIZE = 2, 2, 42
SEED = 20263
ITERS = 3
LR, LR_MULTI, WEIGHT_DECAY, BETAS = 1e-3, 40.0, 0.01, (0.9, 0.999)
CUTMIX_P = 0.5  # dataset/semi.py 55, 61: obtain_cutmix_box(p=0.5)
#: the seed of the box draws: the first after SEED at which both views box both images and, in both views, each box
#: covers padded pixels (of its own image or of the pasted one), so that every case of the valid-pixel mixing counts
BOX_SEED = 20305
#: Pascal's 0.95 would keep no pixel of a tiny untrained network (5 classes); at 0.3 a quarter of the weak view's
#: pixels pass; both sides use this value
CONF_THRESH = 0.3
EMA_CAP = 0.996
SAMPLES = 24
#: a gradient entry above this is resolved: AdamW's first step (``lr x g / (|g| + 1e-8)``) moves its parameter by
#: lr x sign(g) up to 1e-3 of lr, whatever the gradient's round-off; the updated parameters' sums are also stored over
#: these entries (``<prefix>/resolved_sum``, mask ``grad/resolved``), since below it the step turns round-off into
#: moves of up to lr
RESOLVED = 1e-5
STUDENT_SALT, TEACHER_SALT = 0, 500
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
#: the precision of both sides' step: networks (pattern weights, float32 values widened), images (stored as float32
#: values, exact in float64), the Bernoulli draw and the default dtype around the official step; in float32 the
#: round-off differs between CPUs (vector width, oneDNN, MKL) and AdamW's first step turns it into lr-sized moves
#: wherever a gradient is round-off. Float32 where the official code fixes it: the position embedding's resize
#: (``dinov2.py`` 185, ``.float()``), as the project's
DTYPE = torch.float64


def pipeline_cell() -> Any:
    """The released ``unimatch_v2`` cell on the synthetic dataset at the golden's sizes (crop :data:`SIZE`,
    :data:`NUM_CLASSES` classes, ``vit_tiny``): its data pipeline makes the golden's batch."""
    from npsemiseg.config import compose

    overrides = {"model.weights": None, "model.backbone": "vit_tiny", "schedule.crop_size": SIZE,
                 "data.options": {"num_classes": NUM_CLASSES}}
    return compose("paper", framework="unimatch_v2", dataset="synthetic", partition="1/16", head="baseline",
                   protocol="released", overrides=overrides).config


def _unlabeled_items(transform: Any, dataset: Any) -> list[dict[str, torch.Tensor]]:
    """The first padded and the first unpadded crop of the unlabeled set in its order (``B_U`` = 2 items; the flipped
    batch pastes each into the other's box)."""
    padded: dict[bool, dict[str, torch.Tensor]] = {}
    for index in range(len(dataset)):
        item = transform(dataset[index])
        padded.setdefault(bool(item["padding"].any()), item)
        if len(padded) == 2:
            return [padded[True], padded[False]]
    raise RuntimeError("no padded crop in the unlabeled set")


def inputs() -> dict[str, np.ndarray]:
    """The batch the project's data pipeline makes for the released cell (:func:`pipeline_cell`, seeded): labeled
    crops and labels, and for the unlabeled stream the weak view, the two strong views (``image_strong``,
    ``image_strong2``: their own photometric draws) and the crop's padding mask (True = padded); the two CutMix boxes
    of each image from the project's draw (``unimatch_boxes``, p :data:`CUTMIX_P`, in turn from one seeded RNG, as
    ``FixMatch.draw_boxes``); the Bernoulli draw of the complementary masks."""
    from npsemiseg.frameworks.fixmatch import unimatch_boxes
    from npsemiseg.training.factories import build_datasets, train_transforms

    config = pipeline_cell()
    transforms, datasets = train_transforms(config), build_datasets(config)
    torch.manual_seed(SEED)
    random.seed(SEED)
    labeled = [transforms["labeled"](datasets["labeled"][i]) for i in range(B_L)]
    unlabeled = _unlabeled_items(transforms["unlabeled"], datasets["unlabeled"])
    stack = lambda items, key: torch.stack([item[key] for item in items]).numpy()  # noqa: E731
    rng = random.Random(BOX_SEED)
    box1, box2 = (unimatch_boxes(B_U, SIZE, SIZE, p=CUTMIX_P, rng=rng).long() for _ in range(2))
    gen = torch.Generator().manual_seed(SEED)
    return {"images_l": stack(labeled, "image"), "labels_l": stack(labeled, "label"),
            "images_w": stack(unlabeled, "image"), "images_s1": stack(unlabeled, "image_strong"),
            "images_s2": stack(unlabeled, "image_strong2"), "padding": stack(unlabeled, "padding"),
            "box1": box1.numpy(), "box2": box2.numpy(),
            "bernoulli": torch.bernoulli(torch.full((B_U, 32), 0.5), generator=gen).numpy()}


def normalise(images: torch.Tensor) -> torch.Tensor:
    """ImageNet normalisation with float32 constants, as the project's segmentor holds them (its buffers)."""
    mean, std = (torch.tensor(v, dtype=torch.float32).view(1, 3, 1, 1) for v in (MEAN, STD))
    return (images - mean) / std


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


def _cutmixed(box: torch.Tensor, *maps: torch.Tensor) -> list[torch.Tensor]:
    """unimatch_v2.py 181-190 / fixmatch.py 181-185: each map with the flipped batch's values inside ``box``."""
    out = []
    for values in maps:
        mixed = values.clone()
        mixed[box == 1] = values.flip(0)[box == 1]
        out.append(mixed)
    return out


def _strong_loss(criterion_u: nn.Module, pred: torch.Tensor, box: torch.Tensor, mask_u_w: torch.Tensor,
                 conf_u_w: torch.Tensor, ignore_mask: torch.Tensor) -> torch.Tensor:
    """unimatch_v2.py 194-196 (fixmatch.py 189-191): thresholded CE over the valid pixels of one view."""
    mask_cutmixed, conf_cutmixed, ignore_cutmixed = _cutmixed(box, mask_u_w, conf_u_w, ignore_mask)
    loss = criterion_u(pred, mask_cutmixed)
    loss = loss * ((conf_cutmixed >= CONF_THRESH) & (ignore_cutmixed != 255))
    return loss.sum() / (ignore_cutmixed != 255).sum().item()


def _paste(image: torch.Tensor, box: torch.Tensor) -> None:
    """unimatch_v2.py 175-176 (fixmatch.py 176): the flipped batch pasted into ``box``, in place."""
    image[box.unsqueeze(1).expand(image.shape) == 1] = image.flip(0)[box.unsqueeze(1).expand(image.shape) == 1]


def unimatch_v2_losses(model: nn.Module, t: dict[str, torch.Tensor], kept: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """unimatch_v2.py 175-204 on the inputs ``t`` (the teacher's ``mask_u_w`` / ``conf_u_w`` in it)."""
    img_u_s1, img_u_s2 = t["img_u_s1"].clone(), t["img_u_s2"].clone()
    _paste(img_u_s1, t["box1"])
    _paste(img_u_s2, t["box2"])
    pred_x = model(t["img_x"])
    randperm = torch.randperm
    torch.randperm = lambda *a, **k: kept.append(randperm(*a, **k)) or kept[-1]  # record dpt.py 155's draw
    try:
        pred_u_s1, pred_u_s2 = model(torch.cat((img_u_s1, img_u_s2)), comp_drop=True).chunk(2)
    finally:
        torch.randperm = randperm
    criterion_u = nn.CrossEntropyLoss(reduction="none")
    losses = {"loss_x": nn.CrossEntropyLoss(ignore_index=255)(pred_x, t["mask_x"])}
    for name, pred, box in (("loss_u_s1", pred_u_s1, t["box1"]), ("loss_u_s2", pred_u_s2, t["box2"])):
        losses[name] = _strong_loss(criterion_u, pred, box, t["mask_u_w"], t["conf_u_w"], t["ignore_mask"])
    losses["loss"] = (losses["loss_x"] + (losses["loss_u_s1"] + losses["loss_u_s2"]) / 2.0) / 2.0
    return losses


def fixmatch_losses(model: nn.Module, t: dict[str, torch.Tensor], kept: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """fixmatch.py 176-193: one strong view (box 1), labeled and strong images in one pass."""
    img_u_s = t["img_u_s1"].clone()
    _paste(img_u_s, t["box1"])
    num_lb, num_ulb = t["img_x"].shape[0], img_u_s.shape[0]
    pred_x, pred_u_s = model(torch.cat((t["img_x"], img_u_s))).split([num_lb, num_ulb])
    losses = {"loss_x": nn.CrossEntropyLoss(ignore_index=255)(pred_x, t["mask_x"]),
              "loss_u_s": _strong_loss(nn.CrossEntropyLoss(reduction="none"), pred_u_s, t["box1"], t["mask_u_w"],
                                       t["conf_u_w"], t["ignore_mask"])}
    losses["loss"] = (losses["loss_x"] + losses["loss_u_s"]) / 2.0
    return losses


METHODS = {"unimatch_v2": unimatch_v2_losses, "fixmatch_v2": fixmatch_losses}


def record(checkout: Path, method: str) -> tuple[dict[str, np.ndarray], list[str]]:
    """One official step of ``method`` (a key of :data:`METHODS`) in :data:`DTYPE`: the arrays to store and the
    parameter names."""
    torch.set_num_threads(1)
    torch.manual_seed(SEED)  # dpt.py 155's randperm draws from the global generator
    data = inputs()
    model, model_ema = (official_dpt(checkout, salt).to(DTYPE) for salt in (STUDENT_SALT, TEACHER_SALT))
    with default_dtype(DTYPE):
        return _official_step(model, model_ema, data, method)


def _official_step(model: nn.Module, model_ema: nn.Module, data: dict[str, np.ndarray],
                   method: str) -> tuple[dict[str, np.ndarray], list[str]]:
    model.train()
    model_ema.eval()
    for param in model_ema.parameters():  # unimatch_v2.py 88-91
        param.requires_grad = False
    model.binomial = _Binomial(torch.from_numpy(data["bernoulli"]).to(DTYPE))
    optimizer = torch.optim.AdamW(  # unimatch_v2.py 67-73
        [{"params": [p for p in model.backbone.parameters() if p.requires_grad], "lr": LR},
         {"params": [p for n, p in model.named_parameters() if "backbone" not in n], "lr": LR * LR_MULTI}],
        lr=LR, betas=BETAS, weight_decay=WEIGHT_DECAY)
    t = {"img_x": normalise(torch.from_numpy(data["images_l"]).to(DTYPE)), "mask_x": torch.from_numpy(data["labels_l"]),
         "img_u_s1": normalise(torch.from_numpy(data["images_s1"]).to(DTYPE)),
         "img_u_s2": normalise(torch.from_numpy(data["images_s2"]).to(DTYPE)), "box1": torch.from_numpy(data["box1"]),
         "box2": torch.from_numpy(data["box2"]),
         "ignore_mask": torch.from_numpy(data["padding"]).long() * 255}  # dataset/semi.py 64-68: 255 where padded
    with torch.no_grad():  # unimatch_v2.py 170-173
        pred_u_w = model_ema(normalise(torch.from_numpy(data["images_w"]).to(DTYPE))).detach()
        t["conf_u_w"] = pred_u_w.softmax(dim=1).max(dim=1)[0]
        t["mask_u_w"] = pred_u_w.argmax(dim=1)
    kept: list[torch.Tensor] = []
    losses = METHODS[method](model, t, kept)
    optimizer.zero_grad()  # unimatch_v2.py 206-208
    losses["loss"].backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    optimizer.step()
    ema_ratio = min(1 - 1 / (ITERS + 1), EMA_CAP)  # unimatch_v2.py 221-226
    with torch.no_grad():
        for param, param_ema in zip(model.parameters(), model_ema.parameters()):
            param_ema.copy_(param_ema * ema_ratio + param.detach() * (1 - ema_ratio))
        for buffer, buffer_ema in zip(model.buffers(), model_ema.buffers()):
            buffer_ema.copy_(buffer_ema * ema_ratio + buffer.detach() * (1 - ema_ratio))
    out = dict(data, labels_l=data["labels_l"].astype(np.int16), padding=data["padding"].astype(np.uint8),
               box1=data["box1"].astype(np.uint8),
               box2=data["box2"].astype(np.uint8), conf_u_w=t["conf_u_w"].numpy(),
               mask_u_w=t["mask_u_w"].numpy().astype(np.int16),
               mask_ratio=np.array(float(((t["conf_u_w"] >= CONF_THRESH) & (t["ignore_mask"] != 255)).sum()
                                         / (t["ignore_mask"] != 255).sum())),  # unimatch_v2.py 213
               **{k: np.array(float(v.detach())) for k, v in losses.items()})
    if kept:
        out.update(kept=kept[0].numpy(), dropout_mask=_dropout_mask(data["bernoulli"], kept[0]))
    names = [n for n, _ in model.named_parameters() if n in grads]  # every parameter but the unused ones
    return {**out, **_digests(model, model_ema, grads, names)}, names


def _dropout_mask(bernoulli: np.ndarray, perm: torch.Tensor) -> np.ndarray:
    """dpt.py 151-159 with bs // 2 = B_U: the mask the official strong pass applied."""
    mask1 = torch.from_numpy(bernoulli) * 2.0
    mask2 = 2.0 - mask1
    num_kept = int(B_U * (1 - 0.5))
    mask1[perm[:num_kept]], mask2[perm[:num_kept]] = 1.0, 1.0
    return torch.cat((mask1, mask2)).numpy()


def resolved_sums(tensors: dict[str, torch.Tensor], names: list[str], resolved: list[torch.Tensor]) -> dict[str, np.ndarray]:
    """Per parameter of ``names``: the sum and the sum of |x| over its entries where ``resolved`` (its mask) is True."""
    flats = [tensors[n].detach().double().flatten()[mask] for n, mask in zip(names, resolved)]
    return {"resolved_sum": np.array([float(f.sum()) for f in flats]),
            "resolved_abs": np.array([float(f.abs().sum()) for f in flats])}


def _digests(model: nn.Module, model_ema: nn.Module, grads: dict[str, torch.Tensor], names: list[str]) -> dict:
    indices = sample_indices(model)
    resolved = [grads[n].flatten().abs() > RESOLVED for n in names]
    out = {"index": np.concatenate([indices[n] for n in names]),
           "grad/resolved": np.packbits(torch.cat(resolved).numpy())}
    for prefix, tensors in (("grad", grads), ("student", dict(model.named_parameters())),
                            ("ema", dict(model_ema.named_parameters()))):
        out.update({f"{prefix}/{k}": v for k, v in digest(tensors, names, indices).items()})
        out[f"{prefix}/qkv_bias"] = torch.stack([tensors[n].detach() for n in names if n.endswith("attn.qkv.bias")]).numpy()
        if prefix != "grad":
            out.update({f"{prefix}/{k}": v for k, v in resolved_sums(tensors, names, resolved).items()})
    return out


def _numels(checkout: Path, names: list[str]) -> list[int]:
    params = dict(official_dpt(checkout).named_parameters())
    return [params[n].numel() for n in names]


#: per method: the stem, the loop's file and lines (written out), what the step runs
SOURCES = {
    "unimatch_v2": ("unimatch_v2_step", "unimatch_v2.py", "170-208", "model/semseg/dpt.py 148-167 (comp_drop, imported "
                    "and run; the Binomial draw injected, randperm recorded)"),
    "fixmatch_v2": ("fixmatch_v2_step", "fixmatch.py", "171-199", "model/semseg/dpt.py 141-172 (DPT.forward without "
                    "comp_drop, imported and run)"),
}


def main(argv: list[str] | None = None) -> None:
    args = recorder_arguments(__doc__, "a checkout of UniMatch-V2", argv)
    commit = args.commit or official_commit(args.checkout)
    for method, (stem, loop_file, lines, network) in SOURCES.items():
        arrays, names = record(args.checkout, method)
        sidecar = {
            **official_sidecar(f"One training step of {loop_file} of UniMatch V2's repository "
                               "(tests/test_unimatch_v2_golden.py).", "https://github.com/LiheYoung/UniMatch-V2",
                               args.checkout, commit, (loop_file, *OFFICIAL_FILES[1:])),
            "sources": {"loop_body": f"{loop_file} {lines} (written out in the recorder), 212-217 / 221-226 (EMA)",
                        "optimizer": f"{loop_file} 67-73 / 68-73 (AdamW: two groups, betas (0.9, 0.999), weight decay "
                                     "0.01)", "network": network + "; the tiny official DPT of "
                                                                   "tests/golden/record_dinov2_dpt_golden.py"},
            "inputs": "the data pipeline's batch of the released unimatch_v2 cell on the synthetic dataset (crop "
                      f"{SIZE}, seed {SEED}): two strong views, one padded unlabeled crop, the project's CutMix box "
                      "draws",
            "compared": "losses, mask ratio, the EMA model's confidences and pseudo-labels, and sum, sum |x| and "
                        "sampled entries of the student's gradients and updated parameters and the EMA model's parameters",
            "command": f"PYTHONPATH=$PWD python tests/golden/record_unimatch_v2_golden.py CHECKOUT --commit {commit}",
            "sizes": {"B_l": B_L, "B_u": B_U, "size": SIZE, "seed": SEED, "iters": ITERS, "lr": LR,
                      "lr_multi": LR_MULTI, "weight_decay": WEIGHT_DECAY, "betas": list(BETAS),
                      "conf_thresh": CONF_THRESH, "cutmix_p": CUTMIX_P, "box_seed": BOX_SEED, "ema_cap": EMA_CAP,
                      "samples": SAMPLES, "resolved": RESOLVED,
                      "student_salt": STUDENT_SALT, "teacher_salt": TEACHER_SALT},
            "dtype": "float64: both networks (pattern weights, float32 values widened), images (stored as float32 "
                     "values), the Bernoulli draw and the default dtype of the step; float32 where dinov2.py 185 fixes "
                     "it (the position embedding's resize) and in the ImageNet constants (as the project's buffers)",
            "parameters": {"names": names, "samples": [int(min(SAMPLES, n)) for n in _numels(args.checkout, names)]},
            "torch": torch.__version__,
        }
        save_golden(args.out, stem, arrays, sidecar)
        print(f"{method}: " + ", ".join(f"{k} {float(arrays[k]):.6f}" for k in arrays if k.startswith("loss")))


if __name__ == "__main__":
    main()
