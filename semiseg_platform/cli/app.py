"""The ``npsemiseg`` typer app (a leaf: the command modules register on it) and what they share:
the exit statuses, one-line errors, ``--set`` parsing and the global ``--quiet`` / ``--verbose``
options deciding what of the ``logging`` output reaches the terminal."""

from __future__ import annotations

import logging
from typing import Annotated, NoReturn

import typer

from semiseg_platform.logs import configure_logging

app = typer.Typer(
    name="npsemiseg",
    help="NP-SemiSeg: train and compare uncertainty-aware semi-supervised segmentation cells.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

#: exit status of errors in the user's input (nothing was started)
USAGE_ERROR = 2
#: exit status of a cell that started and ended FAILED
CELL_FAILED = 1
#: exit status of a cell stopped by Ctrl-C or SIGTERM (its run ended KILLED)
INTERRUPTED = 130
#: the MLflow tracking option's help, the same for every command
TRACKING_HELP = "MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else ./mlruns.db)"

#: the options of the commands that submit a spec (grid, search): where it is tracked and stored
SpecTracking = Annotated[str | None, typer.Option(
    "--tracking", "--tracking-uri", help="MLflow tracking URI (default: the spec's, $MLFLOW_TRACKING_URI, else ./mlruns.db)")]
SpecStorage = Annotated[str | None, typer.Option(help="checkpoint storage (default: the spec's, else ./ray_results)")]
#: run, grid, search: local tracking / storage paths are reachable from every node (a cluster of several hosts)
SharedFilesystem = Annotated[bool | None, typer.Option(
    "--shared-filesystem/--no-shared-filesystem", show_default=False,
    help="the local tracking store and storage paths are on a filesystem every Ray node mounts (e.g. NFS); "
         "without it a cluster of several hosts refuses them (default: $NPSEMISEG_SHARED_FILESYSTEM)")]


@app.callback()
def main_options(
    quiet: bool = typer.Option(False, "--quiet", "-q", help="only warnings and errors (no progress lines)"),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="also debug messages"),
) -> None:
    """NP-SemiSeg: train and compare uncertainty-aware semi-supervised segmentation cells."""
    configure_logging(logging.WARNING if quiet else logging.DEBUG if verbose else logging.INFO)


def fail(message: str, status: int = USAGE_ERROR) -> NoReturn:
    """Print ``error: <message>`` as one line on stderr and exit with ``status``."""
    typer.echo(f"error: {' '.join(str(message).split())}", err=True)
    raise typer.Exit(status)


def one_line(error: BaseException) -> str:
    """A validation error as one line (pydantic's multi-error reports joined with '; ')."""
    errors = getattr(error, "errors", None)
    if callable(errors):
        try:
            items = errors()
        except Exception:  # noqa: BLE001 - not pydantic's errors() after all
            items = None
        if items:
            parts = []
            for item in items:
                where = ".".join(str(p) for p in item.get("loc", ()) if p != "__root__")
                message = str(item.get("msg", "")).removeprefix("Value error, ")
                parts.append(f"{where}: {message}" if where else message)
            return "; ".join(parts)
    return " ".join(str(error).split())


def parse_assignments(items: list[str] | None) -> dict[str, str]:
    """``["optim.lr=0.01", ...]`` -> ``{"optim.lr": "0.01"}``; ``ValueError`` naming a malformed item."""
    out: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or any(c.isspace() for c in key.strip()):
            raise ValueError(f"--set: expected key=value (e.g. optim.lr=0.01), got {item!r}")
        out[key.strip()] = value
    return out
