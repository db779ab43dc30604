"""``npsemiseg stack up|down|status|env``: the local stack's command group (typer)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, NoReturn

import typer

from semiseg_platform.devstack.settings import ENV_PREFIX, StackError, StackSettings
from semiseg_platform.devstack.stack import Stack

_HOME_HELP = f"data, logs and secrets (default: ${ENV_PREFIX}HOME, else ./.npsemiseg/stack)"
#: the ``--home`` option every command takes
Home = Annotated[Path | None, typer.Option("--home", help=_HOME_HELP)]


def _fail(message: str) -> NoReturn:
    """The error's first line after ``error:``, the rest (a log's tail) below it; exit status 2."""
    first, _, rest = str(message).partition("\n")
    typer.echo(f"error: {first}", err=True)
    if rest:
        typer.echo(rest, err=True)
    raise typer.Exit(2)


def _stack(home: Path | None) -> Stack:
    try:
        return Stack(StackSettings.from_env(home=home))
    except ValueError as error:
        _fail(str(error))


def up(home: Home = None) -> None:
    """Start the services that are not running and wait until each is healthy."""
    stack = _stack(home)
    try:
        started = stack.up()
    except StackError as error:
        _fail(str(error))
    for name in started:
        typer.echo(f"started {name} in {stack.startup_seconds[name]:.1f} s")
    for row in stack.status():
        typer.echo(row.format())
    typer.echo(f"client settings: eval \"$(npsemiseg stack env{' --home ' + str(home) if home else ''})\"")


def down(home: Home = None) -> None:
    """Stop every service of the stack (by process id)."""
    stopped = _stack(home).down()
    typer.echo(f"stopped: {', '.join(stopped) if stopped else 'nothing was running'}")


def status(home: Home = None) -> None:
    """Show each service, its process and its health; exit 1 unless all are healthy."""
    rows = _stack(home).status()
    for row in rows:
        typer.echo(row.format())
    if not all(row.healthy for row in rows):
        raise typer.Exit(1)


def env(home: Home = None) -> None:
    """Print the export lines of a client (secrets as $(cat FILE) references, never their values)."""
    for line in _stack(home).export_lines():
        typer.echo(line)


def stack_app() -> typer.Typer:
    """The ``npsemiseg stack`` command group (a new typer app on each call)."""
    app = typer.Typer(help="The local stack: PostgreSQL, S3 (SeaweedFS), MLflow server, Ray head on 127.0.0.1.",
                      no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)
    for command in (up, down, status, env):
        app.command()(command)
    return app
