"""``npsemiseg evaluate``, ``predict`` and ``export`` and ``npsemiseg.load_model``: bad inputs are one
line and write nothing; a trained smoke cell's checkpoint goes through all of them."""

from __future__ import annotations

import math
import shutil
import socket
from pathlib import Path

import numpy as np
import pytest
import torch
from mlflow.tracking import MlflowClient
from PIL import Image
from typer.testing import CliRunner

import npsemiseg
from npsemiseg.config import cell_config
from npsemiseg.data.datasets import load_image
from npsemiseg.evaluation.visualize import entropy_to_grey
from semiseg_platform.cli.main import app
from semiseg_platform.launch import run_cell_in_process
from semiseg_platform.storage import CheckpointStore, parse_storage
from semiseg_platform.tracking import mlflow_names
from tests.platform_fixtures import fresh_store, running_seaweedfs

runner = CliRunner()


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _files(root: Path) -> set[Path]:
    return {p for p in root.rglob("*")}


@pytest.fixture(scope="module")
def bad_inputs(tmp_path_factory):
    """A store holding one run that is not a cell's, a corrupt checkpoint directory and model file,
    a text file named like an image, an empty directory, a plain file and a real image."""
    root = tmp_path_factory.mktemp("bad-inputs")
    tracking = fresh_store(tmp_path_factory, "bad-inputs-store")
    client = MlflowClient(tracking)
    grid_run = client.create_run(client.create_experiment("x"), tags={mlflow_names.KIND: mlflow_names.KIND_GRID}).info.run_id
    cell_run = client.create_run(client.get_experiment_by_name("x").experiment_id,
                                 tags={mlflow_names.KIND: mlflow_names.KIND_CELL}).info.run_id
    (root / "corrupt").mkdir()
    (root / "corrupt" / "state.pt").write_bytes(b"\x00 not a torch file")
    (root / "corrupt" / "config.yaml").write_text("framework: supervised\n")
    (root / "corrupt.pt").write_bytes(b"PK\x03\x04 truncated")
    (root / "text.png").write_text("not an image")
    (root / "empty").mkdir()
    (root / "plain").write_text("a file")
    Image.fromarray(np.zeros((8, 8, 3), dtype=np.uint8)).save(root / "image.png")
    return {"root": root, "tracking": tracking, "grid_run": grid_run, "cell_run": cell_run}


BAD_INPUTS = [
    (["evaluate", "--run", "0123456789abcdef", "--tracking", "{tracking}"], "--run: no MLflow run '0123456789abcdef'"),
    (["evaluate", "--run", "{grid_run}", "--tracking", "{tracking}"], "is a grid run, expected a cell run"),
    (["evaluate", "--run", "{cell_run}", "--tracking", "{tracking}"], "records no checkpoint"),
    (["evaluate", "--run", "{cell_run}", "--tracking", "{tracking}", "--select", "best"], "records no best checkpoint"),
    (["evaluate", "--run", "abc", "--tracking", "{root}/missing.db"], "--tracking: no MLflow store at"),
    (["evaluate", "--checkpoint", "{root}/nowhere"], "checkpoint {root}/nowhere does not exist"),
    (["evaluate", "--checkpoint", "{root}/empty"], "holds no checkpoint"),
    (["evaluate", "--checkpoint", f"s3://bucket/cell?endpoint_override=http://127.0.0.1:{_closed_port()}"],
     "checkpoint s3://bucket/cell cannot be read"),
    (["evaluate", "--checkpoint", "{root}/corrupt"], "state.pt is not a readable checkpoint file"),
    (["evaluate", "--checkpoint", "{root}/corrupt", "--select", "best"], "holds no best checkpoint"),
    (["evaluate", "--checkpoint", "{root}/corrupt", "--mode", "tiles"], "mode: expected one of"),
    (["evaluate", "--checkpoint", "{root}/corrupt", "--samples", "0"], "--samples: expected T >= 1, got 0"),
    (["evaluate", "--checkpoint", "{root}/corrupt", "--select", "first"], "--select: expected one of"),
    (["evaluate"], "give exactly one of --run RUN_ID and --checkpoint URI"),
    (["export", "--checkpoint", "{root}/corrupt.pt", "--out", "{root}/out.pt"], "corrupt.pt is not a readable"),
    (["export", "--checkpoint", "{root}/corrupt", "--out", "{root}/empty"], "--out: {root}/empty is a directory"),
    (["predict", "--checkpoint", "{root}/corrupt", "{root}/text.png", "--out", "{root}/out"], "text.png: not an image"),
    (["predict", "--checkpoint", "{root}/corrupt", "{root}/empty", "--out", "{root}/out"], "empty: directory holds no image"),
    (["predict", "--checkpoint", "{root}/corrupt", "{root}/gone.png", "--out", "{root}/out"], "gone.png: no such file"),
    (["predict", "--checkpoint", "{root}/corrupt", "{root}/image.png", "--out", "{root}/plain"], "--out: {root}/plain is a file"),
    (["predict", "--checkpoint", "{root}/corrupt", "{root}/image.png", "--out", "{root}/out", "--samples", "-2"],
     "--samples: expected T >= 1"),
    (["predict", "--checkpoint", "{root}/corrupt", "{root}/image.png", "--out", "{root}/out", "--mode", "full"],
     "mode: expected one of"),
    (["predict", "--checkpoint", "{root}/corrupt", "{root}/image.png", "--out", "{root}/out", "--mode", "center_crop"],
     "--mode: center_crop predicts a crop"),
    (["predict", "--checkpoint", "{root}/corrupt", "{root}/image.png", "--out", "{root}/out", "--batch-size", "0"],
     "--batch-size: expected >= 1"),
    (["predict", "--checkpoint", "{root}/corrupt", "{root}/image.png", "--out", "{root}/out"], "state.pt is not a readable"),
]


