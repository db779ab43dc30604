"""Gradient accumulation (``schedule.accumulation_steps``): k micro-batches of b images make the same optimiser step
as one batch of k b images, for every registered framework.

Each test builds a framework twice from one initialisation (float64; every BatchNorm in eval mode, so no batch
statistics; every dropout off) and runs one :func:`~npsemiseg.training.step.train_step` on a batch of 4 labeled + 4
unlabeled images, and one over the same images as 2 micro-batches of 2: the student's parameters after the SGD step
(momentum, weight decay, head at 10x LR), every EMA teacher's and the logged loss terms agree at round-off.

What differs with BatchNorm in training mode: each micro-batch normalises with its own statistics (b images, not
k b) and moves the running statistics k times per optimiser step (momentum applied per micro-batch); teachers that
copy or average the student's buffers take them after the last micro-batch. The framework options each test sets
switch off what is drawn per batch (CutMix boxes and partners, T-VAT's noise, U2PL's sampled anchors) or computed
over the whole batch (confidence thresholds); ``docs/frameworks.md`` ("Gradient accumulation") lists them.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from torch import nn

from unlabeled_views import with_unimatch_views
from npsemiseg.config import with_overrides
from npsemiseg.frameworks import framework_names
from npsemiseg.frameworks.base import Batch, StepContext
from npsemiseg.heads import NPHead, micro_batched_heads
from npsemiseg.training import build_framework
from npsemiseg.training.data_order import Streams
from npsemiseg.training.factories import build_datasets, build_optimizer, train_transforms
from npsemiseg.training.plan import batch_scaling, plan_run
from npsemiseg.training.step import train_step
from semiseg_platform.tracking import mlflow_names

#: per framework: options that leave nothing drawn or thresholded over the whole batch (see the module docstring)
NEUTRAL_OPTIONS: dict[str, dict] = {
    "mt": {"cutmix_prob": 0.0},
    "mt_cps": {"train_dropout": False},
    "psmt": {"tvat": False, "confidence_threshold": 0.0},
    "u2pl": {"sup_only_epochs": 0, "cutmix_prob": 0.0, "contrastive": False, "drop_percent": 100.0},
    "augseg": {"confidence_threshold": 0.0},
    "fixmatch": {"cutmix_p": 0.0, "confidence_threshold": 0.0},
    "unimatch": {"cutmix_p": 0.0, "confidence_threshold": 0.0, "feature_dropout": 0.0},
    "unimatch_v2": {"cutmix_p": 0.0, "confidence_threshold": 0.0, "comp_drop_kept": 1.0},
    "fixmatch_v2": {"cutmix_p": 0.0, "confidence_threshold": 0.0, "comp_drop_kept": 1.0},
}

#: frameworks whose random CutMix (PS-MT's boxes, AugSeg's two stages) or whole-batch percentile (U2PL's entropy
#: filter at its 100th percentile: the batch's maximum) no option switches off: every unlabeled image is the same
#: image, so a box pasted from any partner changes nothing and every micro-batch has the batch's maximum
SAME_UNLABELED = {"psmt", "u2pl", "augseg"}
#: AugSeg's stage 1 pastes labeled boxes into images its teacher is unsure of (probability 1 - rho_i): a teacher
#: certain of class 0 everywhere (rho = 1) pastes none
CERTAIN_TEACHER = {"augseg"}

CPU = torch.device("cpu")


class _EvalBatchNorm(nn.BatchNorm2d):
    """A BatchNorm that always normalises with its running statistics (and moves none): no batch statistics."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, False, 0.0,
                                        self.eps)


def _without_batch_statistics(module: nn.Module) -> None:
    for sub in module.modules():
        if type(sub) is nn.BatchNorm2d:
            sub.__class__ = _EvalBatchNorm
        elif isinstance(sub, nn.modules.dropout._DropoutNd):
            sub.p = 0.0


@pytest.fixture
def float64():
    dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(dtype)


