"""Each switch of ``npsemiseg.protocol`` changes behaviour as documented.

Framework and head switches: flipping the one switch from its corrected to its released value (and
nothing else) changes the framework's training steps on the same seeded batch; switches with a stated
effect (train-mode teachers update BN statistics, label padding, precision) are checked for that effect.
``evaluation_select`` is tested with the loop (tests/test_training.py), the NP head's options in
tests/test_heads_np.py and tests/test_heads_ddp.py (``sync_memories`` only differs across ranks).
"""

from __future__ import annotations

import contextlib
import math

import pytest
import torch

from unlabeled_views import with_unimatch_views
from npsemiseg.config import cell_config, switches, with_overrides
from npsemiseg.data.transforms import IMAGENET_MEAN
from npsemiseg.frameworks.base import Batch, StepContext
from npsemiseg.frameworks.pseudo_labels import prediction_from_logits
from npsemiseg.protocol import implemented_switches
from npsemiseg.training import build_framework, train_transforms
from npsemiseg.training.step import autocast

#: tiny U2PL queues for CPU tests (as tests/test_frameworks.py)
U2PL_SMALL = {"num_queries": 8, "num_negatives": 4, "queue_size": 64, "background_queue_size": 64}
#: switches whose effect is not a different training step in one CPU process (tested below or elsewhere)
NOT_A_STEP_CHANGE = {
    "np_sync_memories": "only differs across ranks: tests/test_heads_ddp.py",
    "np_eval_samples": "evaluation only",
    "np_feature_pool": "the same head on DeepLabv3+ (\"coarse\" is 1 there); on the DPT: "
                       "tests/test_np_feature_pool.py::test_protocol_pools_the_dpt_map_under_corrected_only",
    "np_sup_only_kl": "supervised-only epochs: tests/test_frameworks.py::test_u2pl_np_kl_during_the_supervised_only_epochs",
    "u2pl_teacher_reset": "the first semi-supervised epoch only (these steps are a later epoch's): "
                          "tests/test_u2pl_step_golden.py::test_each_corrected_teacher_moves_the_step_away",
    "u2pl_sup_only_zero_terms": "the supervised-only epochs only (this cell has none): "
                                "tests/test_np_u2pl_step_golden.py::test_the_supervised_only_step_decays_the_representation",
    "evaluation_select": "tests/test_training.py::test_checkpoint_selection_reports_and_restores_the_best_epoch",
    "fp32": "GPU autocast: test_fp32_switch_turns_autocast_off",
    "u2pl_label_pad": "the data pipeline: test_u2pl_label_pad_switch_pads_labels_with_background",
    "u2pl_resize": "the data pipeline: the golden test tests/test_u2pl_resize_golden.py",
    "augseg_cps_lists": "partition lists: test_augseg_cps_lists_switch_reads_the_cps_lists",
    "augseg_eval_window": "evaluation only: test_augseg_cityscapes_evaluation_window",
    "augseg_eval_stride": "evaluation only: test_augseg_cityscapes_evaluation_window",
    "augseg_eval_scheme": "evaluation only: the golden test tests/test_sliding_eval_golden.py (the same loop)",
    "psmt_cityscapes_plain_ce": "an untrained model keeps every pixel under OHEM: test_psmt_cityscapes_plain_ce",
    # the smoke step's contrastive term is 0 (too few classes and keys): tested on the loss itself below
    "u2pl_label_onehot": "test_label_onehot_bug_leaves_images_after_the_first_without_labels",
    "u2pl_label_onehot_ignored": "the golden test: tests/test_u2pl_contrastive_golden.py",
    "u2pl_labeled_negatives": "test_labeled_negatives_bug_enqueues_no_labeled_keys",
    "u2pl_prototype_index": "test_prototype_index_bug_pairs_anchors_with_another_class",
    "crop_padding": "the data pipeline: test_crop_padding_switch_pads_on_the_bottom_and_right",
    "crop_fill": "the data pipeline: test_crop_fill_switch_pads_the_image_with_black",
    "mt_cps_scales": "the data pipeline: tests/test_mt_cps_rescale_golden.py",
    "mt_cps_resize": "the data pipeline: tests/test_mt_cps_rescale_golden.py",
    "official_data_order": "the data order: tests/test_training.py::test_shared_data_order_is_the_official_samplers_order",
    "psmt_blur_kernel": "the data pipeline: test_psmt_blur_kernel_switch_draws_kernels_of_1_3_5",
    "psmt_eval_logits": "evaluation only: test_psmt_eval_logits_switch_averages_the_teachers_logits",
    "psmt_eval_whole": "evaluation only: the golden test tests/test_psmt_eval_golden.py",
    "psmt_eval_resize": "evaluation only: the golden test tests/test_psmt_eval_golden.py",
    "psmt_single_lr": "the optimiser: test_single_lr_switches_group_the_parameters",
    "mt_single_lr": "the optimiser: test_single_lr_switches_group_the_parameters",
    "mt_select_from_epoch": "evaluation only: test_best_epoch_candidates_start_at_select_from_epoch (test_training)",
    "psmt_epochs": "the schedule: test_psmt_epochs_switch_sets_psmt_epoch_counts",
    "head_settings": "the preset's crop and batches: test_head_settings_switch_trains_the_baseline_at_publication_settings",
    "unimatch_voc_eval_whole": "evaluation only: test_unimatch_switches_set_the_official_evaluation_and_schedule",
    "unimatch_eval_window": "evaluation only: test_unimatch_switches_set_the_official_evaluation_and_schedule",
    "unimatch_eval_stride": "evaluation only: test_unimatch_switches_set_the_official_evaluation_and_schedule",
    "unimatch_eval_scheme": "evaluation only: the golden test tests/test_sliding_eval_golden.py",
    "unimatch_ohem_min_kept": "an untrained model keeps every pixel under OHEM: "
                              "test_unimatch_switches_set_the_official_evaluation_and_schedule",
    "unimatch_weight_decay": "the optimiser: test_unimatch_switches_set_the_official_evaluation_and_schedule",
    "unimatch_epochs": "the schedule: test_unimatch_switches_set_the_official_evaluation_and_schedule",
    "unimatch_cps_lists": "partition lists: test_augseg_cps_lists_switch_reads_the_cps_lists",
    "mt_cps_ema_before_unlabeled": "alone (one joint pass) the EMA only moves by a step, the predicting teacher is "
                                   "the same: test_mt_cps_ema_timing_matters_with_split_passes",
    "psmt_warmup_teachers_scratch": "the teachers' initial weights (with the warm-up only): "
                                    "test_psmt_warmup_teachers_scratch_switch_redraws_the_teachers_backbones",
    "grad_clip_per_head": "the optimiser step: test_grad_clip_per_head_switch_clips_every_head_alike_under_corrected",
    "unimatch_lr_timing": "the step's LR, not its losses: test_lr_timing_after_step_runs_iteration_k_at_lr_k_minus_1 "
                          "(test_frameworks_unimatch)",
    "entropy_log_offset": "1e-10 of an entropy, a step only where a pixel sits at a percentile threshold: "
                          "test_released_entropy_takes_the_authors_log_p_plus_1e_10",
}
STEP_SWITCHES = [s for s in implemented_switches() if s.name not in NOT_A_STEP_CHANGE]
#: options under which a switch's effect reaches the losses of an untrained network: the CutMix source enters only the
#: unsupervised term, which an untrained network's confidences leave at 0 under the 0.95 threshold (the random draws
#: are the same for both sources: one draw of torch's generator per step)
SWITCH_OPTIONS = {"unimatch_cutmix_source": {"confidence_threshold": 0.0, "cutmix_p": 1.0}}


