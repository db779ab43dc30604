"""Record one whole training step of UniMatch as LiheYoung/UniMatch runs it: ``tests/golden/unimatch_step_<setting>.npz``
(``setting`` = ``pascal`` or ``cityscapes``); ``record_fixmatch_step_golden.py`` records FixMatch's with the same code.

Usage (from the repository root; CHECKOUT is a checkout of LiheYoung/UniMatch)::

    PYTHONPATH=$PWD python tests/golden/record_unimatch_step_golden.py CHECKOUT [--out tests/golden]

What is official and what is not. The loop body of ``unimatch.py`` (``fixmatch.py``) is read from CHECKOUT at run time,
from ``for i, ((img_x, mask_x), ...`` to the line before ``eval_mode =``, and executed as it stands on one iteration
(``epoch`` 1, ``i`` 0 of ``ITERS_PER_EPOCH`` = 8, of ``EPOCHS`` = 3): the eval-mode prediction of the CutMix source, the
pasting, the train-mode passes (UniMatch's ``model(cat(img_x, img_u_w), True)``), every loss, ``backward``,
``optimizer.step()`` and the LR update after it. The optimiser is the official one (its three lines of ``main`` read
and executed too); before the iteration the LR update block of the body runs once for the previous iteration (``epoch``
0, ``i`` 7), so the step runs at the LR the official loop leaves for it. The model is the official ``DeepLabV3Plus``
(``model/semseg/deeplabv3plus.py``: its ``__init__``, ``forward`` with ``need_fp`` and ``_decode``; ASPP, reduce, fuse,
classifier at the official widths, 2048 -> 256, 256 -> 48, 304 -> 256) on the project's encoder: ``resnet.__dict__``
of the official module is given a factory returning the project's ResNet-50 (no pretrained file) behind
``base_forward``. The criteria are built as ``main`` builds them (``unimatch.py`` 68-75, written out; Cityscapes OHEM
with ``min_kept`` scaled to the tiny crop, :data:`OHEM_MIN_KEPT`, on both sides, so its selection runs). CUDA: the
body's ``.cuda()`` calls return the tensor and ``torch.distributed.barrier`` does nothing (one CPU process);
``rank`` is 1, so nothing is logged.

Random draws, recorded and injected: the inputs (labeled images and labels with an ignored band, the weak view, two
strong views, the padding mask, and the second draw of all of them: ``img_u_*_mix``, which the official loader yields
from its second iterator), the two CutMix boxes (``obtain_cutmix_box`` of the official ``dataset/transform.py``, drawn
here with seeded ``random`` / ``numpy``), and UniMatch's two ``Dropout2d(0.5)`` channel masks (``F.dropout2d``
replaced, on both sides, by a replay of masks drawn here: the input times ``mask / (1 - p)``). The photometric draws
need no injection: both sides get the same strong views. Weights (:func:`golden_model`): the project's model of
the cell with deterministic uniform weights (:func:`golden_weights`), the classifier's last layer scaled by
:data:`LOGIT_SCALE` so that about a third of the VOC pseudo-labels pass the 0.95 threshold, the project's
classifier-block conv biases (the official fuse convs have none; under BN in train mode a bias has no effect and a zero
gradient) set to 0, BN running statistics from :data:`WARMUP_PASSES` no-gradient train-mode passes; copied into the
official model (the ASPP projection's input blocks reordered: the project concatenates the pooling branch first, the
official last). Both networks run in float64: a 50-layer network with BN over 2 x 2 maps amplifies float32 round-off
(in float32 the thread count alone moves some gradient entries by 1e-2 of their tensor's largest), in float64 what
remains is the project's loss path, which computes in float32 by design.

Stored, in the project's parameter names: the inputs, boxes and masks; the official loss terms, mask
ratio and the LR of the step; for every parameter its gradient, and for every parameter and buffer after the official
SGD step: sum, sum of |x| and ``SAMPLES`` sampled entries (``record_mt_cps_golden.sample_indices``), packed per kind
(:func:`digest`).
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import random
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
import yaml
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script: its shared helpers
from record_mt_cps_golden import sample_indices  # noqa: E402
from recording import official_commit, recorder_arguments, save_golden  # noqa: E402

OFFICIAL_FILES = ("unimatch.py", "fixmatch.py", "model/semseg/deeplabv3plus.py", "util/ohem.py", "util/utils.py",
                  "dataset/transform.py", "configs/pascal.yaml", "configs/cityscapes.yaml")
#: the official config and the project's dataset of each setting
SETTINGS = {"pascal": ("configs/pascal.yaml", "synthetic"), "cityscapes": ("configs/cityscapes.yaml", "synthetic_cityscapes")}
B_L, B_U, SIZE = 2, 2, 32
SEED = 20262
ITERS_PER_EPOCH, EPOCHS, EPOCH = 8, 3, 1
#: the project's step index of the recorded iteration (epoch 1, i 0) and the run's length
STEP, TOTAL_STEPS = EPOCH * ITERS_PER_EPOCH, EPOCHS * ITERS_PER_EPOCH
OHEM_MIN_KEPT = 200
SAMPLES = 32
LOGIT_SCALE = 6.0
RESIDUAL_SCALE = 0.2
WARMUP_PASSES = 4
FEATURE_DROPOUT = 0.5
#: project module -> official module (``backbone`` behind the official ``base_forward`` wrapper's ``net``)
MODULES = {
    "backbone": "backbone.net",
    "decoder.aspp.0.branches.0.project.0": "head.b4.gap.1", "decoder.aspp.0.branches.0.project.1": "head.b4.gap.2",
    "decoder.aspp.0.branches.1": "head.b0", "decoder.aspp.0.branches.2": "head.b1",
    "decoder.aspp.0.branches.3": "head.b2", "decoder.aspp.0.branches.4": "head.b3",
    "decoder.aspp.1": "head.project", "decoder.low_level": "reduce",
    "head.classifier.0": "fuse.0", "head.classifier.1": "fuse.1", "head.classifier.4": "fuse.3",
    "head.classifier.5": "fuse.4", "head.classifier.8": "classifier",
}
#: the ASPP projection: the project's input blocks (pool, 1x1, 6, 12, 18), the official's (1x1, 6, 12, 18, pool)
PROJECTION = "decoder.aspp.1.0.weight"
#: the project's classifier-block conv biases: no official counterpart (zero, and zero gradient under BN)
UNMATCHED = ("head.classifier.0.bias", "head.classifier.4.bias")


def cell(framework: str, setting: str) -> dict[str, str]:
    return dict(framework=framework, dataset=SETTINGS[setting][1], partition="1/16", head="baseline",
                protocol="released")


def project_config(framework: str, setting: str, overrides: dict[str, Any] | None = None) -> Any:
    """The released cell of ``framework`` on the setting's synthetic dataset (paper preset: the official LR, LR
    multiplier, weight decay, threshold, criterion), ResNet-50 without a pretrained file."""
    from npsemiseg.config import compose

    base = {"model.weights": None, "loss.ohem_min_kept": OHEM_MIN_KEPT}
    return compose("paper", **cell(framework, setting), overrides={**base, **(overrides or {})}).config


def official_name(name: str) -> str:
    """The official model's name of the project's parameter or buffer ``name``."""
    for project, official in sorted(MODULES.items(), key=lambda kv: -len(kv[0])):
        if name.startswith(project + "."):
            return official + name[len(project):]
    raise KeyError(f"{name}: no official counterpart")


def to_official(name: str, tensor: torch.Tensor) -> torch.Tensor:
    if name != PROJECTION:
        return tensor
    width = tensor.shape[0]
    return torch.cat([tensor[:, width:], tensor[:, :width]], dim=1)


def to_project(name: str, tensor: torch.Tensor) -> torch.Tensor:
    if name != PROJECTION:
        return tensor
    width = tensor.shape[0]
    return torch.cat([tensor[:, -width:], tensor[:, :-width]], dim=1)


def golden_weights(name: str, shape: tuple[int, ...], salt: int) -> torch.Tensor:
    """Deterministic weights of parameter ``name``: uniform numbers of numpy's PCG64 stream seeded by ``(SEED,
    salt)`` (a stable stream), scaled as Kaiming-uniform (``sqrt(6 / fan_in)``) for weights, ``1 + 0.2 u`` for BN scales
    and ``0.2 u`` for biases, ``u`` in [-1, 1). A periodic pattern (``record_mt_cps_golden.pattern_weights``) makes a
    50-layer network's features nearly constant, its BN statistics degenerate and its outputs chaotic (the thread count
    alone moves the logits by 1e-2); these keep the step well conditioned."""
    u = 2.0 * np.random.default_rng([SEED, salt]).random(shape) - 1.0
    if len(shape) > 1:
        values = np.sqrt(6.0 / int(np.prod(shape[1:]))) * u
    else:
        values = (1.0 if name.endswith("weight") else 0.0) + 0.2 * u
        if name.endswith("bn3.weight"):  # a residual branch's last BN: small, as zero_init_residual starts it
            values = RESIDUAL_SCALE * values
    return torch.from_numpy(values).float()


def golden_model(model: nn.Module) -> nn.Module:
    """The project's ``model`` made the golden's network, in place: :func:`golden_weights` (the last classifier layer x
    :data:`LOGIT_SCALE`, the unmatched conv biases 0), float64, then BN statistics from :data:`WARMUP_PASSES`
    no-gradient train-mode passes on seeded images (in float64 they come out the same on any machine, so they are
    recomputed, not stored)."""
    with torch.no_grad():
        for i, (name, p) in enumerate(model.named_parameters()):
            p.copy_(golden_weights(name, tuple(p.shape), i))
            if name == "head.classifier.8.weight":
                p.mul_(LOGIT_SCALE)
            if name in UNMATCHED:
                p.zero_()
        model.double().train()
        gen = torch.Generator().manual_seed(SEED + 1)
        for _ in range(WARMUP_PASSES):
            model(torch.rand(B_L + B_U, 3, SIZE, SIZE, generator=gen, dtype=torch.float64))
    return model


def cutmix_boxes(checkout: Path) -> tuple[np.ndarray, np.ndarray]:
    """The two boxes of each unlabeled image, from the official ``obtain_cutmix_box`` (seeded; the first view always
    boxed, the second with p 0.5) and of the second draw's image (unused by the official step, as there)."""
    transform = official_module(checkout, "dataset.transform")
    random.seed(SEED)
    np.random.seed(SEED)
    box1 = np.stack([transform.obtain_cutmix_box(SIZE, p=1.0).numpy() for _ in range(B_U)])
    box2 = np.stack([transform.obtain_cutmix_box(SIZE, p=p).numpy() for p in (1.0, 0.0)])
    return box1, box2


