"""A DINOv2-style ViT + DPT is one configuration key away: ``model.backbone=vit_tiny`` (or ``dinov2_s`` ...) trains
with every head through the ordinary training step, and its settings are checked before a run starts."""

from __future__ import annotations

import math

import pytest
import torch

from npsemiseg.frameworks.base import Batch, StepContext
from npsemiseg.models import DPTDecoder, ViTBackbone
from npsemiseg.training import build_framework, train
from npsemiseg.training.factories import build_optimizer
from npsemiseg.training.step import train_step
from semiseg_platform.preflight import PreflightError, check_weights
from unlabeled_views import with_unimatch_views

pytestmark = pytest.mark.usefixtures("single_seeded_thread")

VIT = {"model.backbone": "vit_tiny", "schedule.crop_size": 28, "evaluation.resize_multiple": 14}


def _batch(config, batch: int = 2) -> Batch:
    gen = torch.Generator().manual_seed(1)
    size, k = config.schedule.crop_size, config.num_classes
    labels = torch.randint(0, k, (batch, size, size), generator=gen)
    labels[:, :2] = 255
    labeled = {"image": torch.rand(batch, 3, size, size, generator=gen), "label": labels}
    unlabeled = {"image": torch.rand(batch, 3, size, size, generator=gen)}
    for stream in (labeled, unlabeled):
        stream["image_strong"] = (stream["image"] * 0.8).flip(-1)
    return Batch(labeled=labeled, unlabeled=with_unimatch_views(unlabeled))


@pytest.mark.parametrize("framework", ["supervised", "fixmatch", "unimatch_v2", "fixmatch_v2"])
@pytest.mark.parametrize("head", ["baseline", "mc_dropout", "np"])
def test_a_tiny_vit_with_the_dpt_trains_a_step_with_every_head(smoke_config, framework, head):
    config = smoke_config(framework=framework, head=head, **VIT)
    fw = build_framework(config)
    student = fw.student
    assert isinstance(student.backbone, ViTBackbone) and isinstance(student.decoder, DPTDecoder)
    optimizer = build_optimizer(config, student)
    before = {name: p.detach().clone() for name, p in student.named_parameters()}
    ctx = StepContext(step=0, total_steps=4, epoch=0, total_epochs=1, iters_per_epoch=4)
    student.train()
    logs = train_step(fw, _batch(config), ctx, optimizer, config, torch.device("cpu"), world_size=1)
    assert math.isfinite(logs["train/loss"]) and logs["train/loss"] > 0 and logs["train/grad_norm"] > 0
    moved = {name.split(".")[0] for name, p in student.named_parameters() if not torch.equal(p, before[name])}
    assert {"backbone", "decoder", "head"} <= moved  # the ViT, the DPT and the head all learn
    if framework.endswith("_v2"):  # the teacher took its first EMA step: ratio 0 at step 0, a copy of the student
        teacher = dict(fw.teacher.named_parameters())
        assert all(torch.equal(teacher[name], p) for name, p in student.named_parameters())


def test_preflight_names_a_missing_dinov2_file_and_settings_that_cannot_work(smoke_config, tmp_path):
    missing = tmp_path / "dinov2_vits14_pretrain.pth"
    cases = [
        ({"model.weights": str(missing)}, f"model.weights: file {missing} does not exist (expected a DINOv2 checkpoint"),
        ({"model.weights": "imagenet"}, "model.weights: 'imagenet' names torchvision's ResNet weights"),
        ({"schedule.crop_size": 32}, "schedule.crop_size: the vit_tiny backbone takes sides that are multiples of its "
                                     "patch size 14, got 32 (e.g. 28)"),
        ({"evaluation.resize_multiple": None}, "evaluation.resize_multiple: the vit_tiny backbone takes sides that are "
                                               "multiples of its patch size 14; whole images need resize_multiple=14"),
        ({"evaluation.mode": "sliding", "evaluation.crop_size": 30}, "evaluation.crop_size: the vit_tiny backbone "),
    ]
    for overrides, line in cases:
        with pytest.raises(PreflightError) as error:
            check_weights([smoke_config(**{**VIT, "model.weights": None, **overrides})])
        assert str(error.value).startswith(line) and "\n" not in str(error.value)
    missing.write_bytes(b"")  # exists: the file's contents are read when the model is built
    check_weights([smoke_config(**{**VIT, "model.weights": str(missing)})])
    check_weights([smoke_config(**{**VIT, "model.backbone": "dinov2_s", "schedule.crop_size": 518,
                                   "model.weights": "timm"})])


def test_a_unimatch_v2_run_on_the_tiny_vit_trains_evaluates_its_teacher_and_checkpoints(smoke_config, tmp_path):
    config = smoke_config(framework="unimatch_v2", head="np", **VIT, **{"schedule.max_steps": 2,
                                                                       "runtime.output_dir": str(tmp_path)})
    result = train(config)
    assert result.steps == 2 and not result.interrupted
    assert 0.0 <= result.metrics["miou"] <= 1.0 and 0.0 <= result.metrics["pavpu"] <= 1.0
    assert result.checkpoint is not None
