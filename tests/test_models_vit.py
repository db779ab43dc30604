"""Tests of the DINOv2 ViT encoders and the DPT decoder behind the segmentor contract (npsemiseg.models.vit, .dpt).

The forward itself is compared with UniMatch V2's in tests/test_dinov2_dpt_golden.py; here: the registry, the
input and weights errors, the official-layout file, and every head on the DPT's features.
"""

from __future__ import annotations

import pytest
import torch

from npsemiseg.heads.classifier import MCDropout2d
from npsemiseg.models import BACKBONES, ViTSpec, build_backbone, build_segmentor, build_vit_backbone, is_vit_backbone
from npsemiseg.models.vit import load_vit_state_dict

pytestmark = pytest.mark.usefixtures("single_seeded_thread")

K = 4


def test_the_dinov2_sizes_read_the_official_layers_and_widths():
    """UniMatch V2 dpt.py 123-128 (layers) and unimatch_v2.py 54-59 (features, projections)."""
    expected = {"dinov2_s": (384, 12, (2, 5, 8, 11), 64, (48, 96, 192, 384)),
                "dinov2_b": (768, 12, (2, 5, 8, 11), 128, (96, 192, 384, 768)),
                "dinov2_l": (1024, 24, (4, 11, 17, 23), 256, (256, 512, 1024, 1024)),
                "dinov2_g": (1536, 40, (9, 19, 29, 39), 384, (1536,) * 4)}
    for name, (dim, depth, layers, features, channels) in expected.items():
        spec = BACKBONES.get(name)
        assert isinstance(spec, ViTSpec) and is_vit_backbone(name)
        assert (spec.embed_dim, spec.depth, spec.layers, spec.dpt_features, spec.dpt_channels, spec.patch_size) == (
            dim, depth, layers, features, channels, 14)
    assert not is_vit_backbone("resnet_small")
    with pytest.raises(ValueError, match="'dinov2_s' is not a ResNet"):
        build_backbone("dinov2_s")


def test_dinov2_s_is_timms_architecture_with_the_official_parameter_count():
    """ViT-S/14: the official ``DINOv2('small')`` has 22,056,576 parameters, 384 of them its mask token (unused by
    the forward; timm has none): counted with the official module on 2026-11-27, same key set but ``mask_token``."""
    backbone = build_vit_backbone("dinov2_s")
    count = sum(p.numel() for p in backbone.parameters())
    assert count == 22_056_576 - 384
    assert backbone.vit.pos_embed.shape == (1, 37 * 37 + 1, 384)


@pytest.mark.parametrize("size, hint", [((42, 43), "42x42"), ((41, 42), "28x42")])
def test_sides_that_are_not_multiples_of_the_patch_are_one_clear_error(size, hint):
    backbone = build_vit_backbone("vit_tiny")
    expected = rf"multiples of its patch size 14, got {size[0]}x{size[1]} \(crop or resize to e.g. {hint}\)"
    with pytest.raises(ValueError, match=expected):
        backbone(torch.rand(1, 3, *size))


def test_the_four_maps_fill_the_backbone_features_contract():
    backbone = build_vit_backbone("vit_tiny").eval()
    images = torch.randn(2, 3, 56, 42)
    layers = backbone.intermediate_layers(images)
    encoded = backbone(images)
    assert [tuple(x.shape) for x in layers] == [(2, 32, 4, 3)] * 4
    assert torch.equal(encoded.low_level, torch.cat(layers[:3], dim=1))
    assert torch.equal(encoded.layer3, layers[2]) and torch.equal(encoded.high_level, layers[3])
    assert backbone.channels == {"low_level": 96, "layer3": 32, "high_level": 32}


def test_an_official_layout_file_loads_and_a_wrong_one_names_its_keys(tmp_path):
    source = build_vit_backbone("vit_tiny")
    official = dict(source.vit.state_dict())
    official["mask_token"] = torch.zeros(1, 32)  # the official checkpoints carry it; timm has none
    path = tmp_path / "dinov2_tiny.pth"
    torch.save(official, path)
    loaded = build_vit_backbone("vit_tiny", weights=path)
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), source.state_dict().values()))
    broken = {k: v for k, v in official.items() if not k.startswith("blocks.3.")}
    with pytest.raises(ValueError, match=r"does not fit the vit_tiny backbone; missing \(\d+\): blocks\.3\."):
        load_vit_state_dict(loaded, broken, source="broken")
    with pytest.raises(ValueError, match="not a DINOv2 ViT state dict"):
        load_vit_state_dict(loaded, {"conv1.weight": torch.zeros(1)}, source="a resnet")


def test_weights_names_that_do_not_apply_are_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        build_vit_backbone("vit_tiny", weights=tmp_path / "missing.pth")
    with pytest.raises(ValueError, match="torchvision's ImageNet weights are ResNet weights"):
        build_vit_backbone("vit_tiny", weights="imagenet")
    with pytest.raises(ValueError, match="has no pretrained weights on the hub"):
        build_vit_backbone("vit_tiny", weights="timm")
    with pytest.raises(ValueError, match="downloading is disabled"):
        build_vit_backbone("dinov2_s", weights="timm", allow_download=False)
    with pytest.raises(ValueError, match="deep stem is a ResNet stem"):
        build_segmentor(num_classes=K, head="baseline", backbone="vit_tiny", deep_stem=True)


@pytest.mark.parametrize("head, options, samples", [("baseline", {}, 1), ("mc_dropout", {"training_samples": 3}, 3),
                                                    ("np", {"training_samples": 2, "memory_size": 4}, 2)])
def test_every_head_reads_the_dpt_features(head, options, samples):
    model = build_segmentor(num_classes=K, head=head, head_options={**options, "hidden_channels": 8},
                            backbone="vit_tiny", variant="augseg", aspp_channels=16)  # DeepLab widths: ignored
    assert model.decoder.variant == "dpt" and model.head.in_channels == 16
    images, labels = torch.rand(2, 3, 28, 42), torch.randint(0, K, (2, 28, 42))
    model.train()
    out = model(images, labels=labels, num_context=1)
    assert out.features.shape == (2, 16, 16, 24)  # 8 x the 2 x 3 patch grid
    assert out.head.logits.shape[1:] == (2, K, 16, 24)
    model.eval()
    with torch.no_grad():
        assert model(images).head.logits.shape == (samples, 2, K, 16, 24)


def test_decoder_scope_mc_dropout_drops_after_every_dpt_activation():
    model = build_segmentor(num_classes=K, head="mc_dropout", head_options={"dropout": 0.3, "hidden_channels": 8},
                            backbone="vit_tiny")
    drops = [m for m in model.decoder.modules() if isinstance(m, MCDropout2d)]
    # one activation module per residual unit (used twice) x 8 units + output_conv's
    assert len(drops) == 9 and all(m.p == 0.3 for m in drops) and model.decoder_sampling
    model.eval()
    images = torch.rand(1, 3, 28, 28)
    with torch.no_grad():
        encoded = model.encode(images)
        first, second = (model.decoder(encoded.low_level, encoded.high_level) for _ in range(2))
    assert not torch.equal(first, second)
    head_scope = build_segmentor(num_classes=K, head="mc_dropout", backbone="vit_tiny", mc_dropout_scope="head")
    assert not any(isinstance(m, MCDropout2d) for m in head_scope.decoder.modules())