def inputs(checkout: Path) -> dict[str, np.ndarray]:
    """Images as uint8 (``/ 255`` in float64: the project's input in [0, 1]; the official loop gets them normalised),
    labels, padding masks (True = padded, bottom rows / right columns as the official crop pads), boxes."""
    gen = torch.Generator().manual_seed(SEED)
    labels = torch.randint(0, 8, (B_L, SIZE, SIZE), generator=gen)
    labels[:, -5:] = 255
    out = {"images_l": torch.randint(0, 256, (B_L, 3, SIZE, SIZE), generator=gen, dtype=torch.uint8), "labels_l": labels}
    for suffix in ("", "_mix"):
        for key in ("image", "image_strong", "image_strong2"):
            out[key + suffix] = torch.randint(0, 256, (B_U, 3, SIZE, SIZE), generator=gen, dtype=torch.uint8)
        padding = torch.zeros(B_U, SIZE, SIZE, dtype=torch.bool)
        padding[0, :, -7 if suffix else -4:] = True
        padding[1, -6 if suffix else -3:] = True
        out["padding" + suffix] = padding
    arrays = {k: v.numpy() for k, v in out.items()}
    arrays["box1"], arrays["box2"] = cutmix_boxes(checkout)
    return arrays


class MaskReplay:
    """``F.dropout2d`` for the feature perturbation (p = :data:`FEATURE_DROPOUT`): the input times ``mask / (1 - p)``,
    masks drawn here (``masks`` None: recorded into :attr:`masks`) or replayed in call order; other rates: the real
    function (p = 0: the input)."""

    def __init__(self, masks: list[np.ndarray] | None = None) -> None:
        self.replay = masks is not None
        self.masks = list(masks) if masks is not None else []
        self.calls = 0
        self.generator = torch.Generator().manual_seed(SEED + 2)
        self.real = F.dropout2d

    def __call__(self, input: torch.Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> torch.Tensor:
        if p != FEATURE_DROPOUT:
            return self.real(input, p, training, inplace)
        shape = (*input.shape[:2], 1, 1)
        if self.replay:
            mask = torch.from_numpy(self.masks[self.calls])
            if tuple(mask.shape) != shape:
                raise ValueError(f"dropout2d call {self.calls}: recorded mask {tuple(mask.shape)}, input needs {shape}")
        else:
            mask = torch.bernoulli(torch.full(shape, 1 - p), generator=self.generator)
            self.masks.append(mask.numpy())
        self.calls += 1
        return input * (mask / (1 - p))

    @contextlib.contextmanager
    def installed(self) -> Iterator[MaskReplay]:
        torch.nn.functional.dropout2d = self
        try:
            yield self
        finally:
            torch.nn.functional.dropout2d = self.real


@contextlib.contextmanager
def official_path(checkout: Path) -> Iterator[None]:
    """CHECKOUT first on ``sys.path`` with its packages (``model``, ``util``, ``dataset``) freshly imported."""
    names = ("model", "util", "dataset")
    saved = {k: v for k, v in sys.modules.items() if k.split(".")[0] in names}
    for k in saved:
        sys.modules.pop(k)
    sys.path.insert(0, str(checkout))
    try:
        yield
    finally:
        sys.path.remove(str(checkout))
        for k in [k for k in sys.modules if k.split(".")[0] in names]:
            sys.modules.pop(k)
        sys.modules.update(saved)


def official_module(checkout: Path, dotted: str) -> Any:
    import importlib

    with official_path(checkout):
        return importlib.import_module(dotted)


class ProjectEncoder(nn.Module):
    """The official ``backbone.base_forward`` (``[c1, c2, c3, c4]``; the decoder reads the first and last) on the
    project's encoder."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def base_forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        features = self.net(x)
        return [features.low_level, features.layer3, features.high_level]


def official_model(checkout: Path, project: nn.Module, cfg: dict) -> nn.Module:
    """The official ``DeepLabV3Plus(cfg)`` on a copy of the project's encoder, every tensor copied from ``project``."""
    deeplab = official_module(checkout, "model.semseg.deeplabv3plus")
    encoder = copy.deepcopy(project.backbone)
    deeplab.resnet.__dict__["project_resnet"] = lambda **kwargs: ProjectEncoder(encoder)
    model = deeplab.DeepLabV3Plus({**cfg, "backbone": "project_resnet"}).to(project.mean.dtype)
    state = model.state_dict()
    with torch.no_grad():
        for name, t in project.state_dict().items():
            if name not in UNMATCHED:
                state[official_name(name)].copy_(to_official(name, t))
    missing = set(state) - {official_name(n) for n in project.state_dict() if n not in UNMATCHED}
    if missing:
        raise ValueError(f"official tensors without a project counterpart: {sorted(missing)}")
    return model


def loop_text(checkout: Path, framework: str) -> tuple[str, str, str]:
    """The official loop body (the ``for`` statement over ``loader``), its LR update block and the optimiser's
    lines of ``main``, read from ``<framework>.py``."""
    lines = (checkout / f"{framework}.py").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("for i, ((img_x, mask_x),"))
    end = next(i for i in range(start, len(lines)) if lines[i].strip().startswith("eval_mode ="))
    body = textwrap.dedent("\n".join(lines[start:end]))
    first = next(i for i in range(start, end) if lines[i].strip().startswith("iters = epoch"))
    lr_update = textwrap.dedent("\n".join(lines[first:first + 4]))
    opt = next(i for i, line in enumerate(lines) if line.strip().startswith("optimizer = SGD("))
    optimizer = textwrap.dedent("\n".join(lines[opt:opt + 3]))
    return body, lr_update, optimizer


