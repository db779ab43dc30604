"""The ``npsemiseg`` console script: the typer app with every command module registered."""

from __future__ import annotations

import sys

import click

from semiseg_platform.cli import (  # noqa: F401 - each module registers its command
    claims,
    config,
    data,
    evaluate,
    export,
    grid,
    hparams_figure,
    plan,
    predict,
    pretrain,
    run,
    search,
    stack,
    sweep_orphans,
    tables,
    ui,
)
from semiseg_platform.cli.app import app


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point (``npsemiseg``)."""
    app(args=argv if argv is not None else sys.argv[1:], prog_name="npsemiseg")


def run_command(argv: list[str], prog_name: str = "npsemiseg") -> int:
    """Run one command as the console script would and return its exit status (the ``jobs/`` entry points)."""
    try:
        status = app(args=argv, prog_name=prog_name, standalone_mode=False)
    except click.exceptions.Exit as done:
        return done.exit_code
    except click.ClickException as error:
        error.show()
        return error.exit_code
    return status if isinstance(status, int) else 0


if __name__ == "__main__":
    main()