def _configs(smoke_config, switch, dataset: str = "synthetic"):
    framework = switch.frameworks[0] if switch.frameworks else "u2pl"
    head = switch.heads[0] if switch.heads else "baseline"
    if not switch.applies(framework=framework, dataset=dataset, head=head):
        dataset = "synthetic_cityscapes"  # the switches of Cityscapes' settings (sliding windows, OHEM, ...)
    options = U2PL_SMALL if framework == "u2pl" else SWITCH_OPTIONS.get(switch.name, {})
    corrected = smoke_config(framework=framework, head=head, dataset=dataset, protocol="corrected",
                             framework_options=options)
    released = with_overrides(corrected, {f"switches.{switch.name}": switch.released})
    assert switches(released)[switch.name] != switches(corrected)[switch.name]
    return corrected, released


def _batch(config, seed: int) -> Batch:
    gen = torch.Generator().manual_seed(seed)
    size, k = config.schedule.crop_size, config.num_classes
    labels = torch.randint(0, min(k, 2), (2, size, size), generator=gen)  # classes >= 2 absent: empty memories
    labeled = {"image": torch.rand(2, 3, size, size, generator=gen), "label": labels}
    labeled["image_strong"] = (labeled["image"] * 0.8).clamp(0, 1)
    unlabeled = {"image": torch.rand(2, 3, size, size, generator=gen)}
    unlabeled["image_strong"] = unlabeled["image"].flip(-1)
    return Batch(labeled=labeled, unlabeled=with_unimatch_views(unlabeled))


def _steps(config) -> list[dict[str, float]]:
    """Two training steps (epoch 1, so warm-ups and ramp-ups differ) of a freshly built framework."""
    torch.manual_seed(0)
    framework = build_framework(config)
    optimizer = torch.optim.SGD([p for p in framework.student.parameters() if p.requires_grad], lr=0.05)
    losses = []
    for step in range(2):
        torch.manual_seed(100 + step)
        ctx = StepContext(step=2 + step, total_steps=8, epoch=1, total_epochs=4, iters_per_epoch=2)
        result = framework.train_step(_batch(config, step), ctx)
        losses.append({k: float(v.detach()) for k, v in result.losses.items()})
        optimizer.zero_grad()
        result.total.backward()
        optimizer.step()
        framework.after_optimizer_step(ctx)
    return losses


@pytest.mark.parametrize("switch", STEP_SWITCHES, ids=lambda s: s.name)
def test_switch_changes_the_training_step(smoke_config, switch):
    corrected, released = _configs(smoke_config, switch)
    assert _steps(corrected) == _steps(corrected)  # the comparison is deterministic
    assert _steps(released) != _steps(corrected), f"{switch.name}: the released value changes nothing"


@pytest.mark.parametrize("name", ["u2pl_teacher_train_mode", "psmt_teacher_train_mode"])
def test_train_mode_teachers_update_their_bn_statistics(smoke_config, name):
    switch = next(s for s in implemented_switches() if s.name == name)
    for config, moves in zip(_configs(smoke_config, switch), (False, True)):
        torch.manual_seed(0)
        framework = build_framework(config)
        teachers = [m for n, m in framework.modules().items() if n != "student"]
        stats = [{k: v.clone() for k, v in t.state_dict().items() if "running_mean" in k} for t in teachers]
        ctx = StepContext(step=2, total_steps=8, epoch=1, total_epochs=4, iters_per_epoch=2)
        framework.train_step(_batch(config, 0), ctx)
        for teacher, before in zip(teachers, stats):
            after = teacher.state_dict()
            changed = any(not torch.equal(v, after[k]) for k, v in before.items())
            assert changed == moves, f"teacher BN statistics changed={changed} with {switches(config)[name]}"


def test_u2pl_label_pad_switch_pads_labels_with_background(smoke_config):
    switch = next(s for s in implemented_switches() if s.name == "u2pl_label_pad")
    corrected, released = _configs(smoke_config, switch)
    for config, pad in ((corrected, 255), (released, 0)):
        config = with_overrides(config, {"data.augmentation.scale_range": [0.5, 0.5],
                                        "data.augmentation.resize": "rescale"})
        labeled = train_transforms(config)["labeled"]
        item = {"image": torch.rand(3, 16, 16), "label": torch.ones(16, 16, dtype=torch.long), "id": "x"}
        out = labeled(item)["label"]
        assert (out == pad).any() and set(out.unique().tolist()) <= {1, pad}


