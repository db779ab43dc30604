"""The SSL frameworks (MT, PS-MT, U2PL, AugSeg) and their shared pieces: EMA, schedules, teacher
pseudo-labels, U2PL's contrastive queues, PS-MT's teacher target and T-VAT.

Schedules, EMA, T-VAT and the contrastive loss are checked against values computed by hand;
each framework x head runs training steps on synthetic tensors with the smoke model.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from benchmark_scripts import load_benchmark
from head_fixtures import LargestOutput
from torch import nn

from unlabeled_views import with_unimatch_views
from npsemiseg.config import compose
from npsemiseg.data.mixing import adaptive_confidence
from npsemiseg.frameworks import framework_names, get_framework
from npsemiseg.frameworks.base import Batch, StepContext
from npsemiseg.frameworks.contrastive import ClassQueues, contrastive_loss
from npsemiseg.frameworks.ema import augseg_decay, ema_update, memory_buffer_names, u2pl_decay, warmup_decay
from npsemiseg.frameworks.psmt import assist_combine, teacher_target
from npsemiseg.frameworks.schedules import (
    contrastive_alpha,
    cosine_rampup,
    entropy_filter,
    percentile,
    rampup_weight,
    u2pl_drop_percent,
)
from npsemiseg.frameworks.semi import SemiSupervisedFramework
from npsemiseg.frameworks.tvat import at_size, l2_normalize, tvat_perturbation
from npsemiseg.heads import head_class, head_names
from npsemiseg.heads.base import predictive_entropy
from npsemiseg.training import build_framework

#: every registered framework with EMA teachers, every registered head: a new one is tested without editing this file
SSL_FRAMEWORKS = tuple(n for n in framework_names()
                       if issubclass(get_framework(n), SemiSupervisedFramework) and get_framework(n).teacher_names)
HEADS = head_names()

#: tiny U2PL queues / query counts for CPU tests (the paper's 30000 / 50000 / 256 x 50 are defaults)
U2PL_SMALL = {"sup_only_epochs": 0, "num_queries": 8, "num_negatives": 4, "queue_size": 32, "background_queue_size": 48}


# ----------------------------------------------------------------------------------------- EMA
class _Tiny(nn.Module):
    def __init__(self, weight: float, mean: float, tracked: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.full((2,), weight))
        self.register_buffer("running_mean", torch.full((2,), mean))
        self.register_buffer("num_batches_tracked", torch.tensor(tracked))


def test_ema_update_matches_hand_computed_average():
    teacher, student = _Tiny(1.0, 0.0, 3), _Tiny(3.0, 4.0, 7)
    ema_update(teacher, student, 0.75, buffers="ema")
    assert torch.allclose(teacher.weight, torch.full((2,), 0.75 * 1.0 + 0.25 * 3.0))  # 1.5
    assert torch.allclose(teacher.running_mean, torch.full((2,), 0.25 * 4.0))  # 1.0
    assert int(teacher.num_batches_tracked) == 7  # integers are copied, not averaged


def test_ema_buffer_modes_and_forced_copies():
    teacher, student = _Tiny(1.0, 0.0, 3), _Tiny(3.0, 4.0, 7)
    ema_update(teacher, student, 0.5, buffers="none")
    assert float(teacher.running_mean[0]) == 0.0 and int(teacher.num_batches_tracked) == 3
    ema_update(teacher, student, 0.5, buffers="none", copy_buffers={"running_mean"})
    assert float(teacher.running_mean[0]) == 4.0  # memories are copied whatever the mode
    teacher2 = _Tiny(1.0, 0.0, 3)
    ema_update(teacher2, student, 0.9, buffers="copy")
    assert float(teacher2.running_mean[0]) == 4.0 and float(teacher2.weight[0].detach()) == pytest.approx(1.2)
    with pytest.raises(ValueError, match="decay"):
        ema_update(teacher, student, 1.5)


def test_decay_schedules():
    assert [warmup_decay(k, 0.99) for k in (0, 1, 3)] == [0.0, 0.5, 0.75]
    assert warmup_decay(10_000, 0.99) == 0.99
    # U2PL: k counted from the first semi-supervised iteration (10 supervised-only steps here)
    assert u2pl_decay(10, 10) == 0.0 and u2pl_decay(11, 10) == 0.5 and u2pl_decay(3, 10) == 0.0
    assert u2pl_decay(1000, 10) == 0.99
    # AugSeg: 0 throughout epoch 0, then min(1 - 1/(i + 1), d) on the global iteration
    assert augseg_decay(5, 0, 0.999) == 0.0
    assert augseg_decay(5, 1, 0.999) == pytest.approx(1 - 1 / 6)
    assert augseg_decay(100_000, 3, 0.999) == 0.999


# ----------------------------------------------------------------------------------------- schedules
def test_cosine_rampup_and_psmt_weight():
    assert cosine_rampup(0, 10) == 0.0
    assert cosine_rampup(5, 10) == pytest.approx(0.5)
    assert cosine_rampup(2.5, 10) == pytest.approx(0.5 * (1 - math.cos(math.pi / 4)))
    assert cosine_rampup(10, 10) == 1.0 and cosine_rampup(25, 10) == 1.0 and cosine_rampup(3, 0) == 1.0
    # 4 iterations per epoch, ramp over 2 epochs = 8 iterations, final weight 1.5
    assert rampup_weight(4, 4, 1.5, 2) == pytest.approx(0.75)
    assert rampup_weight(0, 4, 1.5, 2) == 0.0 and rampup_weight(8, 4, 1.5, 2) == pytest.approx(1.5)
    assert rampup_weight(5, 4, 1.5, 2, start_epoch=1) == pytest.approx(1.5 * 0.5 * (1 - math.cos(math.pi / 8)))


def test_u2pl_percentile_schedules():
    assert u2pl_drop_percent(0, 80) == 80.0
    assert u2pl_drop_percent(40, 80) == 90.0
    assert u2pl_drop_percent(80, 80) == 100.0
    assert contrastive_alpha(0, 80) == 20.0 and contrastive_alpha(60, 80) == 5.0


def test_percentile_is_numpy_linear_and_entropy_filter_drops_the_top():
    values = torch.tensor([4.0, 1.0, 3.0, 2.0, 10.0])
    for q in (0, 20, 50, 80, 87.5, 100):
        assert float(percentile(values, q)) == pytest.approx(float(np.percentile(values.numpy(), q)))
    entropy = torch.tensor([[[0.1, 0.2, 0.3, 0.4, 0.5]]])
    labels = torch.tensor([[[1, 2, 255, 3, 4]]])
    # percentile over the 4 valid pixels (0.1, 0.2, 0.4, 0.5): 50th = 0.3 -> drop entropy >= 0.3
    assert entropy_filter(entropy, labels, 50).tolist() == [[[1, 2, 255, 255, 255]]]


def test_adaptive_cutmix_confidence_by_hand():
    # pixel 1: one-hot -> (1 - 0) * 1 = 1; pixel 2: uniform over 2 classes -> (1 - 1) * 0.5 = 0;
    # pixel 3: (0.8, 0.2) -> (1 - H / log 2) * 0.8
    p = torch.tensor([[1.0, 0.5, 0.8], [0.0, 0.5, 0.2]]).view(1, 2, 1, 3)
    h3 = -(0.8 * math.log(0.8) + 0.2 * math.log(0.2)) / math.log(2)
    expected = (1.0 + 0.0 + (1 - h3) * 0.8) / 3
    assert float(adaptive_confidence(p, predictive_entropy(p))[0]) == pytest.approx(expected, rel=1e-5)


# ----------------------------------------------------------------------------------------- PS-MT
def test_psmt_teacher_target_by_hand():
    core = torch.tensor([1.0, 2.0, 3.0]).view(1, 3, 1, 1)
    assist = torch.tensor([5.0, 0.0, 4.0]).view(1, 3, 1, 1)
    assert assist_combine(core, assist, 2).flatten().tolist() == [5.0, 2.0, 4.0]
    # teacher 1 is the core: teacher 2 (assist) restricted to its top 2 classes
    target = teacher_target(core, assist, 0, topk=2, gamma=0.5)
    assert target.flatten().tolist() == [3.0, 2.0, 3.5]
    # teacher 2 is the core: teacher 1 keeps its top 2 (classes 1, 2), class 0 from teacher 2
    target = teacher_target(core, assist, 1, topk=2, gamma=0.5)
    assert target.flatten().tolist() == [0.5 * 5 + 0.5 * 5, 0.5 * 2 + 0.5 * 0, 0.5 * 3 + 0.5 * 4]


class _Linear2Class(nn.Module):
    """logits = (w . f, 0) per pixel: the KL's Hessian in f is rank one along w."""

    def __init__(self, w: torch.Tensor) -> None:
        super().__init__()
        self.w = w

    def __call__(self, features: torch.Tensor) -> torch.Tensor:
        first = torch.einsum("c,bchw->bhw", self.w, features)
        return torch.stack([first, torch.zeros_like(first)], dim=1).unsqueeze(0)  # [1, B, 2, h, w]


