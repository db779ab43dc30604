"""One registry for frameworks, heads, datasets, decoders, backbones and presets.

A new head and a new framework are one new file each: here both are defined in this test file,
registered through the public decorators, run as a smoke cell through ``npsemiseg.training.train``
and removed again. No other module is edited for them.
"""

from __future__ import annotations

import inspect
import math
import re

import pytest
import torch
from torch import Tensor, nn

from npsemiseg.config import cell_config, config_params, with_overrides
from npsemiseg.data.info import DATASETS
from npsemiseg.data.augmentation import TRANSFORM_DEFAULTS
from npsemiseg.data.transforms import train_transform
from npsemiseg.frameworks import (
    FRAMEWORKS,
    Framework,
    FrameworkOptions,
    StepContext,
    StepResult,
    framework_names,
    framework_spec,
    get_framework,
)
from npsemiseg.frameworks.base import Batch, head_logs
from npsemiseg.frameworks.supervised import supervised_loss_terms
from npsemiseg.heads import HEADS, ClassifierHead, HeadOutput, build_head, head_class, head_names, head_spec
from npsemiseg.models import BACKBONES, DECODERS, SEGMENTOR_OPTIONS, build_segmentor, upsample_logits
from npsemiseg.presets import PRESETS, preset_names
from npsemiseg.testing import check_plugin
from npsemiseg.training import train

REGISTRIES = {"framework": FRAMEWORKS, "head": HEADS, "dataset": DATASETS, "decoder": DECODERS,
              "backbone": BACKBONES, "preset": PRESETS}


# ------------------------------------------------------------------ a throwaway head and framework
class LinearHeadForTest(ClassifierHead):
    """A 1x1 convolution: ``features [B, C, h, w]`` -> ``logits [1, B, K, h, w]`` (one prediction)."""

    label = "linear (test)"
    description = "a 1x1 convolution, defined in tests/test_registry.py"
    smoke_options = {"bias": True}

    def __init__(self, in_channels: int, num_classes: int, bias: bool = True) -> None:
        super().__init__(in_channels, num_classes)
        self.conv = nn.Conv2d(in_channels, num_classes, 1, bias=bias)

    def forward(self, features: Tensor, *, labels: Tensor | None = None, context_features: Tensor | None = None,
                context_labels: Tensor | None = None, num_samples: int | None = None) -> HeadOutput:
        self.check_inputs(features, labels, context_features, context_labels)  # ValueError naming a bad argument
        if self.resolve_num_samples(num_samples) != 1:
            raise ValueError(f"num_samples: this head makes exactly 1 prediction, got {num_samples}")
        return HeadOutput(self.conv(features)[None], self.zero_aux(features))


class EntropyMinOptions(FrameworkOptions):
    entropy_weight: float = 0.1


class EntropyMinForTest(Framework):
    """Supervised CE on the labeled images + entropy minimisation of the student on the unlabeled ones."""

    name = "entropy_min_test"
    Options = EntropyMinOptions
    smoke_options = {"entropy_weight": 0.2}

    @classmethod
    def paper_options(cls, dataset: str, partition: str) -> dict:
        return EntropyMinOptions().model_dump()

    def train_step(self, batch: Batch, ctx: StepContext) -> StepResult:
        images, labels = batch.labeled["image"], batch.labeled["label"]
        output = self.student(images, labels=labels, num_context=images.shape[0])
        losses = supervised_loss_terms(output, labels, self.loss)
        losses.update(self.head_aux_losses(output.head))
        unlabeled = self.student(batch.unlabeled["image"]).head.logits
        probs = torch.softmax(upsample_logits(unlabeled, batch.unlabeled["image"].shape[-2:]), dim=2).mean(0)
        entropy = -(probs * probs.clamp_min(1e-8).log()).sum(1).mean()
        losses["entropy"] = self.options.entropy_weight * entropy
        return StepResult(losses, head_logs(output.head.stats))


@pytest.fixture
def throwaway():
    """Register the test head and framework through the public decorators; forget them afterwards.

    (Registered here, not at import: tests parametrised over the registries are collected first.)"""
    HEADS.register("linear_test")(LinearHeadForTest)
    FRAMEWORKS.register("entropy_min_test")(EntropyMinForTest)
    try:
        yield
    finally:
        HEADS.remove("linear_test")
        FRAMEWORKS.remove("entropy_min_test")


def test_a_new_head_and_framework_train_and_evaluate_without_editing_another_module(throwaway):
    assert "linear_test" in head_names() and "entropy_min_test" in framework_names()
    assert check_plugin(LinearHeadForTest) == "linear_test" and check_plugin(EntropyMinForTest) == "entropy_min_test"
    config = cell_config("smoke", framework="entropy_min_test", head="linear_test",
                                   **{"runtime.device": "cpu"})
    assert config.framework_options == {"entropy_weight": 0.2} and config.head.options == {"bias": True}
    assert config_params(config)["head.options.bias"] == "true"
    seen: list[dict[str, float]] = []

    from npsemiseg.callbacks import Callbacks

    class Spy(Callbacks):
        def on_step(self, step, total_steps, logs):
            seen.append(logs)

    result = train(config, Spy())
    assert result.steps == config.schedule.max_steps == len(seen)
    assert all({"train/sup", "train/entropy"} <= set(logs) and math.isfinite(logs["train/loss"]) for logs in seen)
    assert 0.0 <= result.metrics["miou"] <= 1.0 and math.isfinite(result.metrics["ece"])
    assert isinstance(result.framework.student.head, LinearHeadForTest)