@pytest.mark.parametrize("args, message", BAD_INPUTS, ids=[f"{a[0]}-{i}" for i, (a, _) in enumerate(BAD_INPUTS)])
def test_bad_input_is_one_line_and_writes_nothing(bad_inputs, tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    values = {k: str(v) for k, v in bad_inputs.items()}
    args = [a.format(**values) for a in args]
    client = MlflowClient(bad_inputs["tracking"])
    runs_before = len(client.search_runs([client.get_experiment_by_name("x").experiment_id]))
    files_before = _files(bad_inputs["root"])
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert message.format(**values) in lines[0]
    assert _files(bad_inputs["root"]) == files_before and list(tmp_path.iterdir()) == []
    assert len(client.search_runs([client.get_experiment_by_name("x").experiment_id])) == runs_before


# ----------------------------------------------------------------------------- a trained cell
@pytest.fixture(scope="module")
def cell(tmp_path_factory):
    """A U2PL + NP smoke cell (student, EMA teacher, NP memories) trained into a fresh store and storage."""
    tracking = fresh_store(tmp_path_factory, "checkpoint-cell")
    storage = tmp_path_factory.mktemp("checkpoint-storage")
    config = cell_config("smoke", framework="u2pl", dataset="synthetic", partition="1/16", head="np",
                                   **{"runtime.device": "cpu"})
    result = run_cell_in_process(config, storage=storage, tracking=tracking, experiment="ckpt", name="lineage")
    return {"tracking": tracking, "storage": storage, "result": result, "run_id": result.run_id,
            "checkpoint": Path(result.checkpoint_uri)}


def _nested_runs(cell) -> list:
    client = MlflowClient(cell["tracking"])
    experiment = client.get_experiment_by_name("ckpt").experiment_id
    return client.search_runs([experiment], f"tags.`{mlflow_names.PARENT_RUN_ID}` = '{cell['run_id']}'",
                              order_by=["attributes.start_time ASC"])


@pytest.mark.integration
def test_evaluate_logs_nested_runs_equal_to_a_direct_evaluation(cell):
    # the cell's own settings: the re-evaluation reproduces the metrics training logged
    first = runner.invoke(app, ["evaluate", "--run", cell["run_id"], "--tracking", cell["tracking"], "--device", "cpu"])
    assert first.exit_code == 0, first.output
    assert "nested under the cell's run" in first.output
    logged = MlflowClient(cell["tracking"]).get_run(cell["run_id"]).data.metrics
    # another T, from the checkpoint's URI: the cell run is found from its checkpoint_uri tag
    second = runner.invoke(app, ["evaluate", "--checkpoint", str(cell["checkpoint"]), "--samples", "3",
                                 "--tracking", cell["tracking"], "--device", "cpu"])
    assert second.exit_code == 0, second.output
    direct = npsemiseg.load_model(cell["checkpoint"]).evaluate(num_samples=3)

    runs = _nested_runs(cell)
    assert len(runs) == 2
    assert all(r.data.tags[mlflow_names.KIND] == mlflow_names.KIND_EVALUATION and r.info.status == "FINISHED" for r in runs)
    assert [r.data.params["num_samples"] for r in runs] == ["2", "3"]
    assert runs[0].data.params[mlflow_names.CHECKPOINT_URI] == str(cell["checkpoint"])
    for key in mlflow_names.FINAL_METRICS:
        assert runs[0].data.metrics[key] == pytest.approx(logged[key], rel=1e-9, nan_ok=True), key
        assert runs[1].data.metrics[key] == pytest.approx(direct[key], rel=1e-9, nan_ok=True), key
    assert f"{direct['miou']:.4f}" in second.output


@pytest.mark.integration
def test_evaluate_selects_the_best_checkpoint_when_the_run_keeps_one(cell, tmp_path):
    best = cell["checkpoint"].parent / "best"
    shutil.copytree(cell["checkpoint"], best)
    try:
        client = MlflowClient(cell["tracking"])
        client.set_tag(cell["run_id"], mlflow_names.BEST_CHECKPOINT_URI, str(best))
        result = runner.invoke(app, ["evaluate", "--run", cell["run_id"], "--select", "best", "--tracking",
                                     cell["tracking"], "--device", "cpu", "--mode", "sliding"])
        assert result.exit_code == 0, result.output
        nested = [r for r in _nested_runs(cell) if r.data.params["select"] == "best"]
        assert len(nested) == 1 and nested[0].data.params[mlflow_names.CHECKPOINT_URI] == str(best)
        assert nested[0].data.tags[mlflow_names.EVAL_MODE] == "sliding"
        by_uri = runner.invoke(app, ["evaluate", "--checkpoint", str(best.parent), "--select", "best", "--tracking",
                                     str(tmp_path / "no-store.db"), "--device", "cpu"])
        assert by_uri.exit_code == 0, by_uri.output
        assert "metrics not logged" in by_uri.output and not (tmp_path / "no-store.db").exists()
    finally:
        client.delete_tag(cell["run_id"], mlflow_names.BEST_CHECKPOINT_URI)
        shutil.rmtree(best)


def _images(directory: Path) -> list[Path]:
    """Three RGB images, two of one size (one batch) and one of another."""
    directory.mkdir()
    rng = np.random.default_rng(0)
    paths = []
    for index, (height, width) in enumerate([(40, 48), (40, 48), (33, 37)]):
        paths.append(directory / f"im{index}.png")
        Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(paths[-1])
    return paths


@pytest.mark.integration
def test_predict_writes_class_indices_uncertainty_and_overlay(cell, tmp_path):
    images = _images(tmp_path / "images")
    out = tmp_path / "out"
    result = runner.invoke(app, ["predict", "--checkpoint", str(cell["checkpoint"].parent), str(images[0].parent),
                                 "--out", str(out), "--samples", "4", "--batch-size", "2", "--device", "cpu"])
    assert result.exit_code == 0, result.output
    model = npsemiseg.load_model(cell["checkpoint"])
    num_classes = model.num_classes
    assert f"log {num_classes} = {math.log(num_classes):.4f} nats" in result.output
    assert len(list(out.iterdir())) == 9
    labels, uncertainty = model.predict(torch.stack([load_image(p) for p in images[:2]]), num_samples=4)
    for index, path in enumerate(images):
        prediction = Image.open(out / f"{path.stem}_prediction.png")
        grey = Image.open(out / f"{path.stem}_uncertainty.png")
        assert prediction.mode == "P" and grey.mode == "L"
        assert prediction.size == grey.size == Image.open(path).size
        values = np.asarray(prediction)
        assert values.min() >= 0 and values.max() < num_classes
        assert float(grey.text["max_nats"]) == pytest.approx(math.log(num_classes), abs=1e-6)
        assert Image.open(out / f"{path.stem}_overlay.png").mode == "RGB"
        if index < 2:  # the first batch: the same as the library's prediction of that batch
            assert np.array_equal(values, labels[index].numpy())
            assert np.array_equal(np.asarray(grey), entropy_to_grey(uncertainty[index], num_classes))
    assert 0 <= uncertainty.min() and uncertainty.max() <= math.log(num_classes) + 1e-5


@pytest.mark.integration
def test_export_then_load_model_predicts_as_the_checkpoint(cell, tmp_path):
    out = tmp_path / "export" / "model.pt"
    result = runner.invoke(app, ["export", "--run", cell["run_id"], "--tracking", cell["tracking"], "--out", str(out)])
    assert result.exit_code == 0, result.output
    payload = torch.load(out, weights_only=True)  # plain tensors and strings: safe to load
    assert payload["kind"] == "npsemiseg.model" and payload["step"] == cell["result"].steps
    exported, original = npsemiseg.load_model(out, num_samples=3), npsemiseg.load_model(cell["checkpoint"], num_samples=3)
    for key in ("head.context_memory", "head.context_centers", "head.target_centers"):  # the NP memories / centers
        assert torch.equal(payload["state_dict"][key], original.model.state_dict()[key]), key
    assert exported.config == original.config and exported.stochastic
    images = torch.rand(2, 3, 36, 44, generator=torch.Generator().manual_seed(1))
    for mode in ("whole", "sliding_global"):
        labels, uncertainty = exported.predict(images, mode=mode)
        expected_labels, expected_uncertainty = original.predict(images, mode=mode)
        assert labels.shape == uncertainty.shape == (2, 36, 44) and labels.dtype == torch.int64
        assert torch.equal(labels, expected_labels) and torch.equal(uncertainty, expected_uncertainty)
    assert exported.samples(5) == 5 and exported.samples() == 3


@pytest.mark.parametrize("command", ["evaluate", "predict", "export"])
def test_checkpoint_commands_have_help(command):
    result = runner.invoke(app, [command, "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    for option in {"evaluate": ("--run", "--checkpoint", "--mode", "--samples", "--select", "--tracking"),
                   "predict": ("--checkpoint", "--out", "--samples", "--device", "--batch-size"),
                   "export": ("--run", "--checkpoint", "--out")}[command]:
        assert option in result.output, option


@pytest.fixture
def s3_endpoint(tmp_path, monkeypatch):
    """A real S3-compatible store (SeaweedFS; skipped when ``weed`` is not installed), signed requests."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    with running_seaweedfs(tmp_path / "seaweedfs") as (_, endpoint):
        yield endpoint


@pytest.mark.integration
def test_export_from_an_s3_lineage(cell, tmp_path, s3_endpoint):
    """A lineage on S3 resolves to its newest complete checkpoint, downloaded for the command only."""
    storage = parse_storage(f"s3://npsemiseg-test/checkpoints?endpoint_override={s3_endpoint}")
    CheckpointStore(storage, "lineage").save(cell["result"].steps, cell["checkpoint"])
    uri = f"s3://npsemiseg-test/checkpoints/lineage?endpoint_override={s3_endpoint}"
    result = runner.invoke(app, ["export", "--checkpoint", uri, "--out", str(tmp_path / "model.pt")])
    assert result.exit_code == 0, result.output
    assert f"from s3://npsemiseg-test/checkpoints/lineage/checkpoint_{cell['result'].steps:09d}" in result.output
    images = torch.rand(1, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    exported, original = npsemiseg.load_model(tmp_path / "model.pt"), npsemiseg.load_model(cell["checkpoint"])
    assert torch.equal(exported.predict(images)[1], original.predict(images)[1])
    missing = runner.invoke(app, ["export", "--checkpoint", uri.replace("lineage", "nothing"), "--out",
                                  str(tmp_path / "other.pt")])
    assert missing.exit_code == 2 and "s3://npsemiseg-test/checkpoints/nothing does not exist" in missing.stderr
    assert not (tmp_path / "other.pt").exists()
