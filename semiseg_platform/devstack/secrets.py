"""The stack's credentials: generated on first start, one 0600 file each under ``<home>/secrets`` (directory 0700).

Services and clients get them through files or their environment, never on a command line or
in a log.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path
from secrets import token_hex, token_urlsafe

from semiseg_platform.devstack.settings import StackError

#: The secrets generated on first start, one file each under ``<home>/secrets/``
SECRET_NAMES = ("postgres_password", "s3_access_key", "s3_secret_key", "mlflow_admin_password",
                "mlflow_flask_secret", "ray_token")


class Secrets:
    """The stack's credentials: one file per secret under ``<home>/secrets`` (0600; directory 0700)."""

    def __init__(self, home: Path) -> None:
        self.directory = Path(home) / "secrets"

    def path(self, name: str) -> Path:
        if name not in SECRET_NAMES:
            raise ValueError(f"secret: expected one of {list(SECRET_NAMES)}, got {name!r}")
        return self.directory / name

    def ensure(self) -> None:
        """Generate the missing secrets (existing ones are kept: the services' stores depend on them)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        os.chmod(self.directory, 0o700)
        for name in SECRET_NAMES:
            path = self.path(name)
            if path.exists():
                os.chmod(path, 0o600)
                continue
            value = token_hex(10).upper() if name == "s3_access_key" else token_urlsafe(32)
            write_private(path, value)

    def get(self, name: str) -> str:
        path = self.path(name)
        if not path.is_file():
            raise StackError(f"secret {name!r} is missing ({path}); start the stack first (npsemiseg stack up)")
        return path.read_text().strip()

    def values(self) -> list[str]:
        """Every secret's value (for leak scans)."""
        return [self.get(name) for name in SECRET_NAMES if self.path(name).is_file()]


def write_private(path: Path, text: str, *, owner: str | None = None) -> None:
    """Write ``text`` to ``path`` created with mode 0600 (never world- or group-readable, not even briefly)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(text)
    if owner is not None:
        shutil.chown(path, user=owner, group=owner)
