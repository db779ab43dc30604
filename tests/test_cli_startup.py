"""The command line answers at once: ``--help`` of every command, ``data check`` and ``data partition`` of a folder
dataset, and the configuration layer (composing a cell, ``config show``, ``config show --explain``, ``grid
--dry-run`` of the paper's specs, ``search --dry-run``) import neither torch, Ray, MLflow nor matplotlib.

Each check runs the console script's ``main`` in a fresh interpreter and reads its ``sys.modules`` (what an
interpreter already holds cannot be un-imported); the times themselves are measured by
``benchmarks/cli_startup.py`` (``docs/performance.md``), never asserted here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import typer
import yaml
from PIL import Image

from semiseg_platform.cli.main import app

#: what a command imports only when it runs
HEAVY = ("torch", "ray", "mlflow", "matplotlib")

_RUN_MAIN = """
import json, sys
from semiseg_platform.cli.main import main
try:
    main(sys.argv[1:])
except SystemExit as done:
    status = done.code
else:
    status = 0
print(json.dumps({"status": status, "heavy": [m for m in HEAVY if m in sys.modules]}))
""".replace("HEAVY", repr(HEAVY))


def imported_by(*argv: str) -> dict:
    """The exit status of ``npsemiseg ARGV`` run in a fresh interpreter and the heavy libraries it imported."""
    done = subprocess.run([sys.executable, "-c", _RUN_MAIN, *argv], capture_output=True, text=True, check=True,
                          env={**os.environ, "COLUMNS": "200"})
    return json.loads(done.stdout.strip().splitlines()[-1])


def command_paths(group: typer.core.TyperGroup, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command and command group of the app, as the words that name it (``()``: the app itself)."""
    paths = [prefix]
    for name, command in group.commands.items():
        if isinstance(command, typer.core.TyperGroup):
            paths += command_paths(command, (*prefix, name))
        else:
            paths.append((*prefix, name))
    return paths


COMMANDS = command_paths(typer.main.get_command(app))


def test_the_commands_are_found():
    assert {(), ("run",), ("config", "show"), ("data", "check"), ("data", "prepare", "coco"), ("stack",)} <= set(COMMANDS)


@pytest.mark.parametrize("command", COMMANDS, ids=lambda words: " ".join(words) or "npsemiseg")
def test_help_imports_no_heavy_library(command):
    found = imported_by(*command, "--help")
    assert found == {"status": 0, "heavy": []}, command


def test_data_partition_and_check_read_a_folder_without_heavy_libraries(tmp_path, monkeypatch):
    """What reads the images (Pillow, numpy) is all ``data partition`` and ``data check`` import."""
    monkeypatch.setenv("NPSEMISEG_CACHE", str(tmp_path / "cache"))  # where data check records what it checked
    folder = tmp_path / "plants"
    (folder / "images").mkdir(parents=True)
    (folder / "masks").mkdir()
    (folder / "classes.yaml").write_text(yaml.safe_dump({"names": ["background", "leaf"]}))
    rng = np.random.default_rng(0)
    for i in range(8):
        Image.fromarray(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)).save(folder / "images" / f"p{i}.png")
        Image.fromarray(rng.integers(0, 2, (16, 16), dtype=np.uint8)).save(folder / "masks" / f"p{i}.png")
    assert imported_by("data", "partition", str(folder), "--labeled", "1/2", "--val", "2") == {"status": 0, "heavy": []}
    assert (folder / "lists" / "val.txt").read_text().count("\n") == 2
    assert imported_by("data", "check", "--folder", str(folder), "--no-progress") == {"status": 0, "heavy": []}
    (folder / "masks" / "p0.png").write_bytes(b"not a png")  # an unusable check names the file, still light
    broken = imported_by("data", "check", "--folder", str(folder), "--no-progress")
    assert broken == {"status": 2, "heavy": []}


#: the paper's cell of ``docs/performance.md``'s measurements, as ``npsemiseg config show`` options
PAPER_CELL = ("--framework", "u2pl", "--dataset", "pascal_classic", "--partition", "1/16", "--head", "np",
              "--preset", "paper")
SPECS = Path(__file__).parents[1] / "jobs" / "specs"


def test_the_configuration_layer_imports_no_heavy_library():
    """The registries describe their entries (options, defaults, paper settings) without the networks' modules:
    composing a cell reads them, and builds nothing."""
    probe = ("import json, sys\n"
             "from npsemiseg.config import RunConfig, compose, config_params, explain\n"
             "composition = compose('paper', framework='unimatch_v2', dataset='cityscapes', partition='1/16', head='np')\n"
             "config = RunConfig.from_yaml(composition.config.to_yaml())\n"
             "assert config == composition.config and explain(config).config == config and config_params(config)\n"
             f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []


COMMANDS_READING_CONFIGURATIONS = {
    "config show": ("config", "show", *PAPER_CELL),
    "config show --explain": ("config", "show", *PAPER_CELL, "--explain", "optim"),
    "config show --json": ("config", "show", *PAPER_CELL, "--json"),
    "grid --dry-run paper": ("grid", "--dry-run", str(SPECS / "paper.yaml")),
    "grid --dry-run paper_unimatch_v2": ("grid", "--dry-run", str(SPECS / "paper_unimatch_v2.yaml")),
    "search --dry-run": ("search", "--dry-run", str(SPECS / "search_np.yaml")),
}


@pytest.mark.parametrize("command", list(COMMANDS_READING_CONFIGURATIONS))
def test_config_show_and_the_dry_runs_import_no_heavy_library(command):
    assert imported_by(*COMMANDS_READING_CONFIGURATIONS[command]) == {"status": 0, "heavy": []}


def test_run_prints_every_final_metric_first():
    from semiseg_platform.cli.run import _SUMMARY_METRICS
    from semiseg_platform.tracking import mlflow_names

    assert sorted(_SUMMARY_METRICS) == sorted(mlflow_names.FINAL_METRICS)