def image(images: np.ndarray) -> torch.Tensor:
    """Stored uint8 images as float64 in [0, 1] (the project's input)."""
    return torch.from_numpy(images).double() / 255.0


def normalise(images: np.ndarray) -> torch.Tensor:
    """The project's normalisation (``Segmentor.encode``) of the stored images: the official loader's ``normalize``."""
    mean = torch.tensor((0.485, 0.456, 0.406)).view(1, 3, 1, 1)
    std = torch.tensor((0.229, 0.224, 0.225)).view(1, 3, 1, 1)
    return (image(images) - mean.double()) / std.double()


def official_batch(data: dict[str, np.ndarray]) -> tuple:
    """The three loader items of ``zip(trainloader_l, trainloader_u, trainloader_u)`` (unimatch.py 121-125)."""
    def draw(suffix: str, boxes: tuple) -> tuple:
        ignore = torch.from_numpy(data["padding" + suffix]).long() * 255
        return (normalise(data["image" + suffix]), normalise(data["image_strong" + suffix]),
                normalise(data["image_strong2" + suffix]), ignore, *boxes)

    boxes = (torch.from_numpy(data["box1"]), torch.from_numpy(data["box2"]))
    return ((normalise(data["images_l"]), torch.from_numpy(data["labels_l"])), draw("", boxes),
            draw("_mix", (torch.zeros_like(boxes[0]), torch.zeros_like(boxes[1]))))


