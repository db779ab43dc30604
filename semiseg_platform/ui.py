"""The MLflow UI over the study's runs: how to open it, what to search, what a cell run says.

The grid's runs are shaped for the UI by the tracking schema (``docs/CONTRACTS.md``): one
experiment per study, the submission's parent run with every cell as its child, the same
parameter keys in every cell (``npsemiseg.config.config_params``), the tags ``framework``, ``dataset``,
``partition``, ``head`` as columns and search terms, a description per cell
(:func:`cell_description`, MLflow's ``mlflow.note.content``) and figures under stable paths
(``figures/uncertainty_maps.png``, ``figures/reliability.png``, ``figures/per_class_iou.png``).

This module serves the UI itself:

- :func:`ui_command`: the ``mlflow server`` command that serves a local store's UI (on loopback,
  one worker); ``npsemiseg ui`` / ``python -m semiseg_platform.ui`` run it (``--print`` only prints it);
- :func:`ready_made_searches`: the README's searches, as filter strings for the search box;
- :func:`study_links`: for each experiment of a store that holds cells, links opening its runs table on a
  saved view (:mod:`semiseg_platform.tracking.experiment_page`): every cell, or one of the ready-made
  searches, best mIoU first, with the final mIoU, PAvPU and ECE as columns; ``npsemiseg ui`` prints them;
- :func:`experiment_url`, :func:`compare_url`: pages of the UI (MLflow 3's hash routes);
- what each cell run says (its description, the per-class IoU figure) is written by
  :mod:`semiseg_platform.tracking.describe`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import quote, urlencode, urlparse

from mlflow import MlflowClient

from semiseg_platform.logs import configure_logging
from semiseg_platform.tracking import DEFAULT_ARTIFACT_DIR, mlflow_names, resolve_tracking_uri
from semiseg_platform.tracking.experiment_page import CELL_FILTER, CELLS_VIEWS, describe_experiment
from semiseg_platform.tracking.store import sqlite_path

DEFAULT_PORT = 5000
#: the names of :func:`ready_made_searches` as the UI's saved views name them
SEARCH_TITLES = {"np_cells": "NP cells", "mc_dropout_vs_np": "MC dropout vs NP",
                 "attention_ablation": "Attention ablation"}

def ui_command(tracking: str | os.PathLike | None = None, *, host: str = "127.0.0.1", port: int = DEFAULT_PORT,
               workers: int = 1) -> list[str]:
    """The command serving the MLflow UI of a local store (``mlflow server`` on ``host:port``).

    ``tracking``: the store (default: ``MLFLOW_TRACKING_URI``, else ``./mlruns.db``, as the cell
    runner and the grid resolve it). Artifacts logged into a SQLite store live in ``mlartifacts/``
    beside it; the server serves them from there. A tracking server (``http(s)://``) has no
    command: its own address is the UI (``ValueError`` saying so).
    """
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


def experiment_url(base_url: str, experiment_id: str, *, view: str | None = None) -> str:
    """The experiment's runs table (``base_url`` = the server's address, e.g. ``http://127.0.0.1:5000``),
    on its saved ``view`` if given (``viewStateShareKey``: its search, order and columns).

    ``workflowType=machine_learning`` = the UI's "Model training" view: MLflow 3.17 otherwise opens
    an experiment on its GenAI overview (traces), where training runs are not listed (the URL
    parameter decides, not the experiment's kind tag: :mod:`semiseg_platform.tracking.experiment_page`).
    """
    query = {"workflowType": "machine_learning", **({"viewStateShareKey": view} if view else {})}
    return f"{base_url.rstrip('/')}/#/experiments/{experiment_id}/runs?{urlencode(query)}"


def search_views(dataset: str, framework: str = "u2pl") -> dict[str, tuple[str, str]]:
    """Saved views ``{id: (name, search filter)}``: every cell (by mIoU, by ECE), then each of
    :func:`ready_made_searches`."""
    views = dict(CELLS_VIEWS)
    for name, search in ready_made_searches(dataset, framework).items():
        views[f"npsemiseg-{name.replace('_', '-')}"] = (f"{SEARCH_TITLES[name]} ({dataset})", search)
    return views


def study_links(tracking_uri: str, base_url: str, framework: str = "u2pl") -> dict[str, dict[str, str]]:
    """``{experiment name: {view name: link}}`` for every experiment of the store that holds cell runs.

    The views (:func:`search_views`, on the dataset of the experiment's newest cell) are written onto the
    experiment first (:func:`~semiseg_platform.tracking.experiment_page.describe_experiment`, which also
    gives experiments created before the UI tags their kind and description). A SQLite store that does
    not exist yet has no links (and is not created).
    """
    db = sqlite_path(tracking_uri)
    if db is not None and not db.is_file():
        return {}
    client = MlflowClient(tracking_uri)
    links: dict[str, dict[str, str]] = {}
    for experiment in client.search_experiments():
        newest = client.search_runs([experiment.experiment_id], CELL_FILTER, max_results=1,
                                    order_by=["attributes.start_time DESC"])
        if not newest:
            continue
        views = search_views(newest[0].data.tags.get(mlflow_names.DATASET, ""), framework)
        describe_experiment(client, experiment, views)
        links[experiment.name] = {name: experiment_url(base_url, experiment.experiment_id, view=view)
                                  for view, (name, _) in views.items()}
    return links


def compare_url(base_url: str, run_ids: Sequence[str], experiment_ids: Sequence[str]) -> str:
    """The compare view of ``run_ids`` (MLflow 3: ``#/compare-runs?runs=[...]&experiments=[...]``)."""
    if len(run_ids) < 2:
        raise ValueError(f"run_ids: expected at least two runs to compare, got {list(run_ids)}")
    runs = quote(json.dumps(list(run_ids), separators=(",", ":")))
    experiments = quote(json.dumps(list(experiment_ids), separators=(",", ":")))
    return f"{base_url.rstrip('/')}/#/compare-runs?runs={runs}&experiments={experiments}"


def serve(tracking: str | None = None, *, host: str = "127.0.0.1", port: int = DEFAULT_PORT,
          print_only: bool = False) -> int:
    """Replace this process with the MLflow UI server of a local store, after printing the links of
    :func:`study_links` (``print_only``: print the command and return 0). Exit status 2, with the
    reason on stderr, for a tracking server (it serves its own UI)."""
    try:
        command = ui_command(tracking, host=host, port=port)
    except ValueError as error:
        print(error, file=sys.stderr)  # the user-facing answer: this store has no command
        return 2
    if print_only:
        print(" ".join(command))
        return 0
    base = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}"
    print(f"MLflow UI at {base} (Ctrl-C stops it); each link opens an experiment's cell runs, best mIoU first, "
          "with their mIoU, PAvPU and ECE")
    for experiment, views in study_links(resolve_tracking_uri(tracking), base).items():
        print(f"experiment {experiment}:")
        for name, url in views.items():
            print(f"  {name}: {url}")
    sys.stdout.flush()  # before execv replaces this process
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
    configure_logging(logging.INFO)
    return serve(args.tracking, host=args.host, port=args.port, print_only=args.print_only)


if __name__ == "__main__":
    sys.exit(main())
