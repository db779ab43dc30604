"""FixMatch and UniMatch: the step's pieces on real small models (CPU) and a smoke cell of each framework x head.

What is checked against the official step (LiheYoung/UniMatch unimatch.py / fixmatch.py): the CutMix source is
predicted in eval mode without gradient; the two strong views' boxes are independent draws; the feature
perturbation drops encoder channels only; the threshold mask and the division by the valid pixels; the loss
weights; and that every new framework trains and evaluates with every head under both protocols.
"""

from __future__ import annotations

import math

import pytest
import torch

from npsemiseg.data import dataset_info
from npsemiseg.data.settings import Publication
from npsemiseg.frameworks import get_framework
from npsemiseg.frameworks.base import Batch, StepContext
from npsemiseg.frameworks.fixmatch import FixMatch, host_rng, mix_partners, thresholded_loss, unimatch_boxes
from npsemiseg.frameworks.unimatch import UniMatch
from npsemiseg.heads import head_class, head_names
from npsemiseg.training import build_framework

NEW_FRAMEWORKS = ("fixmatch", "unimatch")
HEADS = head_names()
CTX = StepContext(step=0, total_steps=4, epoch=0, total_epochs=2, iters_per_epoch=2)


def _unlabeled(gen: torch.Generator, batch: int, size: int, suffix: str = "") -> dict[str, torch.Tensor]:
    """One augmentation draw of an unlabeled batch: weak view, two strong views, the last two columns padded."""
    image = torch.rand(batch, 3, size, size, generator=gen)
    padding = torch.zeros(batch, size, size, dtype=torch.bool)
    padding[..., -2:] = True
    views = {"image": image, "image_strong": image.flip(-1), "image_strong2": image.flip(-2), "padding": padding}
    return {k + suffix: v for k, v in views.items()}


def _batch(config, *, seed: int = 0, batch: int = 2, second_draw: bool = False) -> Batch:
    gen = torch.Generator().manual_seed(seed)
    size, k = config.schedule.crop_size, config.num_classes
    labels = torch.randint(0, k, (batch, size, size), generator=gen)
    labels[:, :2] = 255
    unlabeled = _unlabeled(gen, batch, size)
    if second_draw:
        unlabeled.update(_unlabeled(gen, batch, size, "_mix"))
    return Batch(labeled={"image": torch.rand(batch, 3, size, size, generator=gen), "label": labels},
                 unlabeled=unlabeled)


def _framework(smoke_config, framework: str, head: str = "baseline", **options):
    config = smoke_config(framework=framework, head=head, framework_options=options)
    torch.manual_seed(0)
    return build_framework(config), config


# ----------------------------------------------------------------------------------------- registry and presets
def test_registered_with_their_paper_settings():
    assert get_framework("fixmatch") is FixMatch and get_framework("unimatch") is UniMatch
    for cls in (FixMatch, UniMatch):
        assert cls.teacher_names == () and cls.decoder == "augseg" and cls.augmentation == "psmt"
        assert cls.paper_options("pascal_classic", "1464")["confidence_threshold"] == 0.95
        voc, city = dataset_info("pascal_classic"), dataset_info("cityscapes")  # their settings hold the publications
        assert city.settings.options_for(cls.name, "744") == {"confidence_threshold": 0.0}
        assert (cls.publication_on(voc.settings), cls.publication_on(city.settings)) == (
            Publication(321, 8, lr=1e-3, epochs=80), Publication(801, 8, lr=5e-3, epochs=240))
        assert cls.own_epochs(voc, "1464") == 80 and cls.own_epochs(city, "744") == 240
    assert UniMatch.paper_options("pascal_classic", "92")["feature_dropout"] == 0.5


def test_no_teacher_the_network_is_evaluated(smoke_config):
    fw, _ = _framework(smoke_config, "unimatch")
    assert set(fw.modules()) == {"student"} and fw.eval_model() is fw.student