def criterion(checkout: Path, cfg: dict) -> nn.Module:
    """unimatch.py 68-73: CE or the official OHEM with the config's keywords (``min_kept`` :data:`OHEM_MIN_KEPT`)."""
    kwargs = dict(cfg["criterion"]["kwargs"])
    if cfg["criterion"]["name"] == "OHEM":
        kwargs["min_kept"] = OHEM_MIN_KEPT
        return official_module(checkout, "util.ohem").ProbOhemCrossEntropy2d(**kwargs)
    return nn.CrossEntropyLoss(**kwargs)


@contextlib.contextmanager
def one_cpu_process() -> Iterator[None]:
    """``Tensor.cuda`` returns the tensor and ``torch.distributed.barrier`` does nothing."""
    cuda, barrier = torch.Tensor.cuda, torch.distributed.barrier
    torch.Tensor.cuda = lambda self, *args, **kwargs: self
    torch.distributed.barrier = lambda *args, **kwargs: None
    try:
        yield
    finally:
        torch.Tensor.cuda, torch.distributed.barrier = cuda, barrier


def official_config(checkout: Path, setting: str, num_classes: int) -> dict:
    """The setting's official config with the project's class count."""
    return {**yaml.safe_load((checkout / SETTINGS[setting][0]).read_text()), "nclass": num_classes}


