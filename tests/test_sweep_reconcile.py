"""Every submission reconciles the study's earlier ones: runs left RUNNING by a dead driver or cell
process end KILLED with the reason, an owner on another host only once its heartbeat is stale,
and tables are replaced atomically (real MLflow store, real processes killed with SIGKILL)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow import MlflowClient

from semiseg_platform.storage import atomic_write
from semiseg_platform.sweeps.submission import open_parent, open_submission
from semiseg_platform.tracking import Heartbeat, mlflow_names
from semiseg_platform.tracking.store import REMOTE_STALE_AFTER_S, last_heard_ms, reconcile_submission

#: A grid driver: opens a submission's parent run, says so, then works forever (until SIGKILL)
DRIVER = """
import sys, time
from semiseg_platform.sweeps.submission import open_parent, open_submission
from semiseg_platform.tracking import ending_run
sub = open_submission(sys.argv[1], sys.argv[2], "reconcile")
parent = open_parent(sub, kind="grid", name="g", sweep_id="gid1", spec={}, params={}, to_run=1)
with ending_run(sub.client, parent):
    print(parent, flush=True)
    time.sleep(600)
"""


def _driver(tmp_path: Path, uri: str) -> tuple[subprocess.Popen, str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH", "")])}
    process = subprocess.Popen([sys.executable, "-c", DRIVER, str(tmp_path / "ray_results"), uri],
                               stdout=subprocess.PIPE, text=True, env=env)
    return process, process.stdout.readline().strip()


def _other_host_run(client: MlflowClient, experiment_id: str, heard_s_ago: float, **tags: str) -> str:
    run = client.create_run(experiment_id, start_time=int((time.time() - 2 * heard_s_ago) * 1000), tags={
        mlflow_names.GRID_ID: "gid1", mlflow_names.OWNER_HOST: "elsewhere.example", mlflow_names.OWNER_PID: "1",
        mlflow_names.HEARTBEAT: f"{time.time() - heard_s_ago:.0f}", **tags})
    return run.info.run_id


def test_a_killed_drivers_parent_run_ends_killed_on_the_next_submission(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlruns.db"
    driver, killed_parent = _driver(tmp_path, uri)
    assert killed_parent
    client = MlflowClient(uri)
    live_driver, live_parent = _driver(tmp_path, uri)  # a concurrent submission, alive
    try:
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait(timeout=30)
        assert client.get_run(killed_parent).info.status == "RUNNING"  # the bug: RUNNING forever
        sub = open_submission(str(tmp_path / "ray_results"), uri, "reconcile")
        cell = client.create_run(sub.experiment_id, tags={
            mlflow_names.GRID_ID: "gid1", mlflow_names.KIND: mlflow_names.KIND_CELL,
            mlflow_names.OWNER_HOST: socket.gethostname(), mlflow_names.OWNER_PID: str(driver.pid),
            mlflow_names.OWNER_START: "1"}).info.run_id
        stale = _other_host_run(client, sub.experiment_id, REMOTE_STALE_AFTER_S + 60)
        fresh = _other_host_run(client, sub.experiment_id, 5)
        other_grid = client.create_run(sub.experiment_id, tags={mlflow_names.GRID_ID: "gid2", mlflow_names.OWNER_PID: "1"})

        new_parent = open_parent(sub, kind="grid", name="g", sweep_id="gid1", spec={}, params={}, to_run=1)

        for run_id in (killed_parent, cell):
            run = client.get_run(run_id)
            assert run.info.status == "KILLED"
            assert run.data.tags[mlflow_names.ERROR].startswith("orphaned: owner process")
        assert client.get_run(stale).info.status == "KILLED"
        assert "silent for over" in client.get_run(stale).data.tags[mlflow_names.ERROR]
        for run_id in (fresh, live_parent, new_parent, other_grid.info.run_id):
            assert client.get_run(run_id).info.status == "RUNNING"
        assert client.get_run(new_parent).data.tags[mlflow_names.OWNER_PID] == str(os.getpid())
    finally:
        live_driver.kill()
        live_driver.wait(timeout=30)


def test_children_of_a_submission_whose_trials_are_over_end_killed(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlruns.db"
    sub = open_submission(str(tmp_path / "ray_results"), uri, "reconcile")
    parent = open_parent(sub, kind="grid", name="g", sweep_id="gid1", spec={}, params={}, to_run=1)
    client = sub.client
    child = client.create_run(sub.experiment_id, tags={mlflow_names.GRID_ID: "gid1", mlflow_names.PARENT_RUN_ID: parent,
                                                       mlflow_names.OWNER_HOST: socket.gethostname(),
                                                       mlflow_names.OWNER_PID: str(os.getpid())}).info.run_id
    assert reconcile_submission(client, [sub.experiment_id], "gid1") == []  # its owner lives
    assert reconcile_submission(client, [sub.experiment_id], "gid1", ended_parent=parent) == [child]
    assert client.get_run(child).info.status == "KILLED"
    assert client.get_run(parent).info.status == "RUNNING"


def test_a_submission_with_nothing_to_run_opens_no_parent_but_reconciles(tmp_path):
    """A re-submission whose cells all finished adds no parent run to the experiment; the earlier
    submission's parent its dead driver left RUNNING still ends KILLED."""
    uri = f"sqlite:///{tmp_path}/mlruns.db"
    sub = open_submission(str(tmp_path / "ray_results"), uri, "reconcile")
    orphan = _other_host_run(sub.client, sub.experiment_id, REMOTE_STALE_AFTER_S + 60,
                             **{mlflow_names.KIND: mlflow_names.KIND_GRID})

    assert open_parent(sub, kind="grid", name="g", sweep_id="gid1", spec={}, params={}, to_run=0) is None

    assert [run.info.run_id for run in sub.client.search_runs([sub.experiment_id])] == [orphan]
    assert sub.client.get_run(orphan).info.status == "KILLED"


def test_heartbeat_stamps_the_run(tmp_path):
    client = MlflowClient(f"sqlite:///{tmp_path}/mlruns.db")
    run = client.create_run(client.create_experiment("beat"))
    assert last_heard_ms(run) == run.info.start_time
    began = time.time()
    with Heartbeat(client, run.info.run_id, interval_s=0.2):
        time.sleep(1.5)
    ended = time.time()
    beat = float(client.get_run(run.info.run_id).data.tags[mlflow_names.HEARTBEAT])
    assert began - 1e-3 <= beat <= ended + 1e-3  # a beat's stamp (to the millisecond) from inside the block


def test_atomic_write_leaves_the_old_file_when_the_writer_dies(tmp_path):
    path = atomic_write(tmp_path / "table.csv", lambda p: p.write_text("a,b\n1,2\n"))
    assert path.read_text() == "a,b\n1,2\n"

    def dies_half_way(p: Path) -> None:
        p.write_text("a,b\n3")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        atomic_write(path, dies_half_way)
    assert path.read_text() == "a,b\n1,2\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["table.csv"]
