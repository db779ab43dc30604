"""Files from others are read as data (``npsemiseg.untrusted``): crafted torch files and decompression bombs.

Payloads: :class:`Reduce`, whose unpickling calls ``os.system("touch <marker>")``, and :class:`Sneaky`, a
class outside the allow list whose ``__setstate__`` creates the marker. The fast tests show each payload
does create its marker when unpickled in full (``weights_only=False``: what the readers did before) and that
every reader refuses it naming the file and the global, the marker never created. The bomb is a valid PNG
whose header declares 50,000 x 50,000 pixels over a few bytes of data. The entry points on a real
checkpoint (CLI ``predict``, ``evaluate``, ``export``, ``evaluate --run``, ``train(resume_from=)``, a cell
and a grid resuming from S3) are in the integration half below.
"""

from __future__ import annotations

import os
import random
import re
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from typer.testing import CliRunner

from npsemiseg.data.check import check_dataset
from npsemiseg.data.datasets import load_image, load_index_png
from npsemiseg.models.backbones import read_state_dict
from npsemiseg.training.checkpoint import load_checkpoint, rng_state, set_rng_state
from npsemiseg.untrusted import MAX_IMAGE_PIXELS, ImageTooLargeError, UnsafeFileError, load_torch_file, open_image
from semiseg_platform.cli.main import app

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]


class Reduce:
    """Unpickling calls ``os.system`` (``posix.system``): creates ``marker``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


class Sneaky:
    """A class outside the allow list; unpickling it (``__setstate__``) creates ``marker``."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __setstate__(self, state: dict) -> None:
        Path(state["marker"]).touch()
        self.__dict__.update(state)


PAYLOADS = {"reduce": (Reduce, "posix.system" if os.name == "posix" else "nt.system"),
            "class": (Sneaky, f"{Sneaky.__module__}.Sneaky")}


def craft(state: dict, path: Path, payload: str, marker: Path) -> str:
    """Write ``state`` plus the payload to ``path``; returns the global the payload asks for."""
    kind, name = PAYLOADS[payload]
    torch.save({**state, "extra": kind(marker)}, path)
    return name


