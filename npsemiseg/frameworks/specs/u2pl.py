"""U2PL as a configuration sees it (its step: ``npsemiseg.frameworks.u2pl``)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from npsemiseg.frameworks.specs.base import FRAMEWORKS, FrameworkOptions, FrameworkSpec


class U2PLOptions(FrameworkOptions):
    """U2PL options; defaults = the paper's VOC settings (a dataset's settings change them for it: Cityscapes')."""

    sup_only_epochs: int = Field(1, ge=0)
    ema_decay: float = Field(0.99, ge=0.0, le=1.0)
    ema_buffers: Literal["ema", "copy", "none"] = "ema"
    #: the first semi-supervised epoch's teacher: ``copy`` = parameters and buffers; ``share`` = the student's
    #: parameters (before and after the optimiser step), its own buffers (switch ``u2pl_teacher_reset``)
    teacher_reset: Literal["copy", "share"] = "copy"
    unsup_weight: float = Field(1.0, ge=0.0)
    drop_percent: float = Field(80.0, ge=0.0, le=100.0)
    cutmix_prob: float = Field(0.5, ge=0.0, le=1.0)
    teacher_train_mode: bool = False
    np_targets: Literal["filtered", "unfiltered"] = "filtered"
    #: the NP head's context: the labeled slice of the student's one pass (``slice``) or a pass of its own over the
    #: labeled images (``pass``, switch ``np_context_pass``: the authors' model); other heads ignore it
    np_context: Literal["slice", "pass"] = "slice"
    #: the entropy of the statistics pass (the unsupervised filter, the contrastive masks) with S > 1 samples: of the
    #: mean of the S softmaxes (``mean_probs``) or of the softmax of the mean logits (``mean_logits``, switch
    #: ``u2pl_entropy_mean_logits``: the NP-SemiSeg authors' ``out_t["pred"].mean(0)``)
    teacher_entropy: Literal["mean_probs", "mean_logits"] = "mean_probs"
    #: the log of that entropy (``npsemiseg.heads.base.ENTROPY_LOGS``): ``clamp`` or U2PL's ``offset``
    #: ``log(p + 1e-10)`` (u2pl/utils/loss_helper.py 35-36, train_semi.py's contrastive masks; switch
    #: ``entropy_log_offset``)
    entropy_log: Literal["clamp", "offset"] = "clamp"
    #: the supervised-only epochs' step holds ``0 x representation.sum()`` as its unsupervised and contrastive terms
    #: (``train_semi.py`` 305-306): the representation head gets zero gradients, so SGD's weight decay and momentum
    #: act on it (switch ``u2pl_sup_only_zero_terms``); False: no terms, the head is left alone until it is trained
    sup_only_zero_terms: bool = False
    #: the head's auxiliary term (the NP head's KL) during the supervised-only epochs; False: zero there
    sup_only_kl: bool = True
    contrastive: bool = True
    #: the released contrastive loss's bugs (``contrastive.U2PL_BUGS``), each reproduced when True
    label_onehot_bug: bool = False
    #: with ``label_onehot_bug``: ignored pixels count as class 0 in the first image's slot (switch
    #: ``u2pl_label_onehot_ignored``); no effect without it
    label_onehot_ignored_bug: bool = False
    labeled_negatives_bug: bool = False
    prototype_index_bug: bool = False
    contrastive_weight: float = Field(1.0, ge=0.0)
    alpha_0: float = Field(20.0, ge=0.0, le=50.0)
    anchor_threshold: float = Field(0.3, ge=0.0, le=1.0)
    low_rank: int = Field(3, ge=1)
    high_rank: int = Field(20, ge=1)
    temperature: float = Field(0.5, gt=0.0)
    num_queries: int = Field(256, ge=1)
    num_negatives: int = Field(50, ge=1)
    queue_size: int = Field(30000, ge=1)
    background_queue_size: int = Field(50000, ge=1)


@FRAMEWORKS.register("u2pl")
class U2PLSpec(FrameworkSpec):
    """Student + EMA teacher with entropy-filtered pseudo-labels and the contrastive loss."""

    name = "u2pl"
    implementation = "npsemiseg.frameworks.u2pl:U2PL"
    representation_head = True
    #: smoke: the contrastive loss on fewer anchors, negatives and queued keys
    smoke_options = {"num_queries": 32, "num_negatives": 16, "queue_size": 1024, "background_queue_size": 1024}
    Options = U2PLOptions

    @classmethod
    def paper_options(cls, dataset: str, partition: str) -> dict[str, Any]:
        """The options' defaults (one supervised-only epoch: U2PL@ab3d2be train_semi.py 205, 288, ``sup_only_epoch``
        defaults to 1, the VOC configs' value); a dataset's settings change them (Cityscapes' config: 0)."""
        return U2PLOptions().model_dump()
