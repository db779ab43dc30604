"""Activation checkpointing of the encoder (``runtime.activation_checkpointing``): the same training step, the same
BatchNorm statistics and dropout masks, fewer activations kept for the backward pass.

The equality tests run in float64 with BatchNorm in training mode (batch statistics) and dropout active: the
recomputation draws the masks of the first run (its RNG state restored) and leaves the running statistics as the
first run set them (moved once per forward).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from npsemiseg.frameworks.base import Batch, StepContext
from npsemiseg.models import set_activation_checkpointing
from npsemiseg.models.checkpointing import run_segment
from npsemiseg.training import build_framework
from npsemiseg.training.factories import build_optimizer
from npsemiseg.training.step import train_step

CPU = torch.device("cpu")


@pytest.fixture
def float64():
    dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(dtype)


def _saved_bytes(step) -> int:
    """Bytes of the tensors autograd keeps for the backward pass while ``step()`` runs its forward."""
    total = 0

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        nonlocal total
        total += tensor.numel() * tensor.element_size()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        step()
    return total


def test_a_checkpointed_segment_draws_the_same_dropout_and_moves_bn_statistics_once(float64):
    torch.manual_seed(0)
    segment = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Dropout(0.5),
                            nn.Conv2d(8, 4, 3, padding=1))
    x = torch.randn(2, 3, 6, 6)
    results = []
    for checkpointed in (False, True):
        model = nn.Sequential(*[m for m in segment])  # the same modules: reset the statistics between runs
        bn = model[1]
        bn.reset_running_stats()
        torch.manual_seed(1)
        inputs = x.clone().requires_grad_(True)
        out = run_segment(model, inputs, checkpointed=checkpointed)
        after_forward = torch.rand(()).item()  # the global stream after the forward: the same either way
        (out ** 2).sum().backward()
        grads = [inputs.grad] + [p.grad.clone() for p in model.parameters()]
        model.zero_grad(set_to_none=True)
        results.append((out.detach(), grads, bn.running_mean.clone(), int(bn.num_batches_tracked), after_forward,
                        torch.rand(()).item()))
    (out_a, grads_a, mean_a, tracked_a, rng_a, end_a), (out_b, grads_b, mean_b, tracked_b, rng_b, end_b) = results
    assert torch.equal(out_a, out_b)
    for a, b in zip(grads_a, grads_b):
        assert torch.allclose(a, b, rtol=1e-12, atol=1e-14)
    assert tracked_a == tracked_b == 1 and torch.equal(mean_a, mean_b)  # the recomputation moved nothing
    assert rng_a == rng_b and end_a == end_b  # nor the global RNG stream


@pytest.mark.parametrize("framework, backbone", [("supervised", None), ("mt", None), ("supervised", "vit_tiny")])
def test_the_step_is_the_same_with_checkpointed_encoder(smoke_config, float64, framework, backbone):
    """One ``train_step`` (forward, backward, SGD, EMA) with and without ``runtime.activation_checkpointing``:
    equal weights and BN buffers at round-off (float64; BN in training mode, decoder dropout on), and fewer bytes
    saved for backward with it."""
    overrides = {"model.backbone": backbone, "model.weights": None, "schedule.crop_size": 28} if backbone else {}
    states, saved = [], []
    for on in (False, True):
        config = smoke_config(framework=framework, **overrides, **{"runtime.activation_checkpointing": on})
        torch.manual_seed(0)
        fw = build_framework(config)
        for module in fw.modules().values():
            module.double()
        assert fw.student.backbone.activation_checkpointing is on
        gen = torch.Generator().manual_seed(0)
        crop = config.schedule.crop_size
        labels = torch.randint(0, config.num_classes, (2, crop, crop), generator=gen)
        images = torch.rand(2, 3, crop, crop, generator=gen)
        batch = Batch(labeled={"image": images, "label": labels},
                      unlabeled={"image": torch.rand(2, 3, crop, crop, generator=gen),
                                 "image_strong": torch.rand(2, 3, crop, crop, generator=gen)})
        optimizer = build_optimizer(config, fw.student)
        ctx = StepContext(step=0, total_steps=4, epoch=0, total_epochs=2, iters_per_epoch=2)
        torch.manual_seed(1)
        train_step(fw, batch, ctx, optimizer, config, CPU, 1)
        states.append({f"{n}.{k}": v.clone() for n, m in fw.modules().items() for k, v in m.state_dict().items()})
        torch.manual_seed(1)
        student = fw.student
        saved.append(_saved_bytes(lambda m=student, x=images, y=labels: m(x, labels=y, num_context=2)))
    plain, checkpointed = states
    for key, value in plain.items():
        assert torch.allclose(value, checkpointed[key], rtol=1e-10, atol=1e-12), key
    assert saved[1] < saved[0]


def test_set_activation_checkpointing_reaches_every_encoder(smoke_config):
    fw = build_framework(smoke_config(framework="mt"))
    assert set_activation_checkpointing(fw.teacher, True) == 1
    assert fw.teacher.backbone.activation_checkpointing and not fw.student.backbone.activation_checkpointing
