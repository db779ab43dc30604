"""A smoke run on a Cityscapes-layout tree (PNG files, city folders, the package's partition
lists): the real-data path of the loop (readers, OHEM + aux head, sliding-window evaluation)."""

from __future__ import annotations

import math

import pytest
from data_fixtures import make_cityscapes_split

from npsemiseg.callbacks import Callbacks
from npsemiseg.config import cell_config
from npsemiseg.training import train


@pytest.mark.integration  # writes ~3,500 small PNG files
def test_smoke_run_on_a_cityscapes_layout_tree(tmp_path):
    for split in ("labeled", "unlabeled"):
        make_cityscapes_split(tmp_path, split, "186", size=(32, 64))
    make_cityscapes_split(tmp_path, "val", size=(32, 64))
    config = cell_config(
        "smoke", framework="supervised", dataset="cityscapes", partition="1/16", head="np",
        **{"data.root": str(tmp_path), "evaluation.mode": "sliding", "evaluation.crop_size": 24,
           "evaluation.stride": 16, "schedule.max_steps": 2},
    )
    assert config.partition == "186" and config.loss.ohem and config.model.aux_head
    logs = []

    class Keep(Callbacks):
        def on_step(self, step, total_steps, values):
            logs.append(values)

    result = train(config, Keep())
    assert result.steps == 2 and all(math.isfinite(v) for entry in logs for v in entry.values())
    assert all("train/aux" in entry for entry in logs)
    assert 0.0 <= result.metrics["miou"] <= 1.0 and 0.0 <= result.metrics["pavpu"] <= 1.0
    assert result.metrics["num_images"] == config.evaluation.max_images
