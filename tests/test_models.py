"""Tests of npsemiseg.models: backbones, DeepLabv3+ variants, weights loading, the segmentor."""

from __future__ import annotations

import itertools
import os

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torchvision.models.resnet import Bottleneck

from npsemiseg.heads.base import ClassifierHead, HeadOutput
from npsemiseg.heads.classifier import BaselineHead, MCDropout2d, MCDropoutHead
from npsemiseg.models import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    DeepLabV3PlusDecoder,
    Segmentor,
    build_backbone,
    build_segmentor,
    convert_sync_batchnorm,
    feature_channels,
    upsample_logits,
)

K = 4
# tiny widths for unit tests: u2pl keeps its "low-level as wide as ASPP" shape, augseg/psmt their narrow low-level
WIDTHS = {
    "u2pl": dict(aspp_channels=16, low_level_channels=16),
    "augseg": dict(aspp_channels=16, low_level_channels=6),
    "psmt": dict(aspp_channels=16, low_level_channels=6),
}


pytestmark = pytest.mark.usefixtures("single_seeded_thread")


class ContextMeanHead(ClassifierHead):
    """Test head whose logits depend on its context: 1x1 conv of the features plus a 1x1 conv of
    the spatial/batch mean of the context features (and plus ``latent`` when given)."""

    def __init__(self, in_channels: int, num_classes: int) -> None:
        super().__init__(in_channels, num_classes)
        self.classifier = nn.Conv2d(in_channels, num_classes, 1)
        self.context = nn.Linear(in_channels, num_classes)
        self.calls: list[dict] = []

    def forward(self, features, *, labels=None, context_features=None, context_labels=None, num_samples=None, latent=None):
        self.check_features(features)
        self.calls.append(dict(labels=labels, context_features=context_features, context_labels=context_labels))
        logits = self.classifier(features)
        if context_features is not None:
            logits = logits + self.context(context_features.mean(dim=(0, 2, 3)))[None, :, None, None]
        if latent is not None:
            logits = logits + latent
        return HeadOutput(logits[None], self.zero_aux(features))


def small_segmentor(variant="u2pl", head="baseline", **options) -> Segmentor:
    widths = WIDTHS[variant]
    channels = feature_channels(variant, **widths)
    heads = {"baseline": BaselineHead, "mc_dropout": MCDropoutHead, "context": ContextMeanHead}
    return build_segmentor(
        num_classes=K, head=heads[head](channels, K), variant=variant, backbone="resnet_small", **widths, **options
    )


# ---------------------------------------------------------------- variants, shapes, strides


def test_feature_channels_of_the_three_variants():
    assert feature_channels("u2pl") == 512
    assert feature_channels("augseg") == 304
    assert feature_channels("psmt") == 304
    assert feature_channels("augseg", low_level_channels=256) == 512
    assert feature_channels("u2pl", aspp_channels=16, low_level_channels=8) == 24
    with pytest.raises(ValueError, match="decoder"):
        feature_channels("deeplabv2")


