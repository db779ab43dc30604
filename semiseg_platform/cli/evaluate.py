"""``npsemiseg evaluate``: evaluate a trained cell's checkpoint again (another mode, another T),
logged as a nested MLflow run of the cell's run."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import typer

from semiseg_platform.cli.app import TRACKING_HELP, app, fail, one_line

if TYPE_CHECKING:  # the commands import them when they run: their --help answers without torch or MLflow
    from npsemiseg.config import RunConfig
    from semiseg_platform.checkpoint_lookup import Checkpoint

RUN_HELP = "the cell's MLflow run id (its checkpoint_uri tag names the checkpoint)"
CHECKPOINT_HELP = "a checkpoint directory or lineage (local or s3://...), or a file `npsemiseg export` wrote"
SAMPLES_HELP = "T predictions per pixel for NP and MC dropout heads (default: the cell's evaluation.num_samples)"


def check_options(mode: str | None, samples: int | None, device: str | None) -> str:
    """The device to use (default: cuda when available); ``ValueError`` naming the option when the
    mode, T or device is not one the commands take."""
    import torch

    from npsemiseg.inference_model import check_mode, check_samples

    if mode is not None:
        check_mode(mode)
    if samples is not None and samples < 1:
        raise ValueError(f"--samples: expected T >= 1, got {samples}")
    check_samples(samples)
    if device not in (None, "cpu", "cuda"):
        raise ValueError(f"--device: expected cpu or cuda, got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device: cuda asked for, but this machine has no CUDA device")
    return device or ("cuda" if torch.cuda.is_available() else "cpu")


def print_metrics(metrics: dict[str, float]) -> None:
    """The paper's final metrics first, then the others (per-class IoU, counts, time) by name."""
    from semiseg_platform.tracking import mlflow_names

    shown = [k for k in mlflow_names.FINAL_METRICS if k in metrics]
    for key in shown + sorted(k for k in metrics if k not in shown):
        typer.echo(f"  {key:<24} {metrics[key]:.4f}")


def staged_data_root(data_root: str | None, config: RunConfig, found: Checkpoint) -> str | None:
    """The data root to evaluate on (None: the checkpoint's own local ``data.root``): ``--data-root``, else the S3
    root the cell's run recorded (its checkpoint names the worker's staged copy), else the checkpoint's
    ``data.root``, else ``$NPSEMISEG_DATA``; an S3 root staged here as on a worker. A root that the run or the
    checkpoint names was written by others: it may name no S3 endpoint but the user's own."""
    from npsemiseg.data import DATA_ROOT_ENV
    from semiseg_platform.data_staging import is_remote, resolve_data_root
    from semiseg_platform.storage import parse_storage

    root, named_by = data_root, None
    if data_root is None:
        recorded = found.run.data.params.get("data.root") if found.run is not None else None
        if is_remote(recorded):
            root, named_by = recorded, f"the data.root parameter of run {found.run.info.run_id}"
        elif config.data.root:
            root, named_by = config.data.root, f"the data.root of checkpoint {found.uri}"
        else:
            root = os.environ.get(DATA_ROOT_ENV)
    if not is_remote(root):
        return data_root
    location = parse_storage(root, endpoint_url=found.endpoint_url, named_by=named_by) if named_by else root
    return resolve_data_root(location, config.dataset)


@app.command()
def evaluate(
    run: str | None = typer.Option(None, "--run", help=RUN_HELP),
    checkpoint: str | None = typer.Option(None, "--checkpoint", help=CHECKPOINT_HELP),
    mode: str | None = typer.Option(None, help="center_crop | sliding | sliding_global | whole (default: the cell's)"),
    samples: int | None = typer.Option(None, "--samples", help=SAMPLES_HELP),
    select: str = typer.Option("last", help="last | best checkpoint of the cell"),
    data_root: str | None = typer.Option(None, help="the dataset's root here, a folder or s3://... staged into "
                                                    "$NPSEMISEG_DATA_CACHE (default: the cell's data.root)"),
    device: str | None = typer.Option(None, help="cpu | cuda (default: cuda when available)"),
    tracking: str | None = typer.Option(None, help=TRACKING_HELP),
) -> None:
    """Evaluate a trained cell again on its validation set; log the metrics as a nested run of the cell's run."""
    from npsemiseg import load_model
    from semiseg_platform.checkpoint_lookup import log_evaluation, open_checkpoint

    try:
        device = check_options(mode, samples, device)
        with open_checkpoint(run_id=run, uri=checkpoint, select=select, tracking=tracking) as found:
            model = load_model(found.local, device=device)
            data_root = staged_data_root(data_root, model.config, found)
            metrics = model.evaluate(mode=mode, num_samples=samples, data_root=data_root)
            used_mode = mode or model.config.evaluation.mode or "whole"
            url = log_evaluation(found, metrics, mode=used_mode, num_samples=model.samples(samples), select=select,
                                 step=model.step)
    except (ValueError, FileNotFoundError) as error:
        fail(one_line(error))
    typer.echo(f"cell {model.config.cell_name} ({model.config.cell_id}) step {model.step}: mode {used_mode}, "
               f"T {model.samples(samples) or 1}, checkpoint {found.uri}")
    print_metrics(metrics)
    typer.echo(f"MLflow run: {url} (nested under the cell's run)" if url else
               "no cell run records this checkpoint: metrics not logged to MLflow")