def _batch(config, size: int, *, same_unlabeled: bool = False) -> Batch:
    """``size`` labeled and unlabeled images (``same_unlabeled``: one unlabeled image ``size`` times), each labeled
    image with the same number of ignored pixels (a mean over non-ignored pixels is then the same over any split)."""
    gen = torch.Generator().manual_seed(0)
    crop, k = config.schedule.crop_size, config.num_classes
    labels = torch.randint(0, k, (size, crop, crop), generator=gen)
    labels[:, :2] = 255
    labeled = {"image": torch.rand(size, 3, crop, crop, generator=gen), "label": labels}
    labeled["image_strong"] = (labeled["image"] * 0.8).clamp(0, 1)
    images = torch.rand(1 if same_unlabeled else size, 3, crop, crop, generator=gen)
    unlabeled = {"image": images.expand(size, -1, -1, -1).contiguous()}
    unlabeled["image_strong"] = unlabeled["image"].flip(-1)
    unlabeled = with_unimatch_views(unlabeled)
    unlabeled["padding"] = torch.zeros_like(unlabeled["padding"])  # no padded pixel: the same count in any split
    unlabeled["padding_mix"] = torch.zeros_like(unlabeled["padding_mix"])
    return Batch(labeled=labeled, unlabeled=unlabeled)


def _make_certain(teacher: nn.Module) -> None:
    """The teacher's last classifier layer: weight 0, bias 1000 for class 0 (softmax exactly one-hot in float64)."""
    last = [m for m in teacher.head.modules() if isinstance(m, nn.Conv2d)][-1]
    with torch.no_grad():
        last.weight.zero_()
        last.bias.zero_()
        last.bias[0] = 1000.0


def _split(batch: Batch, parts: int) -> list[Batch]:
    def chunks(part: dict[str, torch.Tensor]) -> list[dict[str, torch.Tensor]]:
        pieces = {k: v.chunk(parts) for k, v in part.items()}
        return [{k: v[i] for k, v in pieces.items()} for i in range(parts)]

    unlabeled = chunks(batch.unlabeled) if batch.unlabeled is not None else [None] * parts
    return [Batch(labeled=lab, unlabeled=unl) for lab, unl in zip(chunks(batch.labeled), unlabeled)]


def _prepared(config, framework: str):
    """The framework of ``config`` from seed 0 in float64, without batch statistics or dropout."""
    torch.manual_seed(0)
    built = build_framework(config)
    for module in built.modules().values():
        module.double()
        _without_batch_statistics(module)
    if framework in CERTAIN_TEACHER:
        _make_certain(built.teacher)
    return built


#: the step of the tests: past U2PL's supervised-only epoch and inside PS-MT's ramp-up
CTX = StepContext(step=2, total_steps=8, epoch=1, total_epochs=4, iters_per_epoch=2)


#: every registered framework, and the released MT (CPS) whose EMA runs inside the step (in its first micro-batch)
CASES = [(name, NEUTRAL_OPTIONS.get(name, {})) for name in framework_names()] + [
    ("mt_cps", {"train_dropout": False, "ema_timing": "before_unlabeled"})]


@pytest.mark.parametrize("framework, options", CASES, ids=[*framework_names(), "mt_cps-ema_before_unlabeled"])
def test_micro_batches_make_the_full_batch_step(smoke_config, float64, framework, options):
    config = smoke_config(framework=framework, head="baseline", framework_options=options)
    built = _prepared(config, framework)
    full, accumulated = built, copy.deepcopy(built)
    initial = [p.detach().clone() for p in built.student.parameters()]
    batch = _batch(config, 4, same_unlabeled=framework in SAME_UNLABELED)
    ctx = CTX
    logs = {}
    for name, fw, data in (("full", full, batch), ("accumulated", accumulated, _split(batch, 2))):
        optimizer = build_optimizer(config, fw.student)
        torch.manual_seed(1)
        logs[name] = train_step(fw, data, ctx, optimizer, config, CPU, 1)
    for (name, a), b in zip(full.modules().items(), accumulated.modules().values()):
        for (key, x), y in zip(a.state_dict().items(), b.state_dict().values()):
            assert torch.allclose(x, y, rtol=1e-9, atol=1e-12), f"{name}.{key}: {(x - y).abs().max():.3g}"
    moved = [not torch.equal(x, y) for x, y in zip(full.student.parameters(), initial)]
    assert sum(moved) > len(moved) // 2, "the step left most parameters as they were"
    for key in ("train/loss", *[k for k in logs["full"] if k.startswith("train/") and k.endswith(("sup", "unsup"))]):
        assert logs["accumulated"][key] == pytest.approx(logs["full"][key], rel=1e-6), key  # logged as float32