@pytest.mark.parametrize("variant,output_stride", [("u2pl", 8), ("augseg", 16), ("psmt", 16)])
def test_variant_output_shapes_and_strides(variant, output_stride):
    model = small_segmentor(variant).eval()
    images = torch.rand(2, 3, 64, 96)
    encoded = model.encode(images)
    assert encoded.low_level.shape == (2, model.backbone.channels["low_level"], 16, 24)
    assert encoded.layer3.shape[-2:] == (64 // output_stride, 96 // output_stride)  # layer 3: stride 8 / 16
    assert encoded.high_level.shape == (2, model.backbone.channels["high_level"], 64 // output_stride, 96 // output_stride)
    output = model(images)
    channels = feature_channels(variant, **WIDTHS[variant])
    assert output.features.shape == (2, channels, 16, 24)
    assert output.head.logits.shape == (1, 2, K, 16, 24)
    assert output.aux_logits is None and output.representation is None


def test_full_width_variants_feature_channels_without_backbone_cost():
    # the decoders at the frameworks' widths, fed random ResNet-50-shaped maps
    low, high = torch.rand(1, 256, 9, 9), torch.rand(1, 32, 3, 3)  # layer-4 width does not change the output
    for variant, channels in (("u2pl", 512), ("augseg", 304), ("psmt", 304)):
        decoder = DeepLabV3PlusDecoder(variant, 32, 256).eval()
        assert decoder.out_channels == channels
        assert decoder(low, high).shape == (1, channels, 9, 9)


def test_decoder_structure_per_variant():
    u2pl = DeepLabV3PlusDecoder("u2pl", 16, 256)
    assert [b[0].dilation for b in u2pl.aspp[0].branches[2:]] == [(12, 12), (24, 24), (36, 36)]
    assert u2pl.aspp[0].out_channels == 1280
    assert u2pl.aspp[1][0].kernel_size == (3, 3) and isinstance(u2pl.aspp[1][-1], nn.Dropout2d)
    augseg = DeepLabV3PlusDecoder("augseg", 16, 256)
    assert [b[0].dilation for b in augseg.aspp[0].branches[2:]] == [(6, 6), (12, 12), (18, 18)]
    assert augseg.aspp[1][0].kernel_size == (1, 1) and not any(isinstance(m, nn.Dropout2d) for m in augseg.modules())
    psmt = DeepLabV3PlusDecoder("psmt", 16, 256)
    assert [b.dilation for b in psmt.aspp.branches] == [(1, 1), (6, 6), (12, 12), (18, 18)]
    assert psmt.aspp.reduce.in_channels == 1024
    assert any(isinstance(m, nn.LeakyReLU) for m in psmt.modules())


def test_psmt_image_pool_branch_is_added_not_concatenated():
    decoder = DeepLabV3PlusDecoder("psmt", 8, 4, aspp_channels=6, low_level_channels=2).eval()
    aspp = decoder.aspp
    x = torch.rand(1, 8, 5, 5)
    branches = aspp.reduce(aspp.branches_act(torch.cat([b(x) for b in aspp.branches], dim=1)))
    pooled = aspp.pool_reduce(aspp.pool(x))
    assert torch.allclose(aspp(x), aspp.out_act(branches + pooled))
    assert aspp(x).shape == (1, 6, 5, 5)


# ---------------------------------------------------------------- backbone: dilation, multi-grid, stem


def _layer4_dilations(backbone) -> list[int]:
    return [block.conv2.dilation[0] for block in backbone.layer4]


def test_dilation_and_multi_grid():
    os8 = build_backbone("resnet_small", output_stride=8)
    assert _layer4_dilations(os8) == [4, 8, 16] and os8.dilations == (4, 8, 16)
    assert [block.conv2.stride[0] for block in os8.layer3] == [1] and os8.layer3[0].conv2.dilation[0] == 1
    os16 = build_backbone("resnet_small", output_stride=16)
    assert _layer4_dilations(os16) == [2, 4, 8]
    assert os16.layer3[0].conv2.stride == (2, 2)
    plain = build_backbone("resnet_small", output_stride=8, multi_grid=None)
    assert _layer4_dilations(plain) == [2, 4, 4]  # torchvision's rule: first block keeps the previous dilation
    resnet50 = build_backbone("resnet50", output_stride=8)
    assert _layer4_dilations(resnet50) == [4, 8, 16]
    assert [block.conv2.dilation[0] for block in resnet50.layer3] == [1, 2, 2, 2, 2, 2]
    assert all(block.conv2.padding == block.conv2.dilation for block in resnet50.layer4)
    with pytest.raises(ValueError, match="output_stride"):
        build_backbone("resnet_small", output_stride=32)
    with pytest.raises(ValueError, match="multi_grid"):
        build_backbone("resnet_small", multi_grid=(1, 2))


def test_zero_init_residual():
    zero = build_backbone("resnet_small")
    assert all(not m.bn3.weight.any() for m in zero.modules() if isinstance(m, Bottleneck))
    ones = build_backbone("resnet_small", zero_init_residual=False)
    assert all(bool((m.bn3.weight == 1).all()) for m in ones.modules() if isinstance(m, Bottleneck))


def test_deep_stem_layout():
    backbone = build_backbone("resnet_small", deep_stem=True)  # stem width 16 (ResNet-50: 64)
    convs = [m for m in backbone.conv1 if isinstance(m, nn.Conv2d)]
    assert [(c.in_channels, c.out_channels, c.kernel_size, c.stride) for c in convs] == [
        (3, 16, (3, 3), (2, 2)),
        (16, 16, (3, 3), (1, 1)),
        (16, 32, (3, 3), (1, 1)),
    ]
    assert backbone.bn1.num_features == 32 and backbone.maxpool.ceil_mode
    assert backbone.layer1[0].conv1.in_channels == 32
    assert {"conv1.0.weight", "conv1.1.running_mean", "conv1.3.weight", "conv1.4.weight", "conv1.6.weight"} <= set(
        backbone.state_dict()
    )
    plain = build_backbone("resnet_small")
    assert not plain.maxpool.ceil_mode
    images = torch.rand(2, 3, 32, 32)  # stem output 16x16: ceil_mode pools to 9x9, floor to 8x8
    assert backbone(images).low_level.shape[-2:] == (9, 9) and plain(images).low_level.shape[-2:] == (8, 8)


# ---------------------------------------------------------------- weights


def _assert_same_tensors(a: nn.Module, b: nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for key in sa:
        assert torch.equal(sa[key], sb[key]), key


def _randomise_bn(module: nn.Module) -> None:
    for m in module.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.weight.data.uniform_(0.5, 1.5)
            m.running_mean.uniform_(-1, 1)


@pytest.mark.parametrize("deep_stem", [False, True])
def test_weights_from_local_file(tmp_path, deep_stem):
    source = build_backbone("resnet_small", deep_stem=deep_stem)
    _randomise_bn(source)
    state = dict(source.state_dict())
    state["fc.weight"], state["fc.bias"] = torch.rand(10, 256), torch.rand(10)  # classifier of the file is dropped
    path = tmp_path / "resnet.pth"
    torch.save(state, path)
    loaded = build_backbone("resnet_small", deep_stem=deep_stem, weights=path)
    _assert_same_tensors(source, loaded)
    assert not torch.equal(
        loaded.state_dict()["conv1.0.weight" if deep_stem else "conv1.weight"],
        build_backbone("resnet_small", deep_stem=deep_stem).state_dict()["conv1.0.weight" if deep_stem else "conv1.weight"],
    )
    # a wrapped DataParallel checkpoint loads the same
    torch.save({"state_dict": {f"module.{k}": v for k, v in state.items()}}, tmp_path / "wrapped.pth")
    _assert_same_tensors(source, build_backbone("resnet_small", deep_stem=deep_stem, weights=str(tmp_path / "wrapped.pth")))


def test_weights_stem_layout_must_match(tmp_path):
    torch.save(build_backbone("resnet_small", deep_stem=True).state_dict(), tmp_path / "deep.pth")
    with pytest.raises(ValueError, match=r"deep-stem.*deep_stem=True"):
        build_backbone("resnet_small", weights=tmp_path / "deep.pth")
    torch.save(build_backbone("resnet_small").state_dict(), tmp_path / "plain.pth")
    with pytest.raises(ValueError, match=r"7x7-stem.*deep_stem=False"):
        build_backbone("resnet_small", deep_stem=True, weights=tmp_path / "plain.pth")


def test_weights_missing_file_is_an_error(tmp_path):
    path = tmp_path / "nowhere" / "resnet50.pth"
    with pytest.raises(FileNotFoundError, match="nowhere/resnet50.pth"):
        build_backbone("resnet_small", weights=path)
    with pytest.raises(FileNotFoundError, match="nowhere/resnet50.pth"):
        small_segmentor(weights=str(path))


def test_weights_mismatched_keys_are_listed(tmp_path):
    state = dict(build_backbone("resnet_small").state_dict())
    del state["layer2.0.conv1.weight"]
    state["layer5.0.conv1.weight"] = torch.rand(1)
    torch.save(state, tmp_path / "bad.pth")
    with pytest.raises(ValueError, match=r"missing \(1\): layer2.0.conv1.weight.*unexpected \(1\): layer5.0.conv1.weight"):
        build_backbone("resnet_small", weights=tmp_path / "bad.pth")
    # a ResNet-50 file into the small ResNet: wrong shapes, listed
    torch.save(build_backbone("resnet_small", output_stride=8).state_dict(), tmp_path / "ok.pth")
    build_backbone("resnet_small", output_stride=16, weights=tmp_path / "ok.pth")  # dilation does not change shapes
    state = dict(build_backbone("resnet_small").state_dict())
    state["layer1.0.conv1.weight"] = torch.rand(3, 3, 1, 1)
    torch.save(state, tmp_path / "shape.pth")
    with pytest.raises(ValueError, match=r"wrong shape \(1\): layer1.0.conv1.weight \(3, 3, 1, 1\)"):
        build_backbone("resnet_small", weights=tmp_path / "shape.pth")


def test_weights_unreadable_file(tmp_path):
    (tmp_path / "junk.pth").write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="junk.pth"):
        build_backbone("resnet_small", weights=tmp_path / "junk.pth")
    torch.save({"conv2.weight": torch.rand(1)}, tmp_path / "other.pth")
    with pytest.raises(ValueError, match="not a ResNet state dict"):
        build_backbone("resnet_small", weights=tmp_path / "other.pth")


def test_imagenet_weights_not_cached_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    with pytest.raises(FileNotFoundError) as error:
        build_backbone("resnet50", weights="imagenet", allow_download=False)
    message = str(error.value)
    assert str(tmp_path / "hub" / "checkpoints" / "resnet50-0676ba61.pth") in message
    assert "weights=<path" in message
    with pytest.raises(ValueError, match="resnet_small"):
        build_backbone("resnet_small", weights="imagenet")
    with pytest.raises(ValueError, match="deep_stem"):
        build_backbone("resnet50", deep_stem=True, weights="imagenet")


def test_imagenet_weights_download_failure_names_the_cache(tmp_path, monkeypatch):
    """Downloading allowed but the network unreachable (a proxy on a closed local port): a clear
    error naming the cache path, and no partial file left in the cache."""
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    for variable in ("https_proxy", "HTTPS_PROXY", "http_proxy", "HTTP_PROXY"):
        monkeypatch.setenv(variable, "http://127.0.0.1:9")
    for variable in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(variable, raising=False)
    cached = tmp_path / "hub" / "checkpoints" / "resnet50-0676ba61.pth"
    with pytest.raises(FileNotFoundError, match="download failed") as error:
        build_backbone("resnet50", weights="imagenet")
    assert str(cached) in str(error.value)
    assert not cached.exists()


@pytest.mark.integration
def test_torchvision_resnet50_file_and_cache(tmp_path, monkeypatch):
    """A real torchvision ResNet-50 state dict loads from a path and from torchvision's cache."""
    import torchvision

    reference = torchvision.models.resnet50()
    _randomise_bn(reference)
    state = reference.state_dict()
    torch.save(state, tmp_path / "resnet50.pth")
    loaded = build_backbone("resnet50", output_stride=8, weights=tmp_path / "resnet50.pth")
    for key, value in loaded.state_dict().items():
        assert torch.equal(value, state[key]), key
    # the same file placed in the cache serves weights="imagenet" without any download
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    cache = tmp_path / "torch" / "hub" / "checkpoints"
    cache.mkdir(parents=True)
    os.replace(tmp_path / "resnet50.pth", cache / "resnet50-0676ba61.pth")
    cached = build_backbone("resnet50", weights="imagenet", allow_download=False)
    assert torch.equal(cached.state_dict()["layer4.2.conv3.weight"], state["layer4.2.conv3.weight"])


@pytest.mark.integration
def test_full_resnet50_u2pl_on_65x65():
    model = build_segmentor(num_classes=21, head=BaselineHead(512, 21), variant="u2pl", backbone="resnet50").eval()
    with torch.inference_mode():
        output = model(torch.rand(1, 3, 65, 65))
    assert output.features.shape == (1, 512, 17, 17)
    assert output.head.logits.shape == (1, 1, 21, 17, 17)
    assert upsample_logits(output.head.logits, (65, 65)).shape == (1, 1, 21, 65, 65)


# ---------------------------------------------------------------- segmentor


def test_normalisation_buffers():
    model = small_segmentor().eval()
    assert torch.allclose(model.mean.flatten(), torch.tensor(IMAGENET_MEAN))
    assert torch.allclose(model.std.flatten(), torch.tensor(IMAGENET_STD))
    assert "mean" in dict(model.named_buffers()) and "mean" not in model.state_dict()
    images = torch.rand(2, 3, 32, 32)
    normalised = (images - torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)) / torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    assert torch.allclose(model.encode(images).high_level, model.backbone(normalised).high_level)
    assert model.double().mean.dtype == torch.float64  # buffers follow the module
    with pytest.raises(ValueError, match="images"):
        model(torch.rand(2, 1, 32, 32, dtype=torch.float64))
    with pytest.raises(ValueError, match="images"):
        model(torch.randint(0, 255, (2, 3, 32, 32), dtype=torch.uint8))


@pytest.mark.parametrize("variant", ["u2pl", "psmt"])
def test_extract_then_classify_equals_forward(variant):
    model = small_segmentor(variant).eval()
    images = torch.rand(2, 3, 32, 32)
    output = model(images)
    features = model.extract(images)
    assert torch.equal(features, output.features)
    assert torch.equal(model.classify(features).logits, output.head.logits)
    # T-VAT style: a perturbation of the feature map changes the prediction
    assert not torch.allclose(model.classify(features + 0.5 * torch.randn_like(features)).logits, output.head.logits)


def test_context_is_the_labelled_slice_of_the_same_batch():
    model = small_segmentor(head="context").eval()
    images, labels = torch.rand(3, 3, 32, 32), torch.randint(0, K, (3, 32, 32))
    output = model(images, labels=labels, num_context=2)
    call = model.head.calls[-1]
    assert torch.equal(call["context_features"], output.features[:2])
    assert torch.equal(call["context_labels"], labels[:2])
    assert call["labels"] is labels
    direct = model.head(output.features, labels=labels, context_features=output.features[:2], context_labels=labels[:2])
    assert torch.allclose(output.head.logits, direct.logits)
    other = model.head(output.features, labels=labels, context_features=output.features[1:], context_labels=labels[1:])
    assert not torch.allclose(output.head.logits, other.logits)
    # no context without num_context; the latent goes through to the head
    model(images, labels=labels)
    assert model.head.calls[-1]["context_features"] is None
    latent = torch.rand(1, K, 1, 1)
    assert torch.allclose(model(images, latent=latent).head.logits, model(images).head.logits + latent)
    with pytest.raises(ValueError, match="num_context"):
        model(images, num_context=1)
    with pytest.raises(ValueError, match="num_context"):
        model(images, labels=labels, num_context=4)


def test_mc_dropout_decoder_scope():
    model = small_segmentor(head="mc_dropout").eval()
    assert model.decoder_sampling and model.decoder.mc_dropout == model.head.dropout
    # dropout after every activation of the decoder
    activations = [m for m in model.decoder.modules() if isinstance(m, (nn.ReLU, nn.LeakyReLU))]
    mc_layers = [m for m in model.decoder.modules() if isinstance(m, MCDropout2d)]
    assert len(activations) == len(mc_layers) == 7  # pool, 1x1, 3 rates, projection, low-level
    images = torch.rand(2, 3, 32, 32)
    # the encoder is deterministic; the decoder samples
    assert torch.equal(model.encode(images).high_level, model.encode(images).high_level)
    assert not torch.equal(model.extract(images), model.extract(images))
    output = model(images, num_samples=4)
    logits = output.head.logits
    assert logits.shape == (4, 2, K, 8, 8)
    for a, b in itertools.combinations(range(4), 2):
        assert not torch.allclose(logits[a], logits[b])
    assert output.features.shape == (2, feature_channels("u2pl", **WIDTHS["u2pl"]), 8, 8)
    assert model(images).head.logits.shape[0] == model.head.training_samples  # default T in eval
    model.train()
    assert model(images).head.logits.shape[0] == 1  # the head's train_mode_passes


def test_mc_dropout_decoder_scope_samples_are_decoder_passes():
    """Each of the S samples is exactly one decoder + head pass on the shared encoding."""
    model = small_segmentor(head="mc_dropout").eval()
    images = torch.rand(1, 3, 32, 32)
    encoded = model.encode(images)
    torch.manual_seed(3)
    output = model(images, num_samples=1)
    torch.manual_seed(3)
    features = model.decoder(encoded.low_level, encoded.high_level)
    direct = model.head(features, num_samples=1).logits
    assert torch.allclose(output.features, features) and torch.allclose(output.head.logits, direct)


def test_mc_dropout_head_scope():
    model = small_segmentor(head="mc_dropout", mc_dropout_scope="head").eval()
    assert not model.decoder_sampling
    assert not any(isinstance(m, MCDropout2d) for m in model.decoder.modules())
    images = torch.rand(2, 3, 32, 32)
    assert torch.equal(model.extract(images), model.extract(images))
    logits = model(images, num_samples=3).head.logits
    assert logits.shape == (3, 2, K, 8, 8)
    assert not torch.allclose(logits[0], logits[1])
    # a baseline head ignores the scope: deterministic in eval
    baseline = small_segmentor()
    assert not baseline.decoder_sampling
    baseline.eval()
    assert torch.equal(baseline(images).head.logits, baseline(images).head.logits)


def test_aux_and_representation_heads():
    model = small_segmentor(aux_head=True, representation_head=True, representation_dim=8)
    images = torch.rand(2, 3, 32, 32)
    output = model(images)
    assert output.aux_logits.shape == (2, K, 4, 4)  # layer 3 at stride 8 (u2pl)
    assert output.representation.shape == (2, 8, 8, 8)
    # hidden widths follow the ASPP width (U2PL: 256; here the narrow 16)
    assert model.aux_head.classifier.in_channels == model.representation_head.embed.in_channels == 16
    model.eval()
    output = model(images)
    assert output.aux_logits is None and output.representation.shape == (2, 8, 8, 8)


def test_parameter_groups_cover_every_parameter_once():
    model = small_segmentor(aux_head=True, representation_head=True)
    groups = model.parameter_groups()
    assert [g["name"] for g in groups] == ["backbone", "decoder"]
    ids = [id(p) for g in groups for p in g["params"]]
    assert len(ids) == len(set(ids)) == len(list(model.parameters()))
    assert {id(p) for p in groups[0]["params"]} == {id(p) for p in model.backbone.parameters()}
    rest = {id(p) for p in groups[1]["params"]}
    for part in (model.decoder, model.head, model.aux_head, model.representation_head):
        assert {id(p) for p in part.parameters()} <= rest
    optimiser = torch.optim.SGD([{"params": groups[0]["params"], "lr": 0.01}, {"params": groups[1]["params"], "lr": 0.1}])
    assert len(optimiser.param_groups) == 2


def test_training_step_reaches_every_part():
    model = small_segmentor(aux_head=True)
    images, labels = torch.rand(2, 3, 32, 32), torch.randint(0, K, (2, 32, 32))
    output = model(images, labels=labels)
    loss = F.cross_entropy(upsample_logits(output.head.logits, (32, 32))[0], labels)
    loss = loss + 0.4 * F.cross_entropy(F.interpolate(output.aux_logits, (32, 32), mode="bilinear"), labels)
    loss.backward()
    for part in (
        model.backbone.conv1,
        model.backbone.layer4,
        model.decoder.aspp,
        model.decoder.low_level,
        model.head,
        model.aux_head,
    ):
        assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in part.parameters()), part