# ----------------------------------------------------------------------------------------- boxes and partners
def test_boxes_follow_obtain_cutmix_box():
    gen = torch.Generator().manual_seed(3)
    boxes = unimatch_boxes(400, 32, 32, p=0.5, generator=gen)
    has_box = boxes.flatten(1).any(dim=1)
    assert 0.35 < float(has_box.float().mean()) < 0.65  # a box with probability p
    area = boxes.flatten(1).float().sum(dim=1)[has_box] / (32 * 32)
    assert float(area.min()) >= 0.0 and float(area.max()) <= 0.4 + 1e-6
    for mask in boxes[has_box][:20]:  # each a single axis-aligned rectangle
        rows, cols = mask.any(dim=1).nonzero().flatten(), mask.any(dim=0).nonzero().flatten()
        assert bool(mask[rows.min():rows.max() + 1, cols.min():cols.max() + 1].all())
    assert not unimatch_boxes(8, 16, 16, p=0.0).any() and unimatch_boxes(8, 16, 16, p=1.0).flatten(1).any(1).all()


def test_two_strong_views_draw_independent_boxes(smoke_config):
    fw, _ = _framework(smoke_config, "unimatch", cutmix_p=1.0)
    torch.manual_seed(11)
    box1, box2 = fw.draw_boxes(6, 24, 24, torch.device("cpu"))
    torch.manual_seed(11)  # the same draws made by hand: one host RNG from torch's, two consecutive box draws
    rng = host_rng()
    ref1, ref2 = unimatch_boxes(6, 24, 24, p=1.0, rng=rng), unimatch_boxes(6, 24, 24, p=1.0, rng=rng)
    assert torch.equal(box1, ref1) and torch.equal(box2, ref2)
    assert not torch.equal(box1, box2)  # not one box reused for both views
    fix, _ = _framework(smoke_config, "fixmatch")
    assert len(fix.draw_boxes(2, 8, 8, torch.device("cpu"))) == 1


def test_step_draws_two_boxes_and_pastes_them_independently(smoke_config, monkeypatch):
    import npsemiseg.frameworks.fixmatch as fixmatch_module

    fw, config = _framework(smoke_config, "unimatch", cutmix_p=1.0)
    seen: list[torch.Tensor] = []
    real = fixmatch_module.unimatch_boxes
    monkeypatch.setattr(fixmatch_module, "unimatch_boxes", lambda *a, **k: seen.append(real(*a, **k)) or seen[-1])
    strong_inputs: list[torch.Tensor] = []
    forward = type(fw.student).forward

    def spy(model, images, **kwargs):
        if kwargs.get("labels") is None and model.training:
            strong_inputs.append(images.detach().clone())
        return forward(model, images, **kwargs)

    monkeypatch.setattr(type(fw.student), "forward", spy)
    batch = _batch(config, batch=3)
    fw.train_step(batch, CTX)
    assert len(seen) == 2 and not torch.equal(seen[0], seen[1])
    (mixed,) = strong_inputs
    s1, s2 = mixed.chunk(2)
    for view, box, key in ((s1, seen[0], "image_strong"), (s2, seen[1], "image_strong2")):
        strong = batch.unlabeled[key]  # each view its own photometric draw, pasted from the source's same view
        outside = ~box[:, None].expand_as(view)
        assert torch.equal(view[outside], strong[outside])  # outside its own box: the view itself
        assert not torch.equal(view, strong)  # inside: pasted from another image


def test_step_draws_come_from_torch_generator_on_the_host():
    """One draw of torch's generator seeds the host RNG: the same seed gives the same boxes, another seed others, and
    the boxes cost no tensor draw or read per number (``unimatch_boxes`` of a given ``rng`` touches no torch RNG)."""
    first = unimatch_boxes(16, 32, 32, generator=torch.Generator().manual_seed(5))
    assert torch.equal(first, unimatch_boxes(16, 32, 32, generator=torch.Generator().manual_seed(5)))
    assert not torch.equal(first, unimatch_boxes(16, 32, 32, generator=torch.Generator().manual_seed(6)))
    gen = torch.Generator().manual_seed(5)
    state = gen.get_state()
    rng = host_rng(gen)
    after = gen.get_state()
    unimatch_boxes(16, 32, 32, rng=rng, generator=gen)
    assert torch.equal(gen.get_state(), after) and not torch.equal(state, after)