def test_throwaway_entries_are_gone_after_the_test():
    assert "linear_test" not in head_names() and "entropy_min_test" not in framework_names()
    with pytest.raises(ValueError, match=r"head: unknown name 'linear_test'"):
        cell_config("smoke", head="linear_test")


# ------------------------------------------------------------------ the same unknown-name error everywhere
@pytest.mark.parametrize("kind", list(REGISTRIES))
def test_unknown_name_error_has_one_shape(kind):
    registry = REGISTRIES[kind]
    expected = re.escape(f"{kind}: unknown name 'nope', expected one of {list(registry.names())}")
    with pytest.raises(ValueError, match=f"^{expected}$"):
        registry.get("nope")
    with pytest.raises(ValueError, match=f"^{expected}$"):
        registry.check("nope")


@pytest.mark.parametrize("key, kind", [("framework", "framework"), ("head.name", "head"), ("dataset", "dataset"),
                                       ("model.decoder", "decoder"), ("model.backbone", "backbone")])
def test_config_names_are_checked_by_their_registry(smoke_config, key, kind):
    with pytest.raises(ValueError, match=re.escape(f"{kind}: unknown name 'nope', expected one of [")):
        with_overrides(smoke_config(), {key: "nope"})


def test_presets_and_accessors_read_the_registries():
    with pytest.raises(ValueError, match=re.escape("preset: unknown name 'nope', expected one of ['paper', 'smoke']")):
        cell_config("nope")
    with pytest.raises(ValueError, match=r"^head: unknown name 'gp'"):
        head_class("gp")
    with pytest.raises(ValueError, match=r"^head: unknown name 'gp'"):
        build_head("gp", 8, 3)
    assert preset_names() == PRESETS.names() and head_names() == HEADS.names()


def test_registering_a_second_class_under_a_taken_name_is_an_error():
    with pytest.raises(ValueError, match=r"head: name 'np' is already registered"):
        HEADS.register("np")(LinearHeadForTest)
    assert head_class("np").__name__ == "NPHead"


def test_head_option_values_are_checked_without_building_a_head():
    with pytest.raises(ValueError, match="memory_size"):
        head_class("np").check_options({"memory_size": 0})
    with pytest.raises(ValueError, match="dropout"):
        head_class("mc_dropout").check_options({"dropout": 0.0})
    state = torch.get_rng_state()
    cell_config("smoke", head="np")
    assert torch.equal(state, torch.get_rng_state())



@pytest.mark.parametrize("name", list(HEADS.names()))
def test_a_head_spec_declares_the_options_its_network_takes(name):
    """What a configuration checks head options against (the spec's ``default_options``, no torch) is what the
    network's constructor takes, with the same defaults: an option added to one and not the other fails here."""
    network = head_class(name)
    keywords = list(inspect.signature(network.__init__).parameters.values())[3:]  # self, in_channels, num_classes
    assert head_spec(name).option_defaults() == {p.name: p.default for p in keywords}
    assert issubclass(network, head_spec(name)) and network.label == head_spec(name).label


@pytest.mark.parametrize("name", list(FRAMEWORKS.names()))
def test_a_framework_spec_is_what_its_class_declares(name):
    framework = get_framework(name)
    spec = framework_spec(name)
    assert issubclass(framework, Framework) and issubclass(framework, spec) and framework.name == spec.name == name
    assert framework.Options is spec.Options and framework.decoder == spec.decoder


def test_model_options_and_augmentation_keys_are_the_builders_keywords():
    """``model.options`` (``SEGMENTOR_OPTIONS``) and ``data.augmentation`` (``TRANSFORM_DEFAULTS``), described without
    torch, are ``build_segmentor``'s and ``train_transform``'s keywords."""
    set_by_the_record = {"num_classes", "head", "head_options", "variant", "backbone", "weights", "deep_stem",
                         "aux_head", "representation_head", "mc_dropout_scope", "align_corners"}
    assert sorted(SEGMENTOR_OPTIONS) == sorted(set(inspect.signature(build_segmentor).parameters) - set_by_the_record)
    keywords = {p.name: p.default for p in inspect.signature(train_transform).parameters.values()}
    assert {k: v for k, v in keywords.items() if k != "crop_size"} == TRANSFORM_DEFAULTS


def test_a_plugin_deriving_from_a_built_in_network_builds_itself():
    """A subclass of a built-in head inherits its spec's ``implementation``; building it builds the subclass."""
    derived = type("WiderBaselineForTest", (head_class("baseline"),), {"description": "a wider baseline"})
    HEADS.register("wider_test")(derived)
    try:
        assert type(build_head("wider_test", 8, 3)) is derived and check_plugin(derived) == "wider_test"
    finally:
        HEADS.remove("wider_test")