def test_upsample_logits():
    logits = torch.rand(3, 2, K, 5, 7)
    up = upsample_logits(logits, (20, 28))
    assert up.shape == (3, 2, K, 20, 28)
    assert torch.allclose(up[1], F.interpolate(logits[1], (20, 28), mode="bilinear", align_corners=False))
    corners = upsample_logits(logits, (20, 28), align_corners=True)
    assert torch.allclose(corners[:, :, :, 0, 0], logits[:, :, :, 0, 0])
    assert upsample_logits(logits, (5, 7)) is logits
    with pytest.raises(ValueError, match="logits"):
        upsample_logits(logits[0], (20, 28))


def test_convert_sync_batchnorm():
    model = small_segmentor(aux_head=True)
    count = sum(isinstance(m, nn.BatchNorm2d) for m in model.modules())
    converted = convert_sync_batchnorm(model)
    assert sum(isinstance(m, nn.SyncBatchNorm) for m in converted.modules()) == count
    assert not any(type(m) is nn.BatchNorm2d for m in converted.modules())


def test_build_segmentor_rejects_bad_arguments():
    with pytest.raises(ValueError, match="in_channels 512 does not match .* 32"):
        build_segmentor(num_classes=K, head=BaselineHead(512, K), backbone="resnet_small", **WIDTHS["u2pl"])
    with pytest.raises(ValueError, match="decoder"):
        build_segmentor(num_classes=K, head=BaselineHead(304, K), variant="pspnet", backbone="resnet_small")
    with pytest.raises(ValueError, match="backbone"):
        build_segmentor(num_classes=K, head=BaselineHead(512, K), backbone="vgg16")
    with pytest.raises(ValueError, match="mc_dropout_scope"):
        small_segmentor(head="mc_dropout", mc_dropout_scope="encoder")
    with pytest.raises(ValueError, match="num_classes"):
        build_segmentor(num_classes=K + 1, head=BaselineHead(32, K), backbone="resnet_small", **WIDTHS["u2pl"])