@pytest.mark.parametrize("name", ["augseg_cps_lists", "unimatch_cps_lists"])
def test_augseg_cps_lists_switch_reads_the_cps_lists(smoke_config, name):
    switch = next(s for s in implemented_switches() if s.name == name)
    corrected, released = _configs(smoke_config, switch, dataset="synthetic_blender")
    assert corrected.partition_lists == "u2pl" and released.partition_lists == "cps"
    # where the dataset has only one partition-list source the switch does not apply
    plain = smoke_config(framework=switch.frameworks[0], dataset="synthetic", protocol="released")
    assert plain.partition_lists == "u2pl" and switches(plain)[switch.name] == "n/a"


def test_fp32_switch_turns_autocast_off(smoke_config):
    switch = next(s for s in implemented_switches() if s.name == "fp32")
    corrected, released = _configs(smoke_config, switch)
    cuda = torch.device("cuda")
    assert isinstance(autocast(released, cuda), contextlib.nullcontext)
    assert isinstance(autocast(corrected, cuda), torch.autocast)


# ---- U2PL's contrastive-loss bugs (switches u2pl_label_onehot, u2pl_labeled_negatives, u2pl_prototype_index)


def _contrastive_inputs(seed: int = 0, k: int = 4):
    gen = torch.Generator().manual_seed(seed)
    b, e, h, w = 4, 8, 4, 4
    rep_s, rep_t = torch.randn(b, e, h, w, generator=gen), torch.randn(b, e, h, w, generator=gen)
    prob = torch.rand(b, k, h, w, generator=gen).softmax(dim=1)
    labels = torch.randint(1, k, (b, h, w), generator=gen)  # class 0 absent: positions differ from classes
    reliable = torch.ones(b, h, w, dtype=torch.bool)
    unreliable = torch.rand(b, h, w, generator=gen) > 0.5
    return rep_s, rep_t, prob, labels, reliable, unreliable


def _queues(k: int = 4):
    from npsemiseg.frameworks.contrastive import ClassQueues

    return ClassQueues([256] * k, 8)


def test_label_onehot_bug_leaves_images_after_the_first_without_labels():
    from npsemiseg.frameworks.contrastive import class_membership

    labels = torch.tensor([[[0, 1]], [[2, 2]], [[1, 255]], [[3, 3]]])  # 2 labeled, 2 unlabeled images
    right = class_membership(labels, 2, 4)
    bugged = class_membership(labels, 2, 4, onehot_bug=True)
    assert right[1].any() and right[3].any()
    assert not bugged[1].any() and not bugged[3].any()  # images after the first of each part: no class
    assert torch.equal(bugged[0], right[:2].any(dim=0)) and torch.equal(bugged[2], right[2:].any(dim=0))
    assert bugged[0, :, 0, 0].tolist() == [True, False, True, False]  # multi-hot: classes 0 and 2


def test_labeled_negatives_bug_enqueues_no_labeled_keys():
    from npsemiseg.frameworks.contrastive import contrastive_loss

    rep_s, rep_t, prob, labels, reliable, unreliable = _contrastive_inputs()
    counts = {}
    for bugs in ((), ("labeled_negatives",)):
        queues = _queues()
        contrastive_loss(rep_s, rep_t, prob, labels, reliable, torch.zeros_like(unreliable), 2, queues,
                         num_queries=4, num_negatives=2, released_bugs=bugs)  # no unlabeled negatives
        counts[bugs] = sum(queues.class_keys(c).shape[0] for c in range(4))
    assert counts[()] > 0 and counts[("labeled_negatives",)] == 0


def test_prototype_index_bug_pairs_anchors_with_another_class():
    from npsemiseg.frameworks.contrastive import contrastive_loss

    rep_s, rep_t, prob, labels, reliable, unreliable = _contrastive_inputs()
    values = {}
    for bugs in ((), ("prototype_index",)):
        queues = _queues()
        loss, _ = contrastive_loss(rep_s, rep_t, prob, labels, reliable, unreliable, 2, queues, num_queries=4,
                                   num_negatives=2, released_bugs=bugs, generator=torch.Generator().manual_seed(1))
        values[bugs] = float(loss)
    assert values[()] != values[("prototype_index",)]
    with pytest.raises(ValueError, match="released_bugs"):
        contrastive_loss(rep_s, rep_t, prob, labels, reliable, unreliable, 2, _queues(), released_bugs=("x",))


def test_augseg_cityscapes_evaluation_window():
    from npsemiseg.config import cell_config

    cell = {"framework": "augseg", "dataset": "cityscapes", "partition": "186", "head": "baseline"}
    released = cell_config("paper", protocol="released", **cell)
    corrected = cell_config("paper", protocol="corrected", **cell)
    assert (released.evaluation.crop_size, released.evaluation.stride) == (800, 533)
    assert (corrected.evaluation.crop_size, corrected.evaluation.stride) == (769, 513)
    assert (released.evaluation.sliding_scheme, corrected.evaluation.sliding_scheme) == ("augseg", "u2pl")
    assert released.model.aux_head is False and corrected.model.aux_head is True
    voc = cell_config("paper", protocol="released", **{**cell, "dataset": "pascal_classic", "partition": "92"})
    assert voc.evaluation.crop_size == 513 and switches(voc)["augseg_eval_window"] == "n/a"


