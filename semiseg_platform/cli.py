"""The ``npsemiseg`` command line: one typer app, one function per command.

Add a command by defining a function decorated with ``@app.command()`` in this module (or in
another module imported at the bottom). Errors the user can fix (a bad option, key, value,
file or storage) print one line, ``error: ...``, and exit with status 2 before anything starts.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, NoReturn, Optional

import typer

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


def build_config(*, framework: str | None, dataset: str | None, partition: str | None, head: str | None,
                 preset: str, config_file: Path | None, assignments: dict[str, str]) -> Any:
    """The run configuration from ``--config`` or ``--preset`` + the four cell options, then ``--set``."""
    from npsemiseg.config import RunConfig

    cell = {"framework": framework, "dataset": dataset, "partition": partition, "head.name": head}
    if config_file is not None:
        if not config_file.is_file():
            raise ValueError(f"--config: file {config_file} does not exist")
        config = RunConfig.from_yaml(config_file.read_text())
        overrides = {k: v for k, v in cell.items() if v is not None}
    else:
        missing = [f"--{k.split('.')[0]}" for k, v in cell.items() if v is None]
        if missing:
            raise ValueError(f"missing option(s) {', '.join(missing)} (or give --config FILE)")
        config = RunConfig.from_preset(preset, framework=framework, dataset=dataset, partition=partition, head=head)
        overrides = {}
    overrides.update(assignments)
    return config.with_overrides(overrides) if overrides else config


_SUMMARY_METRICS = ("miou", "pixel_acc", "pavpu", "ece", "nll", "brier", "auroc")


@app.command()
def run(
    framework: Optional[str] = typer.Option(None, help="supervised | mt | psmt | u2pl | augseg"),
    dataset: Optional[str] = typer.Option(None, help="pascal_classic | pascal_blender | cityscapes | synthetic ..."),
    partition: Optional[str] = typer.Option(None, help="labeled-image count or protocol, e.g. 92 or 1/16"),
    head: Optional[str] = typer.Option(None, help="baseline | mc_dropout | np"),
    preset: str = typer.Option("smoke", help="smoke (tiny, CPU, seconds) | paper"),
    config: Optional[Path] = typer.Option(None, "--config", help="a configuration YAML (replaces --preset)"),
    set_: Optional[list[str]] = typer.Option(None, "--set", help="override a setting: key=value (repeatable)"),
    workers: int = typer.Option(1, help="Ray Train DDP workers; 0 = local mode (in this process)"),
    gpus_per_worker: float = typer.Option(0, help="GPUs per worker (NCCL); 0 = CPU (gloo)"),
    cpus_per_worker: float = typer.Option(1.0, help="CPUs per worker (fractions allowed)"),
    storage: Optional[str] = typer.Option(None, help="checkpoint storage: a directory or s3://bucket/prefix[?endpoint_override=URL]"),
    max_failures: int = typer.Option(0, help="worker-group restarts from the last checkpoint"),
    experiment: str = typer.Option("npsemiseg", help="MLflow experiment"),
    tracking: Optional[str] = typer.Option(None, help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else ./mlruns.db)"),
    name: Optional[str] = typer.Option(None, help="checkpoint lineage name (default: from the cell); the same name resumes"),
) -> None:
    """Train one cell on Ray Train, tracked in MLflow; print its metrics and the run's URL."""
    from semiseg_platform.cell import CellFailedError, cell_run_name, run_cell, validate_resources
    from semiseg_platform.storage import parse_storage
    from semiseg_platform.tracking import CellKilled, resolve_tracking_uri, ui_hint

    try:
        cell = build_config(framework=framework, dataset=dataset, partition=partition, head=head, preset=preset,
                            config_file=config, assignments=parse_assignments(set_))
        validate_resources(workers, gpus_per_worker, cpus_per_worker, max_failures)
        location = parse_storage(storage)
        location.check()
        tracking_uri = resolve_tracking_uri(tracking)
    except ValueError as error:  # pydantic's ValidationError is a ValueError
        fail(one_line(error))
    typer.echo(f"cell {cell.cell_name} ({cell.cell_id}): {workers or 'local-mode'} worker(s), "
               f"checkpoints {location.uri_of(name or cell_run_name(cell, experiment=experiment))}, tracking {tracking_uri}")
    try:
        result = run_cell(cell, workers=workers, gpus_per_worker=gpus_per_worker, cpus_per_worker=cpus_per_worker,
                          storage=location, tracking=tracking_uri, experiment=experiment, max_failures=max_failures,
                          name=name, progress=True)
    except CellFailedError as error:
        failed = error.result
        typer.echo(f"cell {failed.name} {failed.status}: {failed.error}", err=True)
        if failed.run_url:
            typer.echo(f"MLflow run: {failed.run_url}", err=True)
        raise typer.Exit(CELL_FAILED)
    except (KeyboardInterrupt, CellKilled) as error:  # the MLflow run has been ended KILLED
        typer.echo(f"cell {cell.cell_name} KILLED ({error or 'interrupted'})", err=True)
        raise typer.Exit(INTERRUPTED)
    typer.echo(f"cell {result.name} {result.status} after {result.steps} steps in {result.wall_seconds:.1f} s "
               f"(training loop {result.loop_seconds:.1f} s)")
    shown = [k for k in _SUMMARY_METRICS if k in result.metrics]
    shown += sorted(k for k in result.metrics if k not in shown)
    for key in shown:
        typer.echo(f"  {key:<24} {result.metrics[key]:.4f}")
    typer.echo(f"checkpoint: {result.checkpoint_uri}")
    typer.echo(f"MLflow run: {result.run_url}")
    hint = ui_hint(tracking_uri)
    if hint:
        typer.echo(f"  (serve the local store with: {hint})")


