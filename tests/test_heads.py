"""The built-in heads: shapes, sampling behaviour, predictive, KL, build_head and the NP head's bad input (the
contract every registered head keeps, bad input named included: ``tests/test_plugin_contract.py``)."""

from __future__ import annotations

import math

import pytest
import torch
from head_fixtures import C, K, batch, small_np, train_step
from torch.distributions import Normal, kl_divergence

from npsemiseg.heads import (
    BaselineHead,
    HeadOutput,
    MCDropoutHead,
    NPHead,
    build_head,
    downsample_labels,
    gaussian_kl,
    head_class,
    head_names,
    predictive,
)

pytestmark = pytest.mark.usefixtures("single_seeded_thread")


def trained_np(**options) -> tuple[NPHead, torch.Tensor, torch.Tensor]:
    head, (features, labels) = small_np(**options), batch()
    train_step(head, features, labels)
    return head, features, labels


def test_baseline_one_prediction_in_train_and_eval():
    head = BaselineHead(C, K)
    features, labels = batch()
    out = head(features, labels=labels)
    assert isinstance(out, HeadOutput)
    assert out.logits.shape == (1, 2, K, 5, 6) and out.num_samples == 1
    assert out.aux_loss.dim() == 0 and out.aux_loss.item() == 0.0
    head.eval()
    first, second = head(features).logits, head(features).logits
    assert first.shape == (1, 2, K, 5, 6)
    assert torch.equal(first, second)  # deterministic in eval: dropout off


def test_mc_dropout_is_stochastic_in_eval_with_t_samples():
    head = MCDropoutHead(C, K, dropout=0.5, training_samples=4).eval()
    features, _ = batch()
    logits = head(features).logits
    assert logits.shape == (4, 2, K, 5, 6)
    assert not torch.allclose(logits[0], logits[1])  # the passes differ from each other
    assert not torch.allclose(logits, head(features).logits)  # and from call to call
    assert head(features, num_samples=2).logits.shape[0] == 2
    assert head.stochastic and not BaselineHead.stochastic


def test_mc_dropout_trains_with_one_pass_by_default_and_shares_the_block():
    head = MCDropoutHead(C, K, training_samples=5).train()
    features, labels = batch()
    assert head(features, labels=labels).logits.shape[0] == 1
    assert MCDropoutHead(C, K, train_mode_passes=2).train()(features).logits.shape[0] == 2
    baseline = BaselineHead(C, K)
    # same block definition: identical parameter layout, so weights transfer both ways
    head.load_state_dict(baseline.state_dict())
    head.eval()
    baseline.eval()
    with torch.no_grad():
        head.classifier[3].p = head.classifier[7].p = 0.0
        assert torch.allclose(head(features, num_samples=1).logits, baseline(features).logits)


def test_np_head_contract_shapes_and_aux():
    head, features, labels = trained_np()
    out = head(features, labels=labels, context_features=features[:1], context_labels=labels[:1])
    assert out.logits.shape == (3, 2, K, 5, 6)
    assert out.aux_loss.dim() == 0 and out.aux_loss.item() > 0.0
    assert all(isinstance(v, torch.Tensor) and v.dim() == 0 and not v.requires_grad for v in out.stats.values())
    assert "kl" in out.stats
    assert out.aux_loss.item() == pytest.approx(head.lambda_kl * out.stats["kl"].item(), rel=1e-5)
    head.eval()
    inference = head(features, num_samples=2)
    assert inference.logits.shape == (2, 2, K, 5, 6) and inference.aux_loss.item() == 0.0


def test_predictive_is_mean_softmax_and_its_entropy():
    logits = torch.randn(3, 2, K, 4, 5)
    probs, entropy = predictive(logits)
    expected = torch.softmax(logits, dim=2).mean(0)
    assert torch.allclose(probs, expected) and torch.allclose(probs.sum(1), torch.ones(2, 4, 5))
    assert torch.allclose(entropy, -(expected * expected.log()).sum(1), atol=1e-6)
    uniform_probs, uniform_entropy = predictive(torch.zeros(1, 1, K, 2, 2))
    assert torch.allclose(uniform_entropy, torch.full((1, 2, 2), math.log(K)))


