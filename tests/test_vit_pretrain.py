"""The mini-study's ViT pretrained on the procedural corpus: the pretraining of a ViT, its shipped file, the cells.

``pretrained:vit_mini`` is built by the ResNet's pretraining (``npsemiseg.pretrain``) behind UniMatch V2's DPT and
shipped like ``pretrained:default``; ``jobs/specs/mini_vit.yaml`` trains UniMatch V2 and supervised from it.
"""

from __future__ import annotations

import math

import pytest
import torch

from npsemiseg.models.vit import build_vit_backbone
from npsemiseg.pretrain import PRETRAINED, SHIPPED, PretrainConfig, pretrain, resolve_weights
from npsemiseg.untrusted import load_torch_file
from semiseg_platform.preflight import PreflightError, check_weights

pytestmark = pytest.mark.usefixtures("single_seeded_thread")

#: a ViT pretraining of a few seconds: vit_tiny (patch 14) on 28 px corpus images
TINY_VIT = PretrainConfig(backbone="vit_tiny", image_size=28, corpus_size=8, holdout_size=2, steps=2, batch_size=2,
                          head_channels=8, threads=1)
MINI_VIT = {"model.backbone": "vit_mini", "model.weights": "pretrained:vit_mini", "schedule.crop_size": 56,
            "evaluation.resize_multiple": 14}


def test_the_shipped_vit_loads_strictly_into_the_mini_studys_vit():
    """The file is the timm-layout state dict of ``vit_mini`` (every key, every shape: ``load_vit_state_dict``
    refuses anything else), read as data, and it is what the backbone holds after loading, not its random init."""
    entry = SHIPPED["vit_mini"]
    assert PRETRAINED["vit_mini"].backbone == "vit_mini" and entry.key == PRETRAINED["vit_mini"].key
    path = resolve_weights("pretrained:vit_mini")  # SHA-256 checked
    state = load_torch_file(path, what="weights")
    random = build_vit_backbone("vit_mini", weights=None)
    loaded = build_vit_backbone("vit_mini", weights=path)
    assert set(state) == set(loaded.vit.state_dict())
    assert all(torch.equal(loaded.vit.state_dict()[k], v) for k, v in state.items())
    assert not torch.equal(random.vit.blocks[0].attn.qkv.weight, loaded.vit.blocks[0].attn.qkv.weight)
    with pytest.raises(ValueError, match="does not fit the vit_tiny backbone; wrong shape"):
        build_vit_backbone("vit_tiny", weights=path)  # strict: another width is refused, not partly loaded


def test_a_vit_pretrains_on_the_corpus_and_its_file_loads_into_the_vit(tmp_path):
    """``pretrain`` of a ViT keeps the timm ``VisionTransformer``'s state dict (the layout ``model.weights`` loads),
    trained: it differs from the initialisation the same seed gives."""
    result = pretrain(TINY_VIT, cache_dir=tmp_path)
    state = load_torch_file(result.path, what="weights")
    assert "patch_embed.proj.weight" in state and not any(k.startswith("vit.") for k in state)
    backbone = build_vit_backbone("vit_tiny", weights=result.path)
    torch.manual_seed(TINY_VIT.seed)
    from npsemiseg.models import build_segmentor

    initial = build_segmentor(num_classes=11, head="baseline", backbone="vit_tiny").backbone.vit.state_dict()
    assert not torch.equal(initial["patch_embed.proj.weight"], backbone.vit.state_dict()["patch_embed.proj.weight"])
    assert 0.0 <= result.metrics["miou"] <= 1.0


def test_the_head_width_enters_the_key_only_when_set():
    """The shipped default keeps the key it was built under; a set head width is another pretraining."""
    assert PretrainConfig().key == SHIPPED["default"].key == "716946963a2a2d28"
    assert PretrainConfig(head_channels=16).key != PretrainConfig().key
    with pytest.raises(ValueError, match="head_channels: expected a positive integer, got 0"):
        PretrainConfig(head_channels=0)


def test_preflight_checks_a_named_pretraining_against_the_cells_backbone(smoke_config):
    check_weights([smoke_config(**MINI_VIT)])
    cases = [({"model.backbone": "vit_tiny"}, "model.weights: pretrained:vit_mini pretrains the vit_mini backbone, the "
                                              "cell's model.backbone is vit_tiny"),
             ({"model.backbone": "resnet_small", "schedule.crop_size": 64},
              "model.weights: pretrained:vit_mini pretrains the vit_mini backbone"),
             ({"schedule.crop_size": 64}, "schedule.crop_size: the vit_mini backbone takes sides that are multiples "
                                          "of its patch size 14, got 64 (e.g. 56)")]
    for overrides, line in cases:
        with pytest.raises(PreflightError) as error:
            check_weights([smoke_config(**{**MINI_VIT, **overrides})])
        assert str(error.value).startswith(line) and "\n" not in str(error.value)


def test_a_unimatch_v2_cell_trains_from_the_shipped_vit(smoke_config, tmp_path):
    """The smoke cell of the mini-study's UniMatch V2 rows: the student and its EMA teacher start from the shipped
    backbone, two steps train, the teacher is evaluated."""
    from npsemiseg.training import build_framework, train

    config = smoke_config(framework="unimatch_v2", head="np", dataset="study",
                          **{**MINI_VIT, "schedule.max_steps": 2, "runtime.output_dir": str(tmp_path),
                             "head.options.latent_dim": 1})
    shipped = build_vit_backbone("vit_mini", weights=resolve_weights("pretrained:vit_mini")).vit.state_dict()
    framework = build_framework(config)
    for model in (framework.student, framework.teacher):
        assert all(torch.equal(model.backbone.vit.state_dict()[k], v) for k, v in shipped.items())
    result = train(config)
    assert result.steps == 2 and not result.interrupted
    assert math.isfinite(result.metrics["miou"]) and 0.0 <= result.metrics["miou"] <= 1.0


def test_the_cli_builds_and_ships_a_named_vit_pretraining(tmp_path_factory, tmp_path, monkeypatch):
    """``npsemiseg pretrain --name NAME --ship`` builds ``PRETRAINED[NAME]`` (not the configuration options) and
    copies it in as ``NAME_<key>.pt`` with the command that rebuilds it."""
    from platform_fixtures import fresh_store

    from npsemiseg import pretrain as module
    from semiseg_platform.pretrain_runs import pretrain_command

    monkeypatch.setitem(module.PRETRAINED, "tiny_vit", TINY_VIT)
    monkeypatch.setattr(module, "WEIGHTS_DIR", tmp_path / "weights")
    lines: list[str] = []
    path = pretrain_command(name="tiny_vit", steps=999, cache_dir=str(tmp_path / "cache"), ship=True,
                            tracking=fresh_store(tmp_path_factory, "vit_ship"), emit=lines.append)
    assert path == tmp_path / "cache" / TINY_VIT.key / "backbone.pt"  # TINY_VIT's key: steps=999 was not used
    shipped = tmp_path / "weights" / f"tiny_vit_{TINY_VIT.key}.pt"
    assert shipped.read_bytes() == path.read_bytes()
    assert any(line.startswith(f"pretrained vit_tiny (key {TINY_VIT.key}, trained in") for line in lines)
    assert lines[-1].endswith("command='npsemiseg pretrain --name tiny_vit --ship') in npsemiseg/pretrain.py")
