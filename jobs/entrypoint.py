"""What the jobs share: they run the ``npsemiseg`` command of the same name (same options, same
exit statuses), so a job and the CLI cannot drift apart."""

from __future__ import annotations

import sys

from semiseg_platform.cli.main import run_command


def run_job(command: str, argv: list[str] | None, prog: str) -> int:
    """``npsemiseg <command> <argv>`` (default: this process's arguments); returns its exit status."""
    return run_command([command, *(sys.argv[1:] if argv is None else argv)], prog_name=prog)
