"""Where the local stack lives and listens: :class:`StackSettings`, the stack-wide names, :class:`StackError`."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

#: Environment variables read by :meth:`StackSettings.from_env`: ``NPSEMISEG_STACK_<FIELD>``
ENV_PREFIX = "NPSEMISEG_STACK_"
#: The database role of the stack, the MLflow admin user, the PostgreSQL databases
DB_USER = "npsemiseg"
MLFLOW_ADMIN = "admin"
DATABASES = ("mlflow", "mlflow_auth", "optuna")


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
        """``postgresql+psycopg2://npsemiseg@127.0.0.1:<port>/<database>`` (SQLAlchemy); the password
        comes from ``PGPASSFILE``."""
        return f"postgresql+psycopg2://{DB_USER}@{self.host}:{self.postgres_port}/{database}"

    @property
    def ray_temp_dir(self) -> Path:
        """Ray's session directory: short (unix socket paths are limited to 107 bytes) and private to ``home``."""
        digest = hashlib.sha256(str(self.home).encode()).hexdigest()[:10]
        return Path(tempfile.gettempdir()) / f"npsemiseg-ray-{digest}"

    @property
    def secrets_dir(self) -> Path:
        """One 0600 file per secret, plus the files derived from them (client credentials, service configs)."""
        return self.home / "secrets"

    @property
    def aws_credentials_path(self) -> Path:
        """The S3 keys as an AWS shared-credentials file (boto3 and pyarrow's S3 read it)."""
        return self.secrets_dir / "aws_credentials"

    @property
    def pgpass_path(self) -> Path:
        """libpq's password file (``PGPASSFILE``) for the stack's database role."""
        return self.secrets_dir / "pgpass"
