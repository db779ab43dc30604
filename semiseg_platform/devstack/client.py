"""The client side of the local stack: the environment of its clients, the credential files they read, an S3 client.

The Ray head's environment carries :func:`client_env`, so jobs submitted to it reach MLflow and
S3 without credentials in the submission; ``npsemiseg stack env`` prints :func:`export_lines`.
"""

from __future__ import annotations

from semiseg_platform.devstack.secrets import Secrets, write_private
from semiseg_platform.devstack.settings import DB_USER, MLFLOW_ADMIN, StackSettings

#: The region every S3 client of the stack names (SeaweedFS ignores it; boto3 needs one)
S3_REGION = "us-east-1"


def client_env(settings: StackSettings, secrets: Secrets, *, include_secrets: bool = True) -> dict[str, str]:
    """Environment of a client of this stack (the Ray head's jobs, the tests, ``stack env``).

    Secrets travel as files (``AWS_SHARED_CREDENTIALS_FILE``, ``RAY_AUTH_TOKEN_PATH``,
    ``PGPASSFILE``): Ray Tune copies ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` from
    the driver into each trial's runtime environment, which Ray's runtime-env agent logs.
    The one value MLflow's client only takes from the environment,
    ``MLFLOW_TRACKING_PASSWORD``, is added with ``include_secrets=True``.
    """
    s = settings
    env = {
        "MLFLOW_TRACKING_URI": s.mlflow_uri,
        "MLFLOW_TRACKING_USERNAME": MLFLOW_ADMIN,
        "AWS_ENDPOINT_URL_S3": s.s3_endpoint,
        "AWS_SHARED_CREDENTIALS_FILE": str(s.aws_credentials_path),
        "AWS_REGION": S3_REGION,
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN_PATH": str(secrets.path("ray_token")),
        "PGPASSFILE": str(s.pgpass_path),
        "NPSEMISEG_OPTUNA_STORAGE": s.database_uri("optuna"),
        "NPSEMISEG_STORAGE": s.checkpoint_storage,
        # ride out a restart of the tracking server (~1 min here): 10 retries, 1, 2, 4, ... 120 s apart
        "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "10",
        "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    }
    if include_secrets:
        env["MLFLOW_TRACKING_PASSWORD"] = secrets.get("mlflow_admin_password")
    return env


def export_lines(settings: StackSettings, secrets: Secrets) -> list[str]:
    """Shell ``export`` lines for a client; secrets appear as files or ``$(cat <file>)``, never as values."""
    lines = [f"export {key}={value}" for key, value in client_env(settings, secrets, include_secrets=False).items()]
    lines.append(f'export MLFLOW_TRACKING_PASSWORD="$(cat {secrets.path("mlflow_admin_password")})"')
    lines.append(f"export RAY_ADDRESS={settings.ray_dashboard_url}  # for `ray job submit`")
    return lines


def write_client_files(settings: StackSettings, secrets: Secrets) -> None:
    """The secret files clients read (AWS shared credentials, libpq's password file), mode 0600."""
    s = settings
    write_private(s.aws_credentials_path, "[default]\n"
                                          f"aws_access_key_id = {secrets.get('s3_access_key')}\n"
                                          f"aws_secret_access_key = {secrets.get('s3_secret_key')}\n")
    write_private(s.pgpass_path, f"{s.host}:{s.postgres_port}:*:{DB_USER}:{secrets.get('postgres_password')}\n")


def s3_client(settings: StackSettings, secrets: Secrets):
    """A boto3 S3 client of the stack's SeaweedFS, authenticated with the stack's keys."""
    import boto3  # the optional `stack` extra: `stack up` installs it when missing

    return boto3.client("s3", endpoint_url=settings.s3_endpoint, region_name=S3_REGION,
                        aws_access_key_id=secrets.get("s3_access_key"),
                        aws_secret_access_key=secrets.get("s3_secret_key"))