@pytest.mark.parametrize("framework", ["fixmatch", "unimatch"])
def test_unimatch_switches_set_the_official_evaluation_and_schedule(smoke_config, framework):
    """UniMatch@0324f3d (both trainers): VOC evaluated on whole images, Cityscapes by 801 px windows at stride 534,
    OHEM min_kept 200000 without an auxiliary head, weight decay 1e-4, 240 epochs for every head; corrected: the
    shared settings. Every evaluation is a candidate for the best epoch (evaluated every epoch) under released."""
    from npsemiseg.training.factories import build_optimizer

    city = {"framework": framework, "dataset": "cityscapes", "partition": "186", "head": "np"}
    released = cell_config("paper", protocol="released", **city)
    corrected = cell_config("paper", protocol="corrected", **city)
    assert (released.evaluation.mode, released.evaluation.crop_size, released.evaluation.stride) == ("sliding", 801, 534)
    assert (corrected.evaluation.crop_size, corrected.evaluation.stride) == (769, 513)
    assert (released.evaluation.sliding_scheme, corrected.evaluation.sliding_scheme) == ("augseg", "u2pl")
    assert (released.loss.ohem, released.loss.ohem_min_kept, released.loss.ohem_thresh) == (True, 200_000, 0.7)
    assert corrected.loss.ohem_min_kept == 100_000
    assert released.model.aux_head is False and corrected.model.aux_head is True
    assert released.optim.weight_decay == 1e-4 and corrected.optim.weight_decay == 5e-4
    assert released.schedule.epochs == 240 and corrected.schedule.epochs == 200
    assert released.evaluation.select == "best" and corrected.evaluation.select == "last"
    assert released.schedule.eval_every_epochs == corrected.schedule.eval_every_epochs == 1
    assert released.data.augmentation["crop_padding"] == "bottom_right"
    small = smoke_config(framework=framework, dataset="synthetic_cityscapes", protocol="released")
    sgd = build_optimizer(small, build_framework(small).student).torch_optimizer
    assert {g["weight_decay"] for g in sgd.param_groups} == {1e-4}
    voc = {**city, "dataset": "pascal_classic", "partition": "92"}
    assert cell_config("paper", protocol="released", **voc).evaluation.mode == "whole"
    voc_corrected = cell_config("paper", protocol="corrected", **voc)
    assert (voc_corrected.evaluation.mode, voc_corrected.evaluation.crop_size) == ("center_crop", 513)
    assert switches(voc_corrected)["unimatch_eval_window"] == "n/a"
    # other frameworks keep the shared settings
    u2pl = cell_config("paper", protocol="released", **{**city, "framework": "u2pl"})
    assert u2pl.loss.ohem_min_kept == 100_000 and switches(u2pl)["unimatch_ohem_min_kept"] == "n/a"


def test_psmt_cityscapes_plain_ce(smoke_config):
    """The framework receives plain CE (released) or OHEM (corrected); OHEM itself: tests/test_training.py."""
    switch = next(s for s in implemented_switches() if s.name == "psmt_cityscapes_plain_ce")
    corrected, released = _configs(smoke_config, switch)
    assert build_framework(corrected).loss.ohem is True and build_framework(released).loss.ohem is False
    voc = smoke_config(framework="psmt", protocol="corrected")
    assert voc.loss.ohem is False and switches(voc)[switch.name] == "n/a"


def test_mt_framework_runs_mt_cps_mse_between_softmaxes_evaluating_the_student(smoke_config):
    """Switch mt_framework (released) runs framework mt_cps, CPS's MeanTeacher: unsup = 100 x MSE(student softmax,
    train-mode teacher softmax); the student is evaluated."""
    switch = next(s for s in implemented_switches() if s.name == "mt_framework")
    corrected, released = _configs(smoke_config, switch)
    assert (corrected.framework, released.framework) == ("mt", "mt_cps") and released.framework_label == "mt"
    assert released == smoke_config(framework="mt_cps", **{"framework_label": "mt"})  # the class asked for by name
    cps = build_framework(released)
    assert cps.eval_model() is cps.student and build_framework(corrected).eval_model() is not None
    torch.manual_seed(0)
    cps = build_framework(released)
    batch = _batch(released, 0)
    ctx = StepContext(step=2, total_steps=8, epoch=1, total_epochs=4, iters_per_epoch=2)
    teacher_stats = {k: v.clone() for k, v in cps.teacher.state_dict().items() if "running_mean" in k}
    torch.manual_seed(5)
    result = cps.train_step(batch, ctx)
    assert any(not torch.equal(v, cps.teacher.state_dict()[k]) for k, v in teacher_stats.items())
    assert set(result.losses) == {"sup", "unsup"}
    assert 0.0 < float(result.losses["unsup"].detach()) < 100.0  # 100 x a mean squared difference of probabilities
    # no CutMix, no pseudo-label CE: the shared-trainer MT's loss on the same batch differs
    torch.manual_seed(0)
    shared = build_framework(corrected)
    torch.manual_seed(5)
    assert float(shared.train_step(batch, ctx).losses["unsup"]) != float(result.losses["unsup"])


# ---- data, optimiser, schedule, evaluation and preset switches


def _switch(name: str):
    return next(s for s in implemented_switches() if s.name == name)


def test_crop_padding_switch_pads_on_the_bottom_and_right(smoke_config):
    """A 16 x 16 image in a 32 crop: released pads rows and columns 16.. only, corrected 8 on each side."""
    corrected, released = _configs(smoke_config, _switch("crop_padding"))
    item = {"image": torch.rand(3, 16, 16), "label": torch.ones(16, 16, dtype=torch.long), "id": "x"}
    for config, corner in ((released, (0, 0)), (corrected, (8, 8))):
        config = with_overrides(config, {"data.augmentation.resize": "none", "data.augmentation.flip": False})
        label = train_transforms(config)["labeled"](item)["label"]
        assert label.shape == (32, 32)
        top, left = corner
        assert bool((label[top:top + 16, left:left + 16] == 1).all()) and int((label == 1).sum()) == 256


