"""The NP head on a coarser level of its decoder's map (``feature_pool``): shapes, sampling, the equivalence with
pooled features, and the protocol's choice (``corrected``: the DPT's 1/7 map; ``released``: the last map as it is)."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from npsemiseg.config import cell_config
from npsemiseg.heads import NPHead, build_head
from npsemiseg.models import DPTDecoder, build_segmentor
from npsemiseg.testing import check_plugin
from npsemiseg.training import build_framework

pytestmark = pytest.mark.usefixtures("single_seeded_thread")

C, K = 12, 4
SMALL = {"memory_size": 32, "latent_dim": 4, "hidden_channels": 8, "enqueue_per_class": 16}


def _head(pool: int, **options) -> NPHead:
    torch.manual_seed(0)
    return build_head("np", C, K, feature_pool=pool, **SMALL, **options)


def _inputs(side: int = 24):
    gen = torch.Generator().manual_seed(3)
    features = torch.randn(3, C, side, side, generator=gen).relu_()
    labels = torch.randint(0, K, (3, 2 * side, 2 * side), generator=gen)
    labels[:, :3] = 255
    return features, labels


def test_the_pooled_head_decodes_on_the_pooled_grid_and_its_samples_differ():
    head = _head(4)
    features, labels = _inputs(26)  # 26 / 4: a partial cell at the edge (ceil)
    out = head.train()(features, labels=labels, context_features=features[:1], context_labels=labels[:1],
                       num_samples=3)
    assert out.logits.shape == (3, 3, K, 7, 7)
    assert torch.isfinite(out.aux_loss) and out.aux_loss > 0
    out.logits.square().mean().backward()  # gradients reach the decoder
    assert head.decoder.conv1.weight.grad is not None and head.decoder.conv1.weight.grad.abs().sum() > 0
    head.eval()
    torch.manual_seed(5)
    logits = head(features, num_samples=20).logits
    assert logits.shape == (20, 3, K, 7, 7)
    assert not torch.allclose(logits[0], logits[1])  # the T latent samples give different predictions
    probs = logits.softmax(dim=2)
    mean, variance = probs.mean(0), probs.var(0)
    assert torch.allclose(mean.sum(dim=1), torch.ones(3, 7, 7), atol=1e-5)
    assert (variance >= 0).all() and variance.max() > 0 and (variance <= mean * (1 - mean) + 1e-6).all()


def test_pooling_in_the_head_equals_the_head_on_pooled_features():
    features, labels = _inputs()
    pooled, plain = _head(3), _head(1)
    plain.load_state_dict(pooled.state_dict())
    small = F.avg_pool2d(features, 3)
    torch.manual_seed(7)
    a = pooled.train()(features, labels=labels, context_features=features[:2], context_labels=labels[:2],
                       num_samples=2)
    torch.manual_seed(7)
    b = plain.train()(small, labels=labels, context_features=small[:2], context_labels=labels[:2], num_samples=2)
    torch.testing.assert_close(a.logits, b.logits)
    torch.testing.assert_close(pooled.context_centers, plain.context_centers)
    torch.testing.assert_close(pooled.target_centers, plain.target_centers)
    torch.testing.assert_close(pooled.infer_latent(features).r, plain.infer_latent(small).r)


def test_a_context_given_apart_is_pooled_like_the_leading_slice():
    features, labels = _inputs()
    apart, sliced = _head(2), _head(2)
    torch.manual_seed(9)
    a = apart.train()(features, labels=labels, context_features=features[:2].clone(), context_labels=labels[:2],
                      num_samples=2)
    torch.manual_seed(9)
    b = sliced.train()(features, labels=labels, context_features=features[:2], context_labels=labels[:2],
                       num_samples=2)
    torch.testing.assert_close(apart.context_centers, sliced.context_centers)
    torch.testing.assert_close(a.logits, b.logits)


@pytest.mark.parametrize("value", [0, -2, 1.5, "fine", True])
def test_a_bad_feature_pool_is_named(value):
    with pytest.raises(ValueError, match="feature_pool"):
        NPHead.check_options({"feature_pool": value})


def test_coarse_is_resolved_by_the_segmentor_from_its_decoder_not_by_a_head_alone():
    NPHead.check_options({"feature_pool": "coarse"})  # a configuration may ask for it
    with pytest.raises(ValueError, match="feature_pool: 'coarse' is resolved from the decoder"):
        build_head("np", C, K, feature_pool="coarse")
    options = {**NPHead.smoke_options, "feature_pool": "coarse"}
    vit = build_segmentor(num_classes=K, head="np", head_options=options, backbone="vit_tiny")
    resnet = build_segmentor(num_classes=K, head="np", head_options=options, backbone="resnet_small",
                             aspp_channels=16, low_level_channels=8)
    assert vit.head.feature_pool == DPTDecoder.coarse_pool == 4 and resnet.head.feature_pool == 1
    images, labels = torch.rand(2, 3, 56, 56), torch.randint(0, K, (2, 56, 56))
    out = vit.train()(images, labels=labels, num_context=1)  # the DPT's 32 x 32 map, the head's 8 x 8 grid
    assert out.features.shape[-2:] == (32, 32) and out.head.logits.shape[-2:] == (8, 8)


@pytest.mark.parametrize("framework", ["unimatch_v2", "fixmatch"])
def test_protocol_pools_the_dpt_map_under_corrected_only(framework):
    pools = {}
    for protocol in ("released", "corrected"):
        for backbone in ("vit_tiny", "resnet_small"):
            config = cell_config("smoke", framework=framework, head="np", protocol=protocol,
                                 **{"model.backbone": backbone, "schedule.crop_size": 28})
            pools[protocol, backbone] = build_framework(config).student.head.feature_pool
    assert pools == {("released", "vit_tiny"): 1, ("released", "resnet_small"): 1,
                     ("corrected", "vit_tiny"): DPTDecoder.coarse_pool, ("corrected", "resnet_small"): 1}


def test_the_np_head_keeps_the_plug_in_contract():
    assert check_plugin(NPHead) == "np"
