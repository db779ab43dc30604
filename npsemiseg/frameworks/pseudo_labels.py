"""Teacher predictions for any head: pseudo-labels, confidence and entropy.

Every head returns per-sample logits ``[S, B, K, h, w]``; the prediction is the mean of
the per-sample softmaxes (:func:`npsemiseg.heads.base.predictive`). That one rule is how
the baseline (S = 1), MC dropout (mean of T stochastic passes) and the NP head (T latent
samples in inference mode, from the stored centers) all produce pseudo-labels, so no
framework needs to know which head it trains.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from npsemiseg.constants import IGNORE_INDEX
from npsemiseg.frameworks.losses import mean_probabilities
from npsemiseg.heads.base import predictive_entropy
from npsemiseg.label_maps import confusion_matrix
from npsemiseg.models import logit_align_corners, upsample_logits


@dataclass
class TeacherPrediction:
    """A teacher's prediction at image resolution.

    probs ``[B, K, H, W]`` (mean of per-sample softmaxes), entropy ``[B, H, W]`` (natural log),
    confidence ``[B, H, W]`` (max prob), label ``[B, H, W]`` int64 (argmax = hard pseudo-label),
    raw_logits ``[B, K, H, W]`` (the upsampled logits of a one-sample head, else None: T samples at image
    resolution are never kept), output = the raw SegmentorOutput (features, representation, ... at feature
    resolution).
    """

    probs: Tensor
    entropy: Tensor
    confidence: Tensor
    label: Tensor
    raw_logits: Tensor | None
    output: object

    def log_probs(self) -> Tensor:
        """``[B, K, H, W]`` logits of the teacher: the raw logits when S = 1, else the log of
        the mean of per-sample softmaxes (a logit vector whose softmax is the prediction)."""
        if self.raw_logits is not None:
            return self.raw_logits
        return torch.log(self.probs.clamp_min(1e-12))


@contextmanager
def mode(model: nn.Module, train: bool) -> Iterator[nn.Module]:
    """Temporarily put ``model`` in train (``True``) or eval mode, restoring it afterwards."""
    was_training = model.training
    model.train(train)
    try:
        yield model
    finally:
        model.train(was_training)


def prediction_from_logits(logits: Tensor, size: tuple[int, int], output: object = None, *,
                           align_corners: bool = False) -> TeacherPrediction:
    """Summarise per-sample logits ``[S, B, K, h, w]`` at image size ``size`` (upsampled with the model's
    ``align_corners``, one sample at a time)."""
    if logits.shape[0] == 1:
        raw = upsample_logits(logits, size, align_corners=align_corners)[0].float()
        probs = raw.softmax(dim=1)
    else:
        raw, probs = None, mean_probabilities(logits, size, align_corners=align_corners)
    confidence, label = probs.max(dim=1)
    return TeacherPrediction(probs, predictive_entropy(probs), confidence, label, raw, output)


@torch.no_grad()
def teacher_predict(
    model: nn.Module,
    images: Tensor,
    *,
    num_samples: int | None = None,
    train_mode: bool = False,
) -> TeacherPrediction:
    """The teacher's prediction on ``images [B, 3, H, W]`` at image resolution.

    Eval mode by default (the NP head then uses its stored centers; MC dropout keeps its
    dropout active and draws ``num_samples`` passes). ``train_mode=True`` is U2PL's quirk
    (batch BN statistics and train-time dropout; no labels, so NP memories are not written).
    Logits are upsampled as the model says (:func:`~npsemiseg.models.logit_align_corners`).
    """
    with mode(model, train_mode):
        output = model(images, num_samples=num_samples)
    return prediction_from_logits(output.head.logits, tuple(images.shape[-2:]), output,
                                  align_corners=logit_align_corners(model))


def oracle_prediction(prediction: TeacherPrediction, truth: Tensor) -> TeacherPrediction:
    """``prediction`` with the ground truth ``truth [B, H, W]`` in its place where known (not 255).

    The oracle of ``data.unlabeled_truth``: a teacher that is always right and always confident (one-hot
    probabilities, confidence 1, entropy 0, raw logits ``log(probs)``); ignored pixels keep the
    teacher's own prediction; ``output`` (features, representation) stays the teacher's.
    """
    known = truth != IGNORE_INDEX
    num_classes = prediction.probs.shape[1]
    one_hot = F.one_hot(truth.masked_fill(~known, 0), num_classes).permute(0, 3, 1, 2).to(prediction.probs.dtype)
    probs = torch.where(known[:, None], one_hot, prediction.probs)
    confidence, label = probs.max(dim=1)
    entropy = torch.where(known, torch.zeros_like(prediction.entropy), prediction.entropy)
    raw = torch.log(probs.clamp_min(1e-6))
    return TeacherPrediction(probs, entropy, confidence, label, raw, prediction.output)


def pseudo_label_confusion(label: Tensor, truth: Tensor, num_classes: int) -> Tensor:
    """Counts ``[K, K]`` int64 of the pseudo-labels ``label [B, H, W]`` against ``truth [B, H, W]`` where the truth
    is known (not 255): row = true class, column = pseudo-label."""
    known = truth != IGNORE_INDEX
    if not bool(known.any()):
        raise ValueError("data.unlabeled_truth: the unlabeled images of this batch carry no labels (all 255); "
                         "expected a dataset that reveals them (build_dataset(..., reveal_labels=True))")
    return confusion_matrix(label, truth, num_classes).cpu()


def pseudo_label_accuracy(confusion: Tensor) -> dict[str, float]:
    """How right the pseudo-labels of ``confusion [K, K]`` (:func:`pseudo_label_confusion`) are.

    ``pseudo_label_accuracy``: the share of right pixels; ``pseudo_label_class_accuracy``: the mean over the true
    classes present of their ``pseudo_label_recall/<c>`` (the share of class c's pixels labelled c: background
    does not dominate it); ``pseudo_label_precision/<c>``: the share of the pixels labelled c that are c, for every
    class given as a pseudo-label. A class the teacher loses shows as its recall falling and as the precision of
    the class that takes its pixels falling.
    """
    confusion = confusion.double()
    right = confusion.diagonal()
    truth_count, label_count = confusion.sum(dim=1), confusion.sum(dim=0)
    present, given = truth_count > 0, label_count > 0
    recall = right[present] / truth_count[present]
    logs = {"pseudo_label_accuracy": float(right.sum() / confusion.sum()),
            "pseudo_label_class_accuracy": float(recall.mean())}
    logs.update({f"pseudo_label_recall/{c}": float(r) for c, r in zip(present.nonzero().flatten().tolist(), recall)})
    logs.update({f"pseudo_label_precision/{c}": float(right[c] / label_count[c])
                 for c in given.nonzero().flatten().tolist()})
    return logs