def test_mix_partners_are_never_the_image_itself():
    for b in (2, 3, 5):
        for seed in range(5):
            partner = mix_partners(b, torch.Generator().manual_seed(seed))
            assert sorted(partner.tolist()) == list(range(b)) and all(int(p) != i for i, p in enumerate(partner))
    assert mix_partners(1).tolist() == [0]


# ----------------------------------------------------------------------------------------- weak view
@pytest.mark.parametrize("framework", NEW_FRAMEWORKS)
def test_cutmix_source_predicted_in_eval_mode_without_gradient(smoke_config, monkeypatch, framework):
    fw, config = _framework(smoke_config, framework)
    calls: list[tuple[bool, bool, bool]] = []  # (training, grad enabled, labelled pass)
    forward = type(fw.student).forward

    def spy(model, images, **kwargs):
        calls.append((model.training, torch.is_grad_enabled(), kwargs.get("labels") is not None))
        return forward(model, images, **kwargs)

    monkeypatch.setattr(type(fw.student), "forward", spy)
    perturbed_calls: list[tuple[bool, bool]] = []
    real_perturbed = type(fw.student).forward_feature_perturbed

    def perturbed_spy(model, images, **kwargs):
        perturbed_calls.append((model.training, torch.is_grad_enabled()))
        return real_perturbed(model, images, **kwargs)

    monkeypatch.setattr(type(fw.student), "forward_feature_perturbed", perturbed_spy)
    fw.student.train()
    result = fw.train_step(_batch(config), CTX)
    # UniMatch's labeled + weak pass (clean and perturbed streams) runs in train mode with gradient
    assert perturbed_calls == ([(True, True)] if framework == "unimatch" else [])
    # first forward: the weak view, eval mode, no gradient; the network is back in train mode afterwards
    assert calls[0] == (False, False, False)
    assert all(training and grad for training, grad, _ in calls[1:])
    assert fw.student.training
    assert all(v.requires_grad for v in result.losses.values())


def test_weak_view_pseudo_labels_are_detached_and_feed_the_np_targets(smoke_config, monkeypatch):
    fw, config = _framework(smoke_config, "fixmatch", "np")
    captured = {}
    real = fw.student_pass

    def spy(images_l, labels_l, images_u, labels_u):
        captured["labels_u"] = labels_u.clone()
        return real(images_l, labels_l, images_u, labels_u)

    monkeypatch.setattr(fw, "student_pass", spy)
    batch = _batch(config)
    fw.seed_memories(batch.labeled["image"], batch.labeled["label"])
    from npsemiseg.frameworks.pseudo_labels import teacher_predict

    torch.manual_seed(5)
    expected = teacher_predict(fw.student, batch.unlabeled["image"])
    torch.manual_seed(5)
    fw.train_step(batch, CTX)
    want = expected.label.masked_fill(expected.confidence < 0.95, 255)
    assert torch.equal(captured["labels_u"], want)  # eval-mode, thresholded pseudo-labels as NP targets


