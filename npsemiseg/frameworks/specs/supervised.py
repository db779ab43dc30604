"""The supervised reference as a configuration sees it (its step: ``npsemiseg.frameworks.supervised``)."""

from __future__ import annotations

from npsemiseg.frameworks.specs.base import FRAMEWORKS, FrameworkOptions, FrameworkSpec


class SupervisedOptions(FrameworkOptions):
    """The supervised reference has no options of its own."""


@FRAMEWORKS.register("supervised")
class SupervisedSpec(FrameworkSpec):
    """Labeled images only."""

    name = "supervised"
    implementation = "npsemiseg.frameworks.supervised:Supervised"
    Options = SupervisedOptions
    uses_unlabeled = False
