"""AugSeg as a configuration sees it (its step: ``npsemiseg.frameworks.augseg``)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from npsemiseg.frameworks.specs.base import FRAMEWORKS, FrameworkOptions, FrameworkSpec


class AugSegOptions(FrameworkOptions):
    """AugSeg options; defaults = the VOC settings."""

    ema_decay: float = Field(0.999, ge=0.0, le=1.0)
    confidence_threshold: float = Field(0.95, ge=0.0, le=1.0)
    unsup_weight: float = Field(1.0, ge=0.0)
    labeled_beta: tuple[float, float] = (8.0, 2.0)
    unlabeled_beta: float = Field(4.0, gt=0.0)
    #: the NP head's targets on the unlabeled images: the pseudo-labels masked by ``confidence_threshold``
    #: (``filtered``) or not (``unfiltered``, NP-SemiSeg's AugSeg/train_semi.py 405-408); other heads ignore them
    np_targets: Literal["filtered", "unfiltered"] = "filtered"
    #: the NP head's context: the labeled slice of the student's one pass (``slice``) or a pass of its own over the
    #: labeled images (``pass``, switch ``np_context_pass``: the authors' model); other heads ignore it
    np_context: Literal["slice", "pass"] = "slice"
    #: the NP head's memories between steps: as the head keeps them (``head``: ``persist_memories``) or as the
    #: authors' AugSeg loop leaves them (``swapped``, switch ``augseg_np_memories``): kept from step to step within
    #: an epoch with target and context exchanged at every step, both back to their start at each epoch's first step
    np_memories: Literal["head", "swapped"] = "head"
    #: the log of the adaptive confidence's entropy (``npsemiseg.heads.base.ENTROPY_LOGS``): ``clamp`` or AugSeg's
    #: ``offset`` ``log(p + 1e-10)`` (train_semi.py 331; switch ``entropy_log_offset``)
    entropy_log: Literal["clamp", "offset"] = "clamp"


@FRAMEWORKS.register("augseg")
class AugSegSpec(FrameworkSpec):
    """Student + EMA teacher (parameters and buffers), intensity-augmented adaptive-CutMix view."""

    name = "augseg"
    implementation = "npsemiseg.frameworks.augseg:AugSeg"
    decoder = "augseg"
    augmentation = "augseg"
    Options = AugSegOptions
    # its publications (crop, batch), the NP configs' crop and batch, its Cityscapes epochs (240) and options (EMA,
    # threshold, unsupervised weight) per dataset: the datasets' settings (pascal.py, cityscapes.py: AugSeg@7ead870's
    # and NP-SemiSeg@afd9672's AugSeg configs)

    @classmethod
    def paper_options(cls, dataset: str, partition: str) -> dict[str, Any]:
        """The options' defaults (VOC's: EMA 0.999, threshold 0.95, lambda_u 1); a dataset's settings change them
        (Cityscapes: EMA 0.996, no threshold, lambda_u 2.0)."""
        return AugSegOptions().model_dump()