# ----------------------------------------------------------------------------------------- feature perturbation
def test_feature_perturbation_decodes_clean_and_perturbed_as_one_batch(smoke_config, monkeypatch):
    """deeplabv3plus.py 44-50: one decoder call on ``cat(clean, Dropout2d(clean))`` of the whole batch (2B rows: the
    decoder's BatchNorm sees both), channel masks on the encoder maps only, the clean half equal to ``forward``'s
    where BatchNorm uses running statistics (eval mode), parameters untouched."""
    fw, config = _framework(smoke_config, "unimatch")
    model = fw.student
    model.eval()  # the dropout is active whatever the mode; eval-mode BN makes each row independent of the others
    images = _batch(config, batch=3).labeled["image"]
    decoded: list[tuple[torch.Tensor, torch.Tensor]] = []
    real_decoder = type(model.decoder).forward

    def spy(decoder, low, high):
        decoded.append((low.detach(), high.detach()))
        return real_decoder(decoder, low, high)

    monkeypatch.setattr(type(model.decoder), "forward", spy)
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    torch.manual_seed(0)
    with torch.no_grad():
        clean, perturbed = model.forward_feature_perturbed(images, dropout=0.5)
        encoded = model.encode(images)
        reference = model(images)
    (low, high), _ = decoded[0], decoded[1]  # one joint decoder call, then forward's
    assert low.shape[0] == high.shape[0] == 6 and len(decoded) == 2
    assert torch.allclose(clean.head.logits, reference.head.logits, atol=1e-6)  # the clean half is forward's
    assert perturbed.head.logits.shape[1] == 3 and perturbed.aux_logits is None
    assert torch.equal(low[:3], encoded.low_level) and torch.equal(high[:3], encoded.high_level)
    for dropped, whole in ((low[3:], encoded.low_level), (high[3:], encoded.high_level)):
        channel_zero = dropped.flatten(2).abs().amax(dim=2) == 0
        kept = ~channel_zero & (whole.flatten(2).abs().amax(dim=2) > 0)
        assert 0.2 < float(channel_zero.float().mean()) < 0.8  # whole channels dropped at rate ~0.5
        assert torch.allclose(dropped[kept], 2.0 * whole[kept])  # kept channels scaled by 1 / (1 - p)
    assert all(torch.equal(p, params[n]) for n, p in model.named_parameters())  # decoder and head untouched
    with torch.no_grad():
        _, none = model.forward_feature_perturbed(images, dropout=0.0)
    assert torch.allclose(none.head.logits, reference.head.logits, atol=1e-5)  # p = 0: the clean decoding
    with pytest.raises(ValueError, match="dropout"):
        model.forward_feature_perturbed(images, dropout=1.0)


def test_joint_decode_batchnorm_sees_clean_and_perturbed_rows(smoke_config):
    """In train mode the decoder's BN batch is the 2B rows: its running mean moves to the mean over clean and
    perturbed features, not over the clean ones alone."""
    fw, config = _framework(smoke_config, "unimatch")
    model = fw.student.train()
    images = _batch(config, batch=2).labeled["image"]
    bn = model.decoder.low_level[1]
    assert isinstance(bn, torch.nn.BatchNorm2d)
    with torch.no_grad():
        low = model.encode(images).low_level
        torch.manual_seed(1)
        mask = torch.nn.functional.dropout2d(torch.ones_like(low[:, :, :1, :1]), 0.5, training=True)
        before = bn.running_mean.clone()
        torch.manual_seed(1)
        model.forward_feature_perturbed(images, dropout=0.5)
        conv = model.decoder.low_level[0](torch.cat([low, low * mask]))
    expected = (1 - bn.momentum) * before + bn.momentum * conv.mean(dim=(0, 2, 3))
    assert torch.allclose(bn.running_mean, expected, atol=1e-6)


# ----------------------------------------------------------------------------------------- loss
def test_threshold_mask_and_normalisation_by_valid_pixels():
    loss = torch.tensor([[[1.0, 2.0], [3.0, 4.0]]])
    confidence = torch.tensor([[[0.99, 0.5], [0.96, 0.97]]])
    valid = torch.tensor([[[True, True], [True, False]]])
    # kept: (0,0) and (1,0); (0,1) below threshold, (1,1) ignored; divisor = 3 valid pixels
    assert float(thresholded_loss(loss, confidence, valid, 0.95)) == pytest.approx((1.0 + 3.0) / 3)
    assert float(thresholded_loss(loss, confidence, valid, 0.0)) == pytest.approx((1.0 + 2.0 + 3.0) / 3)
    assert float(thresholded_loss(loss, confidence, torch.zeros_like(valid), 0.0)) == 0.0


