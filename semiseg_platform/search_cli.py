"""The ``npsemiseg search`` and ``npsemiseg hparams-figure`` commands (registered on ``cli.app``).

Kept apart from ``semiseg_platform.search`` so that the command line starts without importing
Ray: the search module is imported when a command runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from semiseg_platform.cli import CELL_FAILED, app, fail, one_line, parse_assignments


@app.command()
def search(
    spec: Path = typer.Argument(..., help="search spec (YAML), e.g. jobs/specs/search_smoke.yaml"),
    dataset: Optional[str] = typer.Option(None, help="search this dataset instead of the spec's"),
    partition: Optional[str] = typer.Option(None, help="search this partition instead of the spec's"),
    num_samples: Optional[int] = typer.Option(None, help="trials in this submission instead of the spec's"),
    set_: Optional[list[str]] = typer.Option(None, "--set", help="override a setting of the cell: key=value (repeatable)"),
    tracking: Optional[str] = typer.Option(None, help="MLflow tracking URI (default: the spec's, $MLFLOW_TRACKING_URI, else ./mlruns.db)"),
    storage: Optional[str] = typer.Option(None, help="checkpoint storage (default: the spec's, else ./ray_results)"),
    optuna_storage: Optional[str] = typer.Option(None, help="Optuna RDB URL (default: the spec's, else sqlite:///./optuna.db)"),
    out_dir: Optional[Path] = typer.Option(None, help="where best_config.yaml, trials.csv and hparams.png go"),
) -> None:
    """Search hyper-parameters of one cell with Ray Tune + Optuna (TPE) + ASHA; continues the spec's study."""
    from semiseg_platform.search import load_search_spec, run_search

    try:
        loaded = load_search_spec(spec, overrides=parse_assignments(set_), dataset=dataset, partition=partition,
                                  num_samples=num_samples)
        summary = run_search(loaded, tracking_uri=tracking, storage=storage, optuna_storage=optuna_storage,
                             out_dir=out_dir)
    except ValueError as error:
        fail(one_line(error))
    typer.echo(summary.format())
    if not summary.ok:
        raise typer.Exit(CELL_FAILED)


@app.command("hparams-figure")
def hparams_figure(
    experiment: str = typer.Option(..., help="MLflow experiment holding the search trials"),
    out: Path = typer.Option(..., help="directory for hparams.png"),
    tracking: Optional[str] = typer.Option(None, help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else ./mlruns.db)"),
    search_id: Optional[str] = typer.Option(None, help="only the trials of this search (default: every search)"),
    aggregate: str = typer.Option("max", help="max | mean of the finished trials at each value"),
) -> None:
    """The paper's hyper-parameter figure (mIoU against Q, lambda_kl, T) from finished search trials."""
    from semiseg_platform.search import write_hparams_figure
    from semiseg_platform.tracking import resolve_tracking_uri

    if aggregate not in ("max", "mean"):
        fail(f"--aggregate: expected max or mean, got {aggregate!r}")
    path = write_hparams_figure(resolve_tracking_uri(tracking), experiment, out, search=search_id, aggregate=aggregate)
    if path is None:
        fail(f"--experiment: no finished search trial in experiment {experiment!r}", status=CELL_FAILED)
    typer.echo(f"figure written to {path}")