def test_tvat_direction_by_hand():
    """For logits (w.f, 0) the power iteration converges in one step to +-w/|w| (scaled to eps),
    whatever the random start; the ensemble of two such teachers gives the mean direction."""
    torch.manual_seed(0)
    w = torch.tensor([3.0, -4.0, 0.0], dtype=torch.float64)
    features = torch.randn(4, 3, 1, 1, dtype=torch.float64)
    r = tvat_perturbation(features, [_Linear2Class(w)], xi=1e-6, eps=2.0)
    unit = w / w.norm()
    along = torch.einsum("c,bc->b", unit, r.flatten(1))
    assert torch.allclose(along.abs(), torch.full((4,), 2.0, dtype=torch.float64), atol=1e-6)
    assert torch.allclose(r.flatten(1), along[:, None] * unit[None], atol=1e-6)  # nothing orthogonal to w
    w2 = torch.tensor([3.0, 4.0, 0.0], dtype=torch.float64)
    r2 = tvat_perturbation(features, [_Linear2Class(w), _Linear2Class(w2)], xi=1e-6, eps=1.0)
    mean_w = (w + w2) / 2  # the ensemble's logits are (mean_w . f, 0)
    assert torch.allclose(r2.flatten(1).abs(), (mean_w / mean_w.norm()).abs().expand(4, 3), atol=1e-6)


