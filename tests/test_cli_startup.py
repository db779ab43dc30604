"""The command line answers at once: ``--help`` of every command, ``data check`` and ``data partition`` of a folder
dataset import neither torch, Ray, MLflow nor matplotlib.

Each check runs the console script's ``main`` in a fresh interpreter and reads its ``sys.modules`` (what an
interpreter already holds cannot be un-imported); the times themselves are measured by
``benchmarks/cli_startup.py`` (``docs/performance.md``), never asserted here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import typer
import yaml
from PIL import Image

from npsemiseg import catalog
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


def test_the_catalog_names_what_the_registries_register():
    """The help lists :mod:`npsemiseg.catalog`'s names: exactly what importing the packages registers, in order."""
    probe = ("import json\n"
             "from npsemiseg.data import dataset_names\n"
             "from npsemiseg.frameworks import framework_names\n"
             "from npsemiseg.heads import head_names\n"
             "from npsemiseg.presets import preset_names\n"
             "print(json.dumps([framework_names(), head_names(), dataset_names(), preset_names()]))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    registered = json.loads(done.stdout.strip().splitlines()[-1])
    assert registered == [list(catalog.FRAMEWORK_NAMES), list(catalog.HEAD_NAMES), list(catalog.DATASET_NAMES),
                          list(catalog.PRESET_NAMES)]


def test_run_prints_every_final_metric_first():
    from semiseg_platform.cli.run import _SUMMARY_METRICS
    from semiseg_platform.tracking import mlflow_names

    assert sorted(_SUMMARY_METRICS) == sorted(mlflow_names.FINAL_METRICS)