def test_micro_batches_returning_other_keys_are_refused(smoke_config):
    """A framework whose calls of one step log different keys cannot be averaged: one error naming both."""
    from npsemiseg.frameworks.supervised import Supervised

    class Drifting(Supervised):
        def train_step(self, batch, ctx):
            result = super().train_step(batch, ctx)
            if ctx.micro_batch == 1:
                result.logs["late"] = 1.0
            return result

    config = smoke_config()
    torch.manual_seed(0)
    fw = Drifting(Supervised.Options(), lambda: build_framework(config).student, num_classes=config.num_classes)
    with pytest.raises(ValueError, match=r"Drifting: the micro-batches of step 2 returned different .*'late'"):
        train_step(fw, _split(_batch(config, 4), 2), CTX, build_optimizer(config, fw.student), config, CPU, 1)


# --------------------------------------------------------------------------- plan, data order, loop
def test_the_plan_and_the_global_batch_count_optimiser_steps(smoke_config):
    config = smoke_config(**{"schedule.max_steps": None, "schedule.epochs": 3, "optim.reference_batch": 8})
    twice = with_overrides(config, {"schedule.accumulation_steps": 2})
    assert plan_run(config, num_labeled=4, num_unlabeled=30, world_size=1).iters_per_epoch == 15
    plan = plan_run(twice, num_labeled=4, num_unlabeled=30, world_size=1)
    assert (plan.iters_per_epoch, plan.total_steps) == (7, 21)  # N_u // (B_u x world x k) optimiser steps
    assert plan_run(twice, num_labeled=4, num_unlabeled=30, world_size=2).iters_per_epoch == 3
    scaling = batch_scaling(twice, 2)  # 2 images x 2 processes x 2 micro-batches
    assert (scaling.global_batch, scaling.accumulation_steps) == (8, 2) and not scaling.differs
    assert scaling.describe().startswith("global batch 8 (2 micro-batches per step) (reference 8)")
    assert batch_scaling(twice, 1).warning().startswith("global batch 4 differs from the preset's reference 8")
    assert mlflow_names.effective_params(scaling)[mlflow_names.EFFECTIVE_ACCUMULATION] == "2"


def test_the_micro_batches_of_a_step_are_the_images_of_its_full_batch(smoke_config):
    """Step s takes micro-batches s k .. s k + k - 1: together the samples (and augmentation draws) of the full
    batch of step s; resuming at step s starts at micro-batch s k."""
    config = smoke_config(framework="mt", **{"schedule.batch_size": 2, "schedule.unlabeled_batch_size": 2})
    micro = with_overrides(config, {"schedule.batch_size": 1, "schedule.unlabeled_batch_size": 1,
                                    "schedule.accumulation_steps": 2})
    datasets = build_datasets(config)

    def batches(cfg, start: int) -> list[Batch]:
        plan = plan_run(cfg, num_labeled=len(datasets["labeled"]), num_unlabeled=len(datasets["unlabeled"]),
                        world_size=1)
        streams = Streams(cfg, datasets, train_transforms(cfg), plan, use_unlabeled=True, rank=0, world_size=1,
                          pin_memory=False)
        return list(streams.epoch(0, start))

    full, micro_batches = batches(config, 1), batches(micro, 2)
    assert len(micro_batches) == 2 * len(full)
    for step, whole in enumerate(full):
        parts = micro_batches[2 * step: 2 * step + 2]
        for part in ("labeled", "unlabeled"):
            for key, value in getattr(whole, part).items():
                assert torch.equal(value, torch.cat([getattr(p, part)[key] for p in parts])), (step, part, key)


def test_an_accumulating_run_steps_resumes_exactly_and_logs_per_optimiser_step(smoke_config, tmp_path):
    """4 optimiser steps of 2 micro-batches: ``on_step`` once per optimiser step (steps 1-4), the checkpoint of step 2
    resumes at micro-batch 4 and ends with the uninterrupted run's weights and losses."""
    from npsemiseg.callbacks import Callbacks
    from npsemiseg.training import load_checkpoint, resolve_checkpoint, train

    class Steps(Callbacks):
        def __init__(self, resume=None) -> None:
            self.steps, self.resume = [], resume

        def on_step(self, step, total_steps, logs) -> None:
            self.steps.append((step, total_steps, logs["train/loss"]))

        def resume_from(self):
            return self.resume

    base = smoke_config(framework="mt", **{"schedule.max_steps": 4, "schedule.accumulation_steps": 2})
    straight = Steps()
    train(with_overrides(base, {"runtime.output_dir": str(tmp_path / "straight")}), straight)
    assert [(s, t) for s, t, _ in straight.steps] == [(1, 4), (2, 4), (3, 4), (4, 4)]
    split = str(tmp_path / "split")
    first, second = Steps(), Steps(resume=Path(split) / "checkpoints")
    train(with_overrides(base, {"runtime.output_dir": split, "runtime.stop_at_step": 2}), first)
    train(with_overrides(base, {"runtime.output_dir": split}), second)
    assert first.steps + second.steps == straight.steps
    weights = [load_checkpoint(resolve_checkpoint(Path(d) / "checkpoints"))["modules"]
               for d in (tmp_path / "straight", split)]
    for name, module in weights[0].items():
        assert all(torch.equal(v, weights[1][name][k]) for k, v in module.items()), name


