"""FixMatch (UniMatch's baseline) as a configuration sees it (its step: ``npsemiseg.frameworks.fixmatch``)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from npsemiseg.frameworks.specs.base import FRAMEWORKS, FrameworkOptions, FrameworkSpec


class FixMatchOptions(FrameworkOptions):
    """FixMatch options; defaults = the VOC settings (UniMatch@0324f3d configs/pascal.yaml 16)."""

    confidence_threshold: float = Field(0.95, ge=0.0, le=1.0)
    cutmix_p: float = Field(0.5, ge=0.0, le=1.0)
    #: where each unlabeled image's CutMix box comes from (switch ``unimatch_cutmix_source``): ``second_draw`` =
    #: another augmentation draw of the same image (the official second iterator over the unlabeled set, unimatch.py
    #: 121; the maintainer, UniMatch issue #51), ``batch_shift`` = another image of the batch (issue #34: not
    #: intentional, a shuffled batch does as well)
    cutmix_source: Literal["second_draw", "batch_shift"] = "batch_shift"


@FRAMEWORKS.register("fixmatch")
class FixMatchSpec(FrameworkSpec):
    """One network, eval-mode CutMix-source pseudo-labels, train-mode weak-view pseudo-labels, one strong view."""

    name = "fixmatch"
    implementation = "npsemiseg.frameworks.fixmatch:FixMatch"
    Options = FixMatchOptions
    #: UniMatch's DeepLabv3+ (model/semseg/deeplabv3plus.py 9-68: output stride 16, ASPP 6/12/18 with image pooling,
    #: 1x1 projection without dropout, 48-channel low-level reduction) is AugSeg's variant
    decoder = "augseg"
    #: dataset/semi.py 41-60: rescale by U[0.5, 2] of the image's own long side, crop, flip; strong view ColorJitter
    #: (0.5, 0.5, 0.5, 0.25) p 0.8, grayscale p 0.2, blur sigma U[0.1, 2] p 0.5: PS-MT's strong view; see the docs for
    #: where the weak pipeline differs
    augmentation = "psmt"
    # its publications (crop, batch, LR, epochs) and thresholds per dataset: the datasets' settings (pascal.py,
    # cityscapes.py: UniMatch@0324f3d configs/pascal.yaml, configs/cityscapes.yaml)
    smoke_options = {}

    @classmethod
    def paper_options(cls, dataset: str, partition: str) -> dict[str, Any]:
        """The options' defaults (threshold 0.95); a dataset's settings set its own threshold (Cityscapes: 0)."""
        return cls.Options().model_dump()
