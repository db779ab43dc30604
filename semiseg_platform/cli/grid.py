"""``npsemiseg grid`` (and ``python -m jobs.grid``): every cell of a grid spec under Ray Tune."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from semiseg_platform.cli.app import CELL_FAILED, SharedFilesystem, SpecStorage, SpecTracking, app, fail, one_line
from semiseg_platform.reservations import RESOURCE_TIMEOUT_S

if TYPE_CHECKING:
    from npsemiseg.config import RunConfig
    from npsemiseg.hardware_plan import Gpus


@app.command()
def grid(
    spec: Path = typer.Argument(..., help="grid spec (YAML), e.g. jobs/specs/smoke.yaml"),
    tracking: SpecTracking = None,
    storage: SpecStorage = None,
    tables_dir: Path | None = typer.Option(None, help="where to write the tables (default: under the storage)"),
    resource_timeout: float = typer.Option(RESOURCE_TIMEOUT_S, help="seconds to wait for a cluster's resources"),
    max_failures: int | None = typer.Option(
        None, min=0, help="retries of a cell whose process or node died, from its last checkpoint (default: the "
                          "spec's max_failures, 2); a cell failing on its own (an error in it) is not retried"),
    shared_filesystem: SharedFilesystem = None,
    dry_run: bool = typer.Option(False, "--dry-run", help="validate the spec and list its cells, run nothing"),
    gpus: str | None = typer.Option(None, "--gpus", help="with --dry-run: each cell's plan on these GPUs "
                                                         "(COUNTxMEMORY, e.g. 2x24GB; npsemiseg plan)"),
) -> None:
    """Run every cell of a grid spec under Ray Tune (skips finished cells, resumes interrupted ones).

    Exit status: 0 when every cell finished (or had finished earlier), 1 when any cell failed,
    2 when the spec is invalid (nothing started).
    """
    from npsemiseg.hardware_plan import parse_gpus
    from semiseg_platform.sweeps.grid_spec import expand, load_spec

    try:
        if gpus is not None and not dry_run:
            raise ValueError("--gpus: only with --dry-run (a running grid logs each cell's plan as plan.* params)")
        wanted = parse_gpus(gpus) if gpus is not None else None
        loaded = load_spec(spec)
        if max_failures is not None:
            loaded = loaded.model_copy(update={"max_failures": max_failures})
        if dry_run:
            configs = expand(loaded)
            for config in configs:
                typer.echo(f"{config.cell_id}  {config.cell_name}  seed {config.seed}")
                if wanted is not None:
                    _echo_plan(config, wanted)
            typer.echo(f"{len(configs)} cells (a cell whose process or node dies is retried up to "
                       f"{loaded.max_failures} times)")
            return
        from semiseg_platform.sweeps.grid_runner import run_grid  # Ray, MLflow: only to run the cells

        summary = run_grid(loaded, tracking_uri=tracking, storage=storage, tables_dir=tables_dir,
                           resource_timeout=resource_timeout, shared_filesystem=shared_filesystem)
    except ValueError as error:  # an invalid spec, cell setting or storage: found before any cell starts
        fail(one_line(error))
    typer.echo(summary.tables_markdown)
    typer.echo(summary.claims_markdown)
    typer.echo(summary.format())
    if not summary.ok:
        raise typer.Exit(CELL_FAILED)


def _echo_plan(config: RunConfig, gpus: Gpus) -> None:
    """A cell's plan under its line of ``--dry-run``: the plan, then what differs from the publication (or why
    the memory model cannot plan it)."""
    from npsemiseg.hardware_plan import plan_cell

    try:
        planned = plan_cell(config, gpus)
    except ValueError as error:
        typer.echo(f"    plan on {gpus}: none ({one_line(error)})")
        return
    typer.echo(f"    plan on {gpus}: {planned.describe()}")
    for line in planned.differences:
        typer.echo(f"      differs: {line}")
