"""What others name stays bounded: the files a store lists, the endpoints a tag or a file names, and what a
careless command line points at (the threat model's "Paths, endpoints and command lines").

One test per class, on a real trained checkpoint, the real CLI and a real S3-compatible server: moto's
(``tests.platform_fixtures.running_moto``), which stores keys holding ``..`` as AWS S3 does.
"""

from __future__ import annotations

import shutil
import socket
from pathlib import Path

import boto3
import numpy as np
import pytest
import ray.train
import torch
import yaml
from mlflow.tracking import MlflowClient
from PIL import Image
from typer.testing import CliRunner

from npsemiseg.training.checkpoint import resolve_checkpoint
from semiseg_platform.cli.main import app
from semiseg_platform.launch.reporters import CheckpointReporter
from semiseg_platform.storage import CheckpointStore, checkpoint_dir_name, download_file, parse_storage
from semiseg_platform.tracking import mlflow_names
from tests.platform_fixtures import fresh_store, running_moto

runner = CliRunner()
BUCKET = "npsemiseg-test"


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A supervised smoke cell trained once into a local storage and a fresh store, and an image to predict."""
    from npsemiseg.config import cell_config
    from semiseg_platform.launch import run_cell_in_process

    tracking = fresh_store(tmp_path_factory, "others-store")
    config = cell_config("smoke", framework="supervised", dataset="synthetic", partition="1/16", head="baseline",
                         **{"runtime.device": "cpu"})
    result = run_cell_in_process(config, storage=tmp_path_factory.mktemp("others-storage"), tracking=tracking,
                                 experiment="others", name="lineage")
    image = tmp_path_factory.mktemp("others-images") / "im.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (32, 40, 3), dtype=np.uint8)).save(image)
    return {"config": config, "tracking": tracking, "run_id": result.run_id, "steps": result.steps,
            "checkpoint": Path(result.checkpoint_uri), "image": image}


@pytest.fixture
def s3(monkeypatch):
    """The user's S3 configuration: moto's endpoint in ``AWS_ENDPOINT_URL_S3``, its credentials."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    with running_moto(BUCKET) as endpoint:
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", endpoint)
        yield boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")


def _cell_run(trained, **tags: str) -> str:
    """A cell run in the trained cell's store carrying ``tags`` (what anyone with write access can set)."""
    client = MlflowClient(trained["tracking"])
    experiment = client.get_experiment_by_name("others").experiment_id
    return client.create_run(experiment, tags={mlflow_names.KIND: mlflow_names.KIND_CELL, **tags}).info.run_id


def _one_error_line(result, *parts: str) -> str:
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for part in parts:
        assert part in lines[0], lines[0]
    return lines[0]


