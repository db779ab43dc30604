"""The MLflow UI over the study's runs: how to open it, what to search, what a cell run says.

The grid's runs are shaped for the UI by the tracking schema (``docs/CONTRACTS.md``): one
experiment per study, the submission's parent run with every cell as its child, the same
parameter keys in every cell (``RunConfig.flat()``), the tags ``framework``, ``dataset``,
``partition``, ``head`` as columns and search terms, a description per cell
(:func:`cell_description`, MLflow's ``mlflow.note.content``) and figures under stable paths
(``figures/uncertainty_maps.png``, ``figures/reliability.png``, ``figures/per_class_iou.png``).

This module serves the UI itself:

- :func:`ui_command`: the ``mlflow server`` command that serves a local store's UI (on loopback,
  one worker); ``npsemiseg ui`` / ``python -m semiseg_platform.ui`` run it (``--print`` only prints it);
- :func:`ready_made_searches`: the README's searches, as filter strings for the search box;
- :func:`experiment_url`, :func:`compare_url`: pages of the UI (MLflow 3's hash routes);
- :func:`cell_description`, :func:`per_class_iou_figure`: what :mod:`semiseg_platform.tracking`
  writes into each cell run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlparse

from matplotlib.figure import Figure

#: Where the figure drawn from the per-class IoU table goes in a cell run
PER_CLASS_IOU_FIGURE = "figures/per_class_iou.png"
DEFAULT_PORT = 5000

_HEAD_DESCRIPTIONS = {
    "baseline": "the deterministic baseline classifier (one prediction)",
    "mc_dropout": "MC dropout (uncertainty from T dropout samples)",
    "np": "the NP-SemiSeg neural-process head (uncertainty from T latent samples)",
}


def ui_command(tracking: str | os.PathLike | None = None, *, host: str = "127.0.0.1", port: int = DEFAULT_PORT,
               workers: int = 1) -> list[str]:
    """The command serving the MLflow UI of a local store (``mlflow server`` on ``host:port``).

    ``tracking``: the store (default: ``MLFLOW_TRACKING_URI``, else ``./mlruns.db``, as the cell
    runner and the grid resolve it). Artifacts logged into a SQLite store live in ``mlartifacts/``
    beside it; the server serves them from there. A tracking server (``http(s)://``) has no
    command: its own address is the UI (``ValueError`` saying so).
    """
    from semiseg_platform.tracking import DEFAULT_ARTIFACT_DIR, resolve_tracking_uri

    uri = resolve_tracking_uri(tracking)
    if urlparse(uri).scheme in ("http", "https"):
        raise ValueError(f"tracking: {uri} is a tracking server; open {uri} in a browser (it serves the UI itself)")
    command = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", uri, "--host", host,
               "--port", str(port), "--workers", str(workers)]
    if uri.startswith("sqlite:///"):
        artifacts = Path(uri[len("sqlite:///"):]).parent / DEFAULT_ARTIFACT_DIR
        command += ["--artifacts-destination", artifacts.as_uri()]
    return command


def ready_made_searches(dataset: str = "synthetic_voc", framework: str = "u2pl") -> dict[str, str]:
    """The README's searches (MLflow filter strings for the experiment page's search box).

    - ``np_cells``: every NP cell of ``dataset`` (one per framework and partition);
    - ``mc_dropout_vs_np``: ``framework``'s MC dropout and NP cells on ``dataset`` (MLflow's
      search has no ``OR`` and no ``IN`` on tags: it excludes the other heads of the study's
      grid, the baseline and the ``np_mean`` ablation);
    - ``attention_ablation``: ``framework``'s cells with the NP head class on ``dataset``, i.e.
      NP-SemiSeg (``np``) beside its ablations (``np_mean``: the mean aggregator).
    """
    return {
        "np_cells": f"tags.head = 'np' and tags.dataset = '{dataset}'",
        "mc_dropout_vs_np": f"tags.framework = '{framework}' and tags.dataset = '{dataset}' "
                            "and tags.head != 'baseline' and tags.head != 'np_mean'",
        "attention_ablation": f"tags.framework = '{framework}' and tags.dataset = '{dataset}' and tags.head_name = 'np'",
    }


def experiment_url(base_url: str, experiment_id: str) -> str:
    """The experiment's runs table (``base_url`` = the server's address, e.g. ``http://127.0.0.1:5000``).

    ``workflowType=machine_learning`` = the UI's "Model training" view: MLflow 3 otherwise opens
    an experiment on its GenAI overview (traces), where training runs are not listed.
    """
    return f"{base_url.rstrip('/')}/#/experiments/{experiment_id}/runs?workflowType=machine_learning"


def compare_url(base_url: str, run_ids: Sequence[str], experiment_ids: Sequence[str]) -> str:
    """The compare view of ``run_ids`` (MLflow 3: ``#/compare-runs?runs=[...]&experiments=[...]``)."""
    if len(run_ids) < 2:
        raise ValueError(f"run_ids: expected at least two runs to compare, got {list(run_ids)}")
    runs = quote(json.dumps(list(run_ids), separators=(",", ":")))
    experiments = quote(json.dumps(list(experiment_ids), separators=(",", ":")))
    return f"{base_url.rstrip('/')}/#/compare-runs?runs={runs}&experiments={experiments}"


def cell_description(config: Any, *, grid_id: str | None = None) -> str:
    """What a cell is, in Markdown, for the run's description (``mlflow.note.content``).

    Names the framework, the dataset (and the real dataset a synthetic one stands in for), the
    partition (labeled count and protocol), the head variant with the options it changes from
    the head's defaults, the seed, the preset-level scale (steps, crop, T) and the identifiers.
    """
    from npsemiseg.heads.factory import head_options

    info = config.dataset_info
    protocols = [alias for alias, name in info.partition_aliases.items() if name == config.partition and "/" in alias]
    partition = f"partition `{config.partition}`"
    if protocols:
        partition += f" ({protocols[0]} labeled)"
    dataset = f"`{config.dataset}`"
    if info.real_dataset and info.real_dataset != config.dataset:
        dataset += f" (synthetic stand-in for `{info.real_dataset}`)"
    defaults = head_options(config.head.name)
    changed = {key: value for key, value in config.head.options.items() if defaults.get(key) != value}
    head = f"head `{config.head.variant}`: {_HEAD_DESCRIPTIONS[config.head.name]}"
    if changed and config.head.variant != config.head.name:
        head += "; " + ", ".join(f"{key} = {value}" for key, value in sorted(changed.items()))
    schedule = config.schedule
    steps = f"{schedule.max_steps} steps" if schedule.max_steps else f"{schedule.epochs} epochs"
    lines = [
        f"**{config.cell_name}**: framework `{config.framework}` on {dataset}, {partition}, {head}; seed {config.seed}.",
        "",
        f"Training: {steps}, crop {schedule.crop_size}, batch {schedule.batch_size}; evaluation "
        f"`{config.evaluation.mode}` with T = {config.evaluation.num_samples} predictions.",
        "",
        f"Cell `{config.cell_id}`" + (f", grid `{grid_id}`" if grid_id else "") + ". Figures: "
        f"`figures/uncertainty_maps.png`, `figures/reliability.png`, `{PER_CLASS_IOU_FIGURE}`; "
        "configuration: `config/config.yaml`.",
    ]
    return "\n".join(lines)


def per_class_iou_figure(iou: Mapping[str, float], *, title: str | None = None) -> Figure:
    """A horizontal bar per class (IoU in %); classes absent from the evaluation (NaN) are marked."""
    if not iou:
        raise ValueError("iou: expected at least one class, got none")
    names = list(iou)
    values = [float(v) for v in iou.values()]
    figure = Figure(figsize=(5.0, 0.8 + 0.28 * len(names)), layout="constrained")
    ax = figure.subplots()
    positions = range(len(names))
    ax.barh(positions, [0.0 if v != v else 100 * v for v in values], color="#4c72b0")
    for y, value in zip(positions, values):
        ax.text(1 if value != value else 100 * value + 1, y, "n/a" if value != value else f"{100 * value:.1f}",
                va="center", fontsize=8)
    ax.set_yticks(list(positions), names, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, 110)
    ax.set_xlabel("IoU (%)")
    ax.grid(axis="x", alpha=0.3)
    if title:
        ax.set_title(title, fontsize=9)
    return figure


def serve(tracking: str | None = None, *, host: str = "127.0.0.1", port: int = DEFAULT_PORT,
          print_only: bool = False) -> int:
    """Replace this process with the MLflow UI server of a local store, after printing the
    ready-made searches (``print_only``: print the command and return 0). Exit status 2, with the
    reason on stderr, for a tracking server (it serves its own UI)."""
    try:
        command = ui_command(tracking, host=host, port=port)
    except ValueError as error:
        print(error, file=sys.stderr)
        return 2
    if print_only:
        print(" ".join(command))
        return 0
    print(f"MLflow UI at http://{host}:{port} (Ctrl-C stops it); searches to paste:", file=sys.stderr)
    for name, search in ready_made_searches().items():
        print(f"  {name}: {search}", file=sys.stderr)
    os.execv(command[0], command)
    return 0  # not reached


def main(argv: list[str] | None = None) -> int:
    """``python -m semiseg_platform.ui [--tracking URI] [--port N] [--print]``: serve a local store's UI."""
    parser = argparse.ArgumentParser(prog="python -m semiseg_platform.ui", description=main.__doc__)
    parser.add_argument("--tracking", help="MLflow store (default: $MLFLOW_TRACKING_URI, else ./mlruns.db)")
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind (default: loopback only)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument("--print", dest="print_only", action="store_true", help="print the command, start nothing")
    args = parser.parse_args(argv)
    return serve(args.tracking, host=args.host, port=args.port, print_only=args.print_only)


if __name__ == "__main__":
    sys.exit(main())
