"""``npsemiseg run``: train one cell on Ray Train, tracked in MLflow."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import typer

from npsemiseg.data import dataset_names
from npsemiseg.frameworks import framework_names
from npsemiseg.heads import head_names
from npsemiseg.presets import preset_names
from semiseg_platform.cli.app import (
    CELL_FAILED,
    INTERRUPTED,
    TRACKING_HELP,
    SharedFilesystem,
    app,
    fail,
    one_line,
    parse_assignments,
)
from semiseg_platform.reservations import RESOURCE_TIMEOUT_S

if TYPE_CHECKING:  # the command imports them when it runs: its --help answers without torch, Ray or MLflow
    from npsemiseg.config import Composition, RunConfig
    from npsemiseg.untrusted import UnsafeFileError
    from semiseg_platform.launch import CellFailedError


def build_composition(*, framework: str | None, dataset: str | None, partition: str | None, head: str | None,
                      preset: str, config_file: Path | None, assignments: dict[str, str],
                      protocol: str | None = None) -> Composition:
    """The run configuration and where its values come from: ``--preset`` + the four cell options (and
    ``--protocol``), or ``--config FILE`` (the cell options then change its cell), then ``--set``."""
    from npsemiseg.config import compose, read_config, recompose
    from semiseg_platform.sweeps.spec_base import read_yaml

    cell = {"framework": framework, "dataset": dataset, "partition": partition, "head.name": head, "protocol": protocol}
    if config_file is not None:
        if not config_file.is_file():
            raise ValueError(f"--config: file {config_file} does not exist")
        if not isinstance(read_yaml(config_file, f"--config {config_file}"), dict):
            raise ValueError(f"--config {config_file}: expected a mapping of configuration sections")
        changes = {**{k: v for k, v in cell.items() if v is not None}, **assignments}
        return recompose(read_config(config_file), changes)
    missing = [f"--{k.split('.')[0]}" for k, v in cell.items() if v is None and k != "protocol"]
    if missing:
        raise ValueError(f"missing option(s) {', '.join(missing)} (or give --config FILE)")
    return compose(preset, framework=framework, dataset=dataset, partition=partition, head=head,
                   protocol=protocol or "corrected", overrides=assignments)


def build_config(**options: Any) -> RunConfig:
    """:func:`build_composition`'s configuration."""
    return build_composition(**options).config


def in_process_launch(launcher: str, *, workers: int, gpus_per_worker: float, max_failures: int) -> bool:
    """Whether the cell trains in this process: ``auto`` = a one-device cell on the embedded default
    (seconds to the first step instead of a TorchTrainer's start-up); ``trainer`` = Ray Train always."""
    from semiseg_platform.launch import in_existing_cluster

    one_device = workers == 1 and gpus_per_worker <= 1 and max_failures == 0
    if launcher == "in_process" and not one_device:
        raise ValueError(f"--launcher in_process: trains one worker on at most one GPU without restarts, got "
                         f"--workers {workers} --gpus-per-worker {gpus_per_worker:g} --max-failures {max_failures}")
    if launcher not in ("auto", "trainer", "in_process"):
        raise ValueError(f"--launcher: expected one of ['auto', 'trainer', 'in_process'], got {launcher!r}")
    return launcher == "in_process" or (launcher == "auto" and one_device and not in_existing_cluster())


#: The final metrics printed first, in this order (``mlflow_names.FINAL_METRICS``)
_SUMMARY_METRICS = ("miou", "pixel_acc", "pavpu", "ece", "nll", "brier", "auroc", "ece_adaptive", "aupr", "aurc",
                    "pavpu_balanced")