@pytest.mark.parametrize("framework", ["fixmatch", "unimatch", "unimatch_v2", "fixmatch_v2"])
def test_crop_fill_switch_pads_the_image_with_black(smoke_config, framework):
    """A 16 x 16 image in a 32 crop: the padded pixels are black under released (UniMatch's 0), the ImageNet mean
    under corrected; the image's own pixels are the same under both; AugSeg keeps the mean under both."""
    cell = {"framework": framework, "dataset": "synthetic", "partition": "1/16", "head": "baseline"}
    item = {"image": torch.rand(3, 16, 16) * 0.5 + 0.25, "label": torch.ones(16, 16, dtype=torch.long), "id": "x"}
    outside = torch.ones(32, 32, dtype=torch.bool)
    outside[:16, :16] = False
    fills = {}
    for protocol in ("released", "corrected"):
        config = with_overrides(cell_config("smoke", protocol=protocol, **cell),
                                {"schedule.crop_size": 32, "data.augmentation.resize": "none",
                                 "data.augmentation.flip": False, "data.augmentation.crop_padding": "bottom_right"})
        image = train_transforms(config)["labeled"](item)["image"]
        assert torch.equal(image[:, :16, :16], item["image"])
        fills[protocol] = image[:, outside]
    assert float(fills["released"].abs().max()) == 0.0
    mean = torch.tensor(IMAGENET_MEAN).view(3, 1)
    assert torch.allclose(fills["corrected"], mean.expand_as(fills["corrected"]))
    augseg = cell_config("smoke", protocol="released", **dict(cell, framework="augseg"))
    assert augseg.data.augmentation.get("crop_fill", "mean") == "mean"


def _blur(config):
    from npsemiseg.data.transforms import RandomGaussianBlur

    strong = train_transforms(config)["unlabeled"].strong
    return next(t for t in strong.transforms if isinstance(t, RandomGaussianBlur))


def test_psmt_blur_kernel_switch_draws_kernels_of_1_3_5(smoke_config):
    from npsemiseg.data.transforms import gaussian_blur

    corrected, released = _configs(smoke_config, _switch("psmt_blur_kernel"))
    image = torch.rand(3, 32, 32)
    torch.manual_seed(0)
    sizes = [_blur(released).make_params([image])["size"] for _ in range(2000)]
    assert set(sizes) == {1, 3, 5}
    assert abs(sizes.count(1) / 2000 - 2 / 4.95) < 0.04 and abs(sizes.count(5) / 2000 - 0.95 / 4.95) < 0.04
    assert _blur(corrected).make_params([image])["size"] is None  # kernel 2 ceil(3 sigma) + 1
    assert torch.equal(gaussian_blur(image, 2.0, kernel_size=1), image)  # 40 % of PS-MT's blurs change nothing
    assert not torch.allclose(gaussian_blur(image, 2.0, kernel_size=5), gaussian_blur(image, 2.0))


def test_psmt_eval_logits_switch_averages_the_teachers_logits(smoke_config):
    from npsemiseg.heads.base import predictive

    corrected, released = _configs(smoke_config, _switch("psmt_eval_logits"))
    images = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    probs = {}
    for config in (corrected, released):
        torch.manual_seed(0)
        framework = build_framework(config)
        with torch.no_grad():
            for p in framework.teachers["teacher2"].parameters():
                p.add_(0.5 * torch.randn_like(p))
        ensemble = framework.eval_model().eval()
        members = [m(images).head.logits for m in ensemble.members]
        logits = ensemble(images).head.logits
        if config is released:
            assert torch.allclose(logits, (members[0] + members[1]) / 2)
        else:
            assert torch.equal(logits, torch.cat(members))
        probs[config.framework_options["eval_average"]] = predictive(logits)[0]
    assert not torch.allclose(probs["logits"], probs["probabilities"])


@pytest.mark.parametrize("name", ["psmt_single_lr", "mt_single_lr"])
def test_single_lr_switches_group_the_parameters(smoke_config, name):
    from npsemiseg.training.factories import build_optimizer

    corrected, released = _configs(smoke_config, _switch(name))
    for config in (corrected, released):
        student = build_framework(config).student
        sgd = build_optimizer(config, student).torch_optimizer
        groups = {id(p): g for g in sgd.param_groups for p in g["params"]}
        assert len(groups) == len([p for p in student.parameters() if p.requires_grad])
        bn = next(m for m in student.modules() if isinstance(m, torch.nn.BatchNorm2d))
        conv = next(m for m in student.head.modules() if isinstance(m, torch.nn.Conv2d) and m.bias is not None)
        wd = config.optim.weight_decay
        if config is released:  # one LR; no decay on BN and biases, decay on conv weights
            assert {g["lr"] for g in sgd.param_groups} == {sgd.defaults["lr"]}
            assert groups[id(bn.weight)]["weight_decay"] == groups[id(conv.bias)]["weight_decay"] == 0.0
            assert groups[id(conv.weight)]["weight_decay"] == wd
        else:  # backbone at lr, the rest at lr x head_lr_mult, decay everywhere
            lrs = sorted(g["lr"] for g in sgd.param_groups)
            assert lrs[1] == pytest.approx(lrs[0] * config.optim.head_lr_mult) and lrs[1] != lrs[0]
            assert {g["weight_decay"] for g in sgd.param_groups} == {wd}


def test_psmt_epochs_switch_sets_psmt_epoch_counts():
    from npsemiseg.training.plan import plan_run

    def epochs(dataset, partition, protocol):
        return cell_config("paper", framework="psmt", dataset=dataset, partition=partition,
                                     protocol=protocol).schedule.epochs

    blender = ["662", "1323", "2646", "5291"]
    assert [epochs("pascal_blender", p, "released") for p in blender] == [80, 80, 200, 300]
    assert [epochs("cityscapes", p, "released") for p in ["372", "744", "1488"]] == [320, 450, 550]
    assert [epochs("pascal_blender", p, "corrected") for p in blender] == [80] * 4
    assert epochs("cityscapes", "744", "corrected") == 200 and epochs("pascal_classic", "732", "released") == 80
    released = cell_config("paper", framework="psmt", dataset="pascal_blender", partition="5291",
                                     head="np", protocol="released")  # the NP head: the same batch under both
    corrected = with_overrides(released, protocol="corrected")
    plans = [plan_run(c, num_labeled=5291, num_unlabeled=5291, world_size=4) for c in (released, corrected)]
    assert plans[0].total_steps == 300 / 80 * plans[1].total_steps
    # other frameworks keep the shared schedule under both protocols
    u2pl = cell_config("paper", framework="u2pl", dataset="pascal_blender", partition="5291", protocol="released")
    assert u2pl.schedule.epochs == 80 and switches(u2pl)["psmt_epochs"] == "n/a"