@pytest.mark.integration
def test_files_a_store_lists_are_written_below_their_folder_only(trained, s3, tmp_path):
    """A lineage whose checkpoint lists ``../../..``-keys (their target planted too, so a copy of the listing
    would write it) and a stray file: ``predict --run``, a resume from the lineage and from a checkpoint Ray
registered take the checkpoint's own files, nothing
    is written outside; the download every store-to-disk copy goes through refuses a name leaving its folder, and a
local checkpoint root's ``latest`` names one of its own ``step_*`` directories or nothing."""
    steps, name = trained["steps"], checkpoint_dir_name(trained["steps"])
    storage = parse_storage(f"s3://{BUCKET}/lineages")
    uri = CheckpointStore(storage, "lineage").save(steps, trained["checkpoint"])
    victim = tmp_path / "victim" / "planted.txt"
    s3.put_object(Bucket=BUCKET, Key=f"lineages/lineage/{name}/{'../' * 40}{str(victim).lstrip('/')}", Body=b"x")
    s3.put_object(Bucket=BUCKET, Key=f"lineages/lineage/{name}/extra/run.sh", Body=b"#!/bin/sh\n")
    if victim.parts[1].islower() and len(victim.parts[1]) >= 3:  # the key the traversal's request reaches
        s3.create_bucket(Bucket=victim.parts[1])
        s3.put_object(Bucket=victim.parts[1], Key="/".join(victim.parts[2:]), Body=b"planted by the listing")

    run_id = _cell_run(trained, **{mlflow_names.CHECKPOINT_URI: uri})
    out = tmp_path / "out"
    result = runner.invoke(app, ["predict", "--run", run_id, "--tracking", trained["tracking"], str(trained["image"]),
                                 "--out", str(out), "--device", "cpu"])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == ["im_overlay.png", "im_prediction.png", "im_uncertainty.png"]
    resumed = CheckpointStore(storage, "lineage").local_copy(steps, tmp_path / "resume")
    assert sorted(p.name for p in resumed.rglob("*")) == [".complete", "config.yaml", "state.pt"]
    reporter = CheckpointReporter()  # a checkpoint Ray Train or Tune registered, resumed after a failure
    registered = reporter.download(ray.train.Checkpoint(storage.path("lineage", name), storage.filesystem))
    assert sorted(p.name for p in registered.rglob("*")) == [".complete", "config.yaml", "state.pt"]
    reporter.close()
    assert not victim.exists() and not victim.parent.exists()

    folder = tmp_path / "download"
    folder.mkdir()
    (folder / "link").symlink_to(tmp_path / "victim", target_is_directory=True)
    at_checkpoint = parse_storage(uri)
    for escaping in ("../escaped.pt", "link/state.pt", "/etc/state.pt", "a//state.pt"):
        with pytest.raises(ValueError, match="not below the download folder"):
            download_file(at_checkpoint, escaping, folder)
    assert sorted(p.name for p in folder.iterdir()) == ["link"] and not (tmp_path / "escaped.pt").exists()
    assert not victim.parent.exists()

    root = tmp_path / "root"  # a local checkpoint root whose `latest` names a checkpoint outside it
    shutil.copytree(trained["checkpoint"], root / "step_00000003")
    shutil.copytree(trained["checkpoint"], tmp_path / "outside")
    (root / "latest").write_text("../outside\n")
    assert resolve_checkpoint(root) == root / "step_00000003"


@pytest.mark.integration
def test_endpoints_named_by_tags_and_files_are_refused(trained, s3, tmp_path):
    """A tag's or a checkpoint's ``endpoint_override`` is refused with one line before any request: the host it
    names (a listening socket here) is never contacted with the user's key id. The user's own endpoint works."""
    with socket.socket() as elsewhere:
        elsewhere.bind(("127.0.0.1", 0))
        elsewhere.listen(8)
        elsewhere.setblocking(False)
        named = f"http://127.0.0.1:{elsewhere.getsockname()[1]}"

        uri = CheckpointStore(parse_storage(f"s3://{BUCKET}/lineages"), "lineage").save(trained["steps"],
                                                                                        trained["checkpoint"])
        tagged = _cell_run(trained, **{mlflow_names.CHECKPOINT_URI: f"{uri}?endpoint_override={named}"})
        result = runner.invoke(app, ["evaluate", "--run", tagged, "--tracking", trained["tracking"], "--device", "cpu"])
        _one_error_line(result, f"the checkpoint_uri tag of run {tagged} names the S3 endpoint {named}", "refused")

        checkpoint = tmp_path / "checkpoint"
        shutil.copytree(trained["checkpoint"], checkpoint)
        config = yaml.safe_load((checkpoint / "config.yaml").read_text())
        config["data"]["root"] = f"s3://{BUCKET}/data?endpoint_url={named}"
        (checkpoint / "config.yaml").write_text(yaml.safe_dump(config))
        result = runner.invoke(app, ["evaluate", "--checkpoint", str(checkpoint), "--device", "cpu",
                                     "--tracking", str(tmp_path / "none.db")])
        _one_error_line(result, f"the data.root of checkpoint {checkpoint} names the S3 endpoint {named}")
        with pytest.raises(BlockingIOError):
            elsewhere.accept()  # nothing connected to the named host

    own = _cell_run(trained, **{mlflow_names.CHECKPOINT_URI: uri})  # no endpoint: the user's
    result = runner.invoke(app, ["export", "--run", own, "--tracking", trained["tracking"], "--out",
                                 str(tmp_path / "model.pt")])
    assert result.exit_code == 0, result.output


