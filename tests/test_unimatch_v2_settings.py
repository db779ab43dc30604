"""UniMatch V2's publication settings (``UniMatchV2.publication_values``, the ``paper`` preset's scale step): every
head of ``unimatch_v2`` / ``fixmatch_v2`` at the official config of its dataset, each value explained by its source,
AdamW over the backbone / head groups, the LR set after the step under ``released``, the official sliding windows,
and a missing DINOv2 file as one line before a run starts."""

from __future__ import annotations

import pytest
import torch

from unlabeled_views import with_unimatch_views
from npsemiseg.config import compose, with_overrides
from npsemiseg.evaluation.inference import SLIDING_SCHEMES, sliding_windows
from npsemiseg.data import dataset_info
from npsemiseg.frameworks.unimatch_v2 import UniMatchV2
from npsemiseg.training.factories import build_model, build_optimizer
from semiseg_platform.preflight import PreflightError, check_weights

#: dataset -> (partition, the official config file's name, crop, batch per GPU, epochs, OHEM, sliding): UniMatch-V2
#: configs/<name>.yaml 5, 9, 8, 12-17; unimatch_v2.py 239 (sliding on Cityscapes)
CELLS = {"pascal_classic": ("92", "pascal", 518, 4, 60, False, False),
         "cityscapes": ("186", "cityscapes", 798, 2, 180, True, True),
         "ade20k": ("316", "ade20k", 518, 2, 60, False, False), "coco": ("232", "coco", 518, 4, 20, False, False)}


def _cell(dataset: str, head: str = "np", protocol: str = "released", framework: str = "unimatch_v2"):
    return compose("paper", framework=framework, dataset=dataset, partition=CELLS[dataset][0], head=head,
                   protocol=protocol)


@pytest.mark.parametrize("dataset", sorted(CELLS))
def test_every_head_trains_at_the_official_config_of_its_dataset(dataset):
    _, name, crop, batch, epochs, ohem, sliding = CELLS[dataset]
    configs = [_cell(dataset, head).config for head in ("baseline", "mc_dropout", "np")]
    for config in configs:
        schedule, optim = config.schedule, config.optim
        assert (schedule.crop_size, schedule.batch_size, schedule.unlabeled_batch_size, schedule.epochs) == (
            crop, batch, batch, epochs)
        assert (optim.name, optim.lr, optim.head_lr_mult, optim.weight_decay, optim.reference_batch) == (
            "adamw", 5e-6, 40.0, 0.01, 4 * batch)
        assert (config.model.backbone, config.model.aux_head, config.loss.ohem) == ("dinov2_b", False, ohem)
        assert config.framework_options["confidence_threshold"] == 0.95 and config.framework_options["ema_decay"] == 0.996
        assert config.schedule.lr_timing == "after_step"  # released: unimatch_v2.py 216-219
        evaluation = config.evaluation
        if sliding:
            assert (evaluation.mode, evaluation.crop_size, evaluation.stride, evaluation.sliding_scheme) == (
                "sliding", 798, 532, "unimatch_v2")
            assert config.loss.ohem_min_kept == 200_000
        else:
            assert (evaluation.mode, evaluation.resize_multiple) == ("whole", 14)
    assert _cell(dataset, protocol="corrected").config.schedule.lr_timing == "before_step"
    fixmatch = _cell(dataset, framework="fixmatch_v2").config
    assert (fixmatch.optim.name, fixmatch.schedule.crop_size) == ("adamw", crop)
    assert f"UniMatch-V2 configs/{name}.yaml 5" in _cell(dataset).explain("schedule.crop_size")


def test_explain_names_each_values_source():
    composition = _cell("pascal_classic")
    for key, value, why in UniMatchV2.publication_values(dataset_info("pascal_classic").settings):
        explained = composition.explain(key)
        assert why in explained, key
        assert composition.value(key) == value or key in ("model.weights",), key
    assert "configs/pascal.yaml 10" in composition.explain("optim.lr")
    assert "configs/cityscapes.yaml 17" in _cell("cityscapes").explain("loss.ohem_min_kept")


def test_adamw_groups_take_the_backbone_and_head_lrs():
    """unimatch_v2.py 67-73: the backbone at lr, every other parameter at 40 lr, betas (0.9, 0.999), decay 0.01."""
    config = with_overrides(_cell("pascal_classic").config, {"model.backbone": "vit_tiny", "model.weights": None})
    model = build_model(config)
    optimizer = build_optimizer(config, model)
    groups = optimizer.torch_optimizer.param_groups
    assert isinstance(optimizer.torch_optimizer, torch.optim.AdamW) and len(groups) == 2
    backbone = {id(p) for p in model.backbone.parameters()}
    assert {id(p) for p in groups[0]["params"]} == backbone
    assert all(id(p) not in backbone for p in groups[1]["params"])
    assert sum(len(g["params"]) for g in groups) == len(list(model.parameters()))
    assert [g["lr"] for g in groups] == [5e-6, 5e-6 * 40]
    assert all(g["betas"] == (0.9, 0.999) and g["weight_decay"] == 0.01 for g in groups)