def test_np_memories_take_the_same_rows_per_optimiser_step():
    """Under 2 micro-batches the NP head writes ``enqueue_per_class`` / 2 pixels per class and call: 8 rows per
    class and optimiser step, as one call on the whole batch; ``enqueue_per_class=None`` (every pixel) writes every
    pixel in every call. (Which pixels, and the attention of the first micro-batch on memories without the second's
    rows, differ from the full batch: ``docs/frameworks.md``, "Gradient accumulation".)"""
    features = torch.randn(4, 8, 8, 8)
    labels = torch.zeros(4, 8, 8, dtype=torch.long)  # 256 pixels of class 0 per batch, none of the others

    def count(parts: int) -> int:
        head = NPHead(8, 3, memory_size=64, enqueue_per_class=8).train()
        with micro_batched_heads([head], parts):
            for chunk, chunk_labels in zip(features.chunk(parts), labels.chunk(parts)):
                head(chunk, labels=chunk_labels, context_features=chunk, context_labels=chunk_labels)
        assert head.micro_batches == 1  # restored
        return int(head.target_count[0])

    assert count(1) == count(2) == 8 and count(4) == 8
    every_pixel = NPHead(8, 3, memory_size=64, enqueue_per_class=None)
    with micro_batched_heads([every_pixel], 2):
        assert every_pixel.call_enqueue_limit == 64


# --------------------------------------------------------------------------- two processes
WORLD = 2
DDP_FRAMEWORKS = ("supervised", "mt")


def _ddp_config(framework: str):
    from npsemiseg.config import cell_config

    return cell_config("smoke", framework=framework, dataset="synthetic", partition="1/16", head="baseline",
                       framework_options=NEUTRAL_OPTIONS.get(framework, {}))


def _rank_main(rank: int, store: str, out_dir: str) -> None:
    """Rank ``rank`` of 2: for each framework, its half of the batch of 4 as 2 micro-batches of 1."""
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float64)
    torch.distributed.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    try:
        for framework in DDP_FRAMEWORKS:
            config = _ddp_config(framework)
            fw = _prepared(config, framework)
            half = _split(_batch(config, 4), WORLD)[rank]
            torch.manual_seed(1)
            train_step(fw, _split(half, 2), CTX, build_optimizer(config, fw.student, world_size=WORLD), config, CPU,
                       WORLD)
            torch.save({n: m.state_dict() for n, m in fw.modules().items()}, f"{out_dir}/{framework}-rank{rank}.pt")
    finally:
        torch.distributed.destroy_process_group()


@pytest.mark.integration
def test_two_processes_of_two_micro_batches_make_the_full_batch_step(tmp_path, float64):
    """Global batch 4 = 1 image x 2 processes x 2 micro-batches: one gradient all-reduce after both micro-batches
    gives the step of one process on the batch of 4 (supervised and MT, as the step tests above)."""
    torch.multiprocessing.spawn(_rank_main, args=(str(tmp_path / "store"), str(tmp_path)), nprocs=WORLD, join=True)
    for framework in DDP_FRAMEWORKS:
        config = _ddp_config(framework)
        fw = _prepared(config, framework)
        torch.manual_seed(1)
        train_step(fw, _batch(config, 4), CTX, build_optimizer(config, fw.student), config, CPU, 1)
        for rank in range(WORLD):
            state = torch.load(tmp_path / f"{framework}-rank{rank}.pt")
            for name, module in fw.modules().items():
                for key, value in module.state_dict().items():
                    assert torch.allclose(value, state[name][key], rtol=1e-9, atol=1e-12), (framework, rank, name, key)
