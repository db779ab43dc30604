"""The reliability table of a grid, beside Tables 1-6: per dataset and partition, one row per framework x head,
one column per metric of uncertainty quality (``docs/uncertainty.md``).

Columns: mIoU, ECE with equal-width and equal-mass bins, NLL, Brier, the AUROC and AUPR of "the pixel is
wrong" against the head's uncertainty, AURC, PAvPU and its class-balanced variant; mean ± sample std over
seeds, as Tables 1-6. Every value is x 100 except NLL (nats). The values are a run's final metrics: those of
the model its framework evaluates (``Framework.eval_model``: the EMA teacher where the framework has one)
at the checkpoint ``evaluation.select`` chose (the last epoch by default); the runs log the last epoch's and
the best evaluation's apart (``last/<metric>``, ``best/<metric>``), with ``evaluation.also_student`` the
student's last and best evaluations too (``student/<metric>``, ``best_student/<metric>``), and
:func:`reliability_tables` builds the table from any of them (``values``), its title saying which.

The tables are long frames in the format of :mod:`.tables` (``block`` = framework, ``row`` = head, ``column``
= metric; ``paper`` / ``diff`` NaN: the paper prints none of these), so the writers of :mod:`.rendering` print
them as they print Tables 1-6.
"""

from __future__ import annotations

import math
import re

import pandas as pd

from semiseg_platform.reports.tables import (
    ABLATION_HEADS,
    CELL_KEYS,
    PAPER_HEADS,
    CellKey,
    _cell_status,
    dataset_label,
    for_protocol,
    framework_label,
    head_label,
    latest_per_cell,
    protocol_groups,
    table_frameworks,
    table_partitions,
)

#: (metric, column label, scale): the table's columns; arrows say which way is better
RELIABILITY_COLUMNS = (
    ("miou", "mIoU ↑", 100.0),
    ("ece", "ECE ↓", 100.0),
    ("ece_adaptive", "ECE (equal-mass) ↓", 100.0),
    ("nll", "NLL ↓", 1.0),
    ("brier", "Brier ↓", 100.0),
    ("auroc", "AUROC ↑", 100.0),
    ("aupr", "AUPR ↑", 100.0),
    ("aurc", "AURC ↓", 100.0),
    ("pavpu", "PAvPU ↑", 100.0),
    ("pavpu_balanced", "PAvPU (balanced) ↑", 100.0),
)
RELIABILITY_METRICS = tuple(metric for metric, _, _ in RELIABILITY_COLUMNS)
#: which of a run's values a table shows: its final (selected) metrics, or those logged apart
VALUES = {"final": "", "best": "best/", "last": "last/", "student": "student/", "best_student": "best_student/"}
VALUES_WORDS = {
    "final": "the run's final metrics (the checkpoint evaluation.select chose: the last epoch unless select=best)",
    "best": "the best validation-mIoU evaluation of the run (best/<metric>)",
    "last": "the last epoch's evaluation (last/<metric>)",
    "student": "the student's last-epoch evaluation (student/<metric>, evaluation.also_student)",
    "best_student": "the student's best validation-mIoU evaluation (best_student/<metric>, evaluation.also_student)",
}


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", text).strip("_")


def head_row_label(head: str) -> str:
    """A head's row label: its label, "baseline" for the baseline head (whose label is empty: Tables 1-3 print
    the framework alone)."""
    return head_label(head) or head


def reliability_rows(runs: pd.DataFrame, dataset: str) -> list[tuple[str, str]]:
    """``[(framework, head), ...]`` with a run on ``dataset``, frameworks in Tables 1-3's order, heads in the
    paper's order (baseline, MC dropout, NP-SemiSeg, then the mean aggregator and any other)."""
    on = runs[runs["dataset"] == dataset]
    frameworks = [f for f in table_frameworks(runs) if f in set(on["framework"])]
    frameworks += sorted(set(on["framework"]) - set(frameworks))
    heads = [*PAPER_HEADS, *[h for h in ABLATION_HEADS if h not in PAPER_HEADS]]
    heads += sorted(set(on["head"]) - set(heads))
    present = set(zip(on["framework"], on["head"]))
    return [(f, h) for f in frameworks for h in heads if (f, h) in present]


