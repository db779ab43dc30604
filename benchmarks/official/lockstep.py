"""The NP-SemiSeg authors' U2PL loop and the project's step in lockstep: what a whole run carries from one iteration
to the next, compared iteration by iteration (``benchmarks/official_lockstep.py``).

The official side is ``--framework np_u2pl``'s run (:func:`official.u2pl.official_np_u2pl_run`: the authors'
``U2PL/train_semi.py`` imported from the checkout, its loaders, transforms, samplers, schedule, EMA and memory bank)
with a recorder (:class:`Recorder`) patched in: at every iteration's LR step (``lr_scheduler.step()``, the first line
of an iteration) the state the loop carries (student and teacher parameters and BN buffers, SGD momentum, the memory
bank's keys, the LRs); the batches the loaders deliver; every random draw of the iteration (the CutMix coin and
boxes, the contrastive loss's ``torch.randint``, the NP head's latent noise per network, the dropout masks per
network: the golden recorders' tape). Every other patch is the run's own (:data:`official.u2pl.NP_U2PL_PATCHES`).

The project's side is its ``u2pl`` cell with the NP head of the same settings (:func:`official.study.project_config`):
for every recorded iteration ``k`` its ``train_step`` (what the training loop calls: LR, forward, losses, clipping,
SGD, EMA) runs on the official batch (the images given back in [0, 1]) with the official draws injected, from the
official state before ``k`` (``--free``: from the official initial state only, then its own), and its state after
the step is compared with the official state before ``k + 1``: the largest difference of each part relative to
``max(1, max |official|)`` (the memory bank's keys in U2PL's order, the oldest first). The NP memories are not carried
(deviation N2: every step starts from the zero rows) and not compared.

    python benchmarks/official_lockstep.py --official-root ROOT --steps 45 --out DIR   # DIR/lockstep.json
"""

from __future__ import annotations

import argparse
import copy
import importlib
import json
import sys
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from npsemiseg.config import with_overrides
from npsemiseg.data import mixing
from npsemiseg.frameworks.base import Batch, StepContext
from npsemiseg.training import build_framework
from npsemiseg.training.factories import build_optimizer
from npsemiseg.training.step import train_step

from official.networks import initial_network
from official.np_network import HEAD_MAP, AuthorsModel, NPInterface, authors_model, reorder_decoder_input
from official.patching import patched
from official.study import export_official_layout, official_epochs, project_config, study_of
from official.u2pl import official_np_u2pl_run
from official_side_by_side import IMAGENET_MEAN, IMAGENET_STD, ROOT, checkout

#: the harness's smoke settings (``docs/learning.md``): 64 training images, 8 validation images, batches 4 + 4
SMOKE = {"data.options.train_size": 64, "data.options.val_size": 8, "schedule.batch_size": 4,
         "schedule.unlabeled_batch_size": 4}
ROLES = ("student", "teacher")
PARTS = ("student", "student_buffers", "teacher", "teacher_buffers", "momentum", "queues")


def step_recording() -> types.ModuleType:
    """``tests/golden/step_recording.py``: the golden recorders' dropout tape (:class:`DropoutTape`)."""
    folder = str(ROOT / "tests" / "golden")
    if folder not in sys.path:
        sys.path.insert(0, folder)
    return importlib.import_module("step_recording")


def project_names(model: AuthorsModel) -> dict[int, tuple[str, bool]]:
    """``id`` of each of the authors' model's parameters -> (the project's name, whether its layout is reordered: the
    NP decoder's first convolution, ``[z, x, r]`` theirs, ``[x, z, r]`` ours)."""
    names = {id(p): (n, False) for n, p in model.segmentor.named_parameters()}
    head = dict(model.classifier1.named_parameters())
    for ours, theirs in HEAD_MAP.items():
        for suffix in ("weight", "bias"):
            names[id(head[f"{theirs}.{suffix}"])] = (f"head.{ours}.{suffix}", ours == "decoder.conv1" and suffix == "weight")
    return names


def as_ours(model: AuthorsModel, tensor: Tensor, reorder: bool) -> Tensor:
    """A copy of ``tensor`` (a parameter's value or momentum) in the project's layout."""
    tensor = tensor.detach().clone()
    head = model.classifier1
    return reorder_decoder_input(tensor, head.input_dim, head.latent_dim, "ours") if reorder else tensor


