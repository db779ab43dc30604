"""UniMatch as a configuration sees it (its step: ``npsemiseg.frameworks.unimatch``)."""

from __future__ import annotations

from pydantic import Field

from npsemiseg.frameworks.specs.base import FRAMEWORKS
from npsemiseg.frameworks.specs.fixmatch import FixMatchOptions, FixMatchSpec


class UniMatchOptions(FixMatchOptions):
    """UniMatch options; defaults = the VOC settings (configs/pascal.yaml 16; deeplabv3plus.py 45-46)."""

    feature_dropout: float = Field(0.5, ge=0.0, lt=1.0)


@FRAMEWORKS.register("unimatch")
class UniMatchSpec(FixMatchSpec):
    """FixMatch + a second strong view with its own box + the Dropout2d-perturbed weak stream."""

    name = "unimatch"
    implementation = "npsemiseg.frameworks.unimatch:UniMatch"
    Options = UniMatchOptions
