"""One whole UniMatch step under ``protocol: released`` equals the official loop's
(``tests/golden/unimatch_step_{pascal,cityscapes}.npz``, recorded by ``tests/golden/record_unimatch_step_golden.py``;
source, command and what was compared in the ``.json`` sidecars).

The official loop body of ``unimatch.py`` (LiheYoung/UniMatch@0324f3d, read from the checkout and executed: the
eval-mode CutMix-source prediction of the second draw, the pasting, ``model(cat(img_x, img_u_w), True)`` with the
official ``DeepLabV3Plus`` forward that decodes clean and perturbed features as one batch, the strong pass, every loss,
backward, SGD step and LR update) ran on the official decoder on the project's ResNet-50, every weight copied, in
float64. Here ``npsemiseg.training.step.train_step`` of the released cell takes the same step on the same network,
inputs, boxes and channel masks. Tolerance :data:`RTOL` = 1e-5, relative (``step_differences``): the project computes
its losses in float32 (by design, for mixed precision), the rest in float64 as the official. Measured max relative
|difference| (2026-11-27, 2-core AMD EPYC VM): 3.2e-7 on VOC settings (CE, threshold 0.95, LR 1e-3 x 10 for the
decoder) and 4.5e-7 on Cityscapes settings (OHEM, threshold 0, LR 5e-3 x 1), both at a gradient entry; loss terms
1e-8, BN buffers 1e-15.

Each guarded behaviour moves the step far from the record (:func:`test_each_guarded_behaviour_moves_the_step`,
VOC settings; measured): the perturbed stream decoded apart from the clean one, the project's earlier structure
(labeled loss 0.34, mask ratio 0.22, fp term 0.17 relative; gradients up to 4.7 and BN buffers 0.17 of their scale);
the corrected CutMix source, another image of the batch (first strong term 0.22, gradients 0.57); the classifier
dropout 0.1 (2.6); the LR set before the step (the step's LR 5.3 % away; one step's parameters move by less than the
tolerance); the padding mask left out (first strong term 3.3 %, gradients 6.8 %).
"""

from __future__ import annotations

import json

import pytest
import torch

from golden_files import recorded, recorder, sidecar

REC = recorder("unimatch_step")
RTOL = 1e-5
SETTINGS = ("pascal", "cityscapes")

#: integration: each step runs the float64 ResNet-50 network (about 7 s on CPU)
pytestmark = [pytest.mark.usefixtures("single_seeded_thread"), pytest.mark.integration]


def _decode_apart(self, images, *, dropout=0.5, labels=None, num_context=0, num_samples=None):
    """The structure the project had before: the clean stream as ``forward``, the perturbed stream of the same
    encoder maps decoded as a batch of its own (its own BN statistics)."""
    from npsemiseg.models.backbones import BackboneFeatures

    encoded = self.encode(images)
    clean = self._decode(encoded, labels=labels, num_context=num_context, num_samples=num_samples)
    drop = torch.nn.functional.dropout2d  # the replayed masks
    perturbed = BackboneFeatures(drop(encoded.low_level, dropout, training=True), encoded.layer3,
                                 drop(encoded.high_level, dropout, training=True))
    return clean, self._decode(perturbed, num_samples=num_samples, aux=False)


@pytest.mark.parametrize("setting", SETTINGS)
def test_one_released_step_matches_the_official_step(setting):
    data = recorded(f"unimatch_step_{setting}")
    assert sidecar(f"unimatch_step_{setting}")["official_values"]["feature_masks"] == 2  # c1 and c4, one call each
    fw, logs = REC.project_step("unimatch", setting, data)
    diffs = REC.step_differences("unimatch", fw, logs, data)
    worst = max(diffs, key=diffs.get)
    assert diffs[worst] <= RTOL, f"{worst}: relative |difference| {diffs[worst]:.3g} > {RTOL}"
    assert len(diffs) > 500  # every parameter's gradient and every parameter and buffer after the step
    assert float(data["official/mask_ratio"]) > 0 and all(float(data[f"official/{t}"]) > 0 for t in (
        "loss_u_s1", "loss_u_s2", "loss_u_w_fp"))  # every unlabeled term takes part
    print(json.dumps({"setting": setting, "max": f"{diffs[worst]:.2e}", "where": worst}))


@pytest.mark.parametrize("change", ["decode_apart", "switches.unimatch_cutmix_source=batch_shift",
                                    "switches.unimatch_classifier_dropout=0.1",
                                    "switches.unimatch_lr_timing=before_step", "no_padding"])
def test_each_guarded_behaviour_moves_the_step(change, monkeypatch):
    data, overrides = recorded("unimatch_step_pascal"), {}
    if change == "decode_apart":
        from npsemiseg.models import Segmentor

        monkeypatch.setattr(Segmentor, "forward_feature_perturbed", _decode_apart)
    else:
        data, overrides = REC.changed(data, change)
    fw, logs = REC.project_step("unimatch", "pascal", data, overrides)
    diffs = REC.step_differences("unimatch", fw, logs, data)
    assert max(diffs.values()) > 1e-2, change
