"""The Ray head: token authentication, dashboard and Jobs API on 127.0.0.1, the stack's client settings.

Its environment carries :func:`~semiseg_platform.devstack.client.client_env`, so jobs
submitted to it reach MLflow and S3 without credentials in the submission. Its session
directory is ``settings.ray_temp_dir`` (short: unix socket paths are limited to 107 bytes).
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from semiseg_platform.devstack.client import client_env
from semiseg_platform.devstack.process import base_env, executable, http_status
from semiseg_platform.devstack.service import Requirement, Service


class RayHead(Service):
    """The Ray head of the stack (see the module docs)."""

    name = "ray"
    port_settings: ClassVar[dict[str, str]] = {"gcs": "ray_port", "dashboard": "ray_dashboard_port",
                     "dashboard agent": "ray_dashboard_agent_port", "client server": "ray_client_port"}
    requirements = (Requirement("ray", None),)

    @property
    def endpoint(self) -> str:
        return self.settings.ray_dashboard_url

    def pid_marker(self) -> str:
        return str(self.settings.ray_temp_dir)  # `ray start` runs from the caller's directory, not home

    def log_files(self) -> list[Path]:
        """Ray's session logs (every process of the head writes its own)."""
        ray_logs = self.settings.ray_temp_dir / "session_latest" / "logs"
        return sorted(p for p in ray_logs.rglob("*") if p.is_file()) if ray_logs.is_dir() else []

    def start(self) -> None:
        s = self.settings
        # no Serve replicas to drain on SIGTERM: stop at once (Ray's default waits up to 30 s)
        env = {**base_env(), **client_env(s, self.secrets, include_secrets=True), "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0"}
        command = [
            executable("ray"),
            "start",
            "--head",
            "--block",
            "--disable-usage-stats",
            "--num-cpus",
            f"{s.ray_num_cpus:g}",
            "--num-gpus",
            "0",
            "--node-ip-address",
            s.host,
            "--port",
            str(s.ray_port),
            "--include-dashboard",
            "true",
            "--dashboard-host",
            s.host,
            "--dashboard-port",
            str(s.ray_dashboard_port),
            "--dashboard-agent-listen-port",
            str(s.ray_dashboard_agent_port),
            "--ray-client-server-port",
            str(s.ray_client_port),
            "--temp-dir",
            str(s.ray_temp_dir),
        ]
        self.process.spawn(command, env)

    def probe(self) -> bool:
        token = self.secrets.get("ray_token")
        return http_status(f"{self.settings.ray_dashboard_url}/api/jobs/", headers={"Authorization": f"Bearer {token}"}) == 200
