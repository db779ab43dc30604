"""Process helpers of the local stack: ports, ``/proc`` scans, HTTP probes, and :class:`ManagedProcess`.

A service runs as one child in its own session (its process group id is its pid), recorded in
``<home>/run/<name>.pid`` and logging to ``<home>/logs/<name>.log``; stopping signals the whole
group, then SIGKILLs what is left after ``stop_timeout_s``.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from semiseg_platform.devstack.settings import StackError

logger = logging.getLogger(__name__)

#: Variables a service inherits from the caller's environment (nothing else: no stray credentials)
_INHERITED_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TZ", "TMPDIR", "USER", "LOGNAME")


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


def group_alive(pgid: int) -> bool:
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


def log_tail(path: Path, lines: int = 20) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return "(no log)"
    return "\n".join(text[-lines:]) or "(empty log)"


#: the stack's services listen on this machine: a proxy from the environment must never carry the probes
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def http_status(url: str, *, headers: dict[str, str] | None = None, timeout: float = 5.0) -> int | None:
    """The HTTP status of a GET (None when nothing answers), never through a proxy."""
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with _DIRECT.open(request, timeout=timeout) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code
    except (urllib.error.URLError, OSError):
        return None


def basic_auth_header(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def run_checked(command: list[str], what: str, timeout: float = 900, env: dict[str, str] | None = None) -> None:
    """Run ``command`` to its end; :class:`StackError` with the tail of its output when it fails."""
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env, check=False)
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).splitlines()[-15:])
        raise StackError(f"{what} failed (exit {result.returncode}): {' '.join(command)}\n{tail}")


def venv_bin(name: str) -> Path:
    """``name`` next to this interpreter (the environment's ``bin``)."""
    return Path(sys.executable).parent / name


def executable(name: str) -> str:
    """``name`` next to this interpreter, else on PATH (else the bare name: the spawn then fails naming it)."""
    local = venv_bin(name)
    return str(local) if local.is_file() else (shutil.which(name) or name)


def has_executable(name: str) -> bool:
    return venv_bin(name).is_file() or shutil.which(name) is not None


def as_user(command: list[str], user: str | None) -> list[str]:
    """``command`` run as ``user`` (``setpriv``; unchanged when ``user`` is None)."""
    if user is None:
        return command
    return ["setpriv", f"--reuid={user}", f"--regid={user}", "--init-groups", "--", *command]


def base_env() -> dict[str, str]:
    """A service's environment: a few of the caller's variables, this interpreter's ``bin`` first on PATH."""
    env = {key: os.environ[key] for key in _INHERITED_ENV if key in os.environ}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "/usr/bin:/bin")])
    return env


class ManagedProcess:
    """One service's process under ``home``: its pid file, its log, spawn in a new session, stop by group.

    ``marker`` is a string the process's command line or working directory contains: a recorded
    pid whose process lacks it was reused by another program and does not count as running.
    """

    def __init__(self, name: str, home: Path, marker: str) -> None:
        self.name = name
        self.home = home
        self.marker = marker
        self.log_path = home / "logs" / f"{name}.log"
        self.pid_path = home / "run" / f"{name}.pid"
        self._child: subprocess.Popen | None = None  # the process spawned by this object (its exit code)

    def pid(self) -> int | None:
        """The recorded pid if that process still runs, else None."""
        if not self.pid_path.is_file():
            return None
        try:
            pid = int(self.pid_path.read_text().split()[0])
        except (ValueError, IndexError):
            return None
        return pid if process_alive(pid, self.marker) else None

    def spawn(self, command: list[str], env: dict[str, str], *, cwd: Path | None = None, user: str | None = None) -> int:
        """Start ``command`` in its own session, output appended to the log; records and returns its pid."""
        with open(self.log_path, "ab") as handle:
            handle.write(f"\n--- {time.strftime('%Y-%m-%d %H:%M:%S')} starting {self.name}\n".encode())
            handle.flush()
            self._child = subprocess.Popen(as_user(command, user), stdout=handle, stderr=subprocess.STDOUT,
                                           stdin=subprocess.DEVNULL, env=env, cwd=cwd or self.home, start_new_session=True)
        self.pid_path.write_text(f"{self._child.pid}\n")
        logger.info("%s: spawned pid %d (log %s)", self.name, self._child.pid, self.log_path)
        return self._child.pid

    def exit_code(self) -> int | None:
        """The exit status of the process this object spawned, None while it runs (or if it spawned none)."""
        return None if self._child is None else self._child.poll()

    def log_excerpt(self) -> str:
        """``log <path>:`` and the last lines of the log (for error messages)."""
        return f"log {self.log_path}:\n{log_tail(self.log_path)}"

    def stop(self, first_signal: int, timeout_s: float) -> bool:
        """Send ``first_signal`` to the process group, SIGKILL what is left after ``timeout_s``; True if it ran."""
        pid = self.pid()
        if pid is None:
            self.pid_path.unlink(missing_ok=True)
            return False
        logger.info("%s: stopping pid %d", self.name, pid)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, first_signal)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and group_alive(pid):
            time.sleep(0.2)
        if group_alive(pid):
            logger.warning("%s: still running %.0f s after signal %d, killing its process group",
                           self.name, timeout_s, first_signal)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            time.sleep(0.5)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        self.pid_path.unlink(missing_ok=True)
        return True