def _official_starts(size: int, grid: int) -> list[int]:
    """UniMatch-V2 supervised.py 52-63: the window rows (or columns) of its sliding-window loop."""
    starts, pos = [], 0
    while True:
        starts.append(pos)
        if pos == size - grid:
            return starts
        pos = min(pos + int(grid * 2 / 3), size - grid)


def test_the_unimatch_v2_sliding_scheme_places_the_official_windows():
    """Cityscapes' 1024 x 2048 images: rows 0, 226; columns 0, 532, 1064, 1250 (the ``augseg`` placement cuts the
    last window at the border instead: another window set)."""
    scheme = SLIDING_SCHEMES["unimatch_v2"]
    windows = sliding_windows(1024, 2048, scheme)
    assert sorted({w[0].start for w in windows}) == _official_starts(1024, 798) == [0, 226]
    assert sorted({w[1].start for w in windows}) == _official_starts(2048, 798) == [0, 532, 1064, 1250]
    assert all(w[0].stop - w[0].start == 798 and w[1].stop - w[1].start == 798 for w in windows)
    assert scheme.combine == "probs"
    assert sliding_windows(1024, 2048, SLIDING_SCHEMES["augseg"]) != windows


def test_a_missing_dinov2_file_is_one_line_and_an_existing_one_passes(tmp_path):
    config = _cell("pascal_classic").config
    missing = tmp_path / "dinov2_vitb14_pretrain.pth"
    with pytest.raises(PreflightError, match=r"^model.weights: file .*dinov2_vitb14_pretrain.pth does not exist") as error:
        check_weights([with_overrides(config, {"model.weights": str(missing)})])
    assert "\n" not in str(error.value)
    missing.write_bytes(b"")
    check_weights([with_overrides(config, {"model.weights": str(missing)})])


def test_whole_images_are_resized_to_the_nearest_multiple_of_14_as_the_official_evaluation():
    """supervised.py 75: ``int(h / 14 + 0.5) x 14`` (500 -> 504, 375 -> 378, 333 -> 336, 341 -> 336: the next multiple
    up would give 350 for 341); the composed cells pass the rounding to ``predict``."""
    from npsemiseg.evaluation.inference import resized_side

    for side in (333, 341, 366, 375, 500, 14, 20):
        assert resized_side(side, 14, "nearest") == int(side / 14 + 0.5) * 14
    assert (resized_side(341, 14, "nearest"), resized_side(341, 14, "up")) == (336, 350)
    evaluation = _cell("pascal_classic").config.evaluation
    assert evaluation.predict_options("whole") == {"crop_size": evaluation.crop_size, "stride": None, "scheme": "u2pl",
                                                   "resize_multiple": 14, "resize_rounding": "nearest"}
    with pytest.raises(ValueError, match="resize_rounding: expected 'up' or 'nearest'"):
        resized_side(341, 14, "down")


def test_the_encoder_trains_as_in_the_published_runs_and_freezes_as_lock_backbone():
    """Every published run trained the encoder (training-logs/table03-ade20k_*.log 12: 'lock_backbone': False, though
    configs/ade20k.yaml 21 ships True, Table 7's frozen ablation). ``model.freeze_backbone`` is that ablation
    (unimatch_v2.py 64-65: no gradient, an empty backbone group): a step leaves the backbone as it was and moves the
    decoder."""
    from npsemiseg.frameworks import Batch
    from npsemiseg.frameworks.base import StepContext
    from npsemiseg.training.factories import build_framework

    assert not any(_cell(dataset).config.model.freeze_backbone for dataset in CELLS)
    tiny = {"model.backbone": "vit_tiny", "model.weights": None, "optim.lr": 1e-3, "model.freeze_backbone": True}
    config = with_overrides(_cell("ade20k", head="baseline").config, tiny)
    framework = build_framework(config)
    student = framework.student
    optimizer = build_optimizer(config, student)
    assert optimizer.torch_optimizer.param_groups[0]["params"] == []
    assert not any(p.requires_grad for p in student.backbone.parameters())
    before = {k: v.clone() for k, v in student.state_dict().items()}
    torch.manual_seed(0)
    images = torch.rand(2, 3, 28, 28)
    batch = Batch({"image": images, "label": torch.randint(0, 150, (2, 28, 28))},
                  with_unimatch_views({"image": torch.rand(2, 3, 28, 28), "image_strong": torch.rand(2, 3, 28, 28)}))
    framework.train_step(batch, StepContext(0, 10, 0, 1, 10)).total.backward()
    optimizer.torch_optimizer.step()
    after = student.state_dict()
    backbone = {f"backbone.{k}" for k in student.backbone.state_dict()}
    assert all(torch.equal(before[k], after[k]) for k in backbone)
    assert any(not torch.equal(before[k], after[k]) for k in after if k not in backbone)