@app.command()
def run(
    framework: str | None = typer.Option(None, help=" | ".join(framework_names())),
    dataset: str | None = typer.Option(None, help=" | ".join(dataset_names()) + " | a folder dataset (docs/datasets.md)"),
    partition: str | None = typer.Option(None, help="labeled-image count or protocol, e.g. 92 or 1/16"),
    head: str | None = typer.Option(None, help=" | ".join(head_names())),
    preset: str = typer.Option("smoke", help=" | ".join(preset_names()) + " (smoke: tiny, CPU, seconds)"),
    config: Path | None = typer.Option(None, "--config", help="a configuration YAML (replaces --preset)"),
    set_: list[str] | None = typer.Option(None, "--set", help="override a setting: key=value (repeatable)"),
    workers: int = typer.Option(1, help="DDP workers on Ray Train; 0 = Ray Train's local mode (in this process)"),
    min_workers: int | None = typer.Option(None, help="elastic: the fewest workers to go on with (from a lost node), "
                                                      "the global batch kept by accumulation steps"),
    gpus_per_worker: float = typer.Option(0, help="GPUs per worker (NCCL); 0 = CPU (gloo)"),
    cpus_per_worker: float = typer.Option(1.0, help="CPUs per worker (fractions allowed)"),
    launcher: str = typer.Option("auto", help="auto: a one-device cell on the embedded default trains in this "
                                              "process, others on Ray Train | trainer | in_process"),
    resource_timeout: float = typer.Option(RESOURCE_TIMEOUT_S, help="seconds to wait for a cluster's resources"),
    storage: str | None = typer.Option(None, help="checkpoint storage: a directory or s3://bucket/prefix[?endpoint_override=URL]"),
    max_failures: int = typer.Option(0, help="worker-group restarts from the last checkpoint"),
    experiment: str = typer.Option("npsemiseg", help="MLflow experiment"),
    tracking: str | None = typer.Option(None, help=TRACKING_HELP),
    name: str | None = typer.Option(None, help="checkpoint lineage name (default: from the cell); the same name resumes"),
    shared_filesystem: SharedFilesystem = None,
) -> None:
    """Train one cell (in this process, or on Ray Train), tracked in MLflow; print its metrics and the run's URL.

    Everything that can be checked first is (data, weights, resources, tracking store, storage): a bad
    input is one ``error:`` line and exit status 2, with nothing written. A lineage whose newest checkpoint asks to
    run code (``npsemiseg.untrusted``) is refused with one line and exit status 2 too, its MLflow run ended FAILED.
    """
    try:  # the configuration first: a bad one is named before torch, Ray and MLflow are imported
        cell = build_config(framework=framework, dataset=dataset, partition=partition, head=head, preset=preset,
                            config_file=config, assignments=parse_assignments(set_))
    except ValueError as error:  # pydantic's ValidationError is a ValueError
        fail(one_line(error))
    from semiseg_platform.launch import cell_run_name, validate_min_workers, validate_resources
    from semiseg_platform.preflight import Needed, preflight

    try:
        validate_resources(workers, gpus_per_worker, cpus_per_worker, max_failures)
        validate_min_workers(cell, min_workers, workers)
        in_process = in_process_launch(launcher, workers=workers, gpus_per_worker=gpus_per_worker,
                                       max_failures=max_failures)
        needed = Needed.of(min_workers or workers, gpus_per_worker, cpus_per_worker, in_process=in_process)
        tracking_uri, location = preflight([cell], needed, tracking=tracking, storage=storage,
                                           resource_timeout=resource_timeout, shared_filesystem=shared_filesystem)
    except ValueError as error:  # pydantic's ValidationError is a ValueError
        fail(one_line(error))
    name = name or cell_run_name(cell, experiment=experiment)
    how = "in this process" if in_process else f"{workers or 'local-mode'} Ray Train worker(s)"
    typer.echo(f"cell {cell.cell_name} ({cell.cell_id}): {how}, checkpoints {location.uri_of(name)}, "
               f"tracking {tracking_uri}")
    launch = dict(storage=location, tracking=tracking_uri, experiment=experiment, name=name, progress=True)
    trainer = dict(workers=workers, gpus_per_worker=gpus_per_worker, cpus_per_worker=cpus_per_worker,
                   max_failures=max_failures, min_workers=min_workers)
    _print_result(_train(cell, in_process, launch, trainer), tracking_uri)


def _train(cell: Any, in_process: bool, launch: dict[str, Any], trainer: dict[str, Any]) -> Any:
    """Train ``cell`` in this process or on Ray Train (``trainer``: the workers); a failed or killed cell exits."""
    from semiseg_platform.launch import CellFailedError, run_cell, run_cell_in_process
    from semiseg_platform.tracking import CellKilled

    try:
        return run_cell_in_process(cell, **launch) if in_process else run_cell(cell, **trainer, **launch)
    except CellFailedError as error:
        _exit_failed(error)
    except (KeyboardInterrupt, CellKilled) as error:  # the MLflow run has been ended KILLED
        typer.echo(f"cell {cell.cell_name} KILLED ({error or 'interrupted'})", err=True)
        raise typer.Exit(INTERRUPTED) from None


def _exit_failed(error: CellFailedError) -> NoReturn:
    """Exit for a failed cell: 2 with one line where its lineage's checkpoint asked to run code (the input is bad,
    nothing of it ran), else its status, error and MLflow run, exit ``CELL_FAILED``."""
    failed = error.result
    refused = refused_file(error)
    if refused is not None:
        fail(f"{refused} (cell {failed.name} {failed.status}" + (f", MLflow run {failed.run_url})" if failed.run_url
                                                                  else ")"))
    typer.echo(f"cell {failed.name} {failed.status}: {failed.error}", err=True)
    if failed.run_url:
        typer.echo(f"MLflow run: {failed.run_url}", err=True)
    raise typer.Exit(CELL_FAILED) from None


def refused_file(error: CellFailedError) -> UnsafeFileError | None:
    """The refusal of a file from others (its checkpoint asking to run code) that failed the cell, or None:
    the cell's error itself (in this process) or a Ray Train worker's."""
    from npsemiseg.untrusted import UnsafeFileError

    cause = error.__cause__
    failures = getattr(cause, "worker_failures", None) or {}
    causes = [cause, *(getattr(f, "cause", None) or f.__cause__ or f for f in failures.values())]
    return next((c for c in causes if isinstance(c, UnsafeFileError)), None)


def _print_result(result: Any, tracking_uri: str) -> None:
    """The cell's status, steps and time, its final metrics, checkpoint and MLflow run."""
    from semiseg_platform.tracking import ui_hint

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
