"""UniMatch (Yang et al., CVPR 2023): FixMatch with two strong views and a feature-perturbed weak stream
(``docs/frameworks.md``, FixMatch and UniMatch).

Source: LiheYoung/UniMatch@0324f3dd4a22128105a5eb135d2586c0bb3cc647 ``unimatch.py`` 121-208 (whole-step golden under
``released``: ``tests/test_unimatch_step_golden.py``). Everything of :mod:`npsemiseg.frameworks.fixmatch` (one network,
no EMA teacher; the eval-mode, no-gradient prediction of the CutMix source, a second draw of the same images or
another image of the batch; train-mode detached weak-view pseudo-labels; padding masks in every unlabeled term; the
NP head's targets = the eval-mode pseudo-labels of the weak view), and:

* two strong views, each its own photometric draw (colour jitter, grayscale, blur: dataset/semi.py 51-60; the data
  pipeline's ``image_strong`` and ``image_strong2``) and its own CutMix box drawn independently (dataset/semi.py 55,
  61; unimatch.py 142-145), pasted from the source's view of the same index and labelled from its own box
  (unimatch.py 161-172);
* the feature perturbation (unimatch.py 151-153, model/semseg/deeplabv3plus.py 38-50): the encoder maps (layer 1,
  layer 4) of the whole labeled + weak batch and a copy through ``Dropout2d(feature_dropout)`` (0.5) are decoded as
  ONE batch of ``2 (B_l + B_u)`` (:meth:`npsemiseg.models.Segmentor.forward_feature_perturbed`): every BN of the
  decoder and classifier normalises clean and perturbed features together, as the method defines it, under both
  protocols. Only the weak images' perturbed rows enter the loss, trained against the weak-view pseudo-labels with
  the threshold (unimatch.py 184-186);
* loss ``(loss_x + 0.25 loss_s1 + 0.25 loss_s2 + 0.5 loss_fp) / 2`` (unimatch.py 188): terms ``sup`` (0.5),
  ``unsup_s1``, ``unsup_s2`` (0.125 each), ``unsup_fp`` (0.25); each unsupervised term sums the CE over valid
  pixels at or above the threshold and divides by the valid pixels (unimatch.py 176-186).
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor

from npsemiseg.frameworks.ema import unwrap
from npsemiseg.frameworks.fixmatch import FixMatch, PseudoLabels, thresholded_loss
from npsemiseg.frameworks.semi import StudentPass
from npsemiseg.frameworks.specs.unimatch import UniMatchOptions, UniMatchSpec  # noqa: F401


class UniMatch(UniMatchSpec, FixMatch):
    """FixMatch + a second strong view with its own box + the Dropout2d-perturbed weak stream."""

    #: unimatch.py 188: (loss_x + 0.25 loss_s1 + 0.25 loss_s2 + 0.5 loss_fp) / 2
    sup_weight: ClassVar[float] = 0.5
    strong_weights: ClassVar[tuple[float, ...]] = (0.125, 0.125)
    fp_weight: ClassVar[float] = 0.25

    def weak_pass(self, images_l: Tensor, labels_l: Tensor, weak: Tensor,
                  targets_u: Tensor) -> tuple[StudentPass, Tensor | None]:
        """``model(cat(labeled, weak), need_fp=True)`` (unimatch.py 151-153): the clean and perturbed streams of the
        whole batch decoded as one batch of ``2 (B_l + B_u)`` (:meth:`npsemiseg.models.Segmentor.forward_feature_perturbed`;
        NP context = the clean labeled rows, targets = the clean rows with ``targets_u``); returns the clean pass (as
        FixMatch's) and the perturbed logits of the weak images only, ``[S, B_u, K, h, w]`` at feature resolution
        (``pixel_ce`` upsamples them; the perturbed labeled rows enter no loss, unimatch.py 153)."""
        images = torch.cat([images_l, weak], dim=0)
        labels = torch.cat([labels_l, targets_u], dim=0)
        num_labeled = images_l.shape[0]
        clean, perturbed = unwrap(self.student).forward_feature_perturbed(
            images, dropout=self.options.feature_dropout, labels=labels, num_context=num_labeled)  # type: ignore[attr-defined]
        return self._split(clean, num_labeled), perturbed.head.logits[:, num_labeled:]

    def extra_terms(self, perturbed: Tensor | None, weak: PseudoLabels, valid: Tensor) -> dict[str, Tensor]:
        assert perturbed is not None
        threshold = self.options.confidence_threshold  # type: ignore[attr-defined]
        loss = thresholded_loss(self.pixel_ce(perturbed, weak.label), weak.confidence, valid, threshold)
        return {"unsup_fp": self.fp_weight * loss}