def run_official(checkout: Path, framework: str, cfg: dict, model: nn.Module, data: dict[str, np.ndarray],
                 replay: MaskReplay) -> dict[str, Any]:
    """One official iteration; returns the loop's namespace after it (losses, optimiser, mask ratio)."""
    body, lr_update, optimizer_lines = loop_text(checkout, framework)
    meter = official_module(checkout, "util.utils").AverageMeter
    namespace: dict[str, Any] = {"torch": torch, "nn": nn, "SGD": torch.optim.SGD, "cfg": cfg, "model": model}
    exec(optimizer_lines, namespace)  # noqa: S102 - the official main's optimiser
    namespace.update(criterion_l=criterion(checkout, cfg), criterion_u=nn.CrossEntropyLoss(reduction="none"),
                     trainloader_u=range(ITERS_PER_EPOCH), total_iters=TOTAL_STEPS, rank=1, writer=None, logger=None,
                     **{f"total_{k}": meter() for k in ("loss", "loss_x", "loss_s", "loss_w_fp", "mask_ratio")})
    namespace.update(epoch=0, i=ITERS_PER_EPOCH - 1)
    exec(lr_update, namespace)  # noqa: S102 - the LR the previous iteration leaves
    namespace["lr_step"] = namespace["optimizer"].param_groups[0]["lr"]
    namespace.update(epoch=EPOCH, loader=[official_batch(data)])
    with one_cpu_process(), replay.installed():
        exec(body, namespace)  # noqa: S102 - the official loop body, one iteration
    return namespace