@pytest.mark.parametrize("framework", NEW_FRAMEWORKS)
def test_loss_weights_match_the_official_sum(smoke_config, monkeypatch, framework):
    import npsemiseg.frameworks.fixmatch as fixmatch_module

    fw, config = _framework(smoke_config, framework)
    raw: list[float] = []
    real = fixmatch_module.thresholded_loss

    def spy(*args):
        value = real(*args)
        raw.append(float(value.detach()))
        return value

    monkeypatch.setattr(fixmatch_module, "thresholded_loss", spy)
    if framework == "unimatch":
        import npsemiseg.frameworks.unimatch as unimatch_module

        monkeypatch.setattr(unimatch_module, "thresholded_loss", spy)
    sup_raw = {}
    real_sup = fw.supervised_terms

    def sup_spy(student, labels):
        terms = real_sup(student, labels)
        sup_raw.update({k: float(v.detach()) for k, v in terms.items()})
        return terms

    monkeypatch.setattr(fw, "supervised_terms", sup_spy)
    result = fw.train_step(_batch(config), CTX)
    total = float(result.total.detach())
    if framework == "fixmatch":
        assert set(result.losses) == {"sup", "unsup"}
        loss_s, = raw
        assert total == pytest.approx((sup_raw["sup"] + loss_s) / 2, rel=1e-5)
    else:
        assert set(result.losses) == {"sup", "unsup_s1", "unsup_s2", "unsup_fp"}
        s1, s2, fp = raw
        assert total == pytest.approx((sup_raw["sup"] + 0.25 * s1 + 0.25 * s2 + 0.5 * fp) / 2, rel=1e-5)
        assert float(result.losses["unsup_fp"].detach()) == pytest.approx(0.25 * fp, rel=1e-5)


def test_threshold_one_keeps_no_unlabeled_pixel(smoke_config):
    fw, config = _framework(smoke_config, "unimatch", confidence_threshold=1.0)
    result = fw.train_step(_batch(config), CTX)
    assert all(float(result.losses[k].detach()) == 0.0 for k in ("unsup_s1", "unsup_s2", "unsup_fp"))
    assert result.logs["mask_ratio"] == 0.0


# ----------------------------------------------------------------------------------------- every head
@pytest.mark.parametrize("head", HEADS)
@pytest.mark.parametrize("framework", NEW_FRAMEWORKS)
def test_train_steps_with_every_head(smoke_config, framework, head):
    fw, config = _framework(smoke_config, framework, head)
    optimizer = torch.optim.SGD([p for p in fw.student.parameters() if p.requires_grad], lr=0.05)
    for step in range(2):
        ctx = StepContext(step=step, total_steps=4, epoch=0, total_epochs=2, iters_per_epoch=2)
        result = fw.train_step(_batch(config, seed=step), ctx)
        aux = head_class(head).aux_loss_term
        assert (aux in result.losses) == bool(aux)
        assert all(v.dim() == 0 and torch.isfinite(v) for v in result.losses.values())
        assert all(math.isfinite(v) for v in result.logs.values())
        optimizer.zero_grad()
        result.total.backward()
        grads = [p.grad for p in fw.student.parameters() if p.grad is not None]
        assert grads and all(torch.isfinite(g).all() for g in grads)
        optimizer.step()
        fw.after_optimizer_step(ctx)
    if head_class(head).has_memories:
        assert int(fw.student.head.target_count.sum()) > 0