@pytest.mark.integration
def test_careless_command_lines_are_one_line_and_write_nothing(trained, tmp_path, tmp_path_factory):
    """``predict --out`` holding files or links, ``--set model.options.__class__``, a checkpoint missing an entry
    and an exported model whose weights do not fit: each one ``error:`` line naming what is wrong, exit 2,
    nothing written, no MLflow run."""
    image, checkpoint = str(trained["image"]), str(trained["checkpoint"])
    precious = tmp_path / "precious.txt"
    precious.write_text("keep me")
    out = tmp_path / "out"
    out.mkdir()
    (out / "im_prediction.png").symlink_to(precious)
    predict = ["predict", "--checkpoint", checkpoint, image, "--device", "cpu", "--out"]
    _one_error_line(runner.invoke(app, [*predict, str(out)]), f"--out: {out} is not empty", "--overwrite")
    _one_error_line(runner.invoke(app, [*predict, str(out), "--overwrite"]),
                    f"--out: {out / 'im_prediction.png'} is a symbolic link")
    (tmp_path / "linked").symlink_to(out, target_is_directory=True)
    _one_error_line(runner.invoke(app, [*predict, str(tmp_path / "linked")]), "is a symbolic link")
    assert precious.read_text() == "keep me" and sorted(p.name for p in out.iterdir()) == ["im_prediction.png"]
    (out / "im_prediction.png").unlink()
    (out / "notes.txt").write_text("mine")
    result = runner.invoke(app, [*predict, str(out), "--overwrite"])
    assert result.exit_code == 0, result.output
    assert (out / "notes.txt").read_text() == "mine" and len(list(out.iterdir())) == 4

    tracking = fresh_store(tmp_path_factory, "careless-store")
    result = runner.invoke(app, ["run", "--framework", "supervised", "--dataset", "synthetic", "--partition", "1/16",
                                 "--head", "baseline", "--set", "runtime.device=cpu", "--set", "model.options.__class__=x",
                                 "--launcher", "in_process", "--tracking", tracking, "--storage", str(tmp_path / "s")])
    _one_error_line(result, "model.options: '__class__' is not an option name")
    client = MlflowClient(tracking)
    assert client.search_runs([e.experiment_id for e in client.search_experiments()]) == []

    lacking = tmp_path / "lacking"
    shutil.copytree(checkpoint, lacking)
    state = torch.load(lacking / "state.pt", weights_only=True)
    del state["framework"]
    torch.save(state, lacking / "state.pt")
    _one_error_line(runner.invoke(app, ["evaluate", "--checkpoint", str(lacking), "--device", "cpu"]),
                    f"checkpoint: {lacking / 'state.pt'} lacks the entry 'framework'")
    with pytest.raises(ValueError, match=f"resume_from: {lacking / 'state.pt'} lacks the entry 'framework'"):
        from npsemiseg.config import with_overrides
        from npsemiseg.training import train

        train(with_overrides(trained["config"], {"runtime.output_dir": str(tmp_path / "resumed")}, from_inputs=False),
              resume_from=lacking)

    exported = tmp_path / "model.pt"
    assert runner.invoke(app, ["export", "--checkpoint", checkpoint, "--out", str(exported)]).exit_code == 0
    payload = torch.load(exported, weights_only=True)
    key = next(k for k, v in payload["state_dict"].items() if v.ndim == 4)
    payload["state_dict"][key] = torch.zeros(1, 1, 1, 1)
    torch.save(payload, exported)
    _one_error_line(runner.invoke(app, [*predict[:2], str(exported), *predict[3:], str(tmp_path / "p")]),
                    f"checkpoint: {exported} does not fit the model", "size mismatch")
    assert not (tmp_path / "p").exists() and not (tmp_path / "resumed" / "checkpoints").exists()