def test_tvat_kl_at_crop_size_reweights_the_pixels_of_the_direction():
    """The released variant (switch psmt_tvat_crop_kl) compares crop-size predictions: the classifier's
    logits come out at the crop's size, and the direction, still along w at every pixel, weights the
    pixels differently than the feature-size KL."""
    w = torch.tensor([3.0, -4.0, 0.0], dtype=torch.float64)
    features = torch.randn(2, 3, 3, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    crop_size = at_size(_Linear2Class(w), (12, 12), align_corners=True)
    assert crop_size(features).shape == (1, 2, 2, 12, 12)
    directions = []
    for classifier in (_Linear2Class(w), crop_size):
        torch.manual_seed(0)
        directions.append(tvat_perturbation(features, [classifier], xi=1e-3, eps=2.0))
    unit = w / w.norm()
    for r in directions:
        along = torch.einsum("c,bchw->bhw", unit, r)
        assert torch.allclose(r, along[:, None] * unit[None, :, None, None], atol=1e-9)  # nothing orthogonal to w
        assert torch.allclose(r.flatten(1).norm(dim=1), torch.full((2,), 2.0, dtype=torch.float64))
    assert not torch.allclose(directions[0].abs(), directions[1].abs(), atol=1e-3)


def test_l2_normalize_per_image():
    d = torch.tensor([[3.0, 4.0], [0.0, 2.0]]).view(2, 2, 1, 1)
    assert torch.allclose(l2_normalize(d).flatten(1), torch.tensor([[0.6, 0.8], [0.0, 1.0]]), atol=1e-6)
    tiny = torch.tensor([3e-12, 4e-12]).view(1, 2, 1, 1)
    assert torch.allclose(l2_normalize(tiny).flatten(), torch.tensor([0.6, 0.8]))
    assert float(l2_normalize(tiny, 1e-8).norm()) < 1e-3  # the released code's +1e-8 shrinks it


# ----------------------------------------------------------------------------------------- U2PL contrastive
def test_class_queues_fifo_and_state_round_trip():
    queues = ClassQueues([3, 2], dim=1)
    queues.enqueue(0, torch.tensor([[1.0], [2.0]]))
    queues.enqueue(0, torch.tensor([[3.0], [4.0]]))
    assert sorted(queues.class_keys(0).flatten().tolist()) == [2.0, 3.0, 4.0]  # oldest (1) dropped
    queues.enqueue(1, torch.tensor([[5.0], [6.0], [7.0]]))
    assert sorted(queues.class_keys(1).flatten().tolist()) == [6.0, 7.0]
    restored = ClassQueues([3, 2], dim=1)
    restored.load_state_dict(queues.state_dict())
    queues.enqueue(0, torch.tensor([[9.0]]))
    restored.enqueue(0, torch.tensor([[9.0]]))
    assert torch.equal(queues.class_keys(0), restored.class_keys(0))
    assert sorted(restored.class_keys(0).flatten().tolist()) == [3.0, 4.0, 9.0]
    with pytest.raises(ValueError, match="queue state"):
        restored.load_state_dict({"pointer": torch.zeros(2, dtype=torch.long)})


def test_class_queues_read_the_keys_in_u2pls_order():
    """U2PL's memory bank appends and keeps the last rows (``dequeue_and_enqueue``, u2pl/utils/utils.py 28-47), and
    its negatives are drawn by index: the queue reads its keys in that order, the oldest first, once full too."""
    queues, kept = ClassQueues([4], dim=1), torch.zeros(0, 1)
    for start, n in ((0, 3), (3, 2), (5, 3), (8, 1), (9, 6)):
        keys = torch.arange(start, start + n, dtype=torch.float32)[:, None]
        queues.enqueue(0, keys)
        kept = torch.cat([kept, keys])[-4:]
        assert torch.equal(queues.class_keys(0), kept), (start, n)


def test_contrastive_loss_by_hand():
    """Two labeled images of two pixels (class 0 then class 1), embeddings e0 = (1, 0), e1 = (0, 1);
    the queue of each class holds the other class's embedding. Every anchor has cosine 1 with its
    positive (logit 1/0.5 = 2) and 0 with each of N negatives: loss = log(1 + N e^-2) per class."""
    e0, e1 = [1.0, 0.0], [0.0, 1.0]
    rep = torch.tensor([[e0, e1], [e0, e1]]).permute(0, 2, 1).unsqueeze(2)  # [2, 2, 1, 2]
    labels = torch.tensor([[[0, 1]], [[0, 1]]])
    prob = torch.tensor([[0.9, 0.1], [0.1, 0.9]]).view(1, 2, 1, 2).expand(2, 2, 1, 2)  # [B, K, h, w]
    valid = labels != 255
    queues = ClassQueues([10, 10], dim=2)
    queues.enqueue(0, torch.tensor([e1]))
    queues.enqueue(1, torch.tensor([e0]))
    loss, logs = contrastive_loss(rep.clone().requires_grad_(), rep, prob, labels, valid, valid, 2, queues,
                                  low_rank=1, high_rank=2, num_queries=5, num_negatives=3)
    assert float(loss.detach()) == pytest.approx(math.log(1 + 3 * math.exp(-2.0)), rel=1e-5)
    assert logs["contrastive_classes"] == 2.0
    assert logs["contrastive_fewest_anchors"] == 2.0 and logs["contrastive_anchor_norm_min"] == pytest.approx(1.0)
    # nothing was enqueued: no labeled pixel has another class in its teacher top-1
    assert queues.class_keys(0).shape[0] == 1 and queues.class_keys(1).shape[0] == 1


def test_contrastive_logs_the_fewest_anchors_and_the_smallest_anchor_norm():
    """Class 1 has a single anchor of norm 0.05 (class 0 three of norm 3): the logs name both, and that one anchor
    receives a gradient 1 / 0.05 times that of a unit-norm anchor in its place (the cosine's 1 / |a|)."""
    def class_1_anchor_grad(scale: float):
        rep = torch.tensor([[3.0, 0.0], [0.0, 3.0 * scale]]).T.reshape(1, 2, 1, 2)  # pixel 0: class 0, pixel 1: class 1
        rep = torch.cat([rep, torch.tensor([[3.0, 0.0], [3.0, 0.0]]).T.reshape(1, 2, 1, 2)])  # image 1: class 0 twice
        labels = torch.tensor([[[0, 1]], [[0, 0]]])
        prob = torch.tensor([[[[0.9, 0.1]], [[0.1, 0.9]]], [[[0.9, 0.9]], [[0.1, 0.1]]]])
        queues = ClassQueues([10, 10], dim=2)
        queues.enqueue(0, torch.tensor([[0.0, 1.0]]))
        queues.enqueue(1, torch.tensor([[0.6, 0.8]]))
        student = rep.clone().requires_grad_()
        loss, logs = contrastive_loss(student, rep, prob, labels, labels != 255, labels != 255, 2, queues,
                                      low_rank=1, high_rank=2, num_queries=4, num_negatives=2)
        loss.backward()
        return logs, float(student.grad[0, :, 0, 1].norm())

    logs, small = class_1_anchor_grad(0.05 / 3.0)
    assert logs["contrastive_fewest_anchors"] == 1.0 and logs["contrastive_anchor_norm_min"] == pytest.approx(0.05)
    _, unit = class_1_anchor_grad(1.0 / 3.0)
    assert small / unit == pytest.approx(1.0 / 0.05, rel=1e-4)


def test_contrastive_negative_candidates():
    """Labeled: GT != c but c in the teacher's top low_rank. Unlabeled: unreliable pixels where c
    ranks in [low_rank, high_rank)."""
    k = 4
    probs = torch.tensor([0.4, 0.3, 0.2, 0.1])  # ranks: class 0 -> 0, 1 -> 1, 2 -> 2, 3 -> 3
    prob = probs.view(1, k, 1, 1).expand(2, k, 1, 1).contiguous()
    rep = torch.arange(4.0).view(1, 2, 1, 2).reshape(2, 2, 1, 1)  # [2, 2, 1, 1]: image 0 (labeled), 1 (unlabeled)
    labels = torch.tensor([[[1]], [[0]]])
    reliable = torch.tensor([[[True]], [[False]]])
    unreliable = torch.tensor([[[True]], [[True]]])
    queues = ClassQueues([8] * k, dim=2)
    contrastive_loss(rep, rep, prob, labels, reliable, unreliable, 1, queues, low_rank=2, high_rank=4,
                     num_queries=2, num_negatives=2)
    counts = [queues.class_keys(c).shape[0] for c in range(k)]
    # labeled pixel (GT 1): negative for class 0 (rank 0 < 2), not for 1 (its GT) nor 2, 3 (rank >= 2)
    # unlabeled unreliable pixel: negative for classes 2 and 3 (ranks 2, 3 in [2, 4))
    assert counts == [1, 0, 1, 1]
    assert queues.class_keys(0).tolist() == [rep[0, :, 0, 0].tolist()]
    assert queues.class_keys(2).tolist() == [rep[1, :, 0, 0].tolist()]


# ----------------------------------------------------------------------------------------- frameworks
def _batch(config, *, seed: int = 0, batch: int = 2) -> Batch:
    gen = torch.Generator().manual_seed(seed)
    size = config.schedule.crop_size
    k = config.num_classes
    labels = torch.randint(0, k, (batch, size, size), generator=gen)
    labels[:, :2] = 255
    labeled = {"image": torch.rand(batch, 3, size, size, generator=gen), "label": labels}
    labeled["image_strong"] = (labeled["image"] * 0.8).clamp(0, 1)
    unlabeled = {"image": torch.rand(batch, 3, size, size, generator=gen)}
    unlabeled["image_strong"] = unlabeled["image"].flip(-1)
    return Batch(labeled=labeled, unlabeled=with_unimatch_views(unlabeled))


def _framework(smoke_config, framework: str, head: str, **options):
    opts = {**(U2PL_SMALL if framework == "u2pl" else {}), **options}
    config = smoke_config(framework=framework, head=head, framework_options=opts)
    torch.manual_seed(0)
    return build_framework(config), config


EXPECTED_TERMS = {
    "mt": {"sup", "unsup"},
    "mt_cps": {"sup", "unsup"},
    "psmt": {"sup", "unsup"},
    "u2pl": {"sup", "unsup", "contrastive"},
    "augseg": {"sup", "unsup"},
}


@pytest.mark.parametrize("head", HEADS)
@pytest.mark.parametrize("framework", SSL_FRAMEWORKS)
def test_framework_trains_with_every_head(smoke_config, framework, head):
    fw, config = _framework(smoke_config, framework, head)
    assert set(fw.modules()) >= {"student"} and len(fw.modules()) >= 2
    optimizer = torch.optim.SGD([p for p in fw.student.parameters() if p.requires_grad], lr=0.05)
    # epoch 1 for PS-MT so the ramp-up weight is positive (12-epoch ramp, 2 iterations per epoch)
    teachers = [m for n, m in fw.modules().items() if n != "student"]
    before = [p.detach().clone() for t in teachers for p in t.parameters()]
    for step in range(2):
        ctx = StepContext(step=2 + step, total_steps=8, epoch=1, total_epochs=4, iters_per_epoch=2)
        result = fw.train_step(_batch(config, seed=step), ctx)
        aux_term = head_class(head).aux_loss_term
        expected = EXPECTED_TERMS.get(framework, {"sup"}) | ({aux_term} if aux_term else set())
        assert set(result.losses) == expected if framework in EXPECTED_TERMS else expected <= set(result.losses)
        for name, value in result.losses.items():
            assert value.dim() == 0 and torch.isfinite(value), (name, value)
        assert all(math.isfinite(v) for v in result.logs.values())
        optimizer.zero_grad()
        result.total.backward()
        grads = [p.grad for p in fw.student.parameters() if p.grad is not None]
        assert grads and all(torch.isfinite(g).all() for g in grads)
        optimizer.step()
        fw.after_optimizer_step(ctx)
    after = [p for t in teachers for p in t.parameters()]
    assert any(not torch.equal(a, b) for a, b in zip(before, after)), "no EMA teacher moved"
    assert all(not p.requires_grad for p in after)
    if head_class(head).has_memories:  # every teacher queries the student's memories
        student_buffers = dict(fw.student.named_buffers())
        names = memory_buffer_names(fw.student)
        for teacher in teachers:
            for name, buf in teacher.named_buffers():
                if name in names:
                    assert torch.equal(buf, student_buffers[name]), name


@pytest.mark.parametrize("protocol", ["released", "corrected"])
@pytest.mark.parametrize("head", HEADS)
@pytest.mark.parametrize("framework", ["supervised", "mt", "mt_cps", "psmt"])
def test_whole_step_of_every_head_under_both_protocols(smoke_config, framework, head, protocol):
    """``train_step`` (LR, step, backward, SGD, EMA) of the smoke cell under each protocol: finite losses and
    gradients, most student parameters move (some take no gradient in the smoke network). Released PS-MT: two
    student passes, the NP head once on both; ``mt`` runs ``mt_cps`` under ``released``."""
    from npsemiseg.training.factories import build_optimizer
    from npsemiseg.training.step import train_step

    config = smoke_config(framework=framework, head=head, protocol=protocol)
    torch.manual_seed(0)
    fw = build_framework(config)
    optimizer = build_optimizer(config, fw.student)
    before = [p.detach().clone() for p in optimizer.parameters]
    ctx = StepContext(step=2, total_steps=8, epoch=1, total_epochs=4, iters_per_epoch=2)
    logs = train_step(fw, _batch(config), ctx, optimizer, config, torch.device("cpu"), 1)
    assert all(math.isfinite(v) for v in logs.values()) and logs["train/loss"] > 0
    assert all(torch.isfinite(p.grad).all() for p in optimizer.parameters if p.grad is not None)
    moved = [not torch.equal(b, p) for b, p in zip(before, optimizer.parameters)]
    assert sum(moved) > 0.6 * len(moved), f"{sum(moved)} of {len(moved)} parameters moved"
    if framework == "psmt":
        assert fw.options.student_passes == ("split" if protocol == "released" else "joint")


@pytest.mark.parametrize("head", HEADS)
def test_student_pass_shapes_and_np_context(smoke_config, head):
    fw, config = _framework(smoke_config, "mt", head)
    batch = _batch(config)
    images_l, labels_l = batch.labeled["image"], batch.labeled["label"]
    fw.seed_memories(images_l, labels_l)
    pseudo = torch.full_like(labels_l, 255)
    pseudo[:, 5:9, 5:9] = 1
    student = fw.student_pass(images_l, labels_l, batch.unlabeled["image"], pseudo)
    # training mode: the baseline and MC dropout make one (stochastic) prediction, NP makes T
    s = config.head.options["training_samples"] if head == "np" else 1
    assert fw.student.training and fw.student.head.default_num_samples == s
    h, w = student.output.features.shape[-2:]  # the logits stay at feature resolution; the losses upsample
    assert (h, w) < (config.schedule.crop_size, config.schedule.crop_size)
    assert student.logits_l.shape == (s, 2, config.num_classes, h, w)
    assert student.logits_u.shape == (s, 2, config.num_classes, h, w)
    assert student.labeled_output().head.logits.shape[1] == 2
    if head == "np":
        assert student.head.aux_loss.requires_grad and float(student.head.aux_loss.detach()) >= 0
        # only class 1 of the unlabeled targets was pseudo-labeled; the memories hold it
        assert int(fw.student.head.target_count[1]) > 0


def test_np_memories_seeded_before_the_first_teacher_prediction(smoke_config):
    fw, config = _framework(smoke_config, "augseg", "np")
    head = fw.student.head
    assert int(head.target_count.sum()) == 0
    batch = _batch(config)
    fw.seed_memories(batch.labeled["image"], batch.labeled["label"])
    assert int(head.target_count.sum()) > 0 and int(head.context_count.sum()) > 0
    assert torch.equal(fw.teacher.head.target_centers, head.target_centers)
    bn = next(m for m in fw.student.modules() if isinstance(m, nn.BatchNorm2d))
    assert int(bn.num_batches_tracked) == 0  # seeding moves no BN statistics


def test_teacher_pseudo_labels_are_the_mean_of_per_sample_softmaxes(smoke_config):
    from npsemiseg.frameworks.pseudo_labels import prediction_from_logits

    logits = torch.tensor([[4.0, 0.0], [0.0, 1.0]]).view(2, 1, 2, 1, 1)  # two samples disagree
    pred = prediction_from_logits(logits, (1, 1))
    p1 = torch.softmax(torch.tensor([4.0, 0.0]), 0)
    p2 = torch.softmax(torch.tensor([0.0, 1.0]), 0)
    mean = (p1 + p2) / 2
    assert torch.allclose(pred.probs.flatten(), mean)
    assert int(pred.label) == int(mean.argmax()) and float(pred.confidence) == pytest.approx(float(mean.max()))
    assert float(pred.entropy) == pytest.approx(float(-(mean * mean.log()).sum()))
    assert torch.allclose(pred.log_probs().flatten(), mean.log())


def test_u2pl_supervised_only_epoch_and_teacher_reset(smoke_config):
    fw, config = _framework(smoke_config, "u2pl", "baseline", sup_only_epochs=1)
    ctx = StepContext(step=0, total_steps=8, epoch=0, total_epochs=4, iters_per_epoch=2)
    result = fw.train_step(_batch(config), ctx)
    assert set(result.losses) == {"sup"}
    with torch.no_grad():
        for p in fw.student.parameters():
            p.add_(0.1)
    fw.after_optimizer_step(ctx)  # no EMA during the supervised-only epoch
    assert not torch.equal(next(fw.teacher.parameters()), next(fw.student.parameters()))
    ctx = StepContext(step=2, total_steps=8, epoch=1, total_epochs=4, iters_per_epoch=2)
    fw.train_step(_batch(config), ctx)  # first semi-supervised epoch: teacher reset to the student
    assert all(torch.equal(t, s) for t, s in zip(fw.teacher.parameters(), fw.student.parameters()))


@pytest.mark.parametrize("sup_only_kl", [True, False])
def test_u2pl_np_kl_during_the_supervised_only_epochs(smoke_config, sup_only_kl):
    """``sup_only_kl=False`` (switch np_sup_only_kl, released): the KL term is zero in a supervised-only step and
    trained again in the first semi-supervised one. In a supervised-only step the NP head's context is its targets
    (the labeled images), so its KL is 0 up to float32 round-off, whose sign is the CPU kernels' (-1.5e-8 on the
    AVX2 path): what tells the two settings apart is whether the step's term is in the graph or an exact zero."""
    fw, config = _framework(smoke_config, "u2pl", "np", sup_only_epochs=1, sup_only_kl=sup_only_kl)
    ctx = StepContext(step=0, total_steps=8, epoch=0, total_epochs=4, iters_per_epoch=2)
    result = fw.train_step(_batch(config), ctx)
    kl = result.losses["kl"]
    assert set(result.losses) == {"sup", "kl"} and float(result.logs["head/kl"]) == pytest.approx(0.0, abs=1e-6)
    assert kl.requires_grad is sup_only_kl  # trained (its gradient reaches the latent encoder) or a constant
    assert sup_only_kl or float(kl) == 0.0
    semi = fw.train_step(_batch(config), StepContext(step=2, total_steps=8, epoch=1, total_epochs=4, iters_per_epoch=2))
    assert semi.losses["kl"].requires_grad and float(semi.logs["head/kl"]) > 1e-6  # unlabeled targets: far above round-off


@pytest.mark.parametrize("head", ["baseline", "np"])
def test_u2pl_teacher_train_mode_quirk_moves_teacher_bn_statistics(smoke_config, head):
    fw, config = _framework(smoke_config, "u2pl", head, sup_only_epochs=1, teacher_train_mode=True, ema_buffers="none")
    bn = next(m for m in fw.teacher.modules() if isinstance(m, nn.BatchNorm2d))
    fw.train_step(_batch(config), StepContext(step=0, total_steps=8, epoch=0, total_epochs=4, iters_per_epoch=2))
    assert int(bn.num_batches_tracked) == 1  # the released code's train-mode teacher pass
    result = fw.train_step(_batch(config), StepContext(step=2, total_steps=8, epoch=1, total_epochs=4, iters_per_epoch=2))
    assert all(torch.isfinite(v) for v in result.losses.values())
    assert fw.teacher.training is False  # the pass restores eval mode


def test_u2pl_state_dict_round_trip(smoke_config):
    fw, config = _framework(smoke_config, "u2pl", "baseline")
    fw.queues.enqueue(3, torch.randn(5, fw.queues.dim))
    state = fw.state_dict()
    other, _ = _framework(smoke_config, "u2pl", "baseline")
    other.load_state_dict(state)
    assert torch.equal(other.queues.class_keys(3), fw.queues.class_keys(3))
    with pytest.raises(ValueError, match="U2PL state"):
        other.load_state_dict({})


def test_psmt_alternates_teachers_and_evaluates_their_ensemble(smoke_config):
    fw, config = _framework(smoke_config, "psmt", "baseline")
    t1, t2 = fw.teachers["teacher1"], fw.teachers["teacher2"]
    with torch.no_grad():
        for p in fw.student.parameters():
            p.add_(1.0)
    ref1, ref2 = next(t1.parameters()).clone(), next(t2.parameters()).clone()
    fw.after_optimizer_step(StepContext(step=0, total_steps=8, epoch=0, total_epochs=4, iters_per_epoch=2))
    assert not torch.equal(next(t1.parameters()), ref1) and torch.equal(next(t2.parameters()), ref2)
    ref1 = next(t1.parameters()).clone()
    fw.after_optimizer_step(StepContext(step=2, total_steps=8, epoch=1, total_epochs=4, iters_per_epoch=2))
    assert torch.equal(next(t1.parameters()), ref1) and not torch.equal(next(t2.parameters()), ref2)
    images = torch.rand(1, 3, 32, 32)
    out = fw.eval_model().eval()(images)
    assert out.head.logits.shape[0] == 2  # one sample per teacher


def test_paper_options_per_protocol():
    def composed(framework, dataset, partition):  # a framework's options as composed: its defaults under the dataset's
        return compose("paper", framework=framework, dataset=dataset, partition=partition,
                       head="np").config.framework_options

    def psmt(dataset, partition):
        return composed("psmt", dataset, partition)

    assert psmt("pascal_blender", "1/16")["unsup_weight"] == 1.5
    assert psmt("pascal_classic", "1/16")["unsup_weight"] == 0.06
    assert psmt("pascal_classic", "366")["unsup_weight"] == 0.6
    city = psmt("cityscapes", "1/8")
    assert city["unsup_weight"] == 3.0 and city["cutmix_boxes"] == "random_boxes" and city["eval_teachers"] == "first"
    voc = composed("augseg", "pascal_classic", "92")
    assert (voc["ema_decay"], voc["unsup_weight"], voc["confidence_threshold"]) == (0.999, 1.0, 0.95)
    city = composed("augseg", "cityscapes", "186")
    assert city["ema_decay"] == 0.996 and city["unsup_weight"] == 2.0 and city["confidence_threshold"] == 0.0
    assert composed("u2pl", "pascal_blender", "662")["sup_only_epochs"] == 1
    city = composed("u2pl", "cityscapes", "744")
    assert city["sup_only_epochs"] == 0 and city["queue_size"] == 30000
    mt = get_framework("mt")
    assert mt.paper_options("pascal_classic", "92")["ema_decay"] == 0.99
    assert mt.paper_options("pascal_classic", "92")["sup_only_epochs"] == 1
    city = compose("paper", framework="mt", dataset="cityscapes", partition="186", head="np").config
    assert city.framework_options["sup_only_epochs"] == 0  # Cityscapes' settings (U2PL's config) over MT's default


def test_framework_options_reject_unknown_keys():
    for name in SSL_FRAMEWORKS:
        with pytest.raises(ValueError):
            get_framework(name).Options.model_validate({"no_such_option": 1})


def test_u2pl_without_representation_head_is_a_clear_error(smoke_config):
    config = smoke_config(framework="u2pl", head="baseline", framework_options=U2PL_SMALL,
                          **{"model.representation_head": False})
    with pytest.raises(ValueError, match="representation_head"):
        build_framework(config)


def test_u2pl_evaluates_the_student_during_supervised_only_epochs(smoke_config):
    """U2PL validates the student until its first semi-supervised epoch: the NP teacher's
    memories are empty then, and evaluating it would fail (as every VOC paper run would). Epochs of the labeled
    set: 16 steps each (of the unlabeled set, as U2PL counts, 240)."""
    from npsemiseg import train

    config = smoke_config(framework="u2pl", head="np", **{
        "framework_options.sup_only_epochs": 1, "schedule.eval_every_epochs": 1,
        "schedule.epochs": 2, "schedule.max_steps": None, "schedule.epoch_length": "labeled",
    })
    seen = []

    from npsemiseg.callbacks import Callbacks

    class Spy(Callbacks):
        def on_evaluation(self, step, metrics):
            seen.append((step, metrics["miou"]))

    result = train(config, Spy())
    framework = result.framework
    assert framework.teacher_active and framework.eval_model() is framework.teacher
    assert len(seen) >= 2 and all(0.0 <= m <= 1.0 for _, m in seen)
    assert set(framework.state_dict()) == {"teacher_active", "queues"}


def test_u2pl_teacher_inactive_until_semi_supervised_phase(smoke_config):
    framework = build_framework(smoke_config(framework="u2pl", head="np", **{"framework_options.sup_only_epochs": 1}))
    assert framework.eval_model() is framework.student
    state = framework.state_dict()
    state["teacher_active"] = True
    framework.load_state_dict(state)
    assert framework.eval_model() is framework.teacher


@pytest.mark.parametrize("framework", ["u2pl", "mt", "mt_cps", "psmt", "unimatch", "fixmatch", "augseg"])
def test_np_step_never_holds_t_samples_at_image_resolution(smoke_config, framework):
    """The T samples' logits stay at feature resolution: the losses and the pseudo-labels upsample one sample
    at a time, forward and backward, so no tensor of T x B x K x H x W elements exists in a step."""
    opts = {"u2pl": U2PL_SMALL, "mt": {"sup_only_epochs": 0}}.get(framework, {})
    config = smoke_config(framework=framework, head="np", framework_options=opts,
                          **{"head.options.training_samples": 4})
    torch.manual_seed(0)
    fw = build_framework(config)
    fw.seed_memories(*(_batch(config, seed=1).labeled[k] for k in ("image", "label")))
    size = config.schedule.crop_size
    ctx = StepContext(step=2, total_steps=8, epoch=1, total_epochs=4, iters_per_epoch=2)
    with LargestOutput() as mode:
        result = fw.train_step(_batch(config), ctx)
        result.total.backward()
    one_sample = 2 * 2 * config.num_classes * size * size  # labeled + unlabeled images, one sample
    assert one_sample <= mode.largest < 4 * one_sample


@pytest.mark.parametrize("framework", ["mt", "mt_cps", "psmt", "augseg", "supervised"])
def test_an_np_step_reads_one_device_value_more_than_the_baseline_heads(smoke_config, framework):
    """A read of a device value in the middle of a step makes the host wait for the GPU. The NP head adds one (its
    label check): memories known to hold rows are not read again, its statistics and the frameworks' logs stay
    on the device for the loop to read with the losses. Inside the training step (``deferred_label_checks``) the
    label check joins that transfer too: no read more than the baseline."""
    from npsemiseg.heads import deferred_label_checks

    host_work = load_benchmark("host_work")
    reads, deferred = {}, {}
    for head in ("baseline", "np"):
        fw, config = _framework(smoke_config, framework, head)
        ctx = StepContext(step=2, total_steps=8, epoch=1, total_epochs=4, iters_per_epoch=2)
        fw.train_step(_batch(config), ctx)  # seeds the NP memories
        batches = _batch(config, seed=1), _batch(config, seed=2)  # made outside the counter, as the loop's are
        with host_work.HostWork() as work:
            result = fw.train_step(batches[0], ctx)
        assert head == "baseline" or isinstance(result.logs["head/kl"], torch.Tensor)
        reads[head] = work.reads
        with host_work.HostWork() as work, deferred_label_checks() as checks:
            fw.train_step(batches[1], ctx)
        deferred[head] = work.reads
        assert (head == "np") == bool(checks)
    assert reads["np"] == reads["baseline"] + 1
    assert deferred["np"] == deferred["baseline"]

