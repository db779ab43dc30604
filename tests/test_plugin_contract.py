"""Every registered head, framework and dataset keeps its kind's contract (``npsemiseg.testing.check_plugin``).

Parametrised over the registries, so a plug-in added to the library (a module imported by its package's
``__init__``) is checked without an edit here; a plug-in registered elsewhere calls ``check_plugin`` in its own
test (``tests/test_registry.py`` does, for its throwaway head and framework). The checks themselves are shown to
catch what they claim below.
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

from npsemiseg.data import DATASETS
from npsemiseg.frameworks import FRAMEWORKS, get_framework
from npsemiseg.heads import HEADS, ClassifierHead, HeadOutput
from npsemiseg.testing import PluginContractError, check_plugin

REGISTERED = [(registry.kind, name) for registry in (HEADS, FRAMEWORKS, DATASETS) for name in registry.names()]
BY_KIND = {"head": HEADS, "framework": FRAMEWORKS, "dataset": DATASETS}


@pytest.mark.parametrize(("kind", "name"), REGISTERED)
def test_every_registered_class_keeps_the_contract(kind, name):
    assert check_plugin(BY_KIND[kind].get(name)) == name


class ForgetfulHead(ClassifierHead):
    """A 1x1 convolution that checks its features but not its labels nor num_samples (the rule it breaks)."""

    description = "a head that skips its input checks"

    def __init__(self, in_channels: int, num_classes: int) -> None:
        super().__init__(in_channels, num_classes)
        self.conv = nn.Conv2d(in_channels, num_classes, 1)

    def forward(self, features: Tensor, *, labels: Tensor | None = None, context_features: Tensor | None = None,
                context_labels: Tensor | None = None, num_samples: int | None = None) -> HeadOutput:
        self.check_features(features)
        return HeadOutput(self.conv(features)[None], self.zero_aux(features))


@pytest.fixture
def forgetful():
    HEADS.register("forgetful_test")(ForgetfulHead)
    try:
        yield
    finally:
        HEADS.remove("forgetful_test")


def test_a_head_that_skips_its_label_checks_is_caught(forgetful):
    with pytest.raises(PluginContractError, match=r"ForgetfulHead: labels of another batch size: expected a "
                                                  r"ValueError naming 'labels'"):
        check_plugin(ForgetfulHead)


def test_an_unregistered_class_is_caught_with_the_decorator_to_use():
    with pytest.raises(PluginContractError, match=r"ForgetfulHead is not registered: decorate it with "
                                                  r"@HEADS.register\(name\)"):
        check_plugin(ForgetfulHead)
    with pytest.raises(PluginContractError, match="not a plug-in class"):
        check_plugin(torch.nn.Linear)


def test_a_framework_whose_name_is_not_its_registered_name_is_caught():
    renamed = type("RenamedSupervised", (get_framework("supervised"),), {"name": "something_else"})
    FRAMEWORKS.register("renamed_test")(renamed)
    try:
        with pytest.raises(PluginContractError, match=r"`name` must be the registered name 'renamed_test'"):
            check_plugin(renamed)
    finally:
        FRAMEWORKS.remove("renamed_test")
