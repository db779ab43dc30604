"""The supervised reference: the student trained on the labeled images only.

Loss = supervised CE over the head's S predictions (``head.sample_ce`` form; OHEM and the
0.4-weighted auxiliary head loss when the config asks, as on Cityscapes) + the head's
auxiliary loss (its ``aux_loss_term``: lambda_kl x KL for NP: context = targets = the labeled batch, so the NP
memories are filled from ground truth). The loop loads no unlabeled data for it.

The step follows U2PL's supervised baseline (``train_sup.py`` 177-251 with its ``u2pl`` network, the head at 10x the
backbone's LR on VOC); ``tests/test_supervised_step_golden.py`` runs that official loop body beside ``train_step``.
"""

from __future__ import annotations

from typing import Any

from npsemiseg.frameworks.base import Batch, Framework, StepContext, StepResult, head_logs
from npsemiseg.frameworks.losses import LossSettings, supervised_loss
from npsemiseg.frameworks.specs.supervised import SupervisedOptions, SupervisedSpec  # noqa: F401


class Supervised(SupervisedSpec, Framework):
    """Labeled images only; the student is also the evaluation model."""

    def train_step(self, batch: Batch, ctx: StepContext) -> StepResult:
        """``batch.labeled``: ``image [B, 3, H, W]``, ``label [B, H, W]`` -> ``sup`` (+ ``aux``, ``kl``)."""
        images, labels = batch.labeled["image"], batch.labeled["label"]
        output = self.student(images, labels=labels, num_context=images.shape[0])
        losses = supervised_loss_terms(output, labels, self.loss, align_corners=self.align_corners)
        losses.update(self.head_aux_losses(output.head))
        return StepResult(losses=losses, logs=head_logs(output.head.stats))


def supervised_loss_terms(output: Any, labels: Any, loss: LossSettings, *, align_corners: bool = False) -> dict[str, Any]:
    """:func:`supervised_loss` of a :class:`~npsemiseg.models.SegmentorOutput` whose batch is exactly
    the labeled images ``labels [B, H, W]``, with the run's CE form, OHEM and aux weight (logits upsampled
    with the model's ``align_corners``)."""
    return supervised_loss(
        output.head.logits,
        output.aux_logits,
        labels,
        sample_ce=loss.sample_ce,
        ohem=loss.ohem,
        ohem_thresh=loss.ohem_thresh,
        ohem_min_kept=loss.ohem_min_kept,
        aux_weight=loss.aux_weight,
        align_corners=align_corners,
    )