class Recorder:
    """The official run, iteration by iteration: ``iterations[k]`` holds ``before`` (the carried state, the project's
    names) and ``after`` (the state before ``k + 1``), the ``batch``, the ``losses`` and the draws (``coin``,
    ``cutout``, ``randint``, ``noise`` per network; the dropout masks on :attr:`tape`, ``tape`` counts in the
    states)."""

    def __init__(self) -> None:
        self.iterations: list[dict[str, Any]] = []
        self.current: dict[str, Any] | None = None
        self.nets: dict[str, AuthorsModel] = {}
        self.loop: dict[str, Any] = {}
        self.tape = step_recording().DropoutTape(dtype=torch.float32)

    def state(self) -> dict[str, Any]:
        """The state the loop carries now (``loop``: its optimizer and memory bank, set when ``train`` is called)."""
        student, optimizer = self.nets["student"], self.loop["optimizer"]
        names = project_names(student)
        momentum = {names[id(p)][0]: as_ours(student, optimizer.state[p]["momentum_buffer"], names[id(p)][1])
                    for group in optimizer.param_groups for p in group["params"]
                    if optimizer.state.get(p, {}).get("momentum_buffer") is not None}
        state: dict[str, Any] = {"momentum": momentum, "queues": [bank[0].clone() for bank in self.loop["memobank"]],
                                 "lrs": [group["lr"] for group in optimizer.param_groups],
                                 "tape": {name: len(masks) for name, masks in self.tape.masks.items()}}
        for role, model in self.nets.items():
            names = project_names(model)
            state[role] = {names[id(p)][0]: as_ours(model, p, names[id(p)][1]) for p in model.parameters()}
            state[f"{role}_buffers"] = {n: b.detach().clone() for n, b in model.segmentor.named_buffers()}
        return state

    def begin(self) -> None:
        """A new iteration (the LR step, its first line): the state closes the previous one and opens it."""
        state = self.state()
        if self.current is not None:
            self.current["after"] = state
        self.current = {"before": state, "coin": [], "cutout": [], "randint": [], "noise": {r: [] for r in ROLES},
                        "losses": {}, "batch": {}}
        self.iterations.append(self.current)

    def finish(self) -> None:
        """An epoch's ``train`` returned: its last iteration's ``after``; nothing recorded until the next."""
        if self.current is not None:
            self.current["after"] = self.state()
        self.current = None

    def take(self, kind: str, value: Any, role: str | None = None) -> None:
        """Keep a draw of the current iteration (none outside ``train``: validation's latent noise)."""
        if self.current is not None:
            (self.current[kind][role] if role else self.current[kind]).append(value)


def recording_network(recorder: Recorder, config: Any) -> Callable[[], nn.Module]:
    """The run's network factory (the student first, then the teacher: ``main``'s order), each network's dropout on
    the recorder's tape and its ``NP_HEAD.reparameterize`` keeping its noise (drawn in float32, as the project's)."""
    student, roles = initial_network(config), iter(ROLES)

    def network() -> nn.Module:
        role, segmentor = next(roles), copy.deepcopy(student)
        step_recording().tape_dropout(segmentor, recorder.tape, role)
        model = authors_model(AuthorsModel, importlib.import_module("u2pl.models.np_head"), segmentor, config)

        def reparameterize(head: nn.Module, mean: Tensor, std: Tensor) -> Tensor:
            eps = torch.randn(std.shape, dtype=torch.float32)
            recorder.take("noise", eps.numpy().copy(), role)
            return eps.to(std.dtype) * std + mean

        model.classifier1.reparameterize = types.MethodType(reparameterize, model.classifier1)
        recorder.nets[role] = model
        return NPInterface(model)

    return network


def called_from(filename: str) -> bool:
    """Whether the caller of the function that asks was code of ``filename`` (the script's own draws only)."""
    return sys._getframe(2).f_code.co_filename.endswith(filename)


def recorded_draw(recorder: Recorder, kind: str, draw: Callable[..., Any], filename: str,
                  keep: Callable[[tuple, Any], Any]) -> Callable[..., Any]:
    """``draw`` whose results, where ``filename`` calls it, are kept as ``keep(args, value)`` under ``kind``."""
    def call(*args: Any, **kwargs: Any) -> Any:
        value = draw(*args, **kwargs)
        if called_from(filename):
            recorder.take(kind, keep(args, value))
        return value
    return call


