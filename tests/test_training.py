"""The training loop: losses, schedule, data order, smoke runs, exact resume, NaN stop, checkpoints."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from benchmark_scripts import load_benchmark
import torch.nn.functional as F

from npsemiseg.callbacks import Callbacks
from npsemiseg.config import cell_config, with_overrides
from npsemiseg.frameworks.losses import (
    cross_entropy_loss,
    mean_probabilities,
    mean_softmax,
    ohem_cross_entropy,
    ohem_mask,
    pixel_cross_entropy,
    supervised_loss,
)
from npsemiseg.heads import predictive
from npsemiseg.training import (
    SeededItems,
    build_datasets,
    epoch_order,
    plan_run,
    poly_lr,
    rank_batches,
    train,
    train_transforms,
)
from npsemiseg.training.data_order import run_lists, sampler_epoch, shared_epoch_order


class Recorder(Callbacks):
    """Keeps everything the loop reports."""

    def __init__(self, resume: Path | None = None) -> None:
        self.steps: list[tuple[int, dict[str, float]]] = []
        self.evaluations: list[tuple[int, dict[str, float]]] = []
        self.checkpoints: list[tuple[int, Path]] = []
        self.artifacts: dict[str, Path] = {}
        self.started: dict | None = None
        self.ended = None
        self.resume = resume

    def on_start(self, config, **kwargs) -> None:
        self.started = kwargs

    def on_step(self, step, total_steps, logs) -> None:
        self.steps.append((step, dict(logs)))

    def on_evaluation(self, step, metrics) -> None:
        self.evaluations.append((step, dict(metrics)))

    def on_checkpoint(self, step, directory, metrics) -> None:
        assert (directory / "state.pt").is_file()
        self.checkpoints.append((step, directory))

    def resume_from(self):
        return self.resume

    def on_artifact(self, name, path) -> None:
        assert Path(path).is_file()
        self.artifacts[name] = Path(path)

    def on_end(self, result) -> None:
        self.ended = result


# --------------------------------------------------------------------------- losses
def test_sample_cross_entropy_forms_by_hand():
    # one pixel, K = 2, label 0; sample 1 logits (0, 0), sample 2 logits (2, 0)
    logits = torch.tensor([[0.0, 0.0], [2.0, 0.0]]).view(2, 1, 2, 1, 1)
    labels = torch.zeros(1, 1, 1, dtype=torch.long)
    elbo = pixel_cross_entropy(logits, labels, form="elbo")
    mean_logits = pixel_cross_entropy(logits, labels, form="mean_logits")
    assert elbo.shape == (1, 1, 1)
    assert elbo.item() == pytest.approx((math.log(2) + math.log(1 + math.exp(-2))) / 2, rel=1e-6)
    assert mean_logits.item() == pytest.approx(math.log(1 + math.exp(-1)), rel=1e-6)
    with pytest.raises(ValueError, match="form"):
        pixel_cross_entropy(logits, labels, form="median")  # type: ignore[arg-type]


def test_single_sample_ce_is_plain_ce_and_ignores_255():
    torch.manual_seed(0)
    logits = torch.randn(1, 2, 3, 4, 4)
    labels = torch.randint(0, 3, (2, 4, 4))
    labels[0, 0, :] = 255
    expected = F.cross_entropy(logits[0], labels, ignore_index=255, reduction="none")
    for form in ("elbo", "mean_logits"):
        out = pixel_cross_entropy(logits, labels, form=form)
        assert torch.allclose(out, expected) and (out[0, 0] == 0).all()
    assert cross_entropy_loss(logits, labels).item() == pytest.approx(
        F.cross_entropy(logits[0], labels, ignore_index=255).item(), rel=1e-6)
    with pytest.raises(ValueError, match="labels"):
        pixel_cross_entropy(logits, labels[:1])
    with pytest.raises(ValueError, match="at most"):
        pixel_cross_entropy(logits, labels[:, :2])


def _plain_pixel_ce(logits, labels, form, align_corners):
    """The materialised form the lean loss replaced: every sample upsampled at once, then CE."""
    size = labels.shape[-2:]
    up = F.interpolate(logits.flatten(0, 1).float(), size=size, mode="bilinear", align_corners=align_corners)
    up = up.view(*logits.shape[:3], *size)
    if form == "mean_logits":
        return F.cross_entropy(up.mean(dim=0), labels, ignore_index=255, reduction="none")
    target = labels.expand(logits.shape[0], *labels.shape).flatten(0, 1)
    return F.cross_entropy(up.flatten(0, 1), target, ignore_index=255, reduction="none").view(
        logits.shape[0], *labels.shape).mean(dim=0)


@pytest.mark.parametrize("form", ["elbo", "mean_logits"])
@pytest.mark.parametrize("samples, align_corners, dtype", [(1, False, torch.float32), (5, False, torch.float32),
                                                           (3, True, torch.float32), (5, False, torch.bfloat16)])
def test_upsampling_ce_equals_the_materialised_form_with_gradients(form, samples, align_corners, dtype):
    """Logits at feature resolution, upsampled inside the loss one sample at a time (backward recomputes them):
    the per-pixel loss and the gradient of the logits equal upsample-all-then-CE at float32 round-off."""
    torch.manual_seed(1)
    logits = (torch.randn(samples, 2, 4, 6, 7) * 3).to(dtype)
    labels = torch.randint(0, 4, (2, 23, 27))
    labels[0, :5] = 255
    weights = torch.rand(2, 23, 27)  # a non-uniform upstream gradient (confidence weights, masks)
    lean_in, plain_in = logits.clone().requires_grad_(), logits.clone().requires_grad_()
    lean = pixel_cross_entropy(lean_in, labels, form=form, align_corners=align_corners)
    plain = _plain_pixel_ce(plain_in, labels, form, align_corners)
    assert lean.dtype == plain.dtype == torch.float32 and (lean[0, :5] == 0).all()
    assert torch.allclose(lean, plain, rtol=1e-5, atol=1e-6)
    (lean * weights).sum().backward()
    (plain * weights).sum().backward()
    assert lean_in.grad.dtype == dtype
    tolerance = 1e-6 if dtype == torch.float32 else 1e-2  # bf16 gradients: their own rounding
    assert torch.allclose(lean_in.grad.float(), plain_in.grad.float(), rtol=tolerance, atol=tolerance)


def test_ohem_on_feature_resolution_logits_equals_ohem_on_upsampled_ones():
    torch.manual_seed(2)
    logits = torch.randn(3, 2, 4, 5, 5)
    labels = torch.randint(0, 4, (2, 20, 20))
    labels[1, :3] = 255
    up = F.interpolate(logits.flatten(0, 1), size=(20, 20), mode="bilinear").view(3, 2, 4, 20, 20)
    for min_kept in (1, 300):
        lean = ohem_cross_entropy(logits, labels, thresh=0.7, min_kept=min_kept)
        assert lean.item() == pytest.approx(ohem_cross_entropy(up, labels, thresh=0.7, min_kept=min_kept).item(), rel=1e-5)


def test_mean_probabilities_equal_the_predictive_of_the_upsampled_samples():
    torch.manual_seed(3)
    logits = torch.randn(4, 2, 5, 6, 6) * 2
    up = F.interpolate(logits.flatten(0, 1), size=(17, 19), mode="bilinear", align_corners=True).view(4, 2, 5, 17, 19)
    expected, _ = predictive(up)
    assert torch.allclose(mean_probabilities(logits, (17, 19), align_corners=True), expected, atol=1e-6)


def test_mean_softmax_equals_the_materialised_form_with_gradients():
    """MT (CPS)'s MSE term: the mean softmax of the upsampled samples, one sample at a time, equals upsampling all
    samples at once, softmax and mean, and so does its gradient (float64)."""
    torch.manual_seed(5)
    logits = (torch.randn(3, 2, 4, 5, 6, dtype=torch.float64) * 2).requires_grad_()
    target = torch.rand(2, 4, 13, 11, dtype=torch.float64)
    lean = mean_softmax(logits, (13, 11), align_corners=False)
    (grad_lean,) = torch.autograd.grad(F.mse_loss(lean, target), logits)
    up = F.interpolate(logits.flatten(0, 1), size=(13, 11), mode="bilinear", align_corners=False).view(3, 2, 4, 13, 11)
    full = up.softmax(dim=2).mean(dim=0)
    (grad_full,) = torch.autograd.grad(F.mse_loss(full, target), logits)
    assert lean.dtype == torch.float32 and torch.allclose(lean.double(), full, atol=1e-6)
    assert torch.allclose(grad_lean, grad_full, rtol=1e-5, atol=1e-9)


def test_ohem_mask_threshold_and_min_kept():
    probability = torch.tensor([0.1, 0.5, 0.8, 0.95]).view(1, 1, 4)
    valid = torch.ones(1, 1, 4, dtype=torch.bool)
    assert ohem_mask(probability, valid, thresh=0.7, min_kept=2).flatten().tolist() == [True, True, False, False]
    assert ohem_mask(probability, valid, thresh=0.7, min_kept=3).flatten().tolist() == [True, True, True, False]
    assert ohem_mask(probability, valid, thresh=0.7, min_kept=10).all()  # more than valid: keep all
    valid[0, 0, 0] = False
    assert ohem_mask(probability, valid, thresh=0.7, min_kept=1).flatten().tolist() == [False, True, False, False]


def test_ohem_ce_averages_over_the_hard_pixels():
    # pixel 0 easy (p(label) ~ 1), pixel 1 hard: OHEM keeps only pixel 1
    logits = torch.tensor([[10.0, -10.0], [0.0, 0.0]]).t().reshape(1, 1, 2, 1, 2)
    labels = torch.tensor([[[0, 0]]])
    loss = ohem_cross_entropy(logits, labels, thresh=0.7, min_kept=1)
    assert loss.item() == pytest.approx(math.log(2), rel=1e-5)


def test_supervised_loss_upsamples_and_weights_the_aux_head():
    torch.manual_seed(0)
    logits = torch.randn(2, 1, 3, 4, 4)
    aux = torch.randn(1, 3, 2, 2)
    labels = torch.randint(0, 3, (1, 8, 8))
    terms = supervised_loss(logits, aux, labels, aux_weight=0.4)
    up = F.interpolate(aux, size=(8, 8), mode="bilinear", align_corners=False)
    assert terms["aux"].item() == pytest.approx(0.4 * F.cross_entropy(up, labels).item(), rel=1e-5)
    assert set(supervised_loss(logits, None, labels)) == {"sup"}


# --------------------------------------------------------------------------- schedule and data order
def test_poly_lr():
    assert poly_lr(0.01, 0, 100, 0.9) == 0.01
    assert poly_lr(0.01, 50, 100, 0.9) == pytest.approx(0.01 * 0.5 ** 0.9)
    assert poly_lr(0.01, 99, 100, 0.9) == pytest.approx(0.01 * 0.01 ** 0.9)


def test_epoch_length_conventions(smoke_config):
    config = smoke_config(**{"schedule.max_steps": None, "schedule.epochs": 3})
    plan = plan_run(config, num_labeled=4, num_unlabeled=30, world_size=1)
    assert (plan.iters_per_epoch, plan.total_steps, plan.total_epochs) == (15, 45, 3)
    plan = plan_run(config, num_labeled=4, num_unlabeled=30, world_size=2)
    assert plan.iters_per_epoch == 7  # N_u // (B_u x world)
    labeled = plan_run(with_overrides(config, {"schedule.epoch_length": "labeled"}), num_labeled=4,
                       num_unlabeled=30, world_size=1)
    assert labeled.iters_per_epoch == 2
    capped = plan_run(with_overrides(config, {"schedule.max_steps": 20}), num_labeled=4, num_unlabeled=30, world_size=1)
    assert (capped.total_steps, capped.total_epochs) == (20, 2)


def test_labeled_list_is_repeated_and_shards_partition_the_global_batches():
    order = epoch_order(3, 12, seed=0, stream="labeled", epoch=0)
    assert sorted(order) == [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2]  # whole passes over the labeled list
    assert order != epoch_order(3, 12, seed=0, stream="labeled", epoch=1)
    assert order == epoch_order(3, 12, seed=0, stream="labeled", epoch=0)
    shards = [rank_batches(order, batch_size=2, rank=r, world_size=2, seed=0, stream="labeled", epoch=0)
              for r in range(2)]
    single = rank_batches(order, batch_size=4, rank=0, world_size=1, seed=0, stream="labeled", epoch=0)
    for i, global_batch in enumerate(single):
        assert shards[0][i] + shards[1][i] == global_batch  # same samples, same augmentation seeds
    resumed = rank_batches(order, batch_size=4, rank=0, world_size=1, seed=0, stream="labeled", epoch=0, start_batch=2)
    assert resumed == single[2:]


@pytest.mark.parametrize("order", ["shared_repeated", "shared_sampled"])
@pytest.mark.parametrize("num_labeled", [7, 40])
def test_shared_data_order_is_the_official_samplers_order(order, num_labeled):
    """The official lists (UniMatch's ``SemiDataset``: repeated and truncated; U2PL's ``voc_dset``: ``random.sample``
    after ``random.seed(seed)``) read by a ``DistributedSampler`` of seed 0 per list, ``set_epoch`` on both."""
    import random

    from torch.utils.data.distributed import DistributedSampler

    num_unlabeled, seed = 30, 3
    labeled_ids, unlabeled_ids = [f"l{i}" for i in range(num_labeled)], [f"u{i}" for i in range(num_unlabeled)]
    repeated = labeled_ids * math.ceil(num_unlabeled / num_labeled)
    if order == "shared_repeated":
        official = {"labeled": repeated[:num_unlabeled], "unlabeled": unlabeled_ids}
    else:
        random.seed(seed)
        sampled_labeled = random.sample(repeated, num_unlabeled)
        random.seed(seed)
        official = {"labeled": sampled_labeled, "unlabeled": random.sample(unlabeled_ids, num_unlabeled)}
    lists = run_lists(order, num_labeled, num_unlabeled, seed=seed)
    for stream, ids in (("labeled", labeled_ids), ("unlabeled", unlabeled_ids)):
        sampler = DistributedSampler(official[stream], num_replicas=1, rank=0)  # the scripts' defaults: seed 0
        for epoch in range(3):
            sampler.set_epoch(epoch)
            expected = [official[stream][i] for i in sampler]
            assert [ids[i] for i in shared_epoch_order(lists, stream, num_unlabeled, epoch=epoch)] == expected
    first = shared_epoch_order(lists, "unlabeled", num_unlabeled, epoch=0)
    partner = dict(zip(first, shared_epoch_order(lists, "labeled", num_unlabeled, epoch=0)))
    later = shared_epoch_order(lists, "unlabeled", num_unlabeled, epoch=1)
    assert later != first  # a new permutation every epoch, the same labeled partner for each unlabeled image
    assert dict(zip(later, shared_epoch_order(lists, "labeled", num_unlabeled, epoch=1))) == partner
    assert run_lists(order, num_labeled, num_unlabeled, seed=seed + 1)["labeled"] != lists["labeled"] or \
        order == "shared_repeated"
    longer = shared_epoch_order(lists, "unlabeled", 2 * num_unlabeled + 5, epoch=0)
    assert longer[:num_unlabeled] == first and len(longer) == 2 * num_unlabeled + 5


def test_frozen_data_order_is_torchsemiseg_samplers_order():
    """TorchSemiSeg's MeanTeacher: both lists ``max_samples`` long (the labeled ids repeated, ``BaseDataset``), a
    ``DistributedSampler`` of seed 0 each, ``set_epoch`` on the labeled one only: the unlabeled images in epoch 0's
    permutation in every epoch, the labeled ones in a new permutation each epoch."""
    from torch.utils.data.distributed import DistributedSampler

    num_labeled, num_unlabeled = 6, 30
    lists = run_lists("shared_repeated_frozen", num_labeled, num_unlabeled, seed=5)
    official = {"labeled": list(range(num_labeled)) * (num_unlabeled // num_labeled), "unlabeled": list(range(num_unlabeled))}
    samplers = {stream: DistributedSampler(ids, num_replicas=1, rank=0) for stream, ids in official.items()}
    for epoch in range(3):
        samplers["labeled"].set_epoch(epoch)
        for stream, sampler in samplers.items():
            expected = [official[stream][i] for i in sampler]
            assert shared_epoch_order(lists, stream, num_unlabeled,
                                      epoch=sampler_epoch("shared_repeated_frozen", stream, epoch)) == expected
    assert sampler_epoch("shared_repeated", "unlabeled", 2) == sampler_epoch("shared_repeated_frozen", "labeled", 2) == 2


def test_cycled_labeled_order_replays_the_first_pass_after_the_warm_up(smoke_config):
    """PS-MT's ``zip(cycle(supervised_loader), unsupervised_loader)``: after the warm-up an epoch's labeled batches
    are its first pass's, indices and augmentation seeds, replayed in turn (``itertools.cycle``), from any resume
    point; the warm-up epochs and the unlabeled stream read fresh passes."""
    import itertools

    from npsemiseg.training.data_order import Streams as _Streams

    assert cell_config("paper", framework="psmt", dataset="synthetic_voc", partition="1464",
                       protocol="released").data.order == "cycled_labeled"
    config = with_overrides(smoke_config(framework="psmt"), {"data.order": "cycled_labeled",
                                                             "schedule.epoch_length": "unlabeled"})
    datasets = build_datasets(config)
    plan = plan_run(config, num_labeled=len(datasets["labeled"]), num_unlabeled=len(datasets["unlabeled"]), world_size=1)
    streams = _Streams(config, datasets, train_transforms(config), plan, use_unlabeled=True, rank=0, world_size=1,
                       pin_memory=False, warmup_epochs=1)
    labeled, unlabeled = len(datasets["labeled"]), len(datasets["unlabeled"])
    batch = config.schedule.batch_size
    per_pass = labeled // batch
    assert 1 < per_pass < plan.iters_per_epoch, (labeled, batch, plan.iters_per_epoch)
    warm, after = streams._batches("labeled", labeled, 0, 0), streams._batches("labeled", labeled, 1, 0)
    first_pass = after[:per_pass]
    assert after == list(itertools.islice(itertools.cycle(first_pass), plan.iters_per_epoch))
    assert len({index for b in first_pass for index, _ in b}) == per_pass * batch  # one pass: no image twice
    assert warm[per_pass:2 * per_pass] != warm[:per_pass]  # the warm-up's epoch: fresh passes
    assert streams._batches("labeled", labeled, 1, per_pass + 3) == after[per_pass + 3:]  # resumed mid-epoch
    from npsemiseg.training.setup import setup_run

    released = with_overrides(config, {"framework_options.warmup_epochs": 2})
    assert setup_run(released, torch.device("cpu")).streams.warmup_epochs == 2  # the framework's warm-up reaches it
    fresh = streams._batches("unlabeled", unlabeled, 1, 0)
    assert len({index for b in fresh for index, _ in b}) == min(unlabeled, len(fresh) * config.schedule.unlabeled_batch_size)


def test_released_cells_stream_in_the_official_order(smoke_config):
    from npsemiseg.training.data_order import Streams as _Streams

    assert cell_config("paper", framework="u2pl", dataset="synthetic_voc", partition="1464",
                       protocol="released").data.order == "shared_sampled"
    assert cell_config("paper", framework="unimatch", dataset="synthetic_voc", partition="1464",
                       protocol="released").data.order == "shared_repeated"
    assert cell_config("paper", framework="u2pl", dataset="synthetic_voc", partition="1464").data.order == "passes"
    assert cell_config("paper", framework="mt", dataset="synthetic_voc", partition="1464",
                       protocol="released").data.order == "shared_repeated_frozen"
    config = with_overrides(smoke_config(framework="mt"), {"data.order": "shared_sampled"})
    datasets = build_datasets(config)
    plan = plan_run(config, num_labeled=len(datasets["labeled"]), num_unlabeled=len(datasets["unlabeled"]), world_size=1)
    streams = _Streams(config, datasets, train_transforms(config), plan, use_unlabeled=True, rank=0, world_size=1,
                       pin_memory=False)
    assert streams.lists == run_lists("shared_sampled", len(datasets["labeled"]), len(datasets["unlabeled"]),
                                      seed=config.seed)
    length = plan.iters_per_epoch * config.schedule.unlabeled_batch_size
    loader = streams._loader("unlabeled", streams.items["unlabeled"], 0, 0)
    delivered = [index for batch in loader.batch_sampler for index, _ in batch]
    assert delivered == shared_epoch_order(streams.lists, "unlabeled", length, epoch=0)[:len(delivered)]
    frozen = _Streams(with_overrides(config, {"data.order": "shared_repeated_frozen"}), datasets,
                      train_transforms(config), plan, use_unlabeled=True, rank=0, world_size=1, pin_memory=False)
    indices = {(stream, epoch): [index for batch in frozen._loader(stream, frozen.items[stream], epoch, 0).batch_sampler
                                 for index, _ in batch] for stream in ("labeled", "unlabeled") for epoch in (0, 1)}
    assert indices["unlabeled", 1] == indices["unlabeled", 0] and indices["labeled", 1] != indices["labeled", 0]


def test_seeded_items_are_reproducible_and_leave_the_global_rng(smoke_config):
    config = smoke_config(framework="augseg")
    datasets = build_datasets(config)
    items = SeededItems(datasets["unlabeled"], train_transforms(config)["unlabeled"])
    state = torch.get_rng_state()
    first, again, other = items[(0, 11)], items[(0, 11)], items[(0, 12)]
    assert torch.equal(state, torch.get_rng_state())
    assert set(first) == {"image", "label", "image_strong"}
    assert first["image"].shape[-2:] == (config.schedule.crop_size,) * 2
    assert all(torch.equal(first[k], again[k]) for k in first)
    assert not all(torch.equal(first[k], other[k]) for k in first)


def test_data_stream_does_not_depend_on_num_workers(smoke_config):
    from npsemiseg.training.data_order import Streams as _Streams

    config = smoke_config(framework="mt")
    datasets = build_datasets(config)
    plan = plan_run(config, num_labeled=len(datasets["labeled"]), num_unlabeled=len(datasets["unlabeled"]), world_size=1)

    def first_batches(workers: int):
        cfg = with_overrides(config, {"data.num_workers": workers})
        streams = _Streams(cfg, datasets, train_transforms(cfg), plan, use_unlabeled=True, rank=0, world_size=1,
                           pin_memory=False)
        return [b for _, b in zip(range(2), streams.epoch(0, 0))]

    for a, b in zip(first_batches(0), first_batches(2)):
        for part in ("labeled", "unlabeled"):
            assert all(torch.equal(getattr(a, part)[k], getattr(b, part)[k]) for k in getattr(a, part))


# --------------------------------------------------------------------------- runs
@pytest.mark.parametrize("head", ["baseline", "mc_dropout", "np"])
def test_supervised_smoke_run(smoke_config, head):
    config = smoke_config(head=head)
    recorder = Recorder()
    result = train(config, recorder)
    assert result.steps == config.schedule.max_steps == len(recorder.steps)
    assert recorder.started == {"total_steps": 3, "start_step": 0, "rank": 0, "world_size": 1}
    for _, logs in recorder.steps:
        assert all(math.isfinite(v) for v in logs.values())
        assert {"train/loss", "train/sup", "train/lr", "train/sec_per_iter", "train/images_per_sec"} <= set(logs)
        assert ("train/kl" in logs) is ("train/head/kl" in logs) is (head == "np")
        if head == "np":  # the loss term is lambda_kl x the head's raw KL
            assert logs["train/kl"] == pytest.approx(config.head.options["lambda_kl"] * logs["train/head/kl"], rel=1e-5)
    assert recorder.steps[0][1]["train/lr"] == config.optim.lr
    assert 0.0 <= result.metrics["miou"] <= 1.0 and 0.0 <= result.metrics["pavpu"] <= 1.0
    assert {"ece", "nll", "brier", "auroc", "pixel_acc"} <= set(result.metrics)
    assert result.history[-1]["step"] == 3 and result.cell_id == config.cell_id
    assert recorder.ended is result and result.checkpoint is None and not result.interrupted


def _weights(result_dir: Path) -> dict[str, torch.Tensor]:
    from npsemiseg.training import load_checkpoint, resolve_checkpoint

    state = load_checkpoint(resolve_checkpoint(result_dir / "checkpoints"))
    return {f"{m}.{k}": v for m, sd in state["modules"].items() for k, v in sd.items()}


@pytest.mark.parametrize("framework,overrides", [
    ("supervised", {}), ("u2pl", {}), ("supervised", {"optim.name": "adamw"}),
    # PS-MT's released warm-up: teachers with optimisers of their own, resumed in the middle of it
    ("psmt", {"framework_options.warmup_epochs": 100}),
    # the CutMix boxes and partner shift drawn on the host from torch's generator (its state is checkpointed)
    ("unimatch", {"framework_options.cutmix_p": 1.0}),
], ids=["supervised", "u2pl", "adamw", "psmt-warmup", "unimatch-boxes"])
def test_resume_is_exact(smoke_config, tmp_path, framework, overrides):
    """2 steps + checkpoint + restore + 2 steps == 4 straight steps: weights, NP memories, losses."""
    base = smoke_config(framework=framework, head="np", **{"schedule.max_steps": 4, **overrides})
    straight = Recorder()
    train(with_overrides(base, {"runtime.output_dir": str(tmp_path / "straight")}), straight)

    split_dir = str(tmp_path / "split")
    first = Recorder()
    interrupted = train(with_overrides(base, {"runtime.output_dir": split_dir, "runtime.stop_at_step": 2}), first)
    assert interrupted.interrupted and interrupted.steps == 2 and interrupted.metrics == {}
    second = Recorder(resume=Path(split_dir) / "checkpoints")
    resumed = train(with_overrides(base, {"runtime.output_dir": split_dir}), second)
    assert second.started["start_step"] == 2 and resumed.steps == 4

    losses = [logs["train/loss"] for _, logs in straight.steps]
    assert losses == [logs["train/loss"] for _, logs in first.steps + second.steps]
    a, b = _weights(tmp_path / "straight"), _weights(Path(split_dir))
    assert a.keys() == b.keys()
    different = [k for k in a if not torch.equal(a[k], b[k])]
    assert not different, different[:5]
    assert any("memory" in k for k in a)  # the NP memories are part of what was compared
    timing = {"seconds_per_image"}
    assert {k: v for k, v in resumed.metrics.items() if k not in timing} == pytest.approx(
        {k: v for k, v in straight.ended.metrics.items() if k not in timing}, nan_ok=True)


def test_resume_refuses_a_checkpoint_of_another_cell(smoke_config, tmp_path):
    config = smoke_config(**{"runtime.output_dir": str(tmp_path), "runtime.stop_at_step": 1})
    train(config)
    other = smoke_config(seed=1)
    with pytest.raises(ValueError, match="belongs to cell"):
        train(other, resume_from=tmp_path / "checkpoints")
    with pytest.raises(ValueError, match="resume_from"):
        train(config, resume_from=tmp_path / "nothing")


def test_the_curve_data_is_reported_without_figures(smoke_config):
    from npsemiseg.training.artifacts import CURVES_ARTIFACT
    from semiseg_platform.tracking.mlflow_names import CELL_CURVES

    assert CELL_CURVES == CURVES_ARTIFACT  # the name the reports read is the one training logs
    recorder = Recorder()
    train(smoke_config(head="baseline", **{"schedule.max_steps": 2, "evaluation.figures": False}), recorder)
    # the reports' per-grid figures read it; no figure is drawn
    assert [name for name in recorder.artifacts if name.startswith("figures/")] == ["figures/reliability_curves.json"]


def test_checkpoints_and_artifacts(smoke_config, tmp_path):
    from npsemiseg.training import resolve_checkpoint

    config = smoke_config(head="mc_dropout", **{"runtime.output_dir": str(tmp_path), "schedule.max_steps": 4,
                                                  "schedule.checkpoint_every_steps": 1, "runtime.keep_checkpoints": 2,
                                                  "evaluation.figures": True, "schedule.eval_every_epochs": 1})
    recorder = Recorder()
    result = train(config, recorder)
    assert [s for s, _ in recorder.checkpoints] == [1, 2, 3, 4]
    kept = sorted(p.name for p in (tmp_path / "checkpoints").glob("step_*"))
    assert kept == ["step_00000003", "step_00000004"]  # only the newest two stay
    assert (tmp_path / "checkpoints" / "latest").read_text().strip() == "step_00000004"
    assert result.checkpoint == tmp_path / "checkpoints" / "step_00000004"
    assert not list((tmp_path / "checkpoints").glob(".tmp-*"))
    assert {"figures/uncertainty_maps.png", "figures/reliability.png", "figures/risk_coverage.png",
            "figures/reliability_curves.json", "tables/per_class_iou.csv"} <= set(recorder.artifacts)
    assert (result.checkpoint / "config.yaml").read_text() == config.to_yaml()
    (tmp_path / "checkpoints" / "latest").unlink()  # interrupted before ``latest`` was rewritten
    assert resolve_checkpoint(tmp_path / "checkpoints") == result.checkpoint
    assert recorder.evaluations[-1][0] == 4


def test_the_loop_reads_every_n_steps_and_reports_every_step_in_order_with_the_same_values(smoke_config):
    """``runtime.read_every_steps`` 3 against 1 (5 steps; the loop also reads at each epoch's end): the same
    steps reach ``on_step`` in order with the same logged values (times aside)."""
    timing = {"train/sec_per_iter", "train/images_per_sec", "train/epoch_images_per_sec", "train/peak_memory_mb"}

    def logged(every):
        recorder = Recorder()
        train(smoke_config(**{"schedule.max_steps": 5, "schedule.eval_every_epochs": 0, "runtime.read_every_steps": every}),
              recorder)
        return [(step, {k: v for k, v in logs.items() if k not in timing}) for step, logs in recorder.steps]

    every_step = logged(1)
    assert [step for step, _ in every_step] == [1, 2, 3, 4, 5]
    assert logged(3) == every_step


def test_non_finite_loss_stops_with_the_step_and_term(smoke_config):
    config = smoke_config(**{"optim.lr": 1e30, "schedule.max_steps": 6})
    with pytest.raises(FloatingPointError, match=r"non-finite loss at step \d+: term '\w+' is (nan|inf)"):
        train(config)


def test_the_gradient_norm_is_logged_every_step_before_clipping_and_clipping_bounds_the_update(smoke_config):
    """``train/grad_norm`` is the norm the optimiser received (plain SGD: the update / lr) without clipping, and the
    same pre-clip norm with clipping, whose update then has the clipped norm."""
    from npsemiseg.training.setup import setup_run

    def one_step(clip):
        config = smoke_config(**{"schedule.max_steps": 1, "optim.momentum": 0.0, "optim.weight_decay": 0.0,
                                 "optim.head_lr_mult": 1.0, "optim.lr": 0.01, "optim.grad_clip": clip})
        start = {n: p.detach().clone() for n, p in setup_run(config, torch.device("cpu")).framework.student.named_parameters()}
        recorder = Recorder()
        result = train(config, recorder)
        moved = sum(float((p.detach() - start[n]).pow(2).sum()) for n, p in result.framework.student.named_parameters())
        return recorder.steps[0][1]["train/grad_norm"], math.sqrt(moved) / 0.01

    logged, update = one_step(None)
    assert logged > 1e-2 and update == pytest.approx(logged, rel=1e-3)
    logged_clipped, update_clipped = one_step(1e-3)
    assert logged_clipped == pytest.approx(logged, rel=1e-5)  # the norm before clipping
    assert update_clipped == pytest.approx(1e-3, rel=1e-2)


def test_python_api_names():
    from npsemiseg import RunResult
    from npsemiseg import train as api_train
    from npsemiseg.config import cell_config

    assert api_train is train and RunResult.__name__ == "RunResult"
    assert cell_config("smoke").cell_id


def test_cityscapes_convention_adds_ohem_and_the_aux_head_term(smoke_config):
    config = smoke_config(dataset="synthetic_cityscapes", partition="1/8", **{"schedule.max_steps": 2})
    assert config.loss.ohem and config.model.aux_head and config.optim.head_lr_mult == 1.0
    recorder = Recorder()
    train(config, recorder)
    for _, logs in recorder.steps:
        assert {"train/sup", "train/aux"} <= set(logs)
        assert logs["train/loss"] == pytest.approx(logs["train/sup"] + logs["train/aux"], rel=1e-6)


def test_head_learning_rate_multiplier_and_poly_decay(smoke_config, tmp_path):
    from npsemiseg.training import load_checkpoint, resolve_checkpoint

    config = smoke_config(**{"optim.lr": 0.02, "optim.head_lr_mult": 10.0, "schedule.max_steps": 4,
                             "runtime.output_dir": str(tmp_path), "runtime.stop_at_step": 2})
    train(config)
    state = load_checkpoint(resolve_checkpoint(tmp_path / "checkpoints"))
    lr_step1 = poly_lr(0.02, 1, 4, 0.9)  # the lr of the last step taken (0-based step 1)
    assert [g["lr"] for g in state["optimizer"]["param_groups"]] == pytest.approx([lr_step1, 10 * lr_step1])
    assert state["scheduler"] == {"step": 2, "total_steps": 4, "power": 0.9}
    assert state["data"] == {"epoch": 0, "batch": 2}


def test_adamw_takes_the_same_groups_and_checkpoints_its_moments(smoke_config, tmp_path):
    from npsemiseg.training import load_checkpoint, resolve_checkpoint

    config = smoke_config(**{"optim.name": "adamw", "optim.lr": 0.02, "optim.head_lr_mult": 10.0, "schedule.max_steps": 4,
                             "runtime.output_dir": str(tmp_path), "runtime.stop_at_step": 2})
    train(config)
    optimizer = load_checkpoint(resolve_checkpoint(tmp_path / "checkpoints"))["optimizer"]
    lr_step1 = poly_lr(0.02, 1, 4, 0.9)
    assert [g["lr"] for g in optimizer["param_groups"]] == pytest.approx([lr_step1, 10 * lr_step1])
    assert all("betas" in g and "momentum" not in g for g in optimizer["param_groups"])  # AdamW, not SGD
    assert optimizer["state"] and all({"exp_avg", "exp_avg_sq"} <= set(s) for s in optimizer["state"].values())


def test_evaluating_during_training_does_not_change_the_trajectory(smoke_config):
    """Evaluation runs under a forked RNG: the same losses with and without per-epoch evaluation."""
    config = smoke_config(head="mc_dropout", **{"schedule.epoch_length": "labeled",  # 1 step per epoch
                                                "data.options.train_size": 32})  # 2 labeled images
    quiet, evaluated = Recorder(), Recorder()
    train(config, quiet)
    train(with_overrides(config, {"schedule.eval_every_epochs": 1}), evaluated)
    assert [s for s, _ in evaluated.evaluations] == [1, 2, 3]  # two during training + the final one
    assert [logs["train/loss"] for _, logs in quiet.steps] == [logs["train/loss"] for _, logs in evaluated.steps]


def test_best_epoch_candidates_start_at_select_from_epoch():
    """``evaluation.select_from_epoch`` (CPS's MeanTeacher reports the best of epochs 20-34): earlier evaluations
    never become ``best``, however good."""
    from npsemiseg.training.selection import BestWeights

    best = BestWeights(None, keep_weights=False, from_epoch=20)  # type: ignore[arg-type]
    assert not best.offer(190, 19, {"miou": 0.9})
    assert best.offer(200, 20, {"miou": 0.5}) and not best.offer(210, 21, {"miou": 0.4})
    summary = best.select({"miou": 0.45}, step=340, epoch=34)
    assert (summary["best/epoch"], summary["best/miou"], summary["last/miou"]) == (20, 0.5, 0.45)
    short = BestWeights(None, keep_weights=True, from_epoch=20)  # type: ignore[arg-type]  # a run shorter than that
    assert short.select({"miou": 0.3}, step=30, epoch=3)["miou"] == 0.3  # the last evaluation, nothing to restore


@pytest.mark.parametrize("select", ["best", "last"])
def test_checkpoint_selection_reports_and_restores_the_best_epoch(smoke_config, select):
    """``evaluation.select``: both last and best metrics are logged; with ``best`` the returned model holds
    the best evaluation's weights (re-evaluating it gives that evaluation's metrics exactly)."""
    from npsemiseg.training.artifacts import evaluate_run  # the loop's own evaluation

    found = None
    for lr in (0.5, 0.2, 1.0, 0.05):  # an erratic run: the best mIoU is not the last one
        config = smoke_config(**{"schedule.epoch_length": "labeled", "schedule.max_steps": 6, "schedule.epochs": 6,
                                 "schedule.eval_every_epochs": 1, "data.options.train_size": 32,
                                 "optim.lr": lr, "evaluation.select": select, "evaluation.max_images": 4})
        recorder = Recorder()
        result = train(config, recorder)
        mious = {step: m["miou"] for step, m in recorder.evaluations}
        best_step = max(mious, key=lambda s: (mious[s], -s))
        if best_step != result.steps:
            found = (config, result, mious, best_step)
            break
    assert found is not None, "no learning rate gave a run whose best evaluation is not the last"
    config, result, mious, best_step = found
    metrics = result.metrics
    assert metrics["last/miou"] == mious[result.steps] and metrics["best/miou"] == mious[best_step]
    assert metrics["best/step"] == best_step
    selected = best_step if select == "best" else result.steps
    assert metrics["miou"] == mious[selected]
    again = evaluate_run(result.framework, build_datasets(config), config, step=selected, device=torch.device("cpu"))
    assert again["miou"] == pytest.approx(mious[selected], abs=1e-9)


def test_also_student_logs_the_students_evaluations_apart_from_the_teachers(smoke_config):
    """``evaluation.also_student`` on Mean Teacher (the EMA teacher reported): every evaluation also holds the
    student's metrics, which differ from the teacher's; the run reports the last student's and the best student's
    apart from ``last/*`` and ``best/*``; training and the teacher's metrics are those of a run without it."""
    config = smoke_config("mt", **{"schedule.epoch_length": "labeled", "data.options.train_size": 32,
                                   "schedule.eval_every_epochs": 1})  # 1 step per epoch: 3 evaluations
    plain, both = Recorder(), Recorder()
    train(config, plain)
    result = train(with_overrides(config, {"evaluation.also_student": True}), both)
    assert config.cell_id == with_overrides(config, {"evaluation.also_student": True}).cell_id
    assert [logs["train/loss"] for _, logs in plain.steps] == [logs["train/loss"] for _, logs in both.steps]
    assert [s for s, _ in both.evaluations] == [1, 2, 3]
    for (_, teacher_only), (_, metrics) in zip(plain.evaluations, both.evaluations):
        teacher = {k: v for k, v in metrics.items() if not k.startswith("student/") and k != "seconds_per_image"}
        assert teacher == pytest.approx({k: v for k, v in teacher_only.items() if k != "seconds_per_image"},
                                        rel=0, abs=0, nan_ok=True)
        assert metrics["student/nll"] != metrics["nll"]  # the student, not the EMA teacher again
        assert not any(k.startswith("student/iou/") for k in metrics)  # scalars only
    students = {step: m["student/miou"] for step, m in both.evaluations}
    best_step = max(students, key=lambda s: (students[s], -s))
    final = result.metrics
    assert final["student/miou"] == students[3] and final["student/nll"] == both.evaluations[-1][1]["student/nll"]
    assert final["best_student/miou"] == students[best_step] and final["best_student/step"] == best_step
    assert final["student/nll"] != final["last/nll"] and "student/miou" not in plain.evaluations[-1][1]


def test_also_student_reuses_the_evaluation_where_the_student_is_evaluated(smoke_config):
    """A framework without a teacher: the student's metrics are the evaluation's own (no second evaluation)."""
    result = train(smoke_config(**{"evaluation.also_student": True}))
    assert result.metrics["student/miou"] == result.metrics["miou"] == result.metrics["best_student/miou"]
    assert result.metrics["student/nll"] == result.metrics["last/nll"]


def test_best_student_candidates_start_at_select_from_epoch():
    """``best_student/*`` honours ``evaluation.select_from_epoch`` as ``best/*`` does; the last evaluation stands in
    when none is a candidate, and a history without the student's metrics reports none."""
    from npsemiseg.training.selection import student_summary

    history = [{"step": 10.0, "epoch": 1.0, "student/miou": 0.9}, {"step": 20.0, "epoch": 2.0, "student/miou": 0.5},
               {"step": 30.0, "epoch": 3.0, "student/miou": 0.4, "miou": 0.6}]
    summary = student_summary(history, from_epoch=2)
    assert (summary["best_student/miou"], summary["best_student/step"], summary["student/miou"]) == (0.5, 20.0, 0.4)
    assert student_summary(history)["best_student/epoch"] == 1.0
    assert student_summary(history, from_epoch=5)["best_student/step"] == 30.0
    assert student_summary([{"step": 3.0, "epoch": 1.0, "miou": 0.2}]) == {}


def test_linear_lr_scaling_follows_the_global_batch(smoke_config, tmp_path, caplog):
    """optim.lr_scaling=linear: base lr = lr x global batch / reference; the start line and the warning say so."""
    from npsemiseg.training import batch_scaling, load_checkpoint, resolve_checkpoint

    config = smoke_config(**{"optim.lr": 0.02, "optim.lr_scaling": "linear", "optim.reference_batch": 4,
                             "schedule.max_steps": 4, "runtime.output_dir": str(tmp_path), "runtime.stop_at_step": 2})
    assert batch_scaling(config, 1).lr == pytest.approx(0.01) and batch_scaling(config, 2).lr == pytest.approx(0.02)
    assert not batch_scaling(config, 2).differs and batch_scaling(config, 1).differs
    with caplog.at_level("INFO", logger="npsemiseg.training"):
        train(config)
    state = load_checkpoint(resolve_checkpoint(tmp_path / "checkpoints"))
    lr_step1 = poly_lr(0.01, 1, 4, 0.9)
    assert [g["lr"] for g in state["optimizer"]["param_groups"]] == pytest.approx([lr_step1, 10 * lr_step1])
    messages = [r.getMessage() for r in caplog.records]
    assert any("global batch 2 (reference 4), lr 0.01 (lr_scaling linear)" in m for m in messages)
    assert any("global batch 2 differs from the preset's reference 4" in m for m in messages)


def test_lr_scaling_none_keeps_cell_ids_and_linear_needs_a_reference(smoke_config):
    config = smoke_config()
    assert config.optim.lr_scaling == "none" and config.optim.reference_batch == 2
    assert "lr_scaling" not in config.identity()["optim"]
    assert with_overrides(config, {"optim.reference_batch": "12"}).cell_id == config.cell_id
    assert with_overrides(config, {"optim.lr_scaling": "linear"}).cell_id != config.cell_id
    with pytest.raises(ValueError, match="optim.reference_batch: expected the global batch"):
        with_overrides(config, {"optim.lr_scaling": "linear", "optim.reference_batch": "null"})


def test_epoch_throughput_and_peak_memory_at_the_end_of_each_epoch(smoke_config):
    class Steps(Callbacks):
        logs: list = []

        def on_step(self, step, total_steps, logs):
            self.logs.append(dict(logs))

    steps = Steps()
    train(smoke_config(**{"schedule.max_steps": 3}), steps)
    last = steps.logs[-1]
    assert last["train/epoch_images_per_sec"] > 0 and last["train/peak_memory_mb"] > 10  # a Python process's RSS
    assert "train/peak_memory_mb" not in steps.logs[0]


class _FixedStep:
    """A framework of one weight w: loss terms ``sup = a w`` and ``kl = 0.5 w``, the logs given (tensors and floats),
    and, when given, labels checked as the NP head checks them."""

    def __init__(self, logs, a=2.0, labels=None):
        self.weight = torch.nn.Parameter(torch.tensor(1.0))
        self.a, self.logs, self.labels, self.student = a, logs, labels, None

    def train_step(self, batch, ctx):
        from npsemiseg.frameworks import StepResult
        from npsemiseg.heads import check_label_values

        if self.labels is not None:
            check_label_values(self.labels, 3)
        return StepResult(losses={"sup": self.a * self.weight, "kl": 0.5 * self.weight}, logs=dict(self.logs))

    def after_optimizer_step(self, ctx):
        pass


def _fixed_run(smoke_config, **kwargs):
    from npsemiseg.frameworks import Batch, StepContext
    from npsemiseg.training.factories import Optimizer

    framework = _FixedStep({"head/kl": torch.tensor(0.25), "kept_fraction": 0.75, "rho": torch.tensor([3.0])}, **kwargs)
    sgd = torch.optim.SGD([framework.weight], lr=0.1)
    optimizer = Optimizer(sgd, [framework.weight], [1.0], 0.1)
    config = smoke_config(**{"optim.grad_clip": None})
    contexts = [StepContext(step=i, total_steps=10, epoch=0, total_epochs=1, iters_per_epoch=10) for i in range(10)]
    args = (optimizer, config, torch.device("cpu"), 1)
    return framework, (lambda step, i: step(framework, Batch(labeled={}), contexts[i], *args))


def test_a_step_reads_its_losses_logs_and_gradient_norm_in_one_transfer(smoke_config):
    """Frameworks and heads leave their logs on the device; the step reads them with the loss terms and the
    gradient norm (d(2.5 w)/dw = 2.5), one read, and every value comes back exact as a float."""
    from npsemiseg.training.step import train_step

    _, step = _fixed_run(smoke_config)
    with load_benchmark("host_work").HostWork() as work:
        logs = step(train_step, 0)
    assert work.reads == 1
    assert logs == {"train/loss": 2.5, "train/lr": 0.1, "train/sup": 2.0, "train/kl": 0.5, "train/grad_norm": 2.5,
                    "train/head/kl": 0.25, "train/kept_fraction": 0.75, "train/rho": 3.0}
    assert all(type(v) is float for v in logs.values())


def test_deferred_steps_read_several_steps_in_one_transfer_with_the_same_logs(smoke_config):
    """Three deferred steps read nothing; one read gives each its own exact logs, equal to read-at-once steps'."""
    from npsemiseg.training.step import deferred_train_step, read_logs, train_step

    _, at_once = _fixed_run(smoke_config)
    expected = [at_once(train_step, i) for i in range(3)]
    framework, deferred = _fixed_run(smoke_config)
    with load_benchmark("host_work").HostWork() as work:
        pending = [deferred(deferred_train_step, i) for i in range(3)]
    assert work.reads == 0 and [p.step for p in pending] == [1, 2, 3]
    with load_benchmark("host_work").HostWork() as work:
        assert read_logs(pending) == expected
    assert work.reads == 1


def test_a_non_finite_loss_stops_a_step_before_the_optimiser_and_a_deferred_read_names_its_step(smoke_config):
    from npsemiseg.training.step import deferred_train_step, read_logs, train_step

    framework, step = _fixed_run(smoke_config, a=float("nan"))
    with pytest.raises(FloatingPointError, match=r"non-finite loss at step 1: term 'sup' is nan"):
        step(train_step, 0)
    assert float(framework.weight.detach()) == 1.0  # the optimiser never took it
    _, deferred = _fixed_run(smoke_config, a=float("inf"))
    with pytest.raises(FloatingPointError, match=r"non-finite loss at step 1: term 'sup' is inf"):
        read_logs([deferred(deferred_train_step, i) for i in range(2)])


def test_label_values_are_checked_in_the_steps_transfer(smoke_config):
    """The NP head's label check reads nothing inside a step: the step's one read raises it, naming the labels,
    the range and the offending values (-1 and 7 of a 3-class problem)."""
    from npsemiseg.training.step import train_step

    labels = torch.tensor([[[0, 2, 255], [-1, 7, 1]]])
    _, step = _fixed_run(smoke_config, labels=labels)
    with load_benchmark("host_work").HostWork() as work, pytest.raises(
            ValueError, match=r"labels: values must lie in \[0, 3\) or be 255 \(ignore\), found 2 that do not, from -1 to 7"):
        step(train_step, 0)
    assert work.reads == 1
    _, fine = _fixed_run(smoke_config, labels=labels.clamp(0, 2))
    assert fine(train_step, 0)["train/sup"] == 2.0