@pytest.mark.parametrize("protocol", ["released", "corrected"])
@pytest.mark.parametrize("head", HEADS)
@pytest.mark.parametrize("framework", NEW_FRAMEWORKS)
def test_smoke_cell_trains_and_evaluates(tmp_path, monkeypatch, framework, head, protocol):
    from npsemiseg.config import cell_config
    from npsemiseg.training import train

    monkeypatch.chdir(tmp_path)
    config = cell_config("smoke", framework=framework, head=head, protocol=protocol, dataset="synthetic",
                         partition="1/16")
    result = train(config)
    assert result.steps == config.schedule.max_steps and not result.interrupted
    assert math.isfinite(result.metrics["miou"]) and result.history  # evaluated
    assert set(result.framework.modules()) == {"student"}


# ----------------------------------------------------------------------------------------- released switches and data
def test_lr_timing_after_step_runs_iteration_k_at_lr_k_minus_1(smoke_config):
    """unimatch.py 205-208: the LR of iteration i is set after its optimizer.step(), so iteration k runs at lr(k - 1)
    and iteration 0 at the base LR (switch unimatch_lr_timing); train_step logs the LR it ran at."""
    from npsemiseg.training.factories import build_optimizer
    from npsemiseg.training.plan import poly_lr, step_lr
    from npsemiseg.training.step import train_step

    assert step_lr(1.0, 0, 10, 0.9, "after_step") == 1.0 == step_lr(1.0, 0, 10, 0.9)
    assert step_lr(1.0, 4, 10, 0.9, "after_step") == poly_lr(1.0, 3, 10, 0.9) != step_lr(1.0, 4, 10, 0.9)
    with pytest.raises(ValueError, match="lr_timing"):
        step_lr(1.0, 4, 10, 0.9, "later")
    lrs = {}
    for protocol in ("released", "corrected"):
        config = smoke_config(framework="fixmatch", protocol=protocol)
        assert config.schedule.lr_timing == ("after_step" if protocol == "released" else "before_step")
        torch.manual_seed(0)
        fw = build_framework(config)
        optimizer = build_optimizer(config, fw.student)
        ctx = StepContext(step=3, total_steps=8, epoch=1, total_epochs=4, iters_per_epoch=2)
        logs = train_step(fw, _batch(config, second_draw=True), ctx, optimizer, config, torch.device("cpu"), 1)
        lrs[protocol] = logs["train/lr"]
        assert optimizer.torch_optimizer.param_groups[0]["lr"] == logs["train/lr"]
    base = optimizer.base_lr
    assert lrs == {"released": poly_lr(base, 2, 8, 0.9), "corrected": poly_lr(base, 3, 8, 0.9)}


@pytest.mark.parametrize("framework", NEW_FRAMEWORKS)
def test_released_switches_and_what_the_data_pipeline_gives(framework):
    """Released: no classifier dropout, the CutMix source a second draw; corrected: the shared block's dropout, another
    image of the batch. The unlabeled items carry one strong view per strong term (each its own photometric draw),
    the padding mask and, for the second draw, every key again as ``*_mix``; other frameworks' items are unchanged."""
    from npsemiseg.config import cell_config, with_overrides
    from npsemiseg.data.transforms import train_transform
    from npsemiseg.training.factories import train_transforms

    cell = {"framework": framework, "dataset": "pascal_classic", "partition": "92", "head": "baseline"}
    released, corrected = (cell_config("paper", protocol=p, **cell) for p in ("released", "corrected"))
    assert released.head.options["dropout"] == 0.0 and corrected.head.options["dropout"] == 0.1
    assert (released.framework_options["cutmix_source"], corrected.framework_options["cutmix_source"]) == (
        "second_draw", "batch_shift")
    views = get_framework(framework).unlabeled_views(released.framework_options)
    assert views == {"strong_views": 2 if framework == "unimatch" else 1, "padding_mask": True, "draws": 2}
    assert get_framework(framework).unlabeled_views(corrected.framework_options)["draws"] == 1
    released = with_overrides(released, {"schedule.crop_size": 24, "data.augmentation.resize": "none"})
    transform = train_transforms(released)["unlabeled"]
    item = {"image": torch.rand(3, 16, 40), "label": torch.full((16, 40), 255), "id": "x"}
    torch.manual_seed(0)
    out = transform(item)
    strong = [k for k in out if k.startswith("image_strong") and not k.endswith("_mix")]
    assert len(strong) == views["strong_views"] and out["padding"].shape == (24, 24)
    assert out["padding"].any() and not out["padding"].all()  # the 16 rows padded to the 24 crop
    assert bool((out["image"][:, out["padding"]] == out["image"][:, out["padding"]][:, :1]).all())  # padded: the fill
    assert {f"{k}_mix" for k in ("image", "label", "padding", *strong)} <= set(out)
    assert not torch.equal(out["image"], out["image_mix"])  # another draw (crop, flip) of the same item
    assert not torch.equal(out["image_strong"], out["image_strong_mix"])
    if framework == "unimatch":
        assert not torch.equal(out["image_strong"], out["image_strong2"])  # independent photometric draws
    torch.manual_seed(0)
    plain = train_transform(24, **released.data.augmentation)(item)  # what every other framework gets
    assert set(plain) == {"image", "label", "id", "image_strong"}
    torch.manual_seed(0)
    assert torch.equal(plain["image_strong"], out["image_strong"]) and torch.equal(plain["image"], out["image"])


