"""One whole FixMatch step under ``protocol: released`` equals the official loop's
(``tests/golden/fixmatch_step_{pascal,cityscapes}.npz``, recorded by ``tests/golden/record_fixmatch_step_golden.py``;
source, command and what was compared in the ``.json`` sidecars).

The official loop body of ``fixmatch.py`` (LiheYoung/UniMatch@0324f3d, read from the checkout and executed: the
eval-mode prediction of the CutMix source, the second draw of the same images; the pasting; the train-mode passes;
``(loss_x + loss_u_s) / 2``; backward, SGD step, LR update) ran on the official ``DeepLabV3Plus`` decoder on the
project's ResNet-50, every weight copied, in float64 (``record_unimatch_step_golden.py`` says why and what is
injected). Here ``npsemiseg.training.step.train_step`` of the released cell takes the same step. Tolerance
:data:`RTOL` = 1e-5, relative (the project's losses are float32 by design). Measured max relative |difference|
(2026-11-27, 2-core AMD EPYC VM): 3.6e-7 on VOC settings (CE, threshold 0.95, LR 1e-3 x 10 for the decoder) and
5.7e-7 on Cityscapes settings (OHEM, threshold 0, LR 5e-3 x 1), both at a gradient entry; loss terms 1e-7.

Each guarded behaviour moves the step away from the record (:func:`test_each_guarded_behaviour_moves_the_step`, VOC
settings; measured): the corrected CutMix source, another image of the batch (unsupervised term 0.45 relative,
gradients 1.8 of their scale); the classifier dropout 0.1 (2.3); the LR set before the step (the step's LR 5.3 %
away); the padding mask left out (unsupervised term 7.6 %, gradients 0.3).
"""

from __future__ import annotations

import json

import pytest

from golden_files import recorded, recorder

REC = recorder("unimatch_step")  # the FixMatch recorder is UniMatch's with fixmatch.py
RTOL = 1e-5
SETTINGS = ("pascal", "cityscapes")

#: integration: each step runs the float64 ResNet-50 network (about 5 s on CPU)
pytestmark = [pytest.mark.usefixtures("single_seeded_thread"), pytest.mark.integration]


@pytest.mark.parametrize("setting", SETTINGS)
def test_one_released_step_matches_the_official_step(setting):
    data = recorded(f"fixmatch_step_{setting}")
    fw, logs = REC.project_step("fixmatch", setting, data)
    diffs = REC.step_differences("fixmatch", fw, logs, data)
    worst = max(diffs, key=diffs.get)
    assert diffs[worst] <= RTOL, f"{worst}: relative |difference| {diffs[worst]:.3g} > {RTOL}"
    assert len(diffs) > 500  # every parameter's gradient and every parameter and buffer after the step
    assert 0 < float(data["official/mask_ratio"]) and float(data["official/loss_u_s"]) > 0
    print(json.dumps({"setting": setting, "max": f"{diffs[worst]:.2e}", "where": worst}))


@pytest.mark.parametrize("change", ["switches.unimatch_cutmix_source=batch_shift",
                                    "switches.unimatch_classifier_dropout=0.1",
                                    "switches.unimatch_lr_timing=before_step", "no_padding"])
def test_each_guarded_behaviour_moves_the_step(change):
    data, overrides = REC.changed(recorded("fixmatch_step_pascal"), change)
    fw, logs = REC.project_step("fixmatch", "pascal", data, overrides)
    diffs = REC.step_differences("fixmatch", fw, logs, data)
    assert max(diffs.values()) > 1e-2, change
