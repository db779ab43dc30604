"""Bad inputs through the command line: every one ends with exit status 2 and one ``error:``
line on stderr naming the culprit, and nothing is written: no MLflow store, no checkpoint folder, no
``ray_results/``, no Ray session (the working directory stays empty)."""

from __future__ import annotations

import os
import shutil
import socket
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from semiseg_platform.cli.main import app

runner = CliRunner()

SYNTHETIC = ["run", "--framework", "u2pl", "--dataset", "synthetic", "--partition", "1/16", "--head", "np"]
PASCAL = ["run", "--framework", "u2pl", "--dataset", "pascal_classic", "--partition", "1/16", "--head", "np"]


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def trees(tmp_path_factory) -> dict[str, Path]:
    """Data trees and files outside the working directory: an empty root, a VOC root without images,
    a broken YAML, grid and search specs."""
    base = tmp_path_factory.mktemp("inputs")
    (base / "empty").mkdir()
    no_images = base / "no_images"
    for folder in ("JPEGImages", "SegmentationClassAug"):
        (no_images / folder).mkdir(parents=True)
    (base / "broken.yaml").write_text("framework: u2pl\nhead: [np\noptim: {lr: 0.01}\n")
    (base / "list.yaml").write_text("- just\n- a list\n")
    grid = {"name": "bad", "preset": "smoke", "frameworks": ["supervised"], "heads": {"baseline": None},
            "datasets": {"synthetic_voc": ["1/16"], "pascal_classic": ["1/16"]}, "seeds": [0]}
    (base / "grid_unreadable.yaml").write_text(yaml.safe_dump(grid))
    grid_gpu = {**grid, "datasets": {"synthetic_voc": ["1/16"]}, "resources": {"gpus_per_worker": 64}}
    (base / "grid_gpu.yaml").write_text(yaml.safe_dump(grid_gpu))
    grid_elastic = {**grid, "datasets": {"synthetic_voc": ["1/16"]}, "resources": {"workers": 5, "min_workers": 3}}
    (base / "grid_elastic.yaml").write_text(yaml.safe_dump(grid_elastic))
    grid_ok = {**grid, "datasets": {"synthetic_voc": ["1/16"]}}
    (base / "grid_ok.yaml").write_text(yaml.safe_dump(grid_ok))
    shutil.copy(Path(__file__).parents[1] / "jobs" / "specs" / "search_smoke.yaml", base / "search.yaml")
    return {p.name: p for p in base.iterdir()}


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """An empty working directory (where the default store and storage would appear), no cluster."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    for name in ("MLFLOW_TRACKING_URI", "RAY_ADDRESS", "NPSEMISEG_DATA"):
        monkeypatch.delenv(name, raising=False)
    return work


def _case(args, culprit, env=None):
    return pytest.param(args, culprit, env or {}, id=f"{args[0]}:{culprit[:40]}")


#: (arguments, text the error line must hold, environment); ``{name}`` is replaced by the path of
#: the fixture file or tree ``name``, ``{port}`` by a closed port
CASES = [
    # run: the data, the weights, the resources, the tracking store, the configuration
    _case(PASCAL, "data: dataset pascal_classic: no data root for pascal_classic"),
    _case(PASCAL, "pascal_classic not found under", {"NPSEMISEG_DATA": "{empty}"}),
    _case([*PASCAL, "--set", "data.root={no_images}"], "listed images missing, e.g. "),
    _case([*PASCAL, "--set", "data.root={no_images}", "--set", "data.options={max_items: 3}"],
          "pascal_classic takes no options, got ['max_items']"),
    _case([*PASCAL[:4], "cityscapes", *PASCAL[5:]], "data: dataset cityscapes: no data root"),
    _case([*SYNTHETIC, "--set", "model.weights=/nonexistent/resnet50.pth"],
          "model.weights: file /nonexistent/resnet50.pth does not exist"),
    _case([*SYNTHETIC, "--set", "model.weights=pretrained:nope"],
          "model.weights: unknown pretraining 'pretrained:nope', expected one of ['pretrained:default', 'pretrained:vit_mini']"),
    _case([*SYNTHETIC, "--gpus-per-worker", "64"], "resources: one cell asks for 1 CPU(s) and 64 GPU(s)"),
    _case([*SYNTHETIC, "--cpus-per-worker", "100000"], "lacks 100000 CPU(s)"),
    _case([*SYNTHETIC, "--tracking", "http://127.0.0.1:{port}"], "tracking: MLflow server http://127.0.0.1:"),
    _case([*SYNTHETIC, "--tracking", "postgresql://u:secret@127.0.0.1:{port}/mlflow"],
          "tracking: database 127.0.0.1:"),
    _case([*SYNTHETIC, "--tracking", "{list.yaml}/mlruns.db"], "tracking: SQLite store"),
    _case(["run", "--config", "{broken.yaml}"], "not valid YAML at {broken.yaml}:3:6"),
    _case(["run", "--config", "{list.yaml}"], "expected a mapping of configuration sections"),
    _case([*SYNTHETIC, "--launcher", "in_process", "--workers", "2"], "--launcher in_process"),
    _case([*SYNTHETIC, "--launcher", "somewhere"], "--launcher: expected one of"),
    _case([*SYNTHETIC, "--set", "optim.lr_scaling=linear", "--set", "optim.reference_batch=null"],
          "optim.reference_batch: expected the global batch"),
    _case([*SYNTHETIC, "--set", "head.options.enqueue_per_class=999"],
          "enqueue_per_class: expected at most memory_size=64, got 999"),
    _case([*SYNTHETIC, "--set", "evaluation.mode=sliding", "--set", "evaluation.crop_size=16",
           "--set", "evaluation.stride=32"], "evaluation.stride: expected at most evaluation.crop_size=16"),
    # grid and search: the same checks before the first cell
    _case(["grid", "{broken.yaml}"], "not valid YAML at {broken.yaml}:3:6"),
    _case(["grid", "{grid_unreadable.yaml}"], "data: dataset pascal_classic: no data root"),
    _case(["grid", "{grid_gpu.yaml}"], "resources: one cell asks for 1 CPU(s) and 64 GPU(s)"),
    _case(["grid", "{grid_elastic.yaml}"], "min_workers: the global batch 10 (batch 2 x 5 workers x 1 accumulation "
           "steps) cannot be kept on 3 worker(s)"),
    _case(["grid", "{grid_ok.yaml}", "--tracking", "http://127.0.0.1:{port}"], "tracking: MLflow server"),
    _case(["search", "{broken.yaml}"], "search spec {broken.yaml}: not valid YAML at {broken.yaml}:3:6"),
    _case(["search", "{search.yaml}", "--dataset", "pascal_classic"], "data: dataset pascal_classic: no data root"),
    _case(["search", "{search.yaml}", "--set", "model.weights=/nonexistent/w.pth"], "model.weights: file"),
    # tables: a store that is not there, an experiment it does not hold
    _case(["tables", "--experiment", "npsemiseg", "--out", "t"], "tracking: no MLflow store at"),
    _case(["tables", "--experiment", "npsemiseg", "--out", "t", "--tracking", "http://127.0.0.1:{port}"],
          "tracking: MLflow server"),
    # data: check and prepare
    _case(["data", "check", "--dataset", "pascal_classic", "--root", "{empty}"], "pascal_classic not found under"),
    _case(["data", "check", "--dataset", "pascal_classic", "--root", "{no_images}", "--partition", "1/16"],
          "listed images missing"),
    _case(["data", "check", "--dataset", "imagenet"], "dataset: unknown name 'imagenet'"),
    _case(["data", "check", "--dataset", "pascal_classic", "--partition", "1/3"], "1/3"),
    _case(["data", "check", "--dataset", "pascal_classic", "--sample", "-1"], "sample must be an int >= 0"),
    _case(["data", "prepare", "voc", "--voc", "{empty}", "--sbd", "{empty}", "--out", "{empty}/out"],
          "VOC 2012 not found under"),
    _case(["data", "prepare", "cityscapes", "--root", "{empty}"], "Cityscapes not found under"),
]


def _fill(text: str, trees: dict[str, Path], port: int) -> str:
    for name, path in trees.items():
        text = text.replace("{" + name + "}", str(path))
    return text.replace("{port}", str(port))


@pytest.mark.parametrize(("args", "culprit", "env"), CASES)
def test_bad_input_is_one_error_line_and_writes_nothing(workdir, trees, monkeypatch, args, culprit, env):
    port = _closed_port()
    for name, value in env.items():
        monkeypatch.setenv(name, _fill(value, trees, port))
    before = {p: sorted(os.listdir(p)) for p in trees.values() if p.is_dir()}
    result = runner.invoke(app, [_fill(a, trees, port) for a in args])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert _fill(culprit, trees, port) in lines[0]
    assert "secret" not in lines[0]
    assert list(workdir.iterdir()) == []  # no mlruns.db, no ray_results/, no checkpoints, no tables
    assert {p: sorted(os.listdir(p)) for p in before} == before  # nothing written beside the inputs either


def test_there_are_at_least_twenty_bad_inputs_across_the_commands():
    commands = {case.values[0][0] for case in CASES}
    assert len(CASES) >= 20 and {"run", "grid", "search", "tables", "data"} <= commands