def test_head_settings_switch_trains_the_baseline_at_publication_settings():
    """released: the baseline head at the framework's own crop and batch, MC dropout / NP at the reduced ones;
    corrected: every head of a framework alike. The crop and batch stay derived when the switch, the head or the
    protocol change, and an explicit crop wins."""

    def setting(framework, head, protocol, dataset="pascal_classic", **overrides):
        c = cell_config("paper", framework=framework, dataset=dataset, head=head, protocol=protocol,
                                  **overrides)
        return c.schedule.crop_size, c.schedule.batch_size, c.schedule.unlabeled_batch_size, c.optim.reference_batch

    assert setting("psmt", "baseline", "released") == (512, 8, 8, 32)
    assert setting("u2pl", "baseline", "released", dataset="cityscapes") == (769, 4, 4, 16)
    assert setting("augseg", "baseline", "released", dataset="cityscapes") == (800, 4, 4, 16)
    for head in ("mc_dropout", "np"):
        assert setting("psmt", head, "released") == (480, 3, 3, 12)
        assert setting("psmt", head, "released", dataset="cityscapes") == (580, 2, 2, 8)
    for head in ("baseline", "mc_dropout", "np"):
        assert setting("psmt", head, "corrected") == (480, 3, 3, 12)
    # one switch on its own, and the derived schedule following a change of switch, head or protocol
    assert setting("psmt", "baseline", "corrected", **{"switches.head_settings": "per_head"}) == (512, 8, 8, 32)
    released = cell_config("paper", framework="psmt", dataset="pascal_classic", head="baseline",
                                     protocol="released")
    assert with_overrides(released, {"switches.head_settings": "shared"}).schedule.crop_size == 480
    assert with_overrides(released, {"head.name": "np"}).schedule.crop_size == 480
    assert with_overrides(released, protocol="corrected").schedule.crop_size == 480
    assert with_overrides(released, {"schedule.crop_size": 300}).schedule.crop_size == 300
    assert setting("psmt", "baseline", "released", **{"schedule.crop_size": 300})[0] == 300
    # the crop reaches the training transform
    item = {"image": torch.rand(3, 600, 600), "label": torch.zeros(600, 600, dtype=torch.long), "id": "x"}
    assert train_transforms(released)["labeled"](item)["image"].shape[-2:] == (512, 512)


def test_head_settings_derives_publication_lr_epochs_and_np_config_batch():
    """released (per_head): the baseline head at its framework's publication LR and epochs (PS-MT 0.01 at 32 on
    VOC, 4.5e-3 on Cityscapes; MT 34 epochs), AugSeg's VOC MC-dropout / NP rows at the NP config's 8 in all;
    corrected keeps the shared 1e-3, 80 and 12. Values follow a change of head, switch or protocol; an explicit
    LR or epoch count wins; the smoke preset's own LR stays."""

    def cell(framework, head, protocol, dataset="pascal_classic", partition="92", **overrides):
        return cell_config("paper", framework=framework, dataset=dataset, partition=partition, head=head,
                                     protocol=protocol, **overrides)

    psmt = cell("psmt", "baseline", "released")
    assert (psmt.optim.lr, psmt.optim.reference_batch, psmt.optim.parameter_groups) == (0.01, 32, "single_lr")
    assert cell("psmt", "baseline", "released", dataset="cityscapes", partition="744").optim.lr == 4.5e-3
    assert cell("psmt", "np", "released").optim.lr == cell("psmt", "baseline", "corrected").optim.lr == 1e-3
    # PS-MT's own epochs under psmt_epochs stay for every head
    assert cell("psmt", "np", "released", dataset="pascal_blender", partition="5291").schedule.epochs == 300
    assert cell("psmt", "baseline", "released", dataset="pascal_blender", partition="5291").schedule.epochs == 300
    mt = cell("mt", "baseline", "released")  # CPS's MeanTeacher: batch 8 over 4 GPUs, 0.0025 x 4, one LR, 34 epochs
    assert (mt.schedule.epochs, mt.schedule.crop_size, mt.schedule.batch_size, mt.optim.reference_batch) == (34, 512, 2, 8)
    assert (mt.optim.lr, mt.optim.parameter_groups) == (0.01, "single_lr")
    assert (mt.evaluation.select, mt.evaluation.select_from_epoch) == ("best", 21)  # epoch-20.pth: after 21 epochs
    assert cell("mt", "baseline", "corrected").optim.parameter_groups == "backbone_head"
    assert cell("mt", "np", "released").schedule.epochs == cell("mt", "baseline", "corrected").schedule.epochs == 80
    assert cell("u2pl", "baseline", "released").schedule.epochs == 80
    for head in ("mc_dropout", "np"):
        augseg = cell("augseg", head, "released")
        assert (augseg.schedule.batch_size, augseg.optim.reference_batch, augseg.optim.lr) == (2, 8, 1e-3)
        assert cell("augseg", head, "corrected").schedule.batch_size == 3
        assert cell("augseg", head, "released", dataset="cityscapes", partition="744").optim.reference_batch == 8
    assert cell("augseg", "baseline", "released").optim.reference_batch == 16
    # derived values follow the cell; explicit ones win
    assert with_overrides(mt, {"head.name": "np"}).schedule.epochs == 80
    assert with_overrides(mt, protocol="corrected").schedule.epochs == 80
    assert with_overrides(mt, {"head.name": "np", "schedule.epochs": 50}).schedule.epochs == 50
    assert with_overrides(psmt, {"switches.head_settings": "shared"}).optim.lr == 1e-3
    assert with_overrides(psmt, {"head.name": "np", "optim.lr": 0.5}).optim.lr == 0.5
    # CPS's MeanTeacher's publication settings are mt_cps's; the shared-trainer MT's are the shared trainer's
    assert cell("mt_cps", "baseline", "corrected", **{"switches.head_settings": "per_head"}).schedule.epochs == 34
    assert cell("mt", "baseline", "corrected", **{"switches.head_settings": "per_head"}).schedule.epochs == 80
    assert with_overrides(cell("augseg", "np", "released"), {"head.name": "baseline"}).optim.reference_batch == 16
    smoke = cell_config("smoke", framework="psmt", dataset="pascal_classic", head="baseline",
                                  protocol="released")
    assert with_overrides(smoke, {"head.name": "np"}).optim.lr == smoke.optim.lr == 0.01
    # the epochs and the LR reach the training plan
    from npsemiseg.training.plan import batch_scaling, plan_run

    plan = plan_run(mt, num_labeled=92, num_unlabeled=1372, world_size=4)
    assert plan.total_steps == 34 * plan.iters_per_epoch
    assert batch_scaling(psmt, 4).lr == 0.01
    # PS-MT's own rule (2.5e-3 per GPU of 8 images, VocCode/main.py 200) is linear scaling from reference 32
    assert batch_scaling(with_overrides(psmt, {"optim.lr_scaling": "linear"}), 2).lr == 0.005