def test_smoke_step_runs_on_small_images():
    """The smoke configuration: resnet_small, small widths, batch 4 of 64x64, one SGD step."""
    model = small_segmentor("augseg")
    optimiser = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    images, labels = torch.rand(4, 3, 64, 64), torch.randint(0, K, (4, 64, 64))
    before = model.backbone.conv1.weight.detach().clone()
    loss = F.cross_entropy(upsample_logits(model(images).head.logits, (64, 64))[0], labels)
    optimiser.zero_grad()
    loss.backward()
    optimiser.step()
    assert torch.isfinite(loss) and not torch.equal(before, model.backbone.conv1.weight)


# ---------------------------------------------------------------- with the real heads, built by name


def test_heads_built_by_name():
    model = build_segmentor(
        num_classes=K,
        head="mc_dropout",
        head_options={"dropout": 0.2, "training_samples": 3},
        variant="psmt",
        backbone="resnet_small",
        **WIDTHS["psmt"],
    ).eval()
    assert model.head.in_channels == feature_channels("psmt", **WIDTHS["psmt"])
    assert model.decoder.mc_dropout == 0.2 and model.decoder_sampling
    assert model(torch.rand(1, 3, 32, 32)).head.logits.shape == (3, 1, K, 8, 8)
    with pytest.raises(ValueError, match="head_options"):
        build_segmentor(
            num_classes=K, head=BaselineHead(32, K), head_options={"dropout": 0.2}, backbone="resnet_small", **WIDTHS["u2pl"]
        )


