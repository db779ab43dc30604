"""Chaos: a grid on the local stack survives random kills of any of its processes (results: ``docs/reliability.md``).

Starts the local stack (PostgreSQL, SeaweedFS S3, MLflow server, Ray head; a fresh home on free
loopback ports unless ``--home`` names a running one), runs the grid once undisturbed (the
reference), then again in another experiment while, every ``--interval`` seconds, one process
(``--burst N``: N processes of different kinds at once) chosen with a seeded RNG is killed with
SIGKILL: the grid driver (then resubmitted), a cell's worker (a Tune trial actor), the MLflow
server, the S3 server or the Ray head (then restarted together, and the driver resubmitted). With
``--kinds ...,node`` a worker node (a second raylet of 1 CPU joined to the head, started before the
chaos run) is killed too when a cell trains on it, its raylet and that cell's process at once, and a fresh one joins after
1-5 s; the driver is not resubmitted: the grid retries those cells in the same submission. A
driver that exits unsuccessfully is resubmitted too. At the end the two studies are compared: the
same FINISHED cells, identical final metrics per cell, identical tables, one run per cell id, no
run left RUNNING, one complete checkpoint lineage per cell.

    make chaos                                   # the smoke grid, a kill every 20 s, seed 0
    .venv/bin/python benchmarks/chaos.py --spec jobs/specs/smoke.yaml --interval 20 --seed 0 \\
        --only synthetic_voc=92 --frameworks supervised,mt --steps 12 --checkpoint-every 4

Prints one JSON report (kills by kind, resubmissions, time lost, the checks) and exits 1 when a
check fails.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from unittest import mock

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from stack_fixtures import free_port_block, reachable_home, stack_settings  # noqa: E402

from semiseg_platform.devstack import Stack, StackSettings  # noqa: E402
from semiseg_platform.devstack.process import base_env, executable, group_alive  # noqa: E402
from semiseg_platform.storage import COMPLETE_MARKER, checkpoint_step, parse_storage  # noqa: E402
from semiseg_platform.sweeps.grid_spec import expand, grid_id, load_spec  # noqa: E402
from semiseg_platform.tracking import mlflow_names  # noqa: E402

logger = logging.getLogger("chaos")
KINDS = ("driver", "worker", "mlflow", "s3", "ray")
#: What ``--kinds`` may name besides the default kinds: ``node`` (a worker node of the Ray cluster)
OPTIONAL_KINDS = ("node",)
#: The stack's service behind each kind of kill that is a service
SERVICE_OF = {"mlflow": "mlflow", "s3": "seaweedfs", "ray": "ray"}
#: The process title of a Tune function trainable's actor (where an in-process cell trains)
TRIAL_ACTOR = b"ray::ImplicitFunc"


# ----------------------------------------------------------------------------- the spec
def chaos_spec(path: Path, *, experiment: str, storage: str, only: dict[str, list[str]] | None = None,
               frameworks: list[str] | None = None, heads: list[str] | None = None,
               protocols: list[str] | None = None, steps: int | None = None,
               checkpoint_every: int | None = None, max_failures: int = 1) -> dict:
    """The grid spec at ``path`` in its own experiment and storage, optionally reduced: ``only``
    (dataset -> partitions), ``frameworks``, ``heads`` (names of the spec's head entries), ``protocols``, and
    longer cells with checkpoints (``steps``, ``checkpoint_every``) so that kills hit mid-cell."""
    spec = yaml.safe_load(path.read_text())
    spec.update(experiment=experiment, storage=storage, max_failures=max_failures)
    spec.pop("tracking_uri", None)
    if only:
        spec["datasets"] = {name: partitions for name, partitions in only.items()}
    if frameworks:
        spec["frameworks"] = frameworks
    if protocols:
        spec["protocols"] = protocols
    if heads:
        spec["heads"] = {name: entry for name, entry in spec["heads"].items() if name in heads}
        spec["rules"] = [rule for rule in spec.get("rules", [])
                         if set(rule.get("when", {}).get("heads", [])) <= set(heads)]
    overrides = spec.setdefault("overrides", {})
    if steps:
        overrides["schedule.max_steps"] = steps
    if checkpoint_every:
        overrides["schedule.checkpoint_every_steps"] = checkpoint_every
    return spec


# ----------------------------------------------------------------------------- the driver
@dataclass
class Driver:
    """The grid driver: ``python -m jobs.grid`` joined to the stack's Ray head (``RAY_ADDRESS``)."""

    spec_path: Path
    tables_dir: Path
    env: dict[str, str]
    log_path: Path
    process: subprocess.Popen | None = None
    submissions: int = 0

    def submit(self) -> None:
        command = [sys.executable, "-m", "jobs.grid", str(self.spec_path), "--tables-dir", str(self.tables_dir)]
        with open(self.log_path, "a") as log:
            log.write(f"\n===== submission {self.submissions + 1} at {time.strftime('%H:%M:%S')}\n")
            log.flush()
            self.process = subprocess.Popen(command, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)
        self.submissions += 1

    def poll(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def kill(self) -> bool:
        """SIGKILL the driver (its process group: nothing else of the study runs in it)."""
        if self.process is None or self.process.poll() is not None:
            return False
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=60)
        return True


def driver_env(stack: Stack) -> dict[str, str]:
    """A client of the stack that joins its Ray head as a driver."""
    env = {**os.environ, **stack.client_env(include_secrets=True)}
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL"):
        env.pop(key, None)
    env["RAY_ADDRESS"] = stack.settings.ray_gcs_address
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return env


def run_driver_to_the_end(driver: Driver, timeout_s: float) -> float:
    """Submit and wait (no chaos); returns the wall seconds. ``RuntimeError`` if it fails or times out."""
    began = time.monotonic()
    driver.submit()
    try:
        rc = driver.process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        driver.kill()
        raise RuntimeError(f"the undisturbed grid did not finish in {timeout_s:.0f} s (log {driver.log_path})") from None
    if rc != 0:
        raise RuntimeError(f"the undisturbed grid exited {rc} (log {driver.log_path})")
    return time.monotonic() - began


# ----------------------------------------------------------------------------- the kills
def trial_actor_pids(ray_temp_dir: Path) -> list[int]:
    """The pids of the processes where cells train (Tune trial actors) in the Ray cluster whose
    session lives under ``ray_temp_dir`` (their parent, the raylet, names it: other clusters on
    this machine are never touched)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if not (entry / "cmdline").read_bytes().startswith(TRIAL_ACTOR):
                continue
            parent = (entry / "stat").read_text().rsplit(")", 1)[1].split()[1]
            if str(ray_temp_dir).encode() in Path(f"/proc/{parent}/cmdline").read_bytes():
                pids.append(int(entry.name))
        except OSError:
            continue
    return sorted(pids)


def group_pids(pgid: int) -> list[int]:
    """The processes of process group ``pgid``."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, ValueError):
                if os.getpgid(int(entry.name)) == pgid:
                    pids.append(int(entry.name))
    return pids


def parent_pid(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


@dataclass
class WorkerNode:
    """A worker node of the stack's Ray cluster: ``ray start --address`` of one more raylet (1 CPU)
    on this machine, in its own process group, with the stack's token; :meth:`kill` SIGKILLs the
    node's processes and the cell workers its raylet started."""

    stack: Stack
    log_path: Path
    num_cpus: int = 1
    process: subprocess.Popen | None = None

    def start(self, timeout_s: float = 120.0) -> None:
        env = {**base_env(), **self.stack.client_env(include_secrets=True), "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0"}
        env.pop("RAY_ADDRESS", None)
        agent_port = free_port_block(1)
        command = [executable("ray"), "start", "--address", self.stack.settings.ray_gcs_address, "--block",
                   "--disable-usage-stats", "--num-cpus", str(self.num_cpus), "--num-gpus", "0",
                   "--node-ip-address", self.stack.settings.host, "--dashboard-agent-listen-port", str(agent_port)]
        with open(self.log_path, "a") as log:
            self.process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the worker node exited {self.process.returncode} (log {self.log_path})")
            if self.raylet() is not None:
                return
            time.sleep(0.5)
        raise RuntimeError(f"the worker node's raylet did not start in {timeout_s:.0f} s (log {self.log_path})")

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def raylet(self) -> int | None:
        """The pid of this node's raylet, or None."""
        if self.process is None:
            return None
        for pid in group_pids(self.process.pid):
            with contextlib.suppress(OSError):
                if b"/raylet" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0", 1)[0]:
                    return pid
        return None

    def cell_workers(self) -> list[int]:
        """The Tune trial actors (cells) this node's raylet started."""
        raylet = self.raylet()
        if raylet is None:
            return []
        pids = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                with contextlib.suppress(OSError):
                    if (entry / "cmdline").read_bytes().startswith(TRIAL_ACTOR) and parent_pid(int(entry.name)) == raylet:
                        pids.append(int(entry.name))
        return pids

    def kill(self) -> list[int]:
        """SIGKILL the node (its process group and the cell workers of its raylet); returns those cells' pids."""
        if not self.alive():
            return []
        cells = self.cell_workers()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        for pid in cells:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.process.wait(timeout=60)
        return cells


@dataclass
class Chaos:
    """Every ``interval_s``, kills ``burst`` processes of different kinds at once (kinds and victims
    drawn from ``rng``) while ``driver`` runs, restarts the killed services together and resubmits
    the driver where it died or lost its Ray cluster."""

    stack: Stack
    driver: Driver
    rng: random.Random
    interval_s: float
    kinds: tuple[str, ...] = KINDS
    burst: int = 1
    kills: Counter = field(default_factory=Counter)
    resubmissions: Counter = field(default_factory=Counter)
    events: list[str] = field(default_factory=list)
    #: the kinds still to kill in this round (a seeded shuffle of ``kinds``: every kind once per round)
    bag: list[str] = field(default_factory=list)
    #: the worker node (kind ``node``), started by :meth:`run`
    node: WorkerNode | None = None

    def note(self, text: str) -> None:
        self.events.append(f"{time.strftime('%H:%M:%S')} {text}")
        logger.info("%s", text)

    def kill_burst(self, limit: int | None = None) -> int:
        """Kill up to ``burst`` (and ``limit``) processes of the next kinds of the round (kinds drawn
        without replacement, so every kind is hit once per round; a kind with nothing to kill right
        now waits for the next turn), then bring back what they took down. Returns the kills made."""
        if not self.bag:
            self.bag = self.rng.sample(self.kinds, len(self.kinds))
        wanted = min(self.burst, len(self.bag), limit if limit is not None else self.burst)
        killed: list[str] = []
        for kind in list(self.bag):
            if len(killed) == wanted:
                break
            if getattr(self, f"_kill_{kind}")():
                killed.append(kind)
                self.bag.remove(kind)
        self.kills.update(killed)
        self._recover(killed)
        return len(killed)

    def _kill_driver(self) -> bool:
        if not self.driver.kill():
            return False
        self.note("killed the grid driver")
        return True

    def _kill_worker(self) -> bool:
        pids = trial_actor_pids(self.stack.settings.ray_temp_dir)
        if not pids:
            return False
        pid = self.rng.choice(pids)
        os.kill(pid, signal.SIGKILL)
        self.note(f"killed cell worker {pid}")
        return True

    def _kill_service(self, kind: str) -> bool:
        pid = self.stack.pid(SERVICE_OF[kind])
        if pid is None:
            return False
        os.killpg(pid, signal.SIGKILL)
        if kind == "ray":  # its workers are not all in the head's process group
            for actor in trial_actor_pids(self.stack.settings.ray_temp_dir):
                os.kill(actor, signal.SIGKILL)
        self.note(f"killed {SERVICE_OF[kind]} (pid {pid})")
        self._wait_gone(pid)
        return True

    def _kill_node(self) -> bool:
        if self.node is None or not self.node.alive() or not self.node.cell_workers():
            return False  # only a node with a cell on it: the kill must cost a cell its process
        cells = self.node.kill()
        self.note(f"killed the worker node (pid {self.node.process.pid}) with {len(cells)} cell worker(s) {cells}")
        return True

    def _kill_mlflow(self) -> bool:
        return self._kill_service("mlflow")

    def _kill_s3(self) -> bool:
        return self._kill_service("s3")

    def _kill_ray(self) -> bool:
        return self._kill_service("ray")

    def _recover(self, killed: list[str]) -> None:
        """Restart the killed services after 1-5 s (together), then resubmit the driver if it was
        killed or its Ray cluster was (a driver of a dead cluster is killed first)."""
        services = tuple(SERVICE_OF[kind] for kind in killed if kind in SERVICE_OF)
        if "node" in killed and "ray" not in killed:  # a dead head's workers are gone already; ray is restarted below
            downtime = self.rng.uniform(1.0, 5.0)
            self.note(f"a fresh worker node joins in {downtime:.1f} s")
            time.sleep(downtime)
            self.node.start()
            self.note("worker node back")
        if services:
            downtime = self.rng.uniform(1.0, 5.0)
            self.note(f"restarting {', '.join(services)} in {downtime:.1f} s")
            time.sleep(downtime)
            self.stack.up(services)
            self.note(f"{', '.join(services)} back")
            if "ray" in services and self.node is not None:  # its node went with the head: join the new head
                self.node.kill()
                self.node.start()
                self.note("worker node rejoined")
        if "ray" in killed and self.driver.kill():
            self.note("killed the driver of the dead Ray cluster")
        if "driver" in killed or "ray" in killed:
            self._resubmit("driver killed" if "driver" in killed else "ray head killed")

    @staticmethod
    def _wait_gone(pgid: int, timeout_s: float = 30.0) -> None:
        """Until no process of the killed group is left (its leader, our child, reaped)."""
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pgid, os.WNOHANG)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and group_alive(pgid):
            time.sleep(0.2)

    def _resubmit(self, why: str) -> None:
        self.resubmissions[why] += 1
        self.driver.submit()

    def run(self, timeout_s: float, max_kills: int | None = None) -> float:
        """Run the grid to a successful end under chaos; returns the wall seconds."""
        began = time.monotonic()
        if "node" in self.kinds and self.node is None:
            self.node = WorkerNode(self.stack, self.driver.log_path.with_name("worker-node.log"))
            self.node.start()
            self.note("worker node joined")
        self.driver.submit()
        next_kill = time.monotonic() + self.interval_s
        while True:
            rc = self.driver.poll()
            if rc == 0:
                return time.monotonic() - began
            if rc is not None:
                self.note(f"the driver exited {rc}; resubmitting")
                time.sleep(3)
                self._resubmit(f"driver exited {rc}")
            if time.monotonic() - began > timeout_s:
                self.driver.kill()
                raise RuntimeError(f"the grid did not finish under chaos in {timeout_s:.0f} s")
            left = None if max_kills is None else max_kills - sum(self.kills.values())
            if time.monotonic() >= next_kill and (left is None or left > 0):
                self.kill_burst(left)
                next_kill = time.monotonic() + self.interval_s
            time.sleep(0.5)


# ----------------------------------------------------------------------------- the comparison
def study(client, experiment: str) -> dict:
    """The runs of one experiment: cell runs by cell id (all of them), and every RUNNING run."""
    found = client.get_experiment_by_name(experiment)
    runs = client.search_runs([found.experiment_id], "", max_results=5000) if found else []
    cells: dict[str, list] = {}
    for run in runs:
        if run.data.tags.get(mlflow_names.KIND) == mlflow_names.KIND_CELL:
            cells.setdefault(run.data.tags[mlflow_names.CELL_ID], []).append(run)
    return {"cells": cells, "running": [r.info.run_id for r in runs if r.info.status == "RUNNING"]}


def final_metrics(run) -> dict[str, float]:
    return {key: run.data.metrics[key] for key in mlflow_names.FINAL_METRICS if key in run.data.metrics}


def same_metrics(a: dict[str, float], b: dict[str, float]) -> bool:
    """Identical metrics, a NaN equal to a NaN (AUROC is NaN when an image has one class only)."""
    return a.keys() == b.keys() and all(a[k] == b[k] or (math.isnan(a[k]) and math.isnan(b[k])) for k in a)


def table_files(directory: Path) -> dict[str, str]:
    """The grid's paper tables (Markdown; ``cells`` lists run ids and times, so it is left out)."""
    return {p.name: p.read_text() for p in sorted(directory.glob("*.md"))}


def lineages(storage_uri: str, prefix: str, cell_ids: set[str]) -> dict[str, list]:
    """Per lineage folder of the storage named ``<prefix>...`` (the grid's; Tune's own folders are
    not): the cell id it ends with (None: no cell of the grid), its complete and incomplete checkpoint steps."""
    from pyarrow.fs import FileSelector, FileType  # pyarrow comes with Ray; only the chaos checks list folders

    store = parse_storage(storage_uri)
    found = {}
    for folder in store.filesystem.get_file_info(FileSelector(store.root, allow_not_found=True)):
        if folder.type != FileType.Directory:
            continue
        name = folder.path.rsplit("/", 1)[-1]
        if not name.startswith(prefix):
            continue
        complete, incomplete = [], []
        for child in store.filesystem.get_file_info(FileSelector(folder.path)):
            step = checkpoint_step(child.path.rsplit("/", 1)[-1])
            if step is not None:
                marker = store.filesystem.get_file_info(f"{child.path}/{COMPLETE_MARKER}")
                (complete if marker.type == FileType.File else incomplete).append(step)
        found[name] = [name.rsplit("-", 1)[-1] if name.rsplit("-", 1)[-1] in cell_ids else None,
                       sorted(complete), sorted(incomplete)]
    return found


def compare(client, reference: str, chaotic: str, *, cell_ids: set[str], tables: tuple[Path, Path],
            storage: str, lineage_prefix: str, max_steps: int | None) -> dict[str, str]:
    """Each check's verdict: ``"ok"`` or what differs."""
    ref, got = study(client, reference), study(client, chaotic)
    checks = {}
    finished = {c for c, runs in got["cells"].items() if any(r.info.status == "FINISHED" for r in runs)}
    ref_finished = {c for c, runs in ref["cells"].items() if any(r.info.status == "FINISHED" for r in runs)}
    checks["finished_cells"] = "ok" if finished == ref_finished == cell_ids else \
        f"chaos {len(finished)}, reference {len(ref_finished)}, grid {len(cell_ids)}"
    differ = [c for c in cell_ids if c in finished and c in ref_finished
              and not same_metrics(final_metrics(got["cells"][c][0]), final_metrics(ref["cells"][c][0]))]
    checks["final_metrics"] = "ok" if not differ else f"{len(differ)} cell(s) differ: " + "; ".join(
        f"{c}: {final_metrics(got['cells'][c][0])} vs {final_metrics(ref['cells'][c][0])}" for c in differ[:3])
    duplicates = {c: len(runs) for c, runs in got["cells"].items() if len(runs) > 1}
    checks["one_run_per_cell"] = "ok" if not duplicates else f"duplicates: {duplicates}"
    checks["none_running"] = "ok" if not got["running"] else f"RUNNING: {got['running']}"
    ref_tables, got_tables = (table_files(t) for t in tables)
    checks["tables"] = "ok" if ref_tables == got_tables and got_tables else \
        f"differ: {sorted(k for k in set(ref_tables) | set(got_tables) if ref_tables.get(k) != got_tables.get(k))}"
    checks["checkpoint_lineages"] = _lineage_verdict(lineages(storage, lineage_prefix, cell_ids), cell_ids, max_steps)
    return checks


def _lineage_verdict(found: dict[str, list], cell_ids: set[str], max_steps: int | None) -> str:
    """One lineage per cell, each ending with a complete checkpoint (at ``max_steps`` when known)."""
    orphaned = [name for name, (cell, _, _) in found.items() if cell is None]
    per_cell = Counter(cell for cell, _, _ in found.values() if cell)
    unfinished = [name for name, (cell, complete, _) in found.items()
                  if cell and (not complete or (max_steps and complete[-1] != max_steps))]
    problems = []
    if orphaned:
        problems.append(f"orphaned lineages {orphaned}")
    if any(n > 1 for n in per_cell.values()) or (per_cell and set(per_cell) != cell_ids):
        problems.append(f"lineages per cell {dict(per_cell)} for {len(cell_ids)} cells")
    if unfinished:
        problems.append(f"lineages without a final complete checkpoint {unfinished}")
    return "ok" if not problems else "; ".join(problems)


# ----------------------------------------------------------------------------- main
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", type=Path, default=ROOT / "jobs" / "specs" / "smoke.yaml")
    parser.add_argument("--seed", type=int, default=0, help="seeds the choice of what is killed and when")
    parser.add_argument("--interval", type=float, default=20.0, help="seconds between two kills")
    parser.add_argument("--max-kills", type=int, default=None, help="stop killing after this many")
    parser.add_argument("--burst", type=int, default=1,
                        help="processes of different kinds killed at once at every turn (services restarted together)")
    parser.add_argument("--kinds", default=",".join(KINDS),
                        help=f"what may be killed, of {','.join(KINDS + OPTIONAL_KINDS)} (default {','.join(KINDS)})")
    parser.add_argument("--only", action="append", default=[], metavar="DATASET=P1,P2",
                        help="reduce the grid to these datasets and partitions (repeatable)")
    parser.add_argument("--frameworks", default="", help="reduce the grid to these frameworks (comma-separated)")
    parser.add_argument("--heads", default="", help="reduce the grid to these head entries (comma-separated)")
    parser.add_argument("--protocols", default="", help="reduce the grid to these protocols (comma-separated)")
    parser.add_argument("--steps", type=int, default=12, help="schedule.max_steps of every cell")
    parser.add_argument("--checkpoint-every", type=int, default=4, help="schedule.checkpoint_every_steps")
    parser.add_argument("--home", type=Path, default=None, help="a stack home to use (default: a fresh one)")
    parser.add_argument("--timeout", type=float, default=3 * 3600, help="seconds for each of the two runs")
    parser.add_argument("--keep", action="store_true", help="leave the stack (and its home) up at the end")
    return parser.parse_args(argv)


def _split(text: str) -> list[str]:
    return [item for item in text.split(",") if item]


def _kinds(text: str) -> tuple[str, ...]:
    kinds = tuple(_split(text))
    unknown = [k for k in kinds if k not in KINDS + OPTIONAL_KINDS]
    if unknown or not kinds:
        raise ValueError(f"--kinds: unknown {unknown}, expected some of {list(KINDS + OPTIONAL_KINDS)}")
    return kinds


def write_specs(args: argparse.Namespace, work: Path, stack: Stack, tag: str) -> dict[str, Path]:
    """The reference's and the chaos run's spec files (own experiment and storage each)."""
    only = {name: _split(parts) for name, parts in (item.split("=", 1) for item in args.only)}
    paths = {}
    for role in ("reference", "chaos"):
        spec = chaos_spec(args.spec, experiment=f"chaos-{tag}-{role}", only=only or None,
                          storage=f"{stack.settings.checkpoint_storage}/chaos-{tag}/{role}",
                          frameworks=_split(args.frameworks) or None, heads=_split(args.heads) or None,
                          protocols=_split(args.protocols) or None,
                          steps=args.steps, checkpoint_every=args.checkpoint_every)
        paths[role] = work / f"{role}.yaml"
        paths[role].write_text(yaml.safe_dump(spec, sort_keys=False))
    return paths


def run_chaos(args: argparse.Namespace, stack: Stack, work: Path) -> dict:
    """The reference run, the chaos run and the comparison; returns the report."""
    from mlflow import MlflowClient  # heavy; imported once the stack is up

    tag = f"{args.seed}-{time.strftime('%H%M%S')}"
    specs = write_specs(args, work, stack, tag)
    env = driver_env(stack)
    os.environ.update({k: v for k, v in env.items() if k.startswith(("MLFLOW_", "AWS_"))})
    drivers = {role: Driver(specs[role], work / f"tables-{role}", env, work / f"{role}.log") for role in specs}
    reference_s = run_driver_to_the_end(drivers["reference"], args.timeout)
    chaos = Chaos(stack, drivers["chaos"], random.Random(args.seed), args.interval, _kinds(args.kinds),
                  burst=args.burst)
    try:
        chaos_s = chaos.run(args.timeout, args.max_kills)
    finally:
        if chaos.node is not None:
            chaos.node.kill()
    spec = load_spec(specs["chaos"])
    configs = expand(spec)
    checks = compare(MlflowClient(stack.settings.mlflow_uri), f"chaos-{tag}-reference", f"chaos-{tag}-chaos",
                     cell_ids={c.cell_id for c in configs}, tables=(work / "tables-reference", work / "tables-chaos"),
                     storage=spec.storage, lineage_prefix=f"chaos-{tag}-chaos-{grid_id(configs)}-",
                     max_steps=args.steps)
    return {"bench": "chaos", "spec": str(args.spec), "cells": len(configs), "seed": args.seed,
            "interval_s": args.interval, "burst": args.burst, "kills": dict(chaos.kills),
            "kills_total": sum(chaos.kills.values()),
            "resubmissions": dict(chaos.resubmissions), "submissions": drivers["chaos"].submissions,
            "reference_s": round(reference_s, 1), "chaos_s": round(chaos_s, 1),
            "time_lost_s": round(chaos_s - reference_s, 1), "checks": checks,
            "ok": all(v == "ok" for v in checks.values()), "events": chaos.events, "work": str(work),
            "load1": os.getloadavg()[0]}


def run_on_stack(args: argparse.Namespace) -> dict:
    """:func:`run_chaos` on the stack at ``args.home`` (default: a fresh one on free ports, removed
    afterwards unless ``args.keep``)."""
    home = args.home or reachable_home()
    stack = Stack(StackSettings.from_env(home=home) if args.home else stack_settings(home))
    try:
        stack.up()
        # run_chaos points this process's MLflow / AWS variables at the stack: restore them afterwards
        # (the test runs in pytest's process; later tests must not see a stack that is gone)
        with mock.patch.dict(os.environ):
            return run_chaos(args, stack, Path(tempfile.mkdtemp(prefix="chaos-", dir=home)))
    finally:
        if not args.keep:
            stack.down()
            if args.home is None:
                shutil.rmtree(stack.settings.ray_temp_dir, ignore_errors=True)
                shutil.rmtree(home, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    report = run_on_stack(args)
    print(json.dumps(report, indent=1))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
