"""The orchestrator of the local stack: starts, checks and stops the registered services in order.

:class:`Stack` knows services only through :class:`~semiseg_platform.devstack.service.Service`:
it starts them in waves (every service whose ``needs`` are healthy at once: PostgreSQL, SeaweedFS and
the Ray head together, then the MLflow server), waits for their health checks side by side, and
stops them in reverse registration order. A port already
taken, a missing binary or a service that does not come up raises
:class:`~semiseg_platform.devstack.settings.StackError` naming it (with the tail of its log),
after stopping the services the same call had already started.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from npsemiseg._registry import Registry
from semiseg_platform.devstack.client import client_env, export_lines, s3_client, write_client_files
from semiseg_platform.devstack.mlflow_server import MlflowServer
from semiseg_platform.devstack.postgres import Postgres
from semiseg_platform.devstack.ray_head import RayHead
from semiseg_platform.devstack.seaweedfs import SeaweedFS
from semiseg_platform.devstack.secrets import Secrets
from semiseg_platform.devstack.service import Service, ServiceStatus, ensure_installed
from semiseg_platform.devstack.settings import StackError, StackSettings

logger = logging.getLogger(__name__)

#: The service classes of the stack, in start order (stopped in reverse)
SERVICE_TYPES: Registry[type[Service]] = Registry("service")
for _service_type in (Postgres, SeaweedFS, MlflowServer, RayHead):
    SERVICE_TYPES.add(_service_type.name, _service_type)
#: Service names in start order
SERVICES = SERVICE_TYPES.names()


class Stack:
    """The services of the local stack under ``settings.home`` (see the package docs)."""

    def __init__(self, settings: StackSettings | None = None) -> None:
        self.settings = settings or StackSettings.from_env()
        self.home = self.settings.home
        self.secrets = Secrets(self.home)
        #: the services by name, in start order
        self.services: dict[str, Service] = {name: kind(self.settings, self.secrets) for name, kind in SERVICE_TYPES.items()}
        #: seconds from spawn to healthy, per service started by this object
        self.startup_seconds: dict[str, float] = {}
        #: seconds from the first signal to the process group's end, per service stopped by :meth:`down`
        self.stop_seconds: dict[str, float] = {}

    def service(self, name: str) -> Service:
        """The service called ``name``; ``ValueError`` listing the services otherwise."""
        if name not in self.services:
            raise ValueError(f"service: unknown name {name!r}, expected one of {list(self.services)}")
        return self.services[name]

    # --------------------------------------------------------------------- files
    @property
    def aws_credentials_path(self) -> Path:
        return self.settings.aws_credentials_path

    @property
    def pgpass_path(self) -> Path:
        return self.settings.pgpass_path

    def log_files(self) -> list[Path]:
        """Every log the stack's services wrote (their own and, e.g., Ray's session logs)."""
        files = sorted((self.home / "logs").glob("*.log"))
        for service in self.services.values():
            files += service.log_files()
        return files

    # --------------------------------------------------------------------- client side
    def client_env(self, *, include_secrets: bool = True) -> dict[str, str]:
        """Environment of a client of this stack (see :func:`semiseg_platform.devstack.client.client_env`)."""
        return client_env(self.settings, self.secrets, include_secrets=include_secrets)

    def export_lines(self) -> list[str]:
        """Shell ``export`` lines for a client; secrets appear as files or ``$(cat <file>)``, never as values."""
        return export_lines(self.settings, self.secrets)

    def write_client_files(self) -> None:
        """The secret files clients read (AWS shared credentials, libpq's password file), mode 0600."""
        write_client_files(self.settings, self.secrets)

    def s3_client(self):
        """A boto3 client of the stack's S3 store."""
        return s3_client(self.settings, self.secrets)

    # --------------------------------------------------------------------- state
    def healthy(self, service: str) -> bool:
        """One health probe of ``service`` (a real request through its protocol, authenticated)."""
        return self.service(service).healthy()

    def pid(self, service: str) -> int | None:
        """The recorded pid of ``service`` if that process still runs, else None."""
        return self.service(service).pid()

    def status(self) -> list[ServiceStatus]:
        return [service.status() for service in self.services.values()]

    # --------------------------------------------------------------------- start / stop
    def up(self, services: tuple[str, ...] | None = None) -> list[str]:
        """Start ``services`` (default: all) not yet running, in waves of services whose needs are
        met, and wait until each is healthy.

        Returns the names started by this call. On any failure the services this call started
        are stopped again and :class:`StackError` names the one that failed.
        """
        selected = {self.service(name).name for name in (self.services if services is None else services)}
        ensure_installed(self.services.values(), self.settings.install_missing)
        self._prepare_home()
        pending = [s for name, s in self.services.items() if name in selected and s.pid() is None]
        started: list[Service] = []
        try:
            while pending:
                waiting_for = {service.name for service in pending}
                wave = [service for service in pending if not waiting_for.intersection(service.needs)]
                if not wave:
                    raise StackError(f"services that need each other: {sorted(waiting_for)}")
                for service in wave:
                    service.check_ports()
                began = time.monotonic()
                for service in wave:
                    logger.info("starting %s", service.name)
                    service.start()
                    started.append(service)
                with ThreadPoolExecutor(len(wave), thread_name_prefix="stack-up") as pool:
                    list(pool.map(self._until_healthy, wave, [began] * len(wave)))
                pending = [service for service in pending if service not in wave]
        except BaseException:
            for service in reversed(started):
                with contextlib.suppress(Exception):
                    service.stop()
            raise
        return [service.name for service in started]

    def _until_healthy(self, service: Service, began: float) -> None:
        """Wait for ``service``'s health check, record its start-up time, run its after-start hook."""
        service.wait_healthy()
        self.startup_seconds[service.name] = time.monotonic() - began
        logger.info("%s healthy after %.1f s", service.name, self.startup_seconds[service.name])
        service.after_start()

    def _prepare_home(self) -> None:
        """The home's directories, the secrets (generated on first start) and the clients' credential files."""
        self.home.mkdir(parents=True, exist_ok=True)
        os.chmod(self.home, 0o711)  # others may traverse (the postgres user), not list
        for sub in ("logs", "run"):
            (self.home / sub).mkdir(exist_ok=True)
        self.secrets.ensure()
        self.write_client_files()

    def down(self) -> list[str]:
        """Stop every running service (reverse order); returns the names stopped."""
        stopped = []
        for service in reversed(self.services.values()):
            began = time.monotonic()
            if service.stop():
                stopped.append(service.name)
                self.stop_seconds[service.name] = time.monotonic() - began
        return stopped

    def restart(self, service: str) -> None:
        """Stop and start one service (the fault tests restart MLflow in the middle of a grid)."""
        self.stop(service)
        self.up((service,))

    def stop(self, service: str) -> bool:
        """Stop ``service`` by its pid (its whole process group); True if it was running."""
        return self.service(service).stop()