def bomb_png(path: Path, width: int = 50_000, height: int = 50_000) -> Path:
    """A valid PNG declaring ``width x height`` RGB pixels, its data a few hundred bytes."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * 4096))
                     + chunk(b"IEND", b""))
    return path


# ----------------------------------------------------------------------------- torch files
@pytest.mark.parametrize("payload", list(PAYLOADS))
def test_the_payloads_run_when_unpickled_in_full(tmp_path, payload):
    """The negative control: what ``weights_only=False`` (the readers before) does with these files."""
    marker = tmp_path / "created"
    craft({"format": 1}, tmp_path / "state.pt", payload, marker)
    torch.load(tmp_path / "state.pt", weights_only=False)
    assert marker.exists()


@pytest.mark.parametrize("payload", list(PAYLOADS))
@pytest.mark.parametrize("reader", ["load_torch_file", "load_checkpoint", "read_state_dict", "load_model"])
def test_every_torch_reader_refuses_a_payload_naming_file_and_global(tmp_path, payload, reader):
    import npsemiseg

    marker = tmp_path / "created"
    path = tmp_path / ("state.pt" if reader == "load_checkpoint" else "file.pt")
    name = craft({"conv1.weight": torch.zeros(1)}, path, payload, marker)
    call = {"load_torch_file": lambda: load_torch_file(path, what="test"),
            "load_checkpoint": lambda: load_checkpoint(tmp_path),
            "read_state_dict": lambda: read_state_dict(path),  # model.weights=<file>, the shipped backbone
            "load_model": lambda: npsemiseg.load_model(path)}[reader]  # an exported model file
    with pytest.raises(UnsafeFileError) as raised:
        call()
    message = str(raised.value)
    assert f"{path} asks to load {name}" in message and "\n" not in message, message
    assert not marker.exists()


def test_the_legacy_numpy_allowance_builds_no_other_array(tmp_path):
    """Checkpoints allow numpy's uint32 key of older RNG states, not numpy arrays at large: an object array
    holding the payload or a float64 array is refused at its dtype, before anything of it is built."""
    marker = tmp_path / "created"
    for value, refused in ((np.array([Reduce(marker)], dtype=object), "asks for the numpy dtype ('O8',)"),
                           (np.zeros(3), "asks for the numpy dtype ('f8',)")):
        torch.save({"rng": [], "extra": value}, tmp_path / "state.pt")
        with pytest.raises(UnsafeFileError, match=re.escape(refused)):
            load_checkpoint(tmp_path)
    assert not marker.exists()


def test_rng_states_are_plain_data_and_restore_exactly(tmp_path):
    """Checkpoints' RNG states load with weights_only=True and continue every stream bit for bit; a
    checkpoint written before (numpy's legacy tuple with an ndarray key) still loads and restores too."""
    before = rng_state()
    try:
        _check_rng_round_trip(tmp_path)
    finally:
        set_rng_state(before)


def _check_rng_round_trip(tmp_path: Path) -> None:
    torch.manual_seed(1), np.random.seed(2), random.seed(3)
    np.random.normal()  # a cached Gaussian: has_gauss = 1
    legacy = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    torch.save({"rng": [rng_state()], "legacy": [legacy]}, tmp_path / "state.pt")
    expected = (torch.rand(3), np.random.normal(size=3), random.random())
    loaded = load_checkpoint(tmp_path)
    with pytest.raises(UnsafeFileError, match="numpy"):  # the legacy key is an ndarray: only checkpoints allow it
        load_torch_file(tmp_path / "state.pt", what="test")
    for state in (loaded["rng"][0], loaded["legacy"][0]):
        set_rng_state(state)
        again = (torch.rand(3), np.random.normal(size=3), random.random())
        assert torch.equal(again[0], expected[0]) and np.array_equal(again[1], expected[1]) and again[2] == expected[2]


def _project_lines(pattern: str) -> list[str]:
    """``path:line: text`` of every line of the project's code (not its tests) matching ``pattern``."""
    found = []
    for package in ("npsemiseg", "semiseg_platform", "jobs", "benchmarks"):
        for path in sorted((ROOT / package).rglob("*.py")):
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if re.search(pattern, line):
                    found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    return found


def test_no_weights_only_false_in_the_project():
    """Every torch file the project reads is read as data: no ``weights_only=False`` in its code (the tests'
    negative controls above unpickle files they wrote themselves), every ``torch.load`` call passes
    ``weights_only=True``, no pickle or ``np.load(allow_pickle=True)``, and every YAML read of the project's code
    (benchmarks read the authors' configurations) goes through ``npsemiseg.untrusted.load_yaml``."""
    assert _project_lines(r"weights_only\s*=\s*False") == []
    calls = _project_lines(r"torch\.load\(")
    assert calls and all("weights_only=True" in line for line in calls), calls
    assert _project_lines(r"\bpickle\.loads?\(|cloudpickle\.loads?\(|allow_pickle\s*=\s*True|unsafe_load|full_load") == []
    yaml_loads = [line for line in _project_lines(r"yaml\.(safe_)?load\(|yaml\.load_all\(") if not line.startswith("benchmarks")]
    assert len(yaml_loads) == 1 and yaml_loads[0].startswith("npsemiseg/untrusted/yaml_files.py:"), yaml_loads


# ----------------------------------------------------------------------------- images
@pytest.mark.parametrize("width, height", [(50_000, 50_000), (10_000, 10_000), (8_193, 8_192)],
                         ids=["pil-error", "pil-warning", "own-limit"])
def test_open_image_refuses_more_pixels_than_the_limit_from_the_header(tmp_path, width, height):
    """Three sizes: past PIL's error (2x its warning), between its warning and error, just past our limit."""
    path = bomb_png(tmp_path / "bomb.png", width, height)
    with pytest.raises(ImageTooLargeError, match=re.escape(f"image file {path} declares")) as raised:
        with open_image(path):
            pass
    assert f"{MAX_IMAGE_PIXELS:,}" in str(raised.value)
    with pytest.raises(ImageTooLargeError):  # the training readers: images and labels alike
        load_image(path)
    with pytest.raises(ImageTooLargeError):
        load_index_png(path, max_value=20, what="classes")


def test_open_image_reads_an_image_at_the_limit(tmp_path):
    Image.new("L", (8192, 8192)).save(tmp_path / "large.png")
    with open_image(tmp_path / "large.png") as image:
        assert image.size == (8192, 8192)


def test_data_check_reports_a_bomb_in_the_tree(tmp_path):
    from data_fixtures import make_voc_split

    for split in ("val", "labeled", "unlabeled"):
        make_voc_split(tmp_path, "pascal_classic", split, None if split == "val" else "92", max_items=2)
    image = sorted((tmp_path / "JPEGImages").iterdir())[0]
    bomb_png(image)
    report = check_dataset("pascal_classic", tmp_path, partitions=["92"], max_items=2)
    assert not report.usable
    assert [p.kind for p in report.problems] == ["unreadable"] * len(report.problems)
    assert any(f"image file {image} declares 2,500,000,000 pixels" in p.detail for p in report.problems)
    result = runner.invoke(app, ["data", "check", "--dataset", "pascal_classic", "--root", str(tmp_path), "--partition",
                                 "92", "--max-items", "2", "--no-progress"])
    assert result.exit_code == 2 and len(result.stderr.strip().splitlines()) == 1, result.output
    assert "declares 2,500,000,000 pixels" in result.stderr


def test_predict_refuses_a_bomb_before_loading_anything(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    bomb = bomb_png(tmp_path / "bomb.png")
    result = runner.invoke(app, ["predict", "--checkpoint", str(tmp_path / "nowhere"), str(bomb), "--out",
                                 str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and f"image file {bomb} declares 2,500,000,000 pixels" in lines[0], lines
    assert not (tmp_path / "out").exists()


# ----------------------------------------------------------------------------- the entry points, on a real checkpoint
@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A supervised smoke cell trained once into a local storage and a fresh store: its checkpoint is the base of
    every crafted copy (the real state plus one payload entry)."""
    from npsemiseg.config import cell_config
    from semiseg_platform.launch import run_cell_in_process
    from tests.platform_fixtures import fresh_store

    tracking = fresh_store(tmp_path_factory, "untrusted-store")
    config = cell_config("smoke", framework="supervised", dataset="synthetic", partition="1/16", head="baseline",
                         **{"runtime.device": "cpu"})
    result = run_cell_in_process(config, storage=tmp_path_factory.mktemp("untrusted-storage"), tracking=tracking,
                                 experiment="untrusted", name="lineage")
    checkpoint = Path(result.checkpoint_uri)
    return {"config": config, "tracking": tracking, "run_id": result.run_id, "checkpoint": checkpoint,
            "steps": result.steps, "state": load_checkpoint(checkpoint)}


def crafted_copy(trained, directory: Path, payload: str) -> tuple[Path, Path, str]:
    """A copy of the real checkpoint directory with the payload in its ``state.pt``: (directory, marker, global)."""
    import shutil

    target = directory / trained["checkpoint"].name
    shutil.copytree(trained["checkpoint"], target)
    marker = directory / f"created-by-{payload}"
    return target, marker, craft(trained["state"], target / "state.pt", payload, marker)


def _refused(result, path: Path, name: str) -> None:
    """Exit 2 and one ``error:`` line naming the file and the global."""
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert f"{path} asks to load {name}" in lines[0], lines[0]


CLI_CASES = {
    "predict": ["predict", "--checkpoint", "{checkpoint}", "{image}", "--out", "{out}", "--device", "cpu"],
    "evaluate": ["evaluate", "--checkpoint", "{checkpoint}", "--device", "cpu", "--tracking", "{tracking}"],
    "export": ["export", "--checkpoint", "{checkpoint}", "--out", "{out}/model.pt"],
    "evaluate-run": ["evaluate", "--run", "{run_id}", "--device", "cpu", "--tracking", "{tracking}"],
}


@pytest.mark.integration
@pytest.mark.parametrize("payload", list(PAYLOADS))
@pytest.mark.parametrize("command", list(CLI_CASES))
def test_checkpoint_commands_refuse_a_crafted_checkpoint(trained, tmp_path, monkeypatch, command, payload):
    """``evaluate-run``: the cell run's ``checkpoint_uri`` tag (anyone with write access to the tracking server can
    change it) points at the crafted copy; no nested evaluation run is logged."""
    from mlflow.tracking import MlflowClient

    from semiseg_platform.tracking import mlflow_names

    monkeypatch.chdir(tmp_path)
    checkpoint, marker, name = crafted_copy(trained, tmp_path, payload)
    Image.new("RGB", (40, 32)).save(tmp_path / "image.png")
    values = {"checkpoint": checkpoint, "image": tmp_path / "image.png", "out": tmp_path / "out",
              "tracking": trained["tracking"], "run_id": trained["run_id"]}
    client = MlflowClient(trained["tracking"])
    experiment = client.get_run(trained["run_id"]).info.experiment_id
    runs_before = len(client.search_runs([experiment]))
    client.set_tag(trained["run_id"], mlflow_names.CHECKPOINT_URI, str(checkpoint))
    try:
        result = runner.invoke(app, [str(a).format(**values) for a in CLI_CASES[command]])
    finally:
        client.set_tag(trained["run_id"], mlflow_names.CHECKPOINT_URI, str(trained["checkpoint"]))
    _refused(result, checkpoint / "state.pt", name)
    assert not marker.exists() and not (tmp_path / "out").exists()
    assert len(client.search_runs([experiment])) == runs_before


@pytest.mark.integration
def test_export_refuses_a_crafted_model_file(trained, tmp_path):
    marker = tmp_path / "created"
    name = craft({"kind": "npsemiseg.model", "format": 1}, tmp_path / "model.pt", "reduce", marker)
    result = runner.invoke(app, ["export", "--checkpoint", str(tmp_path / "model.pt"), "--out", str(tmp_path / "o.pt")])
    _refused(result, tmp_path / "model.pt", name)
    assert not marker.exists() and not (tmp_path / "o.pt").exists()


@pytest.mark.integration
@pytest.mark.parametrize("payload", list(PAYLOADS))
def test_resume_from_refuses_a_crafted_checkpoint(trained, tmp_path, payload):
    from npsemiseg.config import with_overrides
    from npsemiseg.training import train

    (tmp_path / "in").mkdir()
    checkpoint, marker, name = crafted_copy(trained, tmp_path / "in", payload)
    config = with_overrides(trained["config"], {"runtime.output_dir": str(tmp_path / "out")}, from_inputs=False)
    with pytest.raises(UnsafeFileError, match=re.escape(f"resume_from: {checkpoint / 'state.pt'} asks to load {name}")):
        train(config, resume_from=checkpoint)
    assert not marker.exists() and not (tmp_path / "out" / "checkpoints").exists()
    if payload == "reduce":  # the real one still resumes: at its last step
        assert train(config, resume_from=trained["checkpoint"]).steps == trained["steps"]


@pytest.fixture(scope="module")
def s3_storage(tmp_path_factory):
    """A real S3-compatible store (SeaweedFS; skipped without ``weed``), signed requests, and Ray for the grid."""
    import ray

    from tests.platform_fixtures import running_seaweedfs

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AWS_ACCESS_KEY_ID", "test")  # before the store starts: its one identity
        patch.setenv("AWS_SECRET_ACCESS_KEY", "test")
        with running_seaweedfs(tmp_path_factory.mktemp("seaweedfs")) as (_, endpoint):
            ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
            try:
                yield f"s3://npsemiseg-test/untrusted?endpoint_override={endpoint}"
            finally:
                ray.shutdown()


def _plant(trained, s3_storage: str, lineage: str, directory: Path) -> tuple[Path, str, str]:
    """A crafted copy of the real checkpoint saved as ``lineage``'s newest checkpoint on S3: (marker, its URI, global)."""
    from semiseg_platform.storage import CheckpointStore, parse_storage

    directory.mkdir()
    checkpoint, marker, name = crafted_copy(trained, directory, "reduce")
    uri = CheckpointStore(parse_storage(s3_storage), lineage).save(trained["steps"], checkpoint)
    return marker, uri, name


@pytest.mark.integration
def test_a_cell_refuses_its_crafted_s3_checkpoint(trained, tmp_path, tmp_path_factory, s3_storage):
    """The same lineage run again resumes from its newest checkpoint on S3: the Python API raises
    ``CellFailedError`` naming the file, ``npsemiseg run`` exits 2 with one line; the payload never runs."""
    from semiseg_platform.launch import CellFailedError, run_cell_in_process
    from tests.platform_fixtures import fresh_store

    marker, _, name = _plant(trained, s3_storage, "crafted", tmp_path / "crafted")
    tracking = fresh_store(tmp_path_factory, "untrusted-cell")
    with pytest.raises(CellFailedError) as raised:
        run_cell_in_process(trained["config"], storage=s3_storage, tracking=tracking, experiment="x", name="crafted")
    assert f"state.pt asks to load {name}" in raised.value.result.error and raised.value.result.status == "FAILED"
    result = runner.invoke(app, ["run", "--framework", "supervised", "--dataset", "synthetic", "--partition", "1/16",
                                 "--head", "baseline", "--set", "runtime.device=cpu", "--launcher", "in_process",
                                 "--storage", s3_storage, "--name", "crafted", "--tracking", tracking])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and f"state.pt asks to load {name}" in lines[0] and "cell " in lines[0], result.stderr
    assert not marker.exists()


@pytest.mark.integration
def test_a_grid_refuses_its_cells_crafted_s3_checkpoint(trained, tmp_path, tmp_path_factory, s3_storage):
    """A grid re-submitted on an S3 storage resumes each cell from its lineage's newest checkpoint: the crafted
    one fails that cell, naming the file; the payload never runs."""
    from semiseg_platform.launch import cell_run_name
    from semiseg_platform.sweeps.grid_runner import run_grid
    from semiseg_platform.sweeps.grid_spec import expand, grid_id, load_spec
    from tests.platform_fixtures import fresh_store

    spec = load_spec({"name": "untrusted", "experiment": "untrusted-grid", "preset": "smoke",
                      "frameworks": ["supervised"], "datasets": {"synthetic": ["1/16"]}, "heads": ["baseline"],
                      "overrides": {"runtime.device": "cpu"}, "resources": {"workers": 1, "cpus_per_worker": 1},
                      "max_failures": 0, "tracking_uri": fresh_store(tmp_path_factory, "untrusted-grid"),
                      "storage": s3_storage})
    configs = expand(spec)
    lineage = cell_run_name(configs[0], grid_id(configs), spec.experiment)
    marker, _, name = _plant(trained, s3_storage, lineage, tmp_path / "crafted")
    summary = run_grid(spec, tables_dir=tmp_path / "tables", emit=lambda line: None)
    assert not summary.ok
    [failed] = summary.cells("failed")
    assert f"state.pt asks to load {name}" in failed.reason, failed.reason
    assert not marker.exists()


@pytest.mark.integration
def test_a_ray_train_cell_refuses_its_crafted_s3_checkpoint(trained, tmp_path, tmp_path_factory, s3_storage):
    """The same through a TorchTrainer worker (``run_cell``, one worker): the refusal crosses Ray and ``npsemiseg
    run`` still finds it (exit 2)."""
    from semiseg_platform.cli.run import refused_file
    from semiseg_platform.launch import CellFailedError, run_cell
    from tests.platform_fixtures import fresh_store

    marker, _, name = _plant(trained, s3_storage, "crafted-train", tmp_path / "crafted")
    with pytest.raises(CellFailedError) as raised:
        run_cell(trained["config"], workers=1, cpus_per_worker=1, storage=s3_storage,
                 tracking=fresh_store(tmp_path_factory, "untrusted-train"), experiment="x", name="crafted-train")
    assert f"state.pt asks to load {name}" in raised.value.result.error, raised.value.result.error
    assert refused_file(raised.value) is not None
    assert not marker.exists()
