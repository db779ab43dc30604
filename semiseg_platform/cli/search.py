"""``npsemiseg search`` (and ``python -m jobs.search``): hyper-parameters of one cell with Ray Tune +
Optuna (TPE) + ASHA."""

from __future__ import annotations

from pathlib import Path

import typer

from semiseg_platform.cli.app import (
    CELL_FAILED,
    SharedFilesystem,
    SpecStorage,
    SpecTracking,
    app,
    fail,
    one_line,
    parse_assignments,
)
from semiseg_platform.reservations import RESOURCE_TIMEOUT_S


@app.command()
def search(
    spec: Path = typer.Argument(..., help="search spec (YAML), e.g. jobs/specs/search_smoke.yaml"),
    dataset: str | None = typer.Option(None, help="search this dataset instead of the spec's"),
    partition: str | None = typer.Option(None, help="search this partition instead of the spec's"),
    trials: int | None = typer.Option(None, help="Tune trials in this submission instead of the spec's"),
    set_: list[str] | None = typer.Option(None, "--set", help="override a setting of the cell: key=value (repeatable)"),
    tracking: SpecTracking = None,
    storage: SpecStorage = None,
    optuna_storage: str | None = typer.Option(None, help="Optuna RDB URL (default: the spec's, else sqlite:///./optuna.db)"),
    out_dir: Path | None = typer.Option(None, help="where best_config.yaml, trials.csv and hparams.png go"),
    resource_timeout: float = typer.Option(RESOURCE_TIMEOUT_S, help="seconds to wait for a cluster's resources"),
    dry_run: bool = typer.Option(False, "--dry-run", help="validate the spec and print its search id, run nothing"),
    shared_filesystem: SharedFilesystem = None,
) -> None:
    """Search hyper-parameters of one cell with Ray Tune + Optuna (TPE) + ASHA; continues the spec's study.

    Exit status: 0 when the study has a best configuration, 1 when no trial ran to its end, 2 when
    the spec is invalid (nothing started).
    """
    from semiseg_platform.sweeps.search_spec import load_search_spec, search_id

    try:
        loaded = load_search_spec(
            spec, overrides=parse_assignments(set_), dataset=dataset, partition=partition, trials=trials
        )
        if dry_run:
            base = loaded.base_config()
            typer.echo(
                f"search {loaded.name}: {base.cell_name}, search_id {search_id(loaded, base)}, "
                f"space {sorted(loaded.space)}, {loaded.trials} trial(s)"
            )
            return
        from semiseg_platform.sweeps.search_runner import run_search  # Ray, MLflow, Optuna: only to search

        summary = run_search(loaded, tracking_uri=tracking, storage=storage, optuna_storage=optuna_storage,
                             out_dir=out_dir, resource_timeout=resource_timeout,
                             shared_filesystem=shared_filesystem)
    except ValueError as error:
        fail(one_line(error))
    typer.echo(summary.format())
    if not summary.ok:
        raise typer.Exit(CELL_FAILED)
