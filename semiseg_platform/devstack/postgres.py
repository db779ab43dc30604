"""PostgreSQL (Debian's server): MLflow's backend store, the MLflow auth app's users and Optuna studies.

Runs from ``<home>/postgres/data`` (``initdb`` on first start, password authentication only);
when run as root it runs as ``settings.postgres_user``. The databases in
:data:`~semiseg_platform.devstack.settings.DATABASES` are created once it is healthy.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import subprocess
from pathlib import Path
from typing import ClassVar

from semiseg_platform.devstack.process import as_user, base_env, run_checked
from semiseg_platform.devstack.secrets import write_private
from semiseg_platform.devstack.service import Requirement, Service
from semiseg_platform.devstack.settings import (
    DATABASES,
    DB_USER,
    ENV_PREFIX,
    StackError,
)

_NOT_INSTALLED = "postgres: the PostgreSQL server (initdb, postgres) is not installed"


def find_postgres_bindir() -> Path | None:
    """The directory holding ``initdb`` and ``postgres`` (Debian: /usr/lib/postgresql/<v>/bin), or None."""
    candidates = sorted(
        glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(Path(p).parent.name) if Path(p).parent.name.isdigit() else 0
    )
    for directory in reversed(candidates):
        if (Path(directory) / "initdb").is_file() and (Path(directory) / "postgres").is_file():
            return Path(directory)
    initdb = shutil.which("initdb")
    if initdb and (Path(initdb).resolve().parent / "postgres").is_file():
        return Path(initdb).resolve().parent
    return None


class Postgres(Service):
    """The PostgreSQL server of the stack (see the module docs)."""

    name = "postgres"
    port_settings: ClassVar[dict[str, str]] = {"postgres": "postgres_port"}
    requirements = (Requirement("psycopg2", "psycopg2-binary", module=True),)
    # SIGINT is the "fast" shutdown (SIGTERM would wait for clients to leave)
    stop_signal = signal.SIGINT

    @property
    def endpoint(self) -> str:
        return f"postgresql://{self.settings.host}:{self.settings.postgres_port}"

    @property
    def pgdata(self) -> Path:
        return self.settings.home / "postgres" / "data"

    @property
    def run_as(self) -> str | None:
        """The user the server runs as: ``settings.postgres_user`` under root (PostgreSQL refuses root), else None."""
        return self.settings.postgres_user if os.geteuid() == 0 else None

    def log_files(self) -> list[Path]:
        return sorted(self.pgdata.glob("log/*"))

    def install(self) -> None:
        """Debian's ``postgresql`` package via apt-get (root only) when the server is missing."""
        if find_postgres_bindir() is not None:
            return
        if not self.settings.install_missing:
            raise StackError(f"{_NOT_INSTALLED}; install Debian's 'postgresql' package")
        if os.geteuid() != 0 or shutil.which("apt-get") is None:
            raise StackError(
                f"{_NOT_INSTALLED} and cannot be installed here (needs root and apt-get); install Debian's 'postgresql' package"
            )
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for command in (
            ["apt-get", "update", "-qq"],
            ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "postgresql"],
        ):
            result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900, check=False)
            if result.returncode != 0:
                raise StackError(f"postgres: {' '.join(command)} failed: {result.stderr.strip()[-500:]}")
        if find_postgres_bindir() is None:
            raise StackError("postgres: apt-get installed 'postgresql' but initdb/postgres were not found")

    def start(self) -> None:
        s = self.settings
        bindir = find_postgres_bindir()
        if bindir is None:
            raise StackError(f"{_NOT_INSTALLED}; install Debian's 'postgresql' package")
        if not (self.pgdata / "PG_VERSION").is_file():
            self._initdb(bindir)
        command = [
            str(bindir / "postgres"),
            "-D",
            str(self.pgdata),
            "-p",
            str(s.postgres_port),
            "-c",
            f"listen_addresses={s.host}",
            "-c",
            f"unix_socket_directories={self.pgdata}",
            "-c",
            "shared_buffers=16MB",
            "-c",
            "max_connections=60",
            "-c",
            "logging_collector=off",
        ]
        self.process.spawn(command, base_env(), user=self.run_as)

    def _initdb(self, bindir: Path) -> None:
        user = self.run_as
        self.pgdata.mkdir(parents=True, exist_ok=True)
        os.chmod(self.pgdata.parent, 0o700)
        os.chmod(self.pgdata, 0o700)
        if user is not None:
            shutil.chown(self.pgdata.parent, user=user, group=user)
            shutil.chown(self.pgdata, user=user, group=user)
            check = subprocess.run(as_user(["test", "-w", str(self.pgdata)], user), capture_output=True, check=False)
            if check.returncode != 0:
                raise StackError(
                    f"postgres: user {user!r} cannot reach {self.pgdata} (a parent directory is not "
                    f"traversable by others); set {ENV_PREFIX}HOME to a directory it can reach"
                )
        pwfile = self.pgdata.parent / "initdb.pw"
        write_private(pwfile, self.secrets.get("postgres_password") + "\n", owner=user)
        try:
            command = [
                str(bindir / "initdb"),
                "-D",
                str(self.pgdata),
                "-U",
                DB_USER,
                f"--pwfile={pwfile}",
                "--auth-host=scram-sha-256",
                "--auth-local=scram-sha-256",
                "-E",
                "UTF8",
                "--no-instructions",
            ]
            run_checked(as_user(command, user), "postgres: initdb", timeout=300)
        finally:
            pwfile.unlink(missing_ok=True)

    def _connect(self, timeout_s: int):
        """A connection to the maintenance database ``postgres`` as the stack's role."""
        import psycopg2  # the optional `stack` extra: `stack up` installs it when missing

        return psycopg2.connect(
            host=self.settings.host,
            port=self.settings.postgres_port,
            user=DB_USER,
            dbname="postgres",
            password=self.secrets.get("postgres_password"),
            connect_timeout=timeout_s,
        )

    def probe(self) -> bool:
        with contextlib.closing(self._connect(3)):
            return True

    def after_start(self) -> None:
        """Create the databases that do not exist yet."""
        connection = self._connect(5)
        connection.autocommit = True
        try:
            with connection.cursor() as cursor:
                for database in DATABASES:
                    cursor.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,))
                    if cursor.fetchone() is None:
                        cursor.execute(f'CREATE DATABASE "{database}"')
        finally:
            connection.close()