def reliability_table(runs: pd.DataFrame, dataset: str, partition: str, partition_label: str, *,
                      values: str = "final") -> pd.DataFrame | None:
    """The long frame of one dataset x partition (None when no run has it)."""
    on = runs[(runs["dataset"] == dataset) & (runs["partition"] == partition)]
    rows = reliability_rows(on, dataset)
    if not rows:
        return None
    prefix = VALUES[values]
    finished = latest_per_cell(on)
    grouped = {key: group for key, group in finished.groupby(list(CELL_KEYS), sort=False)}
    records = []
    for framework, head in rows:
        group = grouped.get((dataset, framework, head, partition))
        for metric, label, scale in RELIABILITY_COLUMNS:
            column = prefix + metric
            found = [] if group is None or column not in group else group[column].dropna()
            record = {"block": framework_label(framework), "row": head_row_label(head), "column": label,
                      "dataset": dataset, "framework": framework, "head": head, "partition": partition,
                      "metric": metric, "paper": math.nan, "diff": math.nan}
            if len(found):
                chosen = group.loc[found.index].sort_values("seed", kind="stable")
                numbers = chosen[column].astype(float) * scale
                record.update(mean=float(numbers.mean()), std=float(numbers.std(ddof=1)) if len(numbers) > 1
                              else math.nan, n=len(numbers), seeds=",".join(chosen["seed"]),
                              run_ids=",".join(chosen["run_id"]), status="ok")
            else:
                record.update(mean=math.nan, std=math.nan, n=0, seeds="", run_ids="",
                              status=_cell_status(runs, CellKey(dataset, framework, head, partition)))
            records.append(record)
    table = pd.DataFrame.from_records(records)
    columns = [label for _, label, _ in RELIABILITY_COLUMNS]
    where = f"{dataset_label(dataset)}, {partition_label}"
    table.attrs.update({
        "name": f"reliability_{dataset}_{_slug(partition)}" + ("" if values == "final" else f"_{values}"),
        "title": f"Reliability: {where} ({values} values)",
        "caption": (f"Uncertainty quality on {where}: calibration, error detection from the head's own uncertainty "
                    f"(the entropy of its predictive), selective risk and PAvPU; values: {VALUES_WORDS[values]}, "
                    + ("of each framework's student (the model it evaluates where it has no teacher)."
                       if values in ("student", "best_student")
                       else "of the model each framework evaluates (its EMA teacher where it has one).")),
        "metric": "reliability", "scale": 100.0, "values": values,
        "note": "x 100 except NLL (nats); ↑ / ↓: higher / lower is better",
        "row_header": ["Framework", "Head"], "columns": columns, "latex_columns": [c.replace("↑", "$\\uparrow$")
                                                                                    .replace("↓", "$\\downarrow$")
                                                                                    for c in columns],
        "latex_rows": [(framework_label(f, latex=True), head_row_label(h)) for f, h in rows],
        "block_is_row_header": True,
    })
    return table


def reliability_tables(runs: pd.DataFrame, *, values: str = "final", suffix: str = "") -> dict[str, pd.DataFrame]:
    """``{name: table}``: one reliability table per dataset x partition that ``runs`` (``load_cell_runs``) hold,
    datasets sorted, partitions in the dataset's order; ``suffix`` is added to every name (a protocol's)."""
    if values not in VALUES:
        raise ValueError(f"values: expected one of {sorted(VALUES)}, got {values!r}")
    tables = {}
    for dataset in sorted({d for d in runs["dataset"] if d}):
        present = set(runs.loc[runs["dataset"] == dataset, "partition"])
        for partition, label in table_partitions(dataset, sorted(present)):
            if partition in present:
                table = reliability_table(runs, dataset, partition, label, values=values)
                if table is not None:
                    tables[table.attrs["name"] + suffix] = table
    return tables


def with_reliability_tables(tables: dict[str, pd.DataFrame], *, values: str = "final") -> dict[str, pd.DataFrame]:
    """``tables`` (:func:`~.tables.build_tables`'s) with the reliability tables of its cell runs (``cells``) added
    before ``cells``, one set per protocol group, suffixed as Tables 1-6 are."""
    runs = tables["cells"]
    groups = protocol_groups(runs)
    added = {name: table for name, table in tables.items() if name != "cells"}
    for protocol, group in groups:
        suffix = f"_{protocol or 'untagged'}" if len(groups) > 1 else ""
        for name, table in reliability_tables(group, values=values, suffix=suffix).items():
            added[name] = for_protocol(table, protocol)
    return {**added, "cells": runs}
