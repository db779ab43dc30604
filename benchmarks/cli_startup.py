"""What the command line costs before it does anything: each command in a fresh interpreter, its wall and CPU
time beside ``python -c "import torch"`` measured in the same run, and which heavy libraries it imported
(results: ``docs/performance.md``, "Command-line start-up").

On a machine shared with other jobs absolute times drift from minute to minute; the ratios to importing torch,
measured in one run (each command ``--repeat`` times, the median kept), are what to compare. CPU time is the
children's user + system time (``resource.getrusage``). The ``data check`` command reads a folder dataset of
``--images`` small random images written into a temporary folder. Usage::

    PYTHONPATH=$PWD python3 benchmarks/cli_startup.py [--repeat 3] [--images 20]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml
from PIL import Image

#: the libraries whose import the command line should pay only when a command needs them
HEAVY = ("torch", "torchvision", "ray", "mlflow", "matplotlib", "pandas", "scipy")

#: runs the CLI as the console script does, then writes the heavy libraries it imported to $CLI_STARTUP_MODULES
_RUN_CLI = (
    "import atexit, json, os, sys\n"
    "def _record():\n"
    "    with open(os.environ['CLI_STARTUP_MODULES'], 'w') as out:\n"
    f"        json.dump([m for m in {HEAVY!r} if m in sys.modules], out)\n"
    "atexit.register(_record)\n"
    "from semiseg_platform.cli.main import main\n"
    "main(sys.argv[1:])\n"
)


def write_folder(folder: Path, images: int) -> None:
    """A folder dataset of ``images`` random 64x64 JPEGs, each with a 3-class index PNG mask."""
    (folder / "images").mkdir(parents=True)
    (folder / "masks").mkdir()
    (folder / "classes.yaml").write_text(yaml.safe_dump({"names": ["background", "a", "b"]}))
    rng = np.random.default_rng(0)
    for i in range(images):
        Image.fromarray(rng.integers(0, 256, size=(64, 64, 3), dtype=np.uint8)).save(folder / "images" / f"i{i:03d}.jpg")
        Image.fromarray(rng.integers(0, 3, size=(64, 64), dtype=np.uint8)).save(folder / "masks" / f"i{i:03d}.png")


def measure(argv: list[str], modules_file: Path, env: dict[str, str]) -> tuple[float, float, int]:
    """One fresh interpreter: its wall seconds, CPU seconds (user + system) and exit status."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(argv, env={**env, "CLI_STARTUP_MODULES": str(modules_file)}, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if done.returncode != 0:
        print(f"  {' '.join(argv[3:])}: exit {done.returncode}: {done.stderr.strip()[-300:]}", file=sys.stderr)
    return wall, cpu, done.returncode


def commands(folder: Path) -> dict[str, list[str]]:
    """What is timed: a label -> the CLI's arguments (None: the torch import itself)."""
    return {
        "--help": ["--help"],
        "run --help": ["run", "--help"],
        "config show --help": ["config", "show", "--help"],
        "data check --help": ["data", "check", "--help"],
        "grid --help": ["grid", "--help"],
        "config show (paper u2pl np 1/16)": ["config", "show", "--framework", "u2pl", "--dataset", "pascal_classic",
                                             "--partition", "1/16", "--head", "np", "--preset", "paper"],
        "config show --explain optim (the same cell)": ["config", "show", "--framework", "u2pl", "--dataset",
                                                        "pascal_classic", "--partition", "1/16", "--head", "np",
                                                        "--preset", "paper", "--explain", "optim"],
        "grid --dry-run jobs/specs/paper.yaml": ["grid", "--dry-run", "jobs/specs/paper.yaml"],
        "search --dry-run jobs/specs/search_np.yaml": ["search", "--dry-run", "jobs/specs/search_np.yaml"],
        "data partition (20 images)": ["data", "partition", str(folder), "--labeled", "1/4", "--val", "0.2"],
        "data check --folder (20 images)": ["data", "check", "--folder", str(folder), "--no-progress"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--images", type=int, default=20)
    args = parser.parse_args()
    env = dict(os.environ)
    rows = []
    with tempfile.TemporaryDirectory(prefix="cli-startup-") as base:
        env["NPSEMISEG_CACHE"] = str(Path(base) / "cache")
        folder = Path(base) / "bench"
        write_folder(folder, args.images)
        modules_file = Path(base) / "modules.json"
        timed = {"python -c 'import torch'": [sys.executable, "-c", "import atexit, json, os, sys; import torch\n"
                                              "json.dump(['torch'], open(os.environ['CLI_STARTUP_MODULES'], 'w'))"]}
        timed |= {label: [sys.executable, "-c", _RUN_CLI, *cli] for label, cli in commands(folder).items()}
        for label, argv in timed.items():
            modules_file.write_text("[]")
            runs = [measure(argv, modules_file, env) for _ in range(args.repeat)]
            wall, cpu = statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)
            rows.append({"command": label, "wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "exit": runs[-1][2],
                         "heavy_imports": json.loads(modules_file.read_text())})
    torch_wall, torch_cpu = rows[0]["wall_s"], rows[0]["cpu_s"]
    print(f"{'command':<44} {'wall s':>7} {'CPU s':>7} {'wall/torch':>10} {'CPU/torch':>9}  heavy imports")
    for row in rows:
        print(f"{row['command']:<44} {row['wall_s']:>7.2f} {row['cpu_s']:>7.2f} {row['wall_s'] / torch_wall:>10.2f} "
              f"{row['cpu_s'] / torch_cpu:>9.2f}  {', '.join(row['heavy_imports']) or '-'}"
              + ("" if row["exit"] == 0 else f"  (exit {row['exit']})"))
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
