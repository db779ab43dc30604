"""The project's training step side by side with the official code's: same network, batch and device, interleaved.

For each framework, two sides take turns (official, project, official, project, ...) on the same batches:

- **official**: the loop body of the official training script, run from a checkout given on the command line
  (``--official-root``; nothing of it is copied into the project). The body is the script's own ``for ... in
  enumerate(loader)`` loop, found in its source with :mod:`ast` and executed as written for one batch, with two
  changes only: ``x.cuda()`` becomes ``x.to(device)`` (so it also runs on CPU) and ``torch.distributed.barrier()``
  is dropped (one process, no DDP or SyncBN wrapper, as the project's side). Its logging runs too (``.item()``
  reads, ``AverageMeter``), into a writer and a logger that discard what they get. The network is the official
  model class (UniMatch ``model/semseg/deeplabv3plus.py``: ASPP, low-level reduction, fuse convs, classifier and its
  ``need_fp`` feature perturbation) on the project's encoder: the official class asks its ``resnet`` module for a
  pretrained backbone, which is replaced, for its constructor only, by the project's ResNet (``--backbone``, random
  init) behind the official ``base_forward`` interface. Every decoder weight is copied from the project's model
  (the ASPP projection's input blocks reordered: the project concatenates the image-pooling branch first, UniMatch
  last); the project's classifier convs have a bias that the official fuse convs lack, set to zero, so both sides
  compute the same function (checked: the eval-mode logits agree, ``max_abs_logit_diff``). The optimiser is the
  official one (SGD, backbone at ``lr``, the rest at ``lr x lr_multi``, momentum 0.9, weight decay 1e-4) with the
  settings of ``configs/pascal.yaml``.
  U2PL: the body of ``train_semi.py``'s ``for step in range(len(loader_l))`` in ``train`` (run for one step at
  epoch 2: past the supervised-only epoch and its teacher copy), VOC 1464's ``experiments/pascal/1464/ours/
  config.yaml``, ``ModelBuilder`` with the project's encoder (its ``_build_encoder`` replaced for the constructor
  only) and every decoder, classifier and representation weight copied (conv biases only U2PL has set to zero),
  the teacher a copy of the student, the memory bank, optimiser and LR scheduler as ``main`` builds them. Its
  ``torch.distributed`` calls run in a one-rank process group (gloo on CPU, NCCL on CUDA), which the project's step
  then also sees. The helpers the loop calls (``u2pl/utils/loss_helper.py``, ``u2pl/utils/utils.py``) get the same
  ``.cuda()`` change; ``cv2`` and ``skimage``, imported at their top and unused by the step, are stand-ins where
  they are not installed.
  NP-SemiSeg's U2PL (row ``u2pl_np``, beside the project's ``u2pl`` x ``np`` cell): the same loop of the authors'
  ``U2PL/train_semi.py`` (Jianf-Wang/NP-SemiSeg), run as U2PL's (epoch 2, one-rank group, their helpers with the
  ``.cuda()`` change, the same stand-ins), with their ``experiments/pascal/1323/np/config.yaml`` (they release no
  1464 configuration; the step's settings are U2PL's 1464 ones but the crop and the batch, which come from the
  inputs). Their ``ModelBuilder`` with their decoder and ``NP_HEAD`` runs on the project's encoder (their ResNet
  needs ImageNet weights and SyncBN on CUDA), the decoder weights copied as for U2PL, the NP head's from the
  project's NP head through the golden recorder's mapping (``HEAD_MAP`` of ``tests/golden/
  record_np_u2pl_step_golden.py``, imported); their plain ``classifier``, built but unused by their forward, keeps
  its initial weights. The NP memories are ``main``'s (one zero row of width 32 per class) and their centers
  ``train``'s at the start of its epoch, computed from those. The NP predictions are sampled, so the agreement
  checked is that of the eval-mode representation, the NP query transform and the NP decoder on one draw.
- **project**: ``npsemiseg.training.step.train_step`` of the cell (protocol ``released``, preset ``paper``,
  dataset ``synthetic_voc``) built with ``build_framework`` / ``build_optimizer``, in float32 (``runtime.amp``
  off, as the official code; ``--project-amp`` turns the project's bf16 autocast on where CUDA is used).

Inputs: random images in [0, 1] (the official side gets them normalised with ImageNet's mean and std, as its
data loader does; the project's model normalises inside), labels with an ignored border, and for the official
side what its loader would give: two strong views (the project's ``image_strong`` and ``image_strong2``),
an all-valid ``ignore_mask``, CutMix boxes drawn with UniMatch's rule on the host (``unimatch_boxes``) and a mix
batch (the unlabeled batch shifted by one image; the project's step makes its own boxes and gets the same mix
batch as its ``*_mix`` draw, where its framework takes one). Each side
gets fresh copies of the host tensors every step (pinned on CUDA) and moves them to the device inside its step.

Measured per side: wall time per step (device synchronised before and after) and the process's CPU seconds in
it (the steadier figure on a shared CPU; on a GPU the host's work), medians over ``--steps`` after ``--warmup``
steps (reported apart), and peak memory: the side's own state (parameters, buffers, gradients and
optimiser state) plus the step's rise above what was allocated when it started (``max_memory_allocated`` on CUDA;
on CPU the process's resident high-water mark after ``malloc_trim``, a coarser proxy), so that the other side's
resident model is not counted. Ratios are project / official (< 1: the project is faster or smaller).

A framework whose side fails is recorded with its error and the others go on. Output: ``side_by_side.json`` and
``side_by_side.md`` under ``--out``.

    python benchmarks/official_side_by_side.py --official-root /path/to/checkouts                  # CPU, paper scale
    python benchmarks/official_side_by_side.py --official-root DIR --device cuda --steps 10
    python benchmarks/official_side_by_side.py --official-root DIR --backbone resnet50 --crop 64 --batch 2 --steps 1
    python benchmarks/official_side_by_side.py --official-root DIR --frameworks u2pl u2pl_np --backbone resnet50 --crop 128

``--official-root`` holds the checkouts as ``<owner>+<repo>`` (``LiheYoung+UniMatch``) or ``<repo>`` folders.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import copy
import datetime
import importlib
import json
import platform
import shlex
import socket
import statistics
import sys
import time
import traceback
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
import yaml
from torch import Tensor, nn

from npsemiseg.config import RunConfig, cell_config
from npsemiseg.frameworks import Batch, StepContext
from npsemiseg.frameworks.ema import unwrap
from npsemiseg.frameworks.fixmatch import unimatch_boxes
from npsemiseg.models import upsample_logits
from npsemiseg.training.factories import build_framework, build_optimizer
from npsemiseg.training.step import train_step

from gpu_acceptance import machine, peak_memory_mib, reset_peak_memory, synchronize
from host_work import HostWork

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "official_side_by_side"
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
NUM_CLASSES = 21
IGNORE = 255
#: framework -> (official repository, training script)
OFFICIAL = {"unimatch": ("LiheYoung/UniMatch", "unimatch.py"), "fixmatch": ("LiheYoung/UniMatch", "fixmatch.py"),
            "u2pl": ("Haochen-Wang409/U2PL", "train_semi.py"), "u2pl_np": ("Jianf-Wang/NP-SemiSeg", "U2PL/train_semi.py")}
#: row -> the project's (framework, head) beside it
ROWS = {"unimatch": ("unimatch", "baseline"), "fixmatch": ("fixmatch", "baseline"), "u2pl": ("u2pl", "baseline"),
        "u2pl_np": ("u2pl", "np")}
#: U2PL's VOC 1464 configuration (the paper's setting of the NP-SemiSeg comparison)
U2PL_CONFIG = "experiments/pascal/1464/ours/config.yaml"
#: the NP-SemiSeg authors' U2PL configuration nearest to it (they release 732 and 1323 only; the step's settings are
#: U2PL's but for the crop, 480, and the batch, 3, which ``--crop`` and ``--batch`` set on both sides anyway)
NP_U2PL_CONFIG = "experiments/pascal/1323/np/config.yaml"


# ----------------------------------------------------------------------------------------- official code


def checkout(root: Path, repository: str) -> Path:
    """The checkout of ``owner/repo`` under ``root``: ``owner+repo`` or ``repo``, spelt in any case (GitHub's names
    are case-insensitive: ``ZhenZHAO+AugSeg`` serves ``zhenzhao/AugSeg``); FileNotFoundError naming both."""
    owner, name = repository.split("/")
    wanted = [f"{owner}+{name}", name]
    present = {entry.name.lower(): entry for entry in root.iterdir() if entry.is_dir()} if root.is_dir() else {}
    for folder in wanted:
        if (root / folder).is_dir():
            return root / folder
        if folder.lower() in present:
            return present[folder.lower()]
    raise FileNotFoundError(f"--official-root: no checkout of {repository} at {root / f'{owner}+{name}'} or {root / name}")


@contextlib.contextmanager
def official_imports(folder: Path) -> Iterator[None]:
    """``folder`` first on ``sys.path`` while importing; afterwards the modules it provided leave ``sys.modules``
    (the repositories share top-level names such as ``model`` and ``util``), held only by what imported them."""
    before = set(sys.modules)
    sys.path.insert(0, str(folder))
    try:
        yield
    finally:
        sys.path.remove(str(folder))
        for name in set(sys.modules) - before:
            if str(folder) in str(getattr(sys.modules[name], "__file__", "") or ""):
                del sys.modules[name]


class _OnDevice(ast.NodeTransformer):
    """``x.cuda(...)`` -> ``x.to(__device__)``; the statement ``torch.distributed.barrier()`` -> ``pass``."""

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        if isinstance(node.func, ast.Attribute) and node.func.attr == "cuda":
            return ast.Call(func=ast.Attribute(value=node.func.value, attr="to", ctx=ast.Load()),
                            args=[ast.Name("__device__", ast.Load())], keywords=[])
        return node

    def visit_Expr(self, node: ast.Expr) -> ast.AST:
        if ast.unparse(node.value) == "torch.distributed.barrier()":
            return ast.Pass()
        return self.generic_visit(node)


def loop_body(script: Path, loop: str = "enumerate(loader)", run: str = "enumerate(loader, start=__step__)") -> types.CodeType:
    """The script's training loop ``for ... in <loop>``, compiled to run ``for ... in <run>`` from a namespace (the
    defaults: ``loader`` holds the batches to run, ``__step__`` the first ``i``): :class:`_OnDevice`'s two changes
    only."""
    tree = ast.parse(script.read_text(), filename=str(script))
    found = [node for node in ast.walk(tree) if isinstance(node, ast.For) and ast.unparse(node.iter) == loop]
    if len(found) != 1:
        raise ValueError(f"{script}: expected one 'for ... in {loop}' loop, found {len(found)}")
    body = _OnDevice().visit(copy.deepcopy(found[0]))
    body.iter = ast.parse(run, mode="eval").body
    module = ast.fix_missing_locations(ast.Module(body=[body], type_ignores=[]))
    return compile(module, str(script), "exec")


class _Discard:
    """The official writer and logger: every call accepted, nothing kept."""

    def __getattr__(self, name: str) -> Callable[..., None]:
        return lambda *args, **kwargs: None


class _Length:
    """``len(trainloader_u)``: a long epoch (the loop logs when ``i % (len // 8) == 0``)."""

    def __len__(self) -> int:
        return 10**6


class ProjectEncoder(nn.Module):
    """The project's ResNet behind the official ``base_forward`` (``[c1, c2, c3, c4]``; c2 is not computed
    separately by the project, layer 3 stands in its place and is unused by the official decoder)."""

    def __init__(self, backbone: nn.Module) -> None:
        super().__init__()
        self.body = backbone

    def base_forward(self, x: Tensor) -> list[Tensor]:
        features = self.body(x)
        return [features.low_level, features.layer3, features.layer3, features.high_level]

    def forward(self, x: Tensor) -> list[Tensor]:
        """U2PL's encoder call (``fpn=True``): the same four maps."""
        return self.base_forward(x)

    def get_outplanes(self) -> int:
        """U2PL's decoder asks its encoder for the layer-4 width."""
        return self.body.channels["high_level"]


def _load(dst: nn.Module, src: nn.Module) -> None:
    dst.load_state_dict(src.state_dict())


def _copy_conv(dst: nn.Conv2d, src: nn.Conv2d) -> None:
    """``src``'s weight (and bias) into ``dst``; a bias only one side has is set to zero on that side, so both
    compute the same function."""
    dst.weight.copy_(src.weight)
    if dst.bias is not None and src.bias is not None:
        dst.bias.copy_(src.bias)
    elif dst.bias is not None or src.bias is not None:
        (dst.bias if dst.bias is not None else src.bias).zero_()  # type: ignore[union-attr]


def _copy_block(dst: nn.Sequential, src: nn.Sequential, pairs: tuple[tuple[int, int], ...]) -> None:
    """Conv-BN blocks: ``dst[i]`` from ``src[j]`` for each ``(i, j)``, convolutions through :func:`_copy_conv`."""
    for i, j in pairs:
        if isinstance(dst[i], nn.Conv2d):
            _copy_conv(dst[i], src[j])
        else:
            _load(dst[i], src[j])


def _aspp_projection(dst: nn.Conv2d, weight: Tensor) -> None:
    """The ASPP projection of the project (input blocks: image pooling, 1x1, rates) in UniMatch's block order
    (1x1, rates, image pooling)."""
    width = weight.shape[0]
    dst.weight.copy_(torch.cat([weight[:, width:], weight[:, :width]], dim=1))


def unimatch_network(folder: Path, cfg: dict[str, Any], student: nn.Module) -> nn.Module:
    """UniMatch's ``DeepLabV3Plus`` on a copy of ``student``'s encoder, its decoder weights copied from
    ``student`` (module docstring); the student's classifier conv biases are zeroed to match."""
    with official_imports(folder):
        deeplab = importlib.import_module("model.semseg.deeplabv3plus")
    encoder = ProjectEncoder(copy.deepcopy(student.backbone))
    official_resnet = deeplab.resnet
    deeplab.resnet = types.SimpleNamespace(**{cfg["backbone"]: lambda **kwargs: encoder})
    try:
        net = deeplab.DeepLabV3Plus(cfg)
    finally:
        deeplab.resnet = official_resnet
    branches, project = student.decoder.aspp[0].branches, student.decoder.aspp[1]
    with torch.no_grad():
        for official_branch, ours in zip((net.head.b0, net.head.b1, net.head.b2, net.head.b3), branches[1:]):
            _copy_block(official_branch, ours, ((0, 0), (1, 1)))
        _copy_block(net.head.b4.gap, branches[0].project, ((1, 0), (2, 1)))  # gap = (pool, conv, BN, ReLU)
        _copy_block(net.head.project, project, ((0, 0), (1, 1)))
        _aspp_projection(net.head.project[0], project[0].weight)
        _copy_block(net.reduce, student.decoder.low_level, ((0, 0), (1, 1)))
        _copy_block(net.fuse, student.head.classifier, ((0, 0), (1, 1), (3, 4), (4, 5)))
        _copy_conv(net.classifier, student.head.classifier[8])
    return net


def u2pl_builder(helper: types.ModuleType, cfg: dict[str, Any], student: nn.Module) -> nn.Module:
    """U2PL's ``ModelBuilder`` (decoder ``dec_deeplabv3_plus`` with its representation head; U2PL's or the NP-SemiSeg
    authors' copy of it, after ``helper``) on a copy of ``student``'s encoder, the decoder's ASPP, projection,
    low-level and representation weights copied from ``student`` (a conv bias that one side lacks is zero)."""
    encoder = ProjectEncoder(copy.deepcopy(student.backbone))
    builder = helper.ModelBuilder
    official_encoder = builder._build_encoder
    builder._build_encoder = lambda self, enc_cfg: encoder
    try:
        net = builder(copy.deepcopy(cfg["net"]))
    finally:
        builder._build_encoder = official_encoder
    ours, theirs = student.decoder, net.decoder
    branches = ours.aspp[0].branches
    conv_bn = ((0, 0), (1, 1))
    with torch.no_grad():
        _copy_block(theirs.aspp.conv1, branches[0].project, ((1, 0), (2, 1)))  # (pool, conv, BN, ReLU)
        for official_branch, branch in zip((theirs.aspp.conv2, theirs.aspp.conv3, theirs.aspp.conv4, theirs.aspp.conv5),
                                           branches[1:]):
            _copy_block(official_branch, branch, conv_bn)
        _copy_block(theirs.head, ours.aspp[1], conv_bn)
        _copy_block(theirs.low_conv, ours.low_level, conv_bn)
        rep = student.representation_head
        _copy_block(theirs.representation, nn.Sequential(*rep.block[0][:2], nn.Identity(), nn.Identity(),
                                                         *rep.block[1][:2], nn.Identity(), nn.Identity(), rep.embed),
                    ((0, 0), (1, 1), (4, 4), (5, 5), (8, 8)))
    return net


def u2pl_network(helper: types.ModuleType, cfg: dict[str, Any], student: nn.Module) -> nn.Module:
    """:func:`u2pl_builder` with the classifier's weights copied from ``student``'s baseline head."""
    net = u2pl_builder(helper, cfg, student)
    with torch.no_grad():
        _copy_block(net.decoder.classifier, student.head.classifier, ((0, 0), (1, 1), (4, 4), (5, 5), (8, 8)))
    return net


def np_u2pl_network(helper: types.ModuleType, cfg: dict[str, Any], student: nn.Module) -> nn.Module:
    """The NP-SemiSeg authors' U2PL model: :func:`u2pl_builder` with their ``NP_HEAD`` (``classifier1``) holding
    ``student``'s NP head weights, mapped as the golden recorder maps them (``HEAD_MAP``: their decoder's first
    convolution reads ``[z, x, r]``, ours ``[x, z, r]``). Their decoder's plain ``classifier``, built but unused by
    its forward, keeps its initial weights."""
    net = u2pl_builder(helper, cfg, student)
    theirs, ours = net.decoder.classifier1, student.head
    state = dict(theirs.named_parameters())
    with torch.no_grad():
        for mine, official in np_golden().HEAD_MAP.items():
            for suffix in ("weight", "bias"):
                value = getattr(ours.get_submodule(mine), suffix)
                if mine == "decoder.conv1" and suffix == "weight":
                    value = np_golden().reorder_decoder_input(value, theirs.input_dim, theirs.latent_dim, "authors")
                state[f"{official}.{suffix}"].copy_(value)
    return net


def np_golden() -> types.ModuleType:
    """``tests/golden/record_np_u2pl_step_golden.py``: the mapping of the project's NP head onto the authors'."""
    folder = str(ROOT / "tests" / "golden")
    if folder not in sys.path:
        sys.path.insert(0, folder)
    return importlib.import_module("record_np_u2pl_step_golden")


# ----------------------------------------------------------------------------------------- inputs


def normalise(images: Tensor) -> Tensor:
    mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    return (images - mean) / std


def make_inputs(batch: int, crop: int, seed: int) -> dict[str, Tensor]:
    """One step's host tensors: images ``[B, 3, H, W]`` in [0, 1], labels ``[B, H, W]`` (a 4-pixel ignored border),
    two strong views, and two CutMix boxes ``[B, H, W]`` (UniMatch's rule)."""
    gen = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, NUM_CLASSES, (batch, crop, crop), generator=gen)
    labels[:, :4] = IGNORE
    return {"image_l": torch.rand(batch, 3, crop, crop, generator=gen), "label_l": labels,
            "image_u": torch.rand(batch, 3, crop, crop, generator=gen),
            "strong_u": torch.rand(batch, 3, crop, crop, generator=gen),
            "strong2_u": torch.rand(batch, 3, crop, crop, generator=gen),
            "box1": unimatch_boxes(batch, crop, crop, generator=gen), "box2": unimatch_boxes(batch, crop, crop, generator=gen)}


def _fresh(tensor: Tensor, device: torch.device) -> Tensor:
    out = tensor.clone()
    return out.pin_memory() if device.type == "cuda" else out


def unimatch_loader_item(inputs: dict[str, Tensor], device: torch.device) -> tuple[Any, ...]:
    """What UniMatch's ``zip(trainloader_l, trainloader_u, trainloader_u)`` yields for one step (fixmatch.py takes
    the same structure): ``(img_x, mask_x), (img_u_w, img_u_s1, img_u_s2, ignore_mask, box1, box2), (mix ...)``;
    the mix batch is the unlabeled one shifted by one image (the project's ``*_mix`` draw, :func:`project_batch`)."""
    weak, strong, strong2 = (normalise(inputs[k]) for k in ("image_u", "strong_u", "strong2_u"))
    ignore = torch.zeros(inputs["label_l"].shape, dtype=torch.long)  # no padded pixel
    box1, box2 = inputs["box1"].float(), inputs["box2"].float()
    roll = [torch.roll(t, 1, dims=0) for t in (weak, strong, strong2, ignore, box1, box2)]
    items = ((normalise(inputs["image_l"]), inputs["label_l"]), (weak, strong, strong2, ignore, box1, box2), roll)
    return tuple(tuple(_fresh(t, device) for t in group) for group in items)


def project_batch(inputs: dict[str, Tensor], device: torch.device) -> Batch:
    """The project's batch of the same tensors, with every unlabeled view a framework may ask for: the strong views
    ``image_strong``, ``image_strong2``, the ``padding`` mask (none padded) and a second draw ``*_mix`` (the batch
    shifted by one image, the official side's mix batch); a framework reads the keys it needs."""
    views = {"image": inputs["image_u"], "image_strong": inputs["strong_u"], "image_strong2": inputs["strong2_u"],
             "padding": torch.zeros(inputs["label_l"].shape, dtype=torch.bool)}
    views.update({f"{k}_mix": torch.roll(v, 1, dims=0) for k, v in list(views.items())})
    return Batch(labeled={"image": _fresh(inputs["image_l"], device), "label": _fresh(inputs["label_l"], device)},
                 unlabeled={k: _fresh(v, device) for k, v in views.items()})


# ----------------------------------------------------------------------------------------- sides


@dataclass
class Side:
    """One side of a pair: ``prepare(inputs)`` makes what its loader would hand over (untimed), ``step(prepared,
    i)`` runs one training step from those host tensors; ``modules`` and ``optimizer`` hold its own state."""

    name: str
    prepare: Callable[[dict[str, Tensor]], Any]
    step: Callable[[Any, int], Any]
    modules: list[nn.Module]
    optimizer: torch.optim.Optimizer
    times: list[float] = field(default_factory=list)
    cpu_times: list[float] = field(default_factory=list)
    peaks: list[float] = field(default_factory=list)
    first_step_s: float | None = None

    def state_bytes(self) -> int:
        tensors = {id(t): t for m in self.modules for t in (*m.parameters(), *m.buffers())}
        tensors.update({id(p.grad): p.grad for m in self.modules for p in m.parameters() if p.grad is not None})
        for state in self.optimizer.state.values():
            tensors.update({id(t): t for t in state.values() if isinstance(t, Tensor)})
        return sum(t.numel() * t.element_size() for t in tensors.values())


def project_config(args: argparse.Namespace, framework: str, head: str, device: torch.device) -> RunConfig:
    overrides = {"runtime.device": device.type, "runtime.progress": "off", "runtime.output_dir": None,
                 "runtime.amp": bool(args.project_amp), "model.weights": None, "model.backbone": args.backbone,
                 "schedule.crop_size": args.crop, "schedule.batch_size": args.batch,
                 "schedule.unlabeled_batch_size": args.batch}
    make = lambda **more: cell_config("paper", framework=framework, dataset="synthetic_voc", partition="1464",  # noqa: E731
                                      head=head, protocol="released", **overrides, **more)
    config = make()
    phases = {f"framework_options.{k}": 0 for k in ("sup_only_epochs", "warmup_epochs") if config.framework_options.get(k)}
    return make(**phases) if phases else config


def project_side(args: argparse.Namespace, framework: str, head: str, device: torch.device) -> tuple[Side, Any]:
    """The project's framework and optimiser on ``device``; ``step`` is ``train_step`` on a fresh batch."""
    config = project_config(args, framework, head, device)
    torch.manual_seed(args.seed)
    built = build_framework(config)
    for module in built.modules().values():
        module.to(device)
    student = unwrap(built.student)
    student.train()
    optimizer = build_optimizer(config, student)

    def step(batch: Batch, i: int) -> Any:
        ctx = StepContext(step=i, total_steps=10**6, epoch=0, total_epochs=80, iters_per_epoch=10**6)
        return train_step(built, batch, ctx, optimizer, config, device, 1)

    prepare = lambda inputs: project_batch(inputs, device)  # noqa: E731
    return Side("project", prepare, step, list(built.modules().values()), optimizer.torch_optimizer), student


def unimatch_side(args: argparse.Namespace, framework: str, student: nn.Module, device: torch.device) -> Side:
    """The official loop body of UniMatch's ``unimatch.py`` or ``fixmatch.py`` (module docstring)."""
    folder = checkout(args.official_root, OFFICIAL[framework][0])
    cfg = yaml.safe_load((folder / "configs" / "pascal.yaml").read_text())
    cfg.update(backbone=args.backbone, crop_size=args.crop, batch_size=args.batch)
    model = unimatch_network(folder, cfg, student).to(device)
    with official_imports(folder):
        average_meter = importlib.import_module("util.utils").AverageMeter
    optimizer = torch.optim.SGD([{"params": model.backbone.parameters(), "lr": cfg["lr"]},
                                 {"params": [p for n, p in model.named_parameters() if "backbone" not in n],
                                  "lr": cfg["lr"] * cfg["lr_multi"]}], lr=cfg["lr"], momentum=0.9, weight_decay=1e-4)
    code = loop_body(folder / OFFICIAL[framework][1])
    namespace: dict[str, Any] = {
        "torch": torch, "nn": nn, "F": F, "model": model, "cfg": cfg, "optimizer": optimizer, "epoch": 0, "rank": 0,
        "criterion_l": nn.CrossEntropyLoss(**cfg["criterion"]["kwargs"]).to(device),
        "criterion_u": nn.CrossEntropyLoss(reduction="none").to(device), "writer": _Discard(), "logger": _Discard(),
        "trainloader_u": _Length(), "total_iters": 10**6, "__device__": device,
        **{name: average_meter() for name in ("total_loss", "total_loss_x", "total_loss_s", "total_loss_w_fp",
                                              "total_mask_ratio")}}

    def step(item: tuple[Any, ...], i: int) -> Any:
        namespace.update(loader=[item], __step__=i)
        exec(code, namespace)  # noqa: S102 - the official loop body (module docstring)
        return namespace["loss"]

    return Side("official", lambda inputs: unimatch_loader_item(inputs, device), step, [model], optimizer)


#: third-party modules U2PL's helpers import at the top but the measured step never calls (``cv2`` for its data
#: transforms, ``skimage.measure`` for one of its utilities): stand-ins where they are not installed
U2PL_UNUSED_MODULES = {"cv2": (), "skimage": (), "skimage.measure": ("label", "regionprops")}


@contextlib.contextmanager
def stand_ins(modules: dict[str, tuple[str, ...]]) -> Iterator[None]:
    """Empty modules (their named functions raising) in ``sys.modules`` for those that cannot be imported."""
    added = []
    for name, functions in modules.items():
        try:
            importlib.import_module(name)
        except ImportError:
            module = types.ModuleType(name)
            for function in functions:
                setattr(module, function, _not_installed(name, function))
            sys.modules[name] = module
            added.append(name)
    try:
        yield
    finally:
        for name in added:
            sys.modules.pop(name, None)


def _not_installed(module: str, function: str) -> Callable[..., None]:
    def call(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError(f"{module}.{function}: not installed (a stand-in of official_side_by_side.py)")
    return call


class _Batches:
    """U2PL's ``loader_l_iter`` / ``loader_u_iter`` (``.next()``, the old DataLoader iterator's name) and its
    ``len(loader_l)`` (a long epoch)."""

    def __init__(self) -> None:
        self.item: Any = None

    def next(self) -> Any:
        return self.item

    def __len__(self) -> int:
        return 10**6


def module_on_device(folder: Path, dotted: str, device: torch.device) -> types.ModuleType:
    """The official module ``dotted`` of ``folder`` with :class:`_OnDevice`'s change (its ``.cuda()`` calls go to
    ``device``), registered under its name while ``folder`` is imported from."""
    path = folder / (dotted.replace(".", "/") + ".py")
    tree = _OnDevice().visit(ast.parse(path.read_text(), filename=str(path)))
    module = types.ModuleType(dotted)
    module.__file__, module.__package__ = str(path), dotted.rpartition(".")[0]
    module.__dict__["__device__"] = device
    sys.modules[dotted] = module
    exec(compile(ast.fix_missing_locations(tree), str(path), "exec"), module.__dict__)  # noqa: S102
    return module


def u2pl_modules(folder: Path, device: torch.device) -> dict[str, types.ModuleType]:
    """U2PL's helpers the loop calls; its loss helpers and utilities with their ``.cuda()`` calls on ``device``."""
    with official_imports(folder), stand_ins(U2PL_UNUSED_MODULES):
        utils = module_on_device(folder, "u2pl.utils.utils", device)
        loss = module_on_device(folder, "u2pl.utils.loss_helper", device)
        names = {"helper": "u2pl.models.model_helper", "lr": "u2pl.utils.lr_helper",
                 "augmentation": "u2pl.dataset.augmentation"}
        return {"utils": utils, "loss": loss, **{key: importlib.import_module(name) for key, name in names.items()}}


def u2pl_side(args: argparse.Namespace, student: nn.Module, device: torch.device) -> Side:
    """The official loop body of U2PL's ``train_semi.py`` ``train`` (module docstring)."""
    folder = checkout(args.official_root, OFFICIAL["u2pl"][0])
    cfg = yaml.safe_load((folder / U2PL_CONFIG).read_text())
    cfg["net"]["sync_bn"] = False
    mods = u2pl_modules(folder, device)
    with official_imports(folder):  # the builder imports its decoder by name
        model = u2pl_network(mods["helper"], cfg, student).to(device)
    return u2pl_loop_side(folder / OFFICIAL["u2pl"][1], cfg, model, mods, device, {})


def np_u2pl_side(args: argparse.Namespace, student: nn.Module, device: torch.device) -> Side:
    """The loop body of the NP-SemiSeg authors' U2PL ``train_semi.py`` ``train`` (module docstring): their model
    (:func:`np_u2pl_network`), the NP memories as ``main`` makes them (one zero row of width 32 per class, lines
    126-133) and their centers as ``train`` computes them at the start of its epoch (lines 304-310)."""
    repository, script = OFFICIAL["u2pl_np"]
    folder = checkout(args.official_root, repository) / Path(script).parent
    cfg = yaml.safe_load((folder / NP_U2PL_CONFIG).read_text())
    cfg["net"]["sync_bn"] = False
    mods = u2pl_modules(folder, device)
    with official_imports(folder):
        model = np_u2pl_network(mods["helper"], cfg, student).to(device)
    width, classes = model.decoder.classifier1.latent_dim, cfg["net"]["num_classes"]
    memories = {name: [torch.zeros(1, width, device=device) for _ in range(classes)]
                for name in ("latent_memory", "deterministic_memory")}
    centers = {f"{name}_centers": torch.stack([rows.mean(0) for rows in memory]) for name, memory in memories.items()}
    return u2pl_loop_side(folder / Path(script).name, cfg, model, mods, device, {**memories, **centers})


def u2pl_loop_side(script: Path, cfg: dict[str, Any], model: nn.Module, mods: dict[str, types.ModuleType],
                   device: torch.device, extra: dict[str, Any]) -> Side:
    """A U2PL ``train`` loop body of ``script`` run at epoch 2 (past the supervised-only epoch and the teacher's
    copy) in a one-process group; teacher, memory bank, optimiser and LR scheduler as ``main`` makes them; ``extra``:
    more names the body reads."""
    teacher = copy.deepcopy(model)
    for p in teacher.parameters():
        p.requires_grad = False
    optim_cfg = cfg["trainer"]["optimizer"]
    groups = [dict(params=model.encoder.parameters(), lr=optim_cfg["kwargs"]["lr"]),
              dict(params=model.decoder.parameters(), lr=optim_cfg["kwargs"]["lr"] * 10)]  # times = 10 on VOC
    optimizer = mods["lr"].get_optimizer(groups, optim_cfg)
    loader_l, loader_u = _Batches(), _Batches()
    num_classes = cfg["net"]["num_classes"]
    memobank = [[torch.zeros(0, 256)] for _ in range(num_classes)]
    queue_size = [50000] + [30000] * (num_classes - 1)
    meters = {n: mods["utils"].AverageMeter(10) for n in ("sup_losses", "uns_losses", "con_losses", "data_times",
                                                        "batch_times", "learning_rates")}
    namespace: dict[str, Any] = {
        "torch": torch, "F": F, "np": np, "time": time, "dist": torch.distributed, "cfg": cfg, "model": model,
        "model_teacher": teacher, "optimizer": optimizer, "sup_loss_fn": mods["loss"].get_criterion(cfg),
        "lr_scheduler": mods["lr"].get_scheduler(cfg["trainer"], len(loader_l), mods["lr"].get_optimizer(groups, optim_cfg)),
        "loader_l": loader_l, "loader_l_iter": loader_l, "loader_u_iter": loader_u, "epoch": 2, "rank": 0,
        "world_size": 1, "tb_logger": _Discard(), "logger": _Discard(), "memobank": memobank,
        "queue_ptrlis": [torch.zeros(1, dtype=torch.long) for _ in range(num_classes)], "queue_size": queue_size,
        "ema_decay_origin": cfg["net"]["ema_decay"], "batch_end": time.time(), "__device__": device,
        "generate_unsup_data": mods["augmentation"].generate_unsup_data, "label_onehot": mods["utils"].label_onehot,
        "compute_unsupervised_loss": mods["loss"].compute_unsupervised_loss,
        "compute_contra_memobank_loss": mods["loss"].compute_contra_memobank_loss, **meters, **extra}
    code = loop_body(script, "range(len(loader_l))", "range(__step__, __step__ + 1)")

    def step(item: tuple[Any, ...], i: int) -> Any:
        loader_l.item, loader_u.item = item
        namespace["__step__"] = i
        exec(code, namespace)  # noqa: S102 - the official loop body (module docstring)
        return namespace["loss"]

    prepare = lambda inputs: ((_fresh(normalise(inputs["image_l"]), device), _fresh(inputs["label_l"], device)),  # noqa: E731
                              (_fresh(normalise(inputs["image_u"]), device), None))
    return Side("official", prepare, step, [model, teacher], optimizer)


def one_process_group(device: torch.device) -> bool:
    """A process group of one rank (gloo on CPU, NCCL on CUDA) for the official code's collectives, if none;
    True when this call made it (the caller destroys it)."""
    if torch.distributed.is_initialized():
        return False
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.distributed.init_process_group("nccl" if device.type == "cuda" else "gloo",
                                         init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1,
                                         **({"device_id": torch.device("cuda", torch.cuda.current_device() if device.index is None
                                                                       else device.index)}
                                            if device.type == "cuda" else {}))
    return True


def same_function(official: nn.Module, student: nn.Module, inputs: dict[str, Tensor], device: torch.device) -> float:
    """Max |official - project| eval-mode logits at image size on the labeled images (before any step): the two
    networks' agreement, ~1e-5 when the weights were copied right."""
    images = inputs["image_l"].to(device)
    official.eval()
    student.eval()
    with torch.no_grad():
        ours = upsample_logits(student(images).head.logits, images.shape[-2:], align_corners=True)[0]
        theirs = official(normalise(inputs["image_l"]).to(device))
        if isinstance(theirs, dict):  # U2PL: {"pred", "rep"} at feature resolution
            theirs = F.interpolate(theirs["pred"], size=images.shape[-2:], mode="bilinear", align_corners=True)
    official.train()
    student.train()
    return float((ours.float() - theirs.float()).abs().max())


def np_same_function(official: nn.Module, student: nn.Module, inputs: dict[str, Tensor], device: torch.device) -> float:
    """:func:`same_function` for the NP head (whose predictions are sampled): max |official - project| of the
    eval-mode representation (encoder, decoder and representation head), of the NP head's query transform (the
    authors' ``memory_dim_transform``, the project's ``query_net``) on the decoder's features, and of the NP
    decoder on one draw of ``(x, z, r)`` (theirs reads ``[z, x, r]``, ours ``x``, ``z``, ``r``)."""
    images = inputs["image_l"].to(device)
    seen: dict[str, Tensor] = {}
    head = official.decoder.classifier1
    hook = head.memory_dim_transform.register_forward_hook(lambda module, args, out: seen.setdefault("query", out))
    official.eval()
    student.eval()
    try:
        with torch.no_grad():
            encoded = student.encode(images)
            features = student.decoder(encoded.low_level, encoded.high_level)
            ours = [student.representation_head(features), student.head.query_net(features)]
            centers = torch.zeros(head.num_classes, head.latent_dim, device=device)
            out = official(normalise(inputs["image_l"]).to(device), centers, centers, phase_train=False)
            x, z, r = features[:1, :, :5, :5], torch.randn(1, 1, head.latent_dim, device=device), centers[:1] + 0.5
            ours.append(student.head.decoder(x, z, r)[0])
            maps = [v.view(1, -1, 1, 1).expand(-1, -1, *x.shape[-2:]) for v in (z[0], r)]
            theirs = [out["rep"], seen["query"], head.decoder(torch.cat([maps[0], x, maps[1]], dim=1))]
    finally:
        hook.remove()
        official.train()
        student.train()
    return max(float((a.float() - b.float()).abs().max()) for a, b in zip(ours, theirs))


# ----------------------------------------------------------------------------------------- measuring


def current_memory_mib(device: torch.device) -> float | None:
    """What is allocated now: ``memory_allocated`` on CUDA, the resident size (VmRSS) on CPU."""
    if device.type == "cuda":
        return torch.cuda.memory_allocated(device) / 2**20
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return None


def reset_step_peak(device: torch.device) -> None:
    """Start a step's peak: CUDA's peak statistics only (the allocator keeps its cache, as in training), or on CPU
    ``gpu_acceptance.reset_peak_memory`` (the heap trimmed, so both sides' steps pay for their pages again)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    else:
        reset_peak_memory(device)


def timed_step(side: Side, inputs: dict[str, Tensor], i: int,
               device: torch.device) -> tuple[float, float, float | None, Any]:
    """One step of ``side``: seconds, the process's CPU seconds, peak MiB (own state + the step's rise), the
    step's result."""
    prepared = side.prepare(inputs)
    reset_step_peak(device)
    before, state = current_memory_mib(device), side.state_bytes() / 2**20
    synchronize(device)
    tick, cpu_tick = time.perf_counter(), time.process_time()
    result = side.step(prepared, i)
    synchronize(device)
    seconds, cpu_seconds = time.perf_counter() - tick, time.process_time() - cpu_tick
    peak = peak_memory_mib(device)
    return seconds, cpu_seconds, (state + peak - before if peak is not None and before is not None else None), result


def interleave(sides: list[Side], inputs: list[dict[str, Tensor]], warmup: int, steps: int, device: torch.device) -> None:
    """``warmup + steps`` rounds; in each, every side one step on the round's inputs, the first side alternating."""
    for i in range(warmup + steps):
        order = sides if i % 2 == 0 else sides[::-1]
        for side in order:
            seconds, cpu_seconds, peak, _ = timed_step(side, inputs[i % len(inputs)], i, device)
            if i < warmup:
                side.first_step_s = seconds if side.first_step_s is None else side.first_step_s
                continue
            side.times.append(seconds)
            side.cpu_times.append(cpu_seconds)
            if peak is not None:
                side.peaks.append(peak)


def host_work(side: Side, inputs: dict[str, Tensor], i: int, device: torch.device) -> dict[str, Any]:
    """One more step of ``side`` under :class:`host_work.HostWork`: its operator calls and reads of device values
    (on CPU every read of a value counts, on CUDA only reads of GPU values), with the reads' sites."""
    prepared = side.prepare(inputs)
    with HostWork(device) as work:
        side.step(prepared, i)
    synchronize(device)
    return work.summary(sites=6)


def summary(side: Side) -> dict[str, Any]:
    return {"step_s": statistics.median(side.times), "all_step_s": side.times, "first_step_s": side.first_step_s,
            "step_cpu_s": statistics.median(side.cpu_times),
            "peak_mib": max(side.peaks) if side.peaks else None, "state_mib": side.state_bytes() / 2**20}


def official_side(args: argparse.Namespace, row: str, student: nn.Module, device: torch.device) -> Side:
    if row == "u2pl_np":
        return np_u2pl_side(args, student, device)
    return u2pl_side(args, student, device) if row == "u2pl" else unimatch_side(args, row, student, device)


def measure(args: argparse.Namespace, framework: str, device: torch.device) -> dict[str, Any]:
    """Build both sides of the row ``framework`` (:data:`ROWS`), check they compute the same function, interleave
    their steps."""
    started = time.perf_counter()
    project_framework, head = ROWS[framework]
    ours, student = project_side(args, project_framework, head, device)
    theirs = official_side(args, framework, student, device)
    inputs = [make_inputs(args.batch, args.crop, args.seed + k) for k in range(2)]
    agree = np_same_function if head == "np" else same_function
    diff = agree(theirs.modules[0], student, inputs[0], device)
    interleave([theirs, ours], inputs, args.warmup, args.steps, device)
    a, b = summary(ours), summary(theirs)
    if args.host_work:
        a["host_work"], b["host_work"] = (host_work(side, inputs[0], args.warmup + args.steps, device) for side in (ours, theirs))
    return {"framework": framework, "head": head, "official": OFFICIAL[framework][0] + " " + OFFICIAL[framework][1],
            "max_abs_logit_diff": diff, "project": a, "official_side": b, "step_ratio": a["step_s"] / b["step_s"],
            "cpu_ratio": a["step_cpu_s"] / b["step_cpu_s"] if b["step_cpu_s"] > 0 else None,
            "memory_ratio": a["peak_mib"] / b["peak_mib"] if a["peak_mib"] and b["peak_mib"] else None,
            "seconds": time.perf_counter() - started}


# ----------------------------------------------------------------------------------------- output


def markdown(report: dict[str, Any]) -> str:
    lines = ["# The project's step beside the official code's", "",
             f"- date: {report['date']}", f"- machine: {report['machine']}", f"- command: `{report['command']}`",
             f"- setting: {report['setting']}", "",
             "Step s: median wall time per step (device synchronised); CPU s: the process's CPU seconds per step (median; "
             "on a GPU the host's work); peak MiB: the side's own state + the step's rise "
             f"({report['memory_measure']}); ratios project / official.", "",
             "| framework | official | project step s | official step s | step ratio | project CPU s | official CPU s | "
             "CPU ratio | project peak MiB | official peak MiB | memory ratio | max logit diff |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in report["results"]:
        if "error" in row:
            lines.append(f"| {row['framework']} | error: {row['error']} |" + " |" * 10)
            continue
        p, o = row["project"], row["official_side"]
        mem = f"{row['memory_ratio']:.2f}" if row["memory_ratio"] is not None else "-"
        peaks = [f"{x:.0f}" if x is not None else "-" for x in (p["peak_mib"], o["peak_mib"])]
        cpu = f"{row['cpu_ratio']:.2f}" if row["cpu_ratio"] is not None else "-"
        lines.append(f"| {row['framework']} | {row['official']} | {p['step_s']:.4f} | {o['step_s']:.4f} | "
                     f"{row['step_ratio']:.2f} | {p['step_cpu_s']:.3f} | {o['step_cpu_s']:.3f} | {cpu} | {peaks[0]} | "
                     f"{peaks[1]} | {mem} | {row['max_abs_logit_diff']:.1e} |")
    return "\n".join(lines + host_work_lines(report)) + "\n"


def host_work_lines(report: dict[str, Any]) -> list[str]:
    """The ``--host-work`` table: each side's operator calls and reads of device values in one step."""
    counted = [row for row in report["results"] if "host_work" in row.get("project", {})]
    if not counted:
        return []
    lines = ["", "Host work of one step (benchmarks/host_work.py): operator calls and reads of device values.", "",
             "| framework | project ops | official ops | ops ratio | project reads | official reads |",
             "|---|---|---|---|---|---|"]
    for row in counted:
        p, o = row["project"]["host_work"], row["official_side"]["host_work"]
        lines.append(f"| {row['framework']} | {p['ops']} | {o['ops']} | {p['ops'] / max(o['ops'], 1):.2f} | "
                     f"{p['reads']} | {o['reads']} |")
    return lines


def measure_or_record(args: argparse.Namespace, framework: str, device: torch.device) -> dict[str, Any]:
    """:func:`measure`'s row, or the framework's error (the others go on)."""
    try:
        row = measure(args, framework, device)
    except Exception as error:  # noqa: BLE001 - one framework's failure is recorded, the others go on
        traceback.print_exc()
        row = {"framework": framework, "error": f"{type(error).__name__}: {error}".splitlines()[0][:300]}
    print(json.dumps({k: v for k, v in row.items() if k not in ("project", "official_side")}), flush=True)
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return row


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--official-root", type=Path, required=True, help="folder holding the official checkouts")
    parser.add_argument("--frameworks", nargs="+", default=list(OFFICIAL), choices=list(OFFICIAL))
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--backbone", default="resnet101", choices=["resnet50", "resnet101"])
    parser.add_argument("--crop", type=int, default=480)
    parser.add_argument("--batch", type=int, default=3, help="labeled images per step (and as many unlabeled)")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--project-amp", action="store_true", help="the project's bf16 autocast on CUDA")
    parser.add_argument("--host-work", action="store_true", help="count one more step's operator calls and reads per side")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.backends.cudnn.benchmark = True  # as the official scripts set it
    report: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"), "machine": machine(device),
        "command": shlex.join(["python", "benchmarks/official_side_by_side.py", *(argv if argv is not None else sys.argv[1:])]),
        "setting": f"{args.backbone} random init, crop {args.crop}, {args.batch} + {args.batch} images, float32"
                   + (" (project bf16 autocast)" if args.project_amp else "") + f", torch {torch.__version__}, "
                   f"python {platform.python_version()}",
        "memory_measure": "max_memory_allocated" if device.type == "cuda" else "peak RSS after malloc_trim",
        "results": []}
    group = any(ROWS[row][0] == "u2pl" for row in args.frameworks) and one_process_group(device)
    try:
        for framework in args.frameworks:
            report["results"].append(measure_or_record(args, framework, device))
            write(report, args.out)  # after each framework: a run cut short keeps what it measured
    finally:
        if group:
            torch.distributed.destroy_process_group()
    print(markdown(report))
    return report


def write(report: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "side_by_side.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / "side_by_side.md").write_text(markdown(report))


if __name__ == "__main__":
    main()
