"""``npsemiseg grid`` (and ``python -m jobs.grid``): every cell of a grid spec under Ray Tune."""

from __future__ import annotations

from pathlib import Path

import typer

from semiseg_platform.cli.app import CELL_FAILED, SharedFilesystem, SpecStorage, SpecTracking, app, fail, one_line
from semiseg_platform.reservations import RESOURCE_TIMEOUT_S


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
) -> None:
    """Run every cell of a grid spec under Ray Tune (skips finished cells, resumes interrupted ones).

    Exit status: 0 when every cell finished (or had finished earlier), 1 when any cell failed,
    2 when the spec is invalid (nothing started).
    """
    from semiseg_platform.sweeps.grid_spec import expand, load_spec

    try:
        loaded = load_spec(spec)
        if max_failures is not None:
            loaded = loaded.model_copy(update={"max_failures": max_failures})
        if dry_run:
            configs = expand(loaded)
            for config in configs:
                typer.echo(f"{config.cell_id}  {config.cell_name}  seed {config.seed}")
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