def digest(prefix: str, named: dict[str, torch.Tensor], indices: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Sum, sum of |values| and the sampled entries of every tensor of ``named`` (project names), as float64, packed:
    ``<prefix>/names`` [n], ``<prefix>/sum`` and ``<prefix>/abs`` [n], ``<prefix>/index`` [n, SAMPLES] (-1 past a small
    tensor's size) and ``<prefix>/at`` [n, SAMPLES] (NaN there)."""
    names = list(named)
    index = np.full((len(names), SAMPLES), -1, dtype=np.int32)
    at = np.full((len(names), SAMPLES), np.nan)
    total, absolute = np.zeros(len(names)), np.zeros(len(names))
    for row, name in enumerate(names):
        flat = named[name].detach().double().flatten()
        total[row], absolute[row] = float(flat.sum()), float(flat.abs().sum())
        picked = indices[name]
        index[row, :picked.size] = picked
        at[row, :picked.size] = flat[torch.from_numpy(picked).long()].numpy()
    return {f"{prefix}/names": np.array(names), f"{prefix}/sum": total, f"{prefix}/abs": absolute,
            f"{prefix}/index": index, f"{prefix}/at": at}


def in_project_names(model: nn.Module, project: nn.Module, grads: bool = False) -> dict[str, torch.Tensor]:
    """The official ``model``'s parameters (their gradients with ``grads``) and buffers under the project's names."""
    official = {**dict(model.named_parameters()), **({} if grads else dict(model.named_buffers()))}
    params = [n for n, _ in project.named_parameters()]
    names = params if grads else params + [n for n in project.state_dict() if n not in params]  # persistent buffers
    return {n: to_project(n, official[official_name(n)].grad if grads else official[official_name(n)])
            for n in names if n not in UNMATCHED}


def record(checkout: Path, framework: str, setting: str) -> tuple[dict[str, np.ndarray], dict]:
    from npsemiseg.training import build_model

    torch.manual_seed(0)
    torch.set_num_threads(1)
    project = golden_model(build_model(project_config(framework, setting)))
    data = inputs(checkout)
    replay = MaskReplay()
    cfg = official_config(checkout, setting, project.num_classes)
    model = official_model(checkout, project, cfg)
    namespace = run_official(checkout, framework, cfg, model, data, replay)
    indices = sample_indices(project)
    out = dict(data)
    out.update({f"mask/{i}": m for i, m in enumerate(replay.masks)})
    terms = ("loss", "loss_x", "loss_u_s1", "loss_u_s2", "loss_u_w_fp") if framework == "unimatch" else (
        "loss", "loss_x", "loss_u_s")
    out.update({f"official/{k}": np.array(float(namespace[k].detach())) for k in terms})
    out["official/mask_ratio"] = np.array(float(namespace["mask_ratio"]))
    out["official/lr_step"] = np.array(namespace["lr_step"])
    out["official/lr_next"] = np.array(namespace["optimizer"].param_groups[0]["lr"])
    out.update(digest("grad", in_project_names(model, project, grads=True), indices))
    out.update(digest("after", in_project_names(model, project), indices))
    meta = {"cfg": SETTINGS[setting][0], "terms": list(terms), "feature_masks": len(replay.masks)}
    return out, meta


def project_step(framework: str, setting: str, data: dict[str, np.ndarray],
                 overrides: dict[str, Any] | None = None) -> tuple[Any, dict[str, float]]:
    """The project's side of the golden: ``npsemiseg.training.step.train_step`` of the released cell (``overrides`` on
    top) on the recorded network, inputs, boxes and feature masks, at step :data:`STEP` of :data:`TOTAL_STEPS`.
    Returns the framework (its student after the SGD step, gradients kept) and the step's logs."""
    from npsemiseg.frameworks.base import Batch, StepContext
    from npsemiseg.training import build_framework
    from npsemiseg.training.factories import build_optimizer
    from npsemiseg.training.step import train_step

    torch.manual_seed(0)
    config = project_config(framework, setting, overrides)
    fw = build_framework(config)
    golden_model(fw.student)
    boxes = [torch.from_numpy(data[k]).bool() for k in ("box1", "box2")]
    fw.draw_boxes = lambda *args: boxes[:len(fw.strong_weights)]
    keys = [k + s for s in ("", "_mix") for k in ("image", "image_strong", "image_strong2", "padding")]
    batch = Batch(labeled={"image": image(data["images_l"]), "label": torch.from_numpy(data["labels_l"])},
                  unlabeled={k: image(data[k]) if k.startswith("image") else torch.from_numpy(data[k]) for k in keys})
    masks = [data[f"mask/{i}"] for i in range(sum(k.startswith("mask/") for k in data))]
    ctx = StepContext(step=STEP, total_steps=TOTAL_STEPS, epoch=EPOCH, total_epochs=EPOCHS,
                      iters_per_epoch=ITERS_PER_EPOCH)
    with MaskReplay(masks).installed():
        logs = train_step(fw, batch, ctx, build_optimizer(config, fw.student), config, torch.device("cpu"), 1)
    return fw, logs


#: the project's loss terms as weights x the official terms (unimatch.py 188, fixmatch.py 166)
TERMS = {"unimatch": {"sup": (0.5, "loss_x"), "unsup_s1": (0.125, "loss_u_s1"), "unsup_s2": (0.125, "loss_u_s2"),
                      "unsup_fp": (0.25, "loss_u_w_fp"), "loss": (1.0, "loss")},
         "fixmatch": {"sup": (0.5, "loss_x"), "unsup": (0.5, "loss_u_s"), "loss": (1.0, "loss")}}


def step_differences(framework: str, fw: Any, logs: dict[str, float], data: dict[str, np.ndarray]) -> dict[str, float]:
    """Relative |difference| of every compared quantity between the project's step (``fw`` after
    :func:`project_step`, its ``logs``) and the record: loss terms and mask ratio (relative to max(1, |official|)), the
    LR (relative), and per parameter its gradient and per parameter and buffer its value after the step (sampled
    entries relative to their largest official |entry|, sum and sum |x| relative to the official sum |x|). The
    project's unmatched conv biases: their gradient relative to the largest gradient entry of their layer's weight."""
    official = {k: w * float(data[f"official/{o}"]) for k, (w, o) in TERMS[framework].items()}
    diffs = {f"term/{k}": abs(logs[f"train/{k}"] - v) / max(1.0, abs(v)) for k, v in official.items()}
    diffs["mask_ratio"] = abs(logs["train/mask_ratio"] - float(data["official/mask_ratio"]))
    diffs["lr"] = abs(logs["train/lr"] - float(data["official/lr_step"])) / float(data["official/lr_step"])
    params, state = dict(fw.student.named_parameters()), fw.student.state_dict()
    for prefix in ("grad", "after"):
        for row, name in enumerate(data[f"{prefix}/names"]):
            flat = (params[name].grad if prefix == "grad" else state[name]).detach().double().flatten()
            picked = data[f"{prefix}/index"][row] >= 0
            ref = data[f"{prefix}/at"][row][picked]
            at = flat[torch.from_numpy(data[f"{prefix}/index"][row][picked]).long()].numpy()
            scale = max(float(data[f"{prefix}/abs"][row]), 1e-30)
            largest = float(np.abs(ref).max())
            diffs[f"{prefix}/{name}"] = max(
                float(np.abs(at - ref).max()) / (largest if largest else 1.0),
                abs(float(flat.sum()) - float(data[f"{prefix}/sum"][row])) / scale,
                abs(float(flat.abs().sum()) - float(data[f"{prefix}/abs"][row])) / scale)
    for name in UNMATCHED:
        weight = params[name.removesuffix("bias") + "weight"].grad
        diffs[f"unmatched/{name}"] = float(params[name].grad.abs().max() / weight.abs().max())
    return diffs


def sources(framework: str, config: str) -> dict[str, str]:
    """What of the official checkout the record ran, and how (read and executed, imported, written out)."""
    return {
        "loop_body": f"{framework}.py, the 'for i, ((img_x, mask_x), ...' statement up to 'eval_mode =' (read and "
                     "executed: one iteration)",
        "optimizer": f"{framework}.py 'optimizer = SGD(' (three lines, read and executed)",
        "model": "model/semseg/deeplabv3plus.py DeepLabV3Plus (imported; its encoder the project's)",
        "criterion": "unimatch.py 68-75 (written out), util/ohem.py (imported)",
        "boxes": "dataset/transform.py obtain_cutmix_box (imported, seeded)",
        "config": config,
    }


def changed(data: dict[str, np.ndarray], change: str) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The record's inputs and the overrides of one guarded change: ``no_padding`` (no padded pixel in either draw)
    or ``switches.<name>=<value>`` (a switch at another value)."""
    if change == "no_padding":
        return {**data, "padding": data["padding"] & False, "padding_mix": data["padding_mix"] & False}, {}
    key, value = change.split("=")
    return data, {key: float(value) if value[0].isdigit() else value}


def main(argv: list[str] | None = None, framework: str = "unimatch") -> None:
    args = recorder_arguments(__doc__, "a checkout of LiheYoung/UniMatch", argv)
    commit = args.commit or official_commit(args.checkout)
    for setting in SETTINGS:
        arrays, meta = record(args.checkout, framework, setting)
        sidecar = {
            "about": f"One whole training step of {framework} as LiheYoung/UniMatch runs it, {setting} settings "
                     f"(tests/test_{framework}_step_golden.py).",
            "repository": "https://github.com/LiheYoung/UniMatch",
            "commit": commit,
            "official_file_sha256": {f: hashlib.sha256((args.checkout / f).read_bytes()).hexdigest()
                                     for f in OFFICIAL_FILES},
            "sources": sources(framework, meta["cfg"]),
            "compared": "losses, mask ratio, LR; gradient, and after the SGD step value, of every parameter and "
                        "buffer (sum, sum |x|, sampled entries)",
            "command": f"PYTHONPATH=$PWD python tests/golden/record_{framework}_step_golden.py CHECKOUT --commit {commit}",
            "sizes": {"B_l": B_L, "B_u": B_U, "size": SIZE, "seed": SEED, "step": STEP, "total_steps": TOTAL_STEPS,
                      "ohem_min_kept": OHEM_MIN_KEPT, "logit_scale": LOGIT_SCALE, "samples": SAMPLES,
                      "cell": cell(framework, setting)},
            "official_values": meta,
            "torch": torch.__version__,
        }
        save_golden(args.out, f"{framework}_step_{setting}", arrays, sidecar)
        print(setting, {k: round(float(v), 6) for k, v in arrays.items() if k.startswith("official/")})


if __name__ == "__main__":
    main()
