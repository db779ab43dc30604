"""A grid's reliability figures: per dataset x partition, one row per framework, its reliability diagram and its
risk-coverage curve with the heads side by side (one line per head), drawn from the cells' curve data
(``figures/reliability_curves.json``, which every cell logs: ``mlflow_names.CELL_CURVES``).

A cell with several seeds is drawn from its lowest seed's run (the figure shows shapes; the reliability table
gives the numbers over seeds). Cells without the data (runs logged before it existed) are left out.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Mapping
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure
from mlflow import MlflowClient

from semiseg_platform.reports.reliability import head_row_label, reliability_rows
from semiseg_platform.reports.tables import framework_label, latest_per_cell
from semiseg_platform.storage import atomic_write
from semiseg_platform.tracking import mlflow_names

#: one colour per head, the same in every panel
HEAD_COLOURS = {"baseline": "tab:grey", "mc_dropout": "tab:orange", "np": "tab:blue", "np_mean": "tab:green"}


def load_curves(client: MlflowClient, runs: pd.DataFrame) -> dict[tuple[str, ...], dict]:
    """``{(protocol, dataset, framework, head, partition): curves}`` from the lowest-seed finished run of each cell
    that logged ``CELL_CURVES``."""
    finished = latest_per_cell(runs).sort_values(["seed", "run_id"], kind="stable")
    curves: dict[tuple[str, ...], dict] = {}
    with tempfile.TemporaryDirectory(prefix="npsemiseg-curves-") as scratch:
        for row in finished.itertuples(index=False):
            key = (row.protocol, row.dataset, row.framework, row.head, row.partition)
            if key in curves:
                continue
            try:
                path = client.download_artifacts(row.run_id, mlflow_names.CELL_CURVES, scratch)
            except Exception:  # noqa: BLE001 - MLflow raises several kinds for a missing artifact
                continue
            curves[key] = json.loads(Path(path).read_text())
    return curves


def reliability_figure(curves: Mapping[tuple[str, ...], dict], runs: pd.DataFrame, dataset: str, partition: str, *,
                       protocol: str = "", title: str) -> Figure | None:
    """The figure of one protocol x dataset x partition (None when no cell of it has curve data)."""
    rows = [(f, h) for f, h in reliability_rows(runs[runs["partition"] == partition], dataset)
            if (protocol, dataset, f, h, partition) in curves]
    frameworks = list(dict.fromkeys(f for f, _ in rows))
    if not frameworks:
        return None
    figure = Figure(figsize=(8.0, 3.0 * len(frameworks) + 0.6), layout="constrained")
    axes = figure.subplots(len(frameworks), 2, squeeze=False)
    for (diagram, risk), framework in zip(axes, frameworks):
        for head in [h for f, h in rows if f == framework]:
            data = curves[(protocol, dataset, framework, head, partition)]
            colour, label = HEAD_COLOURS.get(head), head_row_label(head)
            bins = data["reliability"]
            points = [((lo + hi) / 2, acc) for lo, hi, acc in zip(bins["lower"], bins["upper"], bins["accuracy"])
                      if acc is not None]
            diagram.plot([p[0] for p in points], [p[1] for p in points], "o-", color=colour, label=label, ms=3)
            curve = data["risk_coverage"]
            risk.plot(curve["coverage"], curve["risk"], "-", color=colour, label=label)
        diagram.plot([0, 1], [0, 1], "--", color="black", linewidth=0.8)
        diagram.set(xlim=(0, 1), ylim=(0, 1), xlabel="confidence", ylabel="accuracy",
                    title=f"{framework_label(framework)}: reliability")
        risk.set(xlim=(0, 1), ylim=(0, None), xlabel="coverage (most certain first)", ylabel="risk (error rate)",
                 title=f"{framework_label(framework)}: risk-coverage")
        diagram.legend(fontsize=7, loc="upper left")
    figure.suptitle(title, fontsize=10)
    return figure


def write_reliability_figures(tracking_uri: str, tables: Mapping[str, pd.DataFrame], out_dir: str | Path) -> list[Path]:
    """``<reliability table name>.png`` beside each reliability table of ``tables`` (:func:`.with_reliability_tables`)
    whose cells logged curve data; returns the files written."""
    runs = tables["cells"]
    reliability = {name: t for name, t in tables.items() if name != "cells" and t.attrs.get("metric") == "reliability"
                   and t.attrs.get("values") == "final"}
    if not reliability or not len(runs):
        return []
    curves = load_curves(MlflowClient(tracking_uri), runs)
    written = []
    for name, table in reliability.items():
        dataset, partition = table["dataset"].iloc[0], table["partition"].iloc[0]
        protocol = table.attrs.get("protocol", "")
        figure = reliability_figure(curves, runs[runs["protocol"] == protocol], dataset, partition, protocol=protocol,
                                    title=table.attrs["title"])
        if figure is not None:
            Path(out_dir).mkdir(parents=True, exist_ok=True)
            written.append(atomic_write(Path(out_dir) / f"{name}.png", lambda p, f=figure: f.savefig(p, dpi=100)))
    return written