def test_gaussian_kl_matches_torch_distributions():
    mean_t, mean_c = torch.randn(3, 5), torch.randn(3, 5)
    sigma_t, sigma_c = torch.rand(3, 5) + 0.1, torch.rand(3, 5) + 0.1
    expected = kl_divergence(Normal(mean_t, sigma_t), Normal(mean_c, sigma_c)).sum(-1)
    assert torch.allclose(gaussian_kl(mean_t, sigma_t, mean_c, sigma_c), expected, atol=1e-5)
    assert torch.allclose(gaussian_kl(mean_t, sigma_t, mean_t, sigma_t), torch.zeros(3), atol=1e-6)


def test_kl_authors_uses_sigma_as_variance():
    head = small_np(kl="authors")
    mean_t, mean_c = torch.randn(3, 4), torch.randn(3, 4)
    st, sc = torch.rand(3, 4) + 0.1, torch.rand(3, 4) + 0.1
    authors = (0.5 * torch.log(sc / st).sum(-1) - 0.5 * 4 + 0.5 * (st / sc).sum(-1)
               + 0.5 * ((mean_c - mean_t).pow(2) / sc).sum(-1))
    assert torch.allclose(head.kl_divergence(mean_t, st, mean_c, sc), authors, atol=1e-5)
    paper = small_np().kl_divergence(mean_t, st, mean_c, sc)
    assert not torch.allclose(paper, authors)


def test_downsample_labels_is_nearest():
    labels = torch.randint(0, K, (2, 8, 12))
    assert torch.equal(downsample_labels(labels, (4, 6)), labels[:, ::2, ::2])
    assert downsample_labels(labels, (8, 12)) is labels


def test_build_head_names_and_options():
    assert isinstance(build_head("baseline", C, K), BaselineHead)
    assert build_head("mc_dropout", C, K, training_samples=7).training_samples == 7
    head = build_head("np", C, K, memory_size=32, enqueue_per_class=8, attention="mean")
    assert isinstance(head, NPHead) and head.memory_size == 32 and head.attention == "mean"
    with pytest.raises(ValueError, match="'resnet'"):
        build_head("resnet", C, K)
    with pytest.raises(ValueError, match="latent_dim"):
        build_head("baseline", C, K, latent_dim=4)


@pytest.mark.parametrize("name", [n for n in head_names() if "hidden_channels" in head_class(n).option_defaults()])
def test_hidden_channels_sizes_every_heads_classifier_and_is_checked_before_building(name):
    """One option sizes the 3x3 blocks of all three heads (the mini-study narrows them with its decoder)."""
    options = {"memory_size": 16, "enqueue_per_class": 4, "latent_dim": 4} if name == "np" else {}
    head = build_head(name, C, K, hidden_channels=12, **options)
    widths = {m.out_channels for m in head.modules() if isinstance(m, torch.nn.Conv2d) and m.kernel_size == (3, 3)}
    assert widths == {12}
    features, labels = batch()
    train_step(head, features, labels)
    assert head.eval()(features).logits.shape[2] == K
    for bad in (0, True, 2.5):
        with pytest.raises(ValueError, match="hidden_channels"):
            head_class(name).check_options({"hidden_channels": bad})


def test_np_bad_input():
    head = small_np()
    features, labels = batch()
    with pytest.raises(ValueError, match="empty"):
        head.eval()(features)  # inference before any memory was filled
    head.train()
    for bad in (K, -1, 254):
        wrong = labels.clone()
        wrong[0, 3, 3] = bad
        with pytest.raises(ValueError, match=r"labels: values must lie in \[0, 4\)"):
            head(features, labels=wrong, context_features=features[:1], context_labels=labels[:1])
    with pytest.raises(ValueError, match="context_labels"):
        head(features, labels=labels, context_features=features[:1], context_labels=labels[:1, :, :] + K)
    with pytest.raises(ValueError, match="context_features and context_labels"):
        head(features, labels=labels, context_features=features[:1])
    with pytest.raises(ValueError, match="context memory is empty"):
        head(features, labels=labels)  # no context given and none stored
    for option, value in [("attention", "dot"), ("kl", "other"), ("decoder_impl", "fast"), ("decoder_norm", "layer"),
                          ("memory_size", 0), ("enqueue_per_class", 17), ("lambda_kl", -1.0)]:
        with pytest.raises(ValueError, match=option):
            small_np(**{option: value})
