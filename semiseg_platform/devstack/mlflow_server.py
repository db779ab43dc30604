"""The MLflow tracking server: basic auth, ``--allowed-hosts``, artifacts proxied to the stack's S3.

Backend store and auth users in PostgreSQL (``mlflow``, ``mlflow_auth``), artifacts under
``s3://<bucket>/mlflow``; the admin password and Flask secret come from the stack's secrets
through the server's environment.
"""

from __future__ import annotations

import sys
from typing import ClassVar

from semiseg_platform.devstack.client import S3_REGION
from semiseg_platform.devstack.process import base_env, basic_auth_header, http_status
from semiseg_platform.devstack.secrets import write_private
from semiseg_platform.devstack.service import Requirement, Service
from semiseg_platform.devstack.settings import MLFLOW_ADMIN


class MlflowServer(Service):
    """The tracking server of the stack (see the module docs)."""

    name = "mlflow"
    needs = ("postgres", "seaweedfs")  # its backend store (database created) and artifact bucket
    port_settings: ClassVar[dict[str, str]] = {"mlflow": "mlflow_port"}
    requirements = (Requirement("flask_wtf", "mlflow[auth]", module=True),
                    Requirement("psycopg2", "psycopg2-binary", module=True))

    @property
    def endpoint(self) -> str:
        return self.settings.mlflow_uri

    def server_env(self) -> dict[str, str]:
        """The tracking server's environment: S3 credentials for proxied artifacts, the auth settings."""
        s = self.settings
        auth_ini = s.home / "mlflow" / "basic_auth.ini"
        write_private(auth_ini, "[mlflow]\ndefault_permission = READ\n"
                                f"database_uri = {s.database_uri('mlflow_auth')}\n"
                                f"admin_username = {MLFLOW_ADMIN}\n"
                                "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
                                # PBKDF2 per request is costly on a small machine: cache verified credentials
                                "auth_cache_ttl_seconds = 60\n")
        return {**base_env(), "PGPASSFILE": str(s.pgpass_path), "MLFLOW_S3_ENDPOINT_URL": s.s3_endpoint,
                "AWS_SHARED_CREDENTIALS_FILE": str(s.aws_credentials_path), "AWS_DEFAULT_REGION": S3_REGION,
                "MLFLOW_AUTH_CONFIG_PATH": str(auth_ini),
                # no GenAI job runner: it forks seven worker processes the platform never uses
                "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
                "MLFLOW_AUTH_ADMIN_PASSWORD": self.secrets.get("mlflow_admin_password"),
                "MLFLOW_FLASK_SERVER_SECRET_KEY": self.secrets.get("mlflow_flask_secret")}

    def start(self) -> None:
        s = self.settings
        command = [sys.executable, "-m", "mlflow", "server", "--host", s.host, "--port", str(s.mlflow_port), "--workers", "1",
                   "--backend-store-uri", s.database_uri("mlflow"), "--artifacts-destination", s.artifact_destination,
                   "--app-name", "basic-auth",
                   "--allowed-hosts", f"{s.host}:{s.mlflow_port},localhost:{s.mlflow_port}"]
        env = self.server_env()  # writes basic_auth.ini, creating the server's working directory
        self.process.spawn(command, env, cwd=s.home / "mlflow")

    def probe(self) -> bool:
        url = f"{self.settings.mlflow_uri}/api/2.0/mlflow/experiments/search?max_results=1"
        auth = basic_auth_header(MLFLOW_ADMIN, self.secrets.get("mlflow_admin_password"))
        return http_status(url, headers=auth) == 200