def test_align_corners_switch_reaches_the_model_and_the_evaluation(smoke_config):
    from npsemiseg.evaluation.inference import sample_logits
    from npsemiseg.models import logit_align_corners
    from npsemiseg.training import build_model

    corrected, released = _configs(smoke_config, _switch("align_corners"))
    images = torch.rand(1, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    logits = []
    for config, expected in ((corrected, False), (released, True)):
        torch.manual_seed(0)
        model = build_model(config).eval()
        assert logit_align_corners(model) is expected
        assert logit_align_corners(build_framework(config).eval_model()) is expected
        with torch.no_grad():
            logits.append(sample_logits(model, images, None))
    assert logits[0].shape == logits[1].shape and not torch.allclose(logits[0], logits[1])


def test_psmt_warm_up_trains_each_teacher_with_an_optimiser_of_its_own(smoke_config):
    """released (5 warm-up epochs): the teachers are models of their own (not copies of the student), each
    trained on the labeled batch by its own optimiser in a warm-up step; afterwards they are frozen and the
    optimisers dropped. corrected (0): teachers start as copies of the student."""
    corrected, released = _configs(smoke_config, _switch("psmt_warmup_epochs"))
    copied = build_framework(corrected)
    assert all(torch.equal(a, b) for a, b in zip(copied.teacher.parameters(), copied.student.parameters()))
    framework = build_framework(released)
    teacher1, teacher2 = (framework.teachers[n] for n in framework.teacher_names)
    assert not all(torch.equal(a, b) for a, b in zip(teacher1.parameters(), teacher2.parameters()))
    before = {n: [p.detach().clone() for p in t.parameters()] for n, t in framework.teachers.items()}
    batch = _batch(released, seed=0)
    ctx = StepContext(step=0, total_steps=40, epoch=0, total_epochs=10, iters_per_epoch=4)
    result = framework.train_step(batch, ctx)
    assert {"warmup/teacher1_loss", "warmup/teacher2_loss"} <= set(result.logs)
    for name, teacher in framework.teachers.items():
        assert not teacher.training and all(p.grad is not None for p in teacher.parameters() if p.requires_grad)
        assert any(not torch.equal(a, b) for a, b in zip(before[name], teacher.parameters())), name
    state = framework.state_dict()["teacher_optimizers"]
    assert set(state) == {"teacher1", "teacher2"} and all(s["state"] for s in state.values())
    framework.after_optimizer_step(ctx)  # no copy of the student into the teachers
    assert not all(torch.equal(a, b) for a, b in zip(teacher1.parameters(), framework.student.parameters()))
    semi = StepContext(step=20, total_steps=40, epoch=5, total_epochs=10, iters_per_epoch=4)  # after the warm-up
    framework.train_step(batch, semi)
    assert not any(p.requires_grad for t in framework.teachers.values() for p in t.parameters())
    assert framework.state_dict()["teacher_optimizers"] == {}


def test_grad_clip_per_head_switch_clips_every_head_alike_under_corrected(smoke_config):
    """Switch grad_clip_per_head: released clips the NP cells only (the authors' NP trainers, at 5); corrected clips
    every head of a framework at 5, so a baseline-vs-NP difference is the head's alone. An override still wins."""
    for framework in ("supervised", "mt", "u2pl", "augseg", "psmt"):
        for head in ("baseline", "mc_dropout", "np"):
            released = smoke_config(framework=framework, head=head, protocol="released")
            corrected = smoke_config(framework=framework, head=head, protocol="corrected")
            assert released.optim.grad_clip == (5.0 if head == "np" else None), (framework, head)
            assert corrected.optim.grad_clip == 5.0, (framework, head)
            assert switches(corrected)["grad_clip_per_head"] == 5.0
    unclipped = smoke_config(framework="u2pl", head="baseline", protocol="corrected", **{"optim.grad_clip": None})
    assert unclipped.optim.grad_clip is None


@pytest.mark.parametrize("head", ["baseline", "mc_dropout", "np"])
def test_mt_cps_released_step_trains_every_head_in_two_passes(smoke_config, head):
    """Switches mt_cps_split_passes / mt_cps_ema_before_unlabeled / mt_cps_no_dropout with each head: the student
    runs once per half (BN statistics per half), the teacher is updated before it predicts the unlabeled half (and
    not again after the optimiser step), no train-only dropout is left; the MC-dropout head keeps its own."""
    config = smoke_config(framework="mt", head=head, protocol="released")
    assert config.framework == "mt_cps" and config.framework_options["passes"] == "split"
    torch.manual_seed(0)
    framework = build_framework(config)
    kinds = {type(m).__name__ for model in framework.modules().values() for m in model.modules()}
    assert "Dropout2d" not in kinds and (("MCDropout2d" in kinds) == (head == "mc_dropout"))
    calls = []
    framework.student.register_forward_hook(lambda module, args, out: calls.append(args[0].shape[0]))
    predicted = []
    original = framework.predict
    framework.predict = lambda teacher, images, **kw: (predicted.append(
        [p.detach().clone() for p in teacher.parameters()]), original(teacher, images, **kw))[1]
    batch = _batch(config, 0)
    ctx = StepContext(step=3, total_steps=8, epoch=1, total_epochs=4, iters_per_epoch=2)
    with torch.no_grad():  # a teacher unlike the student, so that the EMA moves it
        for p in framework.teacher.parameters():
            p.mul_(0.5)
    result = framework.train_step(batch, ctx)
    labeled = batch.labeled["image"].shape[0]
    if head != "np":  # the NP head runs backbone and decoder per half, then the head once on both
        assert calls == [labeled, batch.unlabeled["image"].shape[0]]
    assert len(predicted) == 2 and any(not torch.equal(a, b) for a, b in zip(*predicted))
    assert torch.isfinite(result.total) and set(result.losses) >= {"sup", "unsup"}
    result.total.backward()
    before = [p.detach().clone() for p in framework.teacher.parameters()]
    framework.after_optimizer_step(ctx)
    assert all(torch.equal(a, b) for a, b in zip(before, framework.teacher.parameters()))


def test_mt_cps_ema_timing_matters_with_split_passes(smoke_config):
    """Switch mt_cps_ema_before_unlabeled with split passes: from the second step on the labeled half is predicted
    by a teacher one EMA update older than the one that predicts the unlabeled half (TorchSemiSeg network.py
    39-41); with the EMA after the optimiser step both halves see the same teacher. With one joint pass the two
    placements give the same predicting teacher (the update is only moved by a step)."""
    split = smoke_config(framework="mt_cps", head="baseline", protocol="released")
    after = with_overrides(split, {"switches.mt_cps_ema_before_unlabeled": "after_step"})
    first_released, second_released = _steps(split)
    first_after, second_after = _steps(after)
    assert first_released == first_after  # the teacher starts as the student: the first EMA changes nothing
    assert second_released["unsup"] != second_after["unsup"]
    joint = with_overrides(split, {"switches.mt_cps_split_passes": "joint"})
    assert _steps(joint) == _steps(with_overrides(joint, {"switches.mt_cps_ema_before_unlabeled": "after_step"}))


@pytest.mark.parametrize("backbones", ["scratch", "pretrained"])
def test_psmt_warmup_teachers_scratch_switch_redraws_the_teachers_backbones(smoke_config, backbones):
    """Switch psmt_warmup_teachers_scratch (released): with the warm-up, the teachers' backbones start from a random
    initialisation (BN statistics reset), the student's and the teachers' decoders and heads from the run's weights;
    ``pretrained`` keeps the run's weights in the teachers' backbones too. Stand-in for pretrained weights here:
    every backbone parameter 0.125, every BN running mean 0.5."""
    from npsemiseg.training import build_model

    config = smoke_config(framework="psmt", head="baseline", protocol="released",
                          **{"framework_options.warmup_teacher_backbones": backbones,
                             "framework_options.warmup_epochs": 1})  # the smoke preset shortens it to 0

    def pretrained():
        model = build_model(config)
        with torch.no_grad():
            for p in model.backbone.parameters():
                p.fill_(0.125)
            for name, b in model.backbone.named_buffers():
                if name.endswith("running_mean"):
                    b.fill_(0.5)
        return model

    framework = build_framework(config, pretrained)
    assert all(bool((p == 0.125).all()) for p in framework.student.backbone.parameters())
    for name in framework.teacher_names:
        teacher = framework.teachers[name]
        weights = [bool((p == 0.125).all()) for p in teacher.backbone.parameters()]
        stats = [bool((b == 0.5).all()) for n, b in teacher.backbone.named_buffers() if n.endswith("running_mean")]
        if backbones == "scratch":
            assert not any(weights) and not any(stats)
        else:
            assert all(weights) and all(stats)


def test_released_entropy_takes_the_authors_log_p_plus_1e_10(smoke_config):
    """Under ``released`` the teacher's entropy is ``-sum p log(p + 1e-10)`` (U2PL loss_helper.py 35-36, AugSeg
    train_semi.py 331, the NP-SemiSeg authors' 499-500 and 366), under ``corrected`` ``-sum p log(max(p, 1e-12))``:
    U2PL's entropy filter and AugSeg's adaptive confidence take the form the cell's protocol names."""
    # a confident pixel (its entropy 4.6e-9 clamped, 3 % less with the offset), a one-hot one, a uniform one
    logits = torch.tensor([[1.0, 1e-10, 1e-10, 0.0], [1.0, 0.0, 0.0, 0.0], [0.25] * 4]).T.reshape(1, 4, 1, 3).log()
    stats = prediction_from_logits(logits[None], (1, 3))  # the teacher's statistics pass, as U2PL reads it
    probs = stats.probs
    forms = {"released": -(probs * torch.log(probs + 1e-10)).sum(dim=1),
             "corrected": -(probs * torch.log(probs.clamp_min(1e-12))).sum(dim=1)}
    assert not torch.equal(forms["released"], forms["corrected"])
    for protocol, entropy in forms.items():
        u2pl = build_framework(smoke_config(framework="u2pl", protocol=protocol, framework_options=U2PL_SMALL))
        assert torch.equal(u2pl._entropy_u(stats, 0, (1, 3), u2pl.options), entropy), protocol
        augseg = build_framework(smoke_config(framework="augseg", protocol=protocol))
        rho = ((1 - entropy / math.log(4)) * probs.amax(dim=1)).mean(dim=(1, 2))
        assert torch.equal(augseg.image_confidence(probs), rho), protocol