def test_second_draw_pastes_the_source_view_and_predicts_it_in_eval_mode(smoke_config, monkeypatch):
    """cutmix_source second_draw: the eval-mode pass predicts ``image_mix`` and each box pastes the ``_mix`` strong
    view of the same index (unimatch.py 131-145); the padding of the source counts inside the box."""
    fw, config = _framework(smoke_config, "unimatch", cutmix_p=1.0, cutmix_source="second_draw")
    batch = _batch(config, batch=2, second_draw=True)
    seen: list[torch.Tensor] = []
    forward = type(fw.student).forward

    def spy(model, images, **kwargs):
        seen.append(images.detach().clone())
        return forward(model, images, **kwargs)

    monkeypatch.setattr(type(fw.student), "forward", spy)
    torch.manual_seed(3)
    fw.train_step(batch, CTX)
    assert torch.equal(seen[0], batch.unlabeled["image_mix"])  # the eval-mode pass: the source's weak view
    s1, s2 = seen[-1].chunk(2)
    for view, key in ((s1, "image_strong"), (s2, "image_strong2")):
        pasted = view != batch.unlabeled[key]
        assert pasted.any() and torch.equal(view[pasted], batch.unlabeled[key + "_mix"][pasted])


def test_np_head_in_the_joint_decode_takes_clean_context_and_no_perturbed_targets(smoke_config, monkeypatch):
    """UniMatch + NP: one head call on the 2N rows of the joint decode; its context is the clean labeled rows, its
    targets the clean rows (ground truth + weak pseudo-labels), the perturbed half labelled 255 (no memory rows)."""
    fw, config = _framework(smoke_config, "unimatch", "np", confidence_threshold=0.0)  # every weak pixel a target
    calls: list[dict] = []
    real = type(fw.student.head).forward

    def spy(head, features, **kwargs):
        calls.append({"rows": features.shape[0], **{k: v for k, v in kwargs.items() if torch.is_tensor(v)}})
        return real(head, features, **kwargs)

    monkeypatch.setattr(type(fw.student.head), "forward", spy)
    batch = _batch(config, batch=2)
    fw.train_step(batch, CTX)
    joint = next(c for c in calls if c["rows"] == 8)  # 2 x (2 labeled + 2 weak)
    assert joint["context_features"].shape[0] == 2 and joint["labels"].shape[0] == 8
    assert torch.equal(joint["context_labels"], batch.labeled["label"])  # context: the clean labeled rows
    assert torch.equal(joint["labels"][:2], batch.labeled["label"])
    assert bool((joint["labels"][2:4] != 255).all())  # the clean weak rows: pseudo-labelled targets
    assert bool((joint["labels"][4:] == 255).all())  # the perturbed half: no targets