def test_np_head_gets_the_labelled_slice_as_context():
    model = build_segmentor(
        num_classes=K,
        head="np",
        head_options={"memory_size": 64, "enqueue_per_class": 16, "hidden_channels": 16},
        backbone="resnet_small",
        **WIDTHS["u2pl"],
    )
    images = torch.rand(3, 3, 32, 32)
    labels = torch.full((3, 32, 32), 2, dtype=torch.long)
    labels[:2] = 1  # the two labelled (context) images hold class 1 only, the unlabelled one class 2
    output = model(images, labels=labels, num_context=2)
    assert output.head.logits.shape == (model.head.training_samples, 3, K, 8, 8)
    assert output.head.aux_loss.dim() == 0
    assert model.head.context_count.tolist() == [0, 16, 0, 0]
    assert model.head.target_count.tolist() == [0, 16, 16, 0]
    # inference with a latent inferred once (sliding_global): passed through to the head
    model.eval()
    with torch.no_grad():
        latent = model.head.infer_latent(model.extract(images), num_samples=2)
        logits = model(images, latent=latent).head.logits
    assert logits.shape == (2, 3, K, 8, 8)


@pytest.mark.parametrize("samples_per_pass", [None, 1, 2])
def test_decoder_passes_batched_or_looped_compute_the_same_function(samples_per_pass):
    """Sample-major batching keeps sample s of image b at logits[s, b]: with a negligible dropout
    rate every sample equals the deterministic decoder + classifier output of its own image."""
    channels = feature_channels("u2pl", **WIDTHS["u2pl"])
    model = build_segmentor(
        num_classes=K,
        head=MCDropoutHead(channels, K, dropout=1e-9),
        backbone="resnet_small",
        samples_per_pass=samples_per_pass,
        **WIDTHS["u2pl"],
    ).eval()
    images = torch.rand(2, 3, 32, 32)
    output = model(images, num_samples=3)
    assert output.head.logits.shape == (3, 2, K, 8, 8)
    encoded = model.encode(images)
    expected = model.head.classifier(model.decoder(encoded.low_level, encoded.high_level))
    for s in range(3):
        assert torch.allclose(output.head.logits[s], expected, atol=1e-5)
    assert torch.allclose(output.features, model.decoder(encoded.low_level, encoded.high_level), atol=1e-6)
    with pytest.raises(ValueError, match="samples_per_pass"):
        build_segmentor(
            num_classes=K, head=BaselineHead(channels, K), backbone="resnet_small", samples_per_pass=0, **WIDTHS["u2pl"]
        )


