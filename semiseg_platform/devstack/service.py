"""The one interface every service of the local stack implements, and the install check over them.

A :class:`Service` declares its name, its ports (role -> settings field), what it needs
installed and the signal that stops it, and implements :meth:`Service.start` (spawn its
process), :meth:`Service.probe` (one real, authenticated request) and optionally
:meth:`Service.after_start` (create databases, a bucket). The orchestrator
(:class:`semiseg_platform.devstack.stack.Stack`) loops over services through this interface only.
"""

from __future__ import annotations

import importlib
import logging
import signal
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from semiseg_platform.devstack.process import ManagedProcess, has_executable, port_in_use, run_checked
from semiseg_platform.devstack.secrets import Secrets
from semiseg_platform.devstack.settings import ENV_PREFIX, StackError, StackSettings

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Requirement:
    """Something a service runs: an executable (next to this interpreter or on PATH) or an importable
    Python module, and the pip requirement that provides it (None: not installable from here)."""

    name: str
    pip: str | None
    module: bool = False

    def present(self) -> bool:
        if not self.module:
            return has_executable(self.name)
        try:
            importlib.import_module(self.name)
        except ImportError:
            return False
        return True

    def describe_missing(self, service: str) -> str:
        if self.module:
            return f"the Python module {self.name!r} cannot be imported"
        return f"{service}: the '{self.name}' executable is not next to {sys.executable} nor on PATH"


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


class Service(ABC):
    """One service of the stack: its ports, health check, start and stop (see the module docs)."""

    #: the service's name (pid file, log file, status line, error messages)
    name: ClassVar[str]
    #: the TCP ports it listens on: role -> the :class:`StackSettings` field holding the port
    port_settings: ClassVar[dict[str, str]]
    #: executables and Python modules it needs
    requirements: ClassVar[tuple[Requirement, ...]] = ()
    #: the first signal :meth:`stop` sends to its process group
    stop_signal: ClassVar[int] = signal.SIGTERM
    #: the services that must be healthy before it starts (the others start beside it)
    needs: ClassVar[tuple[str, ...]] = ()

    def __init__(self, settings: StackSettings, secrets: Secrets) -> None:
        self.settings = settings
        self.secrets = secrets
        self.process = ManagedProcess(self.name, settings.home, self.pid_marker())

    # --------------------------------------------------------------------- what each service declares
    @property
    @abstractmethod
    def endpoint(self) -> str:
        """Where clients reach it (the status line)."""

    @abstractmethod
    def start(self) -> None:
        """Spawn the service's process (``self.process.spawn``); returns without waiting for health."""

    @abstractmethod
    def probe(self) -> bool:
        """One health probe: a real request through the service's protocol, authenticated."""

    def install(self) -> None:  # noqa: B027 - an optional hook: most services need no system package
        """Install what pip cannot (system packages); nothing by default."""

    def after_start(self) -> None:  # noqa: B027 - an optional hook: most services create nothing
        """Create what clients expect once the service is healthy (databases, a bucket); nothing by default."""

    def pid_marker(self) -> str:
        """A string the service's command line or working directory contains (pid reuse guard)."""
        return str(self.settings.home)

    def ports(self) -> dict[str, int]:
        """The TCP ports the service listens on, by role."""
        return {role: getattr(self.settings, field) for role, field in self.port_settings.items()}

    def port_setting(self, role: str) -> str:
        """The :class:`StackSettings` field that sets the port of ``role``."""
        return self.port_settings[role]

    def log_files(self) -> list[Path]:
        """The service's logs besides ``<home>/logs/<name>.log``."""
        return []

    # --------------------------------------------------------------------- the same for every service
    def healthy(self) -> bool:
        """:meth:`probe`, with any failure meaning "not healthy (yet)"."""
        try:
            return bool(self.probe())
        except Exception:  # noqa: BLE001 - any failure of the probe means "not healthy yet"
            return False

    def pid(self) -> int | None:
        return self.process.pid()

    def status(self) -> ServiceStatus:
        pid = self.pid()
        return ServiceStatus(self.name, pid, pid is not None, pid is not None and self.healthy(), self.endpoint)

    def check_ports(self) -> None:
        """:class:`StackError` naming the first port already taken and the setting that moves it."""
        for role, port in self.ports().items():
            if port_in_use(self.settings.host, port):
                raise StackError(f"{self.name}: port {port} ({role}) on {self.settings.host} is already in use; "
                                 f"set {ENV_PREFIX}{self.port_setting(role).upper()} to a free port")

    def wait_healthy(self) -> None:
        """Poll :meth:`probe` until healthy; :class:`StackError` with the log's tail if it exits or times out."""
        deadline = time.monotonic() + self.settings.start_timeout_s
        while time.monotonic() < deadline:
            code = self.process.exit_code()
            if code is not None:
                raise StackError(f"{self.name} exited with status {code} while starting; {self.process.log_excerpt()}")
            if self.healthy():
                return
            time.sleep(0.5)
        raise StackError(f"{self.name} did not become healthy within {self.settings.start_timeout_s:.0f} s; "
                         f"{self.process.log_excerpt()}")

    def stop(self) -> bool:
        """Stop the service by its pid (its whole process group); True if it was running."""
        return self.process.stop(self.stop_signal, self.settings.stop_timeout_s)


def ensure_installed(services: Iterable[Service], install_missing: bool) -> None:
    """Check (and with ``install_missing``, install) what ``services`` run; :class:`StackError` naming what is missing."""
    services = list(services)
    for service in services:
        service.install()
    needed = [(service.name, requirement) for service in services for requirement in service.requirements]
    missing: dict[Requirement, str] = {}  # requirement -> the first service needing it
    for name, requirement in needed:
        if requirement.pip and requirement not in missing and not requirement.present():
            missing[requirement] = name
    if missing:
        packages = list(dict.fromkeys(requirement.pip for requirement in missing))
        if not install_missing:
            absent = "; ".join(requirement.describe_missing(name) for requirement, name in missing.items())
            raise StackError(f"{absent}. Install {packages}: pip install -e '.[stack]'")
        logger.info("installing %s", packages)
        run_checked([sys.executable, "-m", "pip", "install", "--quiet", *packages], f"pip install {' '.join(packages)}")
    for _name, requirement in needed:
        if not requirement.module and not requirement.present():
            raise StackError(f"{requirement.name}: executable not found next to {sys.executable} or on PATH")
