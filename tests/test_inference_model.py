"""``npsemiseg.load_model`` without the platform: a checkpoint of ``train`` evaluated and exported."""

from __future__ import annotations

import pytest
import torch

import npsemiseg
from npsemiseg import train
from npsemiseg.config import cell_config
from npsemiseg.inference_model import EXPORT_KIND


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A supervised MC-dropout smoke cell trained with checkpoints under ``runtime.output_dir``."""
    output = tmp_path_factory.mktemp("trained")
    config = cell_config("smoke", framework="supervised", dataset="synthetic", partition="1/16",
                                   head="mc_dropout", **{"runtime.device": "cpu", "runtime.output_dir": str(output)})
    return config, train(config), output / "checkpoints"


def test_checkpoint_model_reproduces_the_runs_evaluation_and_survives_export(trained, tmp_path):
    config, result, checkpoints = trained
    model = npsemiseg.load_model(checkpoints)  # a checkpoint root: its latest checkpoint
    assert model.step == result.steps and model.stochastic and model.config == config
    metrics = model.evaluate()
    for key in ("miou", "pavpu", "ece", "nll"):
        assert metrics[key] == pytest.approx(result.metrics[key], rel=1e-9), key
    path = model.export(tmp_path / "model.pt")
    assert torch.load(path, weights_only=True)["kind"] == EXPORT_KIND
    exported = npsemiseg.load_model(path, num_samples=3)
    images = torch.rand(3, 3, 30, 34, generator=torch.Generator().manual_seed(0))
    labels, uncertainty = exported.predict(images)
    assert labels.shape == (3, 30, 34) and uncertainty.shape == (3, 30, 34)
    assert torch.equal(labels, model.predict(images, num_samples=3)[0])
    again = exported.predict(images)  # seeded per call: the same samples
    assert torch.equal(again[1], uncertainty)
    assert not torch.equal(exported.predict(images, num_samples=1)[1], uncertainty)  # T matters for MC dropout


def test_bad_files_are_named(tmp_path):
    (tmp_path / "garbage.pt").write_bytes(b"garbage")
    torch.save({"weights": torch.zeros(1)}, tmp_path / "other.pt")
    with pytest.raises(ValueError, match="garbage.pt is not a readable checkpoint file"):
        npsemiseg.load_model(tmp_path / "garbage.pt")
    with pytest.raises(ValueError, match="other.pt is not an exported npsemiseg model"):
        npsemiseg.load_model(tmp_path / "other.pt")
    with pytest.raises(ValueError, match="missing.pt does not exist"):
        npsemiseg.load_model(tmp_path / "missing.pt")
    with pytest.raises(ValueError, match="holds no checkpoint"):
        npsemiseg.load_model(tmp_path)
    with pytest.raises(ValueError, match="mode: expected one of"):
        npsemiseg.SegmentationModel(cell_config("smoke", framework="supervised", dataset="synthetic",
                                                          partition="1/16", head="np"), torch.nn.Identity(), step=0,
                                    mode="tiles")