@app.command("sweep-orphans")
def sweep_orphans(
    experiment: str = typer.Option("npsemiseg", help="MLflow experiment"),
    tracking: Optional[str] = typer.Option(None, help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else ./mlruns.db)"),
    stale_after: Optional[float] = typer.Option(None, help="also end runs owned on other hosts after this many seconds"),
) -> None:
    """End RUNNING MLflow runs whose owning process is gone (status KILLED, reason in the 'error' tag)."""
    from semiseg_platform.tracking import sweep_orphaned_runs

    swept = sweep_orphaned_runs(experiment, tracking=tracking, stale_after_s=stale_after)
    typer.echo(f"{len(swept)} orphaned run(s) ended" + (": " + ", ".join(swept) if swept else ""))


@app.command()
def tables(
    experiment: str = typer.Option(..., help="MLflow experiment to read the cell runs from"),
    out: Path = typer.Option(..., help="directory for the tables (Markdown, LaTeX, CSV, Parquet) and figures"),
    tracking: Optional[str] = typer.Option(None, help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else ./mlruns.db)"),
    grid_id: Optional[str] = typer.Option(None, help="only the cells of this grid (default: every cell run)"),
) -> None:
    """Build the paper's Tables 1-6 (and the uncertainty-time figure) from MLflow runs; print them."""
    from semiseg_platform.tables import markdown_report, write_report
    from semiseg_platform.tracking import resolve_tracking_uri

    tracking_uri = resolve_tracking_uri(tracking)
    built, written = write_report(tracking_uri, experiment, out, grid_id=grid_id)
    typer.echo(markdown_report(built))
    typer.echo(f"{len(written)} files written to {out}")


@app.command()
def grid(
    spec: Path = typer.Argument(..., help="grid spec (YAML), e.g. jobs/specs/smoke.yaml"),
    tracking: Optional[str] = typer.Option(None, help="MLflow tracking URI (default: the spec's, $MLFLOW_TRACKING_URI, else ./mlruns.db)"),
    storage: Optional[str] = typer.Option(None, help="checkpoint storage (default: the spec's, else ./ray_results)"),
    tables_dir: Optional[Path] = typer.Option(None, help="where to write the tables (default: under the storage)"),
) -> None:
    """Run every cell of a grid spec under Ray Tune (skips finished cells, resumes interrupted ones)."""
    from semiseg_platform.grid import load_spec, run_grid

    try:
        loaded = load_spec(spec)
    except ValueError as error:
        fail(one_line(error))
    try:
        summary = run_grid(loaded, tracking_uri=tracking, storage=storage, tables_dir=tables_dir)
    except ValueError as error:  # an invalid cell setting or storage: found before any cell starts
        fail(one_line(error))
    typer.echo(summary.format())
    if not summary.ok:
        raise typer.Exit(CELL_FAILED)


@app.command()
def ui(
    tracking: Optional[str] = typer.Option(None, help="MLflow store (default: $MLFLOW_TRACKING_URI, else ./mlruns.db)"),
    host: str = typer.Option("127.0.0.1", help="interface to bind (default: loopback only)"),
    port: int = typer.Option(5000, help="port of the UI"),
    print_only: bool = typer.Option(False, "--print", help="print the command, start nothing"),
) -> None:
    """Serve the MLflow UI of a local store (mlflow server on loopback) and print the ready-made searches."""
    from semiseg_platform.ui import serve

    status = serve(tracking, host=host, port=port, print_only=print_only)
    if status:
        raise typer.Exit(status)


from semiseg_platform.devstack import stack_app  # noqa: E402 - the `npsemiseg stack ...` group

app.add_typer(stack_app(), name="stack")


from semiseg_platform import search_cli  # noqa: E402,F401 - `npsemiseg search`, `npsemiseg hparams-figure`


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point (``npsemiseg``)."""
    app(args=argv if argv is not None else sys.argv[1:], prog_name="npsemiseg")


if __name__ == "__main__":
    main()