def recorded_loss(recorder: Recorder, name: str, function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` (a loss; a tuple's last item) with its value kept under ``name``."""
    def call(*args: Any, **kwargs: Any) -> Any:
        value = function(*args, **kwargs)
        if recorder.current is not None:
            recorder.current["losses"][name] = float(value[-1] if isinstance(value, tuple) else value)
        return value
    return call


class RecordedLoader:
    """A loader whose iterator keeps each batch it hands the loop under ``key`` (``.next()`` as the loop calls it)."""

    def __init__(self, loader: Any, key: str, recorder: Recorder) -> None:
        self.loader, self.key, self.recorder, self.sampler = loader, key, recorder, loader.sampler

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Any]:
        self.iterator = iter(self.loader)
        return self

    def __next__(self) -> Any:
        batch = next(self.iterator)
        self.recorder.current["batch"][self.key] = [t.clone() for t in batch]
        return batch

    next = __next__


def recording(recorder: Recorder) -> Callable[[Any, Callable[..., Any]], list[tuple[Any, str, Any]]]:
    """The recorder's patches of a run (:data:`official.u2pl.Recording`): the LR step opens an iteration; the CutMix
    coin (``np.random.uniform`` of ``train_semi.py``) and boxes, the contrastive loss's ``torch.randint``, the three
    losses and the batches kept; ``train`` given the loop's optimizer and memory bank."""
    def patches(module: Any, train: Callable[..., Any]) -> list[tuple[Any, str, Any]]:
        scheduler = sys.modules["u2pl.utils.lr_helper"].LRScheduler
        augmentation = sys.modules["u2pl.dataset.augmentation"]
        scheduler_step, get_criterion = scheduler.step, module.get_criterion

        def step(lr_scheduler: Any) -> None:
            scheduler_step(lr_scheduler)
            recorder.begin()

        def recorded_train(*args: Any) -> Any:
            recorder.loop = {"optimizer": args[4], "memobank": args[-3]}
            loaders = (RecordedLoader(args[7], "labeled", recorder), RecordedLoader(args[8], "unlabeled", recorder))
            try:
                return train(*args[:7], *loaders, *args[9:])
            finally:
                recorder.finish()

        return [(scheduler, "step", step), (module, "train", recorded_train),
                (augmentation, "generate_cutout_mask", recorded_draw(
                    recorder, "cutout", augmentation.generate_cutout_mask, "augmentation.py", lambda a, v: v.clone())),
                (torch, "randint", recorded_draw(recorder, "randint", torch.randint, "loss_helper.py",
                                                 lambda a, v: (int(a[0]), v.numpy().copy()))),
                (np.random, "uniform", recorded_draw(recorder, "coin", np.random.uniform, "train_semi.py",
                                                     lambda a, v: float(v))),
                (module, "get_criterion", lambda cfg: recorded_loss(recorder, "sup", get_criterion(cfg))),
                (module, "compute_unsupervised_loss", recorded_loss(recorder, "unsup", module.compute_unsupervised_loss)),
                (module, "compute_contra_memobank_loss",
                 recorded_loss(recorder, "contrastive", module.compute_contra_memobank_loss))]
    return patches


def record_official(folder: Path, config: Any, lists: dict[str, Path], save_path: Path) -> tuple[Recorder, dict]:
    """The authors' run of ``config`` (:func:`official.u2pl.official_np_u2pl_run`) recorded; and its result."""
    recorder = Recorder()
    result = official_np_u2pl_run(folder, config, lists, save_path, network=recording_network(recorder, config),
                                  recording=recording(recorder))
    return recorder, result


def load_state(framework: Any, optimizer: Any, state: dict[str, Any]) -> None:
    """The project's student, teacher, SGD momentum and memory bank set to a recorded official ``state`` (the bank's
    keys in U2PL's order, the oldest first: the ring buffer's next write replaces the oldest, as U2PL's list drops
    them)."""
    with torch.no_grad():
        for role in ROLES:
            model = getattr(framework, role)
            for kind, items in (("parameters", dict(model.named_parameters())), ("buffers", dict(model.named_buffers()))):
                for name, value in state[role if kind == "parameters" else f"{role}_buffers"].items():
                    items[name].copy_(value)
    params, torch_optimizer = dict(framework.student.named_parameters()), optimizer.torch_optimizer
    torch_optimizer.state.clear()
    for name, buffer in state["momentum"].items():
        torch_optimizer.state[params[name]] = {"momentum_buffer": buffer.clone()}
    for c, keys in enumerate(state["queues"]):
        framework.queues.keys[c], framework.queues.pointer[c] = keys.float().clone(), 0


def cutmix_boxes(masks: list[Tensor]) -> Tensor:
    """U2PL's CutMix masks (1 outside the box) as the project's boxes ``[B, 4]`` (y0, y1, x0, x1)."""
    boxes = []
    for mask in masks:
        inside = mask == 0
        rows, cols = inside.any(1).nonzero()[:, 0], inside.any(0).nonzero()[:, 0]
        boxes.append([int(rows[0]), int(rows[-1]) + 1, int(cols[0]), int(cols[-1]) + 1])
    return torch.tensor(boxes)


def injected(iteration: dict[str, Any], framework: Any) -> tuple[list[tuple[Any, str, Any]], dict]:
    """Patches giving the project's step the official iteration's draws, and what is left of them (``randint``,
    ``noise`` per network, ``mismatched``: draws of another bound or size, where the step already differs: taken
    reduced to the bound)."""
    patches: list[tuple[Any, str, Any]] = []
    if iteration["coin"]:
        coin, boxes = iteration["coin"][0], iteration["cutout"]
        patches.append((mixing, "_rand", lambda generator, *shape: torch.tensor(coin)))
        if boxes:
            patches.append((mixing, "u2pl_boxes", lambda b, h, w, generator=None: cutmix_boxes(boxes)))
    left: dict[str, Any] = {"randint": list(iteration["randint"]), "mismatched": 0,
                            "noise": {role: list(iteration["noise"][role]) for role in ROLES}}

    def randint(high: int, size: tuple, **kwargs: Any) -> Tensor:
        bound, values = left["randint"].pop(0)
        if (int(high), tuple(size)) != (bound, values.shape):  # the step already differs: counted, and taken
            left["mismatched"] += 1
            return torch.from_numpy(np.resize(values, tuple(size)) % int(high))
        return torch.from_numpy(values)

    for role in ROLES:
        def sample(mean: Tensor, sigma: Tensor, num_samples: int, queue: list = left["noise"][role]) -> Tensor:
            eps = torch.from_numpy(np.stack([queue.pop(0) for _ in range(num_samples)]))
            return mean.float() + sigma.float() * eps
        patches.append((getattr(framework, role).head, "sample", sample))
    return [*patches, (torch, "randint", randint)], left


def project_step(framework: Any, optimizer: Any, config: Any, iteration: dict[str, Any],
                 ctx: StepContext) -> tuple[dict[str, float], dict]:
    """The project's ``train_step`` on the official iteration's batch (given back in [0, 1]) with its draws; the
    logs and the draws left."""
    mean, std = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1), torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    (images_l, labels_l), (images_u, _) = iteration["batch"]["labeled"], iteration["batch"]["unlabeled"]
    batch = Batch(labeled={"image": images_l * std + mean, "label": labels_l.long()},
                  unlabeled={"image": images_u * std + mean})
    patches, left = injected(iteration, framework)
    with patched(patches):
        logs = train_step(framework, batch, ctx, optimizer, config, torch.device("cpu"), 1)
    return logs, left


def relative(ours: Tensor, theirs: Tensor) -> float:
    """max |ours - theirs| / max(1, max |theirs|)."""
    if theirs.numel() == 0:
        return 0.0 if ours.numel() == 0 else float("inf")
    return float((ours.float() - theirs.float()).abs().max()) / max(1.0, float(theirs.abs().max()))


def differences(framework: Any, optimizer: Any, official: dict[str, Any]) -> dict[str, float]:
    """The project's state against the ``official`` state, per part (:data:`PARTS`)."""
    out = {}
    for role in ROLES:
        model = getattr(framework, role)
        for part, items in ((role, dict(model.named_parameters())), (f"{role}_buffers", dict(model.named_buffers()))):
            out[part] = max((relative(items[n].detach(), v) for n, v in official[part].items() if v.is_floating_point()),
                            default=0.0)
    params, state = dict(framework.student.named_parameters()), optimizer.torch_optimizer.state
    out["momentum"] = max((relative(state[params[n]]["momentum_buffer"], v) for n, v in official["momentum"].items()),
                          default=0.0)
    queues = framework.queues
    out["queues"] = max((relative(queues.class_keys(c), keys) if queues.class_keys(c).shape == keys.shape else float("inf")
                         for c, keys in enumerate(official["queues"])), default=0.0)
    return out


def replay_tape(recorder: Recorder, iteration: dict[str, Any]) -> Any:
    """A dropout tape replaying the masks the official networks drew in ``iteration``."""
    start, end = iteration["before"]["tape"], iteration["after"]["tape"]
    return step_recording().DropoutTape({name: masks[start.get(name, 0):end.get(name, 0)]
                                         for name, masks in recorder.tape.masks.items()})


def lockstep(config: Any, recorder: Recorder, free: bool = False) -> list[dict[str, Any]]:
    """The project's step on every recorded iteration (from the official state before it; ``free``: from the official
    initial state only): one row per iteration with both sides' losses and LRs, the parts' differences after the
    step (:func:`differences`) and the draws the step left (all taken: 0)."""
    framework = build_framework(config)
    optimizer = build_optimizer(config, framework.student)
    iterations = recorder.iterations
    per_epoch = len(iterations) // official_epochs("np_u2pl", config)
    rows = []
    for k, iteration in enumerate(iterations):
        if not free or k == 0:
            load_state(framework, optimizer, iteration["before"])
        tape = replay_tape(recorder, iteration)
        for role in ROLES:
            step_recording().tape_dropout(getattr(framework, role), tape, role)
            for module in getattr(framework, role).modules():  # a tape set by an earlier iteration: this one's
                if isinstance(module, step_recording().TapeDropout):
                    module.tape = tape
        ctx = StepContext(step=k, total_steps=len(iterations), epoch=k // per_epoch,
                          total_epochs=len(iterations) // per_epoch, iters_per_epoch=per_epoch)
        logs, left = project_step(framework, optimizer, config, iteration, ctx)
        rows.append({"iteration": k, "epoch": ctx.epoch, "mixed": bool(iteration["coin"] and iteration["cutout"]),
                     "official_lr": iteration["before"]["lrs"],
                     "project_lr": [g["lr"] for g in optimizer.torch_optimizer.param_groups],
                     **{f"official_{n}": v for n, v in iteration["losses"].items()},
                     **{f"project_{n}": logs.get(f"train/{n}") for n in ("sup", "unsup", "contrastive", "kl")},
                     "draws_left": len(left["randint"]) + sum(map(len, left["noise"].values())) + len(tape.unused()),
                     "draws_mismatched": left["mismatched"],
                     **differences(framework, optimizer, iteration["after"])})
    return rows


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--official-root", type=Path, required=True, help="folder of <owner>+<repo> checkouts")
    parser.add_argument("--data-seed", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=45, help="iterations (a multiple of the official epoch's)")
    parser.add_argument("--free", action="store_true", help="carry the project's own state after the first step")
    parser.add_argument("--set", dest="settings", action="append", default=[], metavar="KEY=VALUE",
                        help="a setting of the project's side only (VALUE read as YAML), e.g. to see a switch part")
    parser.add_argument("--out", type=Path, required=True)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Record the official run at the smoke settings (:data:`SMOKE`), run the lockstep, write ``--out/lockstep.json``
    (the rows and the largest difference of each part) and print the largest."""
    import yaml

    args = parse_args(argv)
    torch.set_num_threads(1)
    config = project_config("np_u2pl", args.data_seed, args.seed, args.steps, dict(SMOKE))
    lists = export_official_layout(study_of(config), args.out / "data_u2pl", layout="u2pl")
    folder = checkout(args.official_root, "Jianf-Wang/NP-SemiSeg")
    recorder, result = record_official(folder, config, lists, args.out / "official")
    project = with_overrides(config, {k: yaml.safe_load(v) for k, v in (s.split("=", 1) for s in args.settings)})
    rows = lockstep(project, recorder, free=args.free)
    largest = {part: max(row[part] for row in rows) for part in (*PARTS, "draws_left", "draws_mismatched")}
    report = {"steps": args.steps, "free": args.free, "settings": args.settings, "official_curve": result["curve"],
              "largest": largest, "rows": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "lockstep.json").write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(largest))
    return report