def test_decoder_passes_in_chunks_are_distinct_samples():
    model = small_segmentor(head="mc_dropout", samples_per_pass=2).eval()
    logits = model(torch.rand(1, 3, 32, 32), num_samples=5).head.logits
    assert logits.shape == (5, 1, K, 8, 8)
    for a, b in itertools.combinations(range(5), 2):
        assert not torch.allclose(logits[a], logits[b])


@pytest.mark.parametrize("size, dilation, centre_only", [(8, 12, True), (8, 8, True), (8, 4, False), (65, 12, False)])
def test_atrous_conv_skips_padding_taps_with_the_same_output_and_gradients(size, dilation, centre_only):
    from npsemiseg.models.atrous import AtrousConv2d

    torch.manual_seed(0)
    full = torch.nn.Conv2d(8, 4, 3, padding=dilation, dilation=dilation, bias=True)
    atrous = AtrousConv2d.from_conv(full)
    x = torch.randn(2, 8, size, size, requires_grad=True)
    assert atrous._centre_only(x) is centre_only
    outputs = [conv(x) for conv in (full, atrous)]
    grads = [torch.autograd.grad(y.square().sum(), (x, full.weight, full.bias)) for y in outputs]
    torch.testing.assert_close(outputs[1], outputs[0])
    for got, expected in zip(grads[1], grads[0]):
        torch.testing.assert_close(got, expected)


def test_decoders_and_backbone_use_atrous_convs_without_changing_the_state_dict():
    from npsemiseg.models.atrous import AtrousConv2d

    for variant in ("u2pl", "psmt"):
        torch.manual_seed(0)
        model = build_segmentor(num_classes=3, head="baseline", variant=variant, backbone="resnet_small",
                                aspp_channels=8, low_level_channels=8)
        dilated = [m for m in model.modules() if isinstance(m, torch.nn.Conv2d) and m.dilation != (1, 1)]
        assert dilated and all(isinstance(m, AtrousConv2d) for m in dilated)
        again = build_segmentor(num_classes=3, head="baseline", variant=variant, backbone="resnet_small",
                                aspp_channels=8, low_level_channels=8)
        again.load_state_dict(model.state_dict(), strict=True)
        backbone_keys = {k for k in model.backbone.state_dict() if ".conv2." in k and "layer4" in k}
        assert backbone_keys and all(k.endswith("conv2.weight") for k in backbone_keys)
