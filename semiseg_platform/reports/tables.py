"""The paper's tables and figures, built from MLflow runs only (never from local files).

Tables (the layout of the paper, `paper/np_semiseg_icml2023.tex`):

- Tables 1-3: mIoU per framework x head x partition, one table per dataset
  (classic VOC, blender VOC, Cityscapes; a synthetic stand-in takes its real
  dataset's place). Rows are grouped in head blocks (baseline, MC dropout,
  NP-SemiSeg), one row per framework; columns are the four partition protocols.
  FixMatch and UniMatch, which the paper has no rows for (``COMPANION_FRAMEWORKS``,
  ``jobs/specs/paper_unimatch.yaml``), follow the paper's frameworks in each block
  when the experiment holds their runs; so do UniMatch V2's (``jobs/specs/paper_unimatch_v2.yaml``: its own
  experiment, whose tables then hold its rows only, with ADE20K and COCO tables and a column for every
  partition its runs have beyond the four protocols, such as classic VOC's full 1464).
- Table 4: PAvPU of U2PL, MC dropout vs NP-SemiSeg, rows = dataset x partition.
- Tables 5-6: U2PL + NP-SemiSeg without (mean aggregator, head variant
  ``np_mean``) vs with attention, mIoU and PAvPU.

Every table is a *long* DataFrame with one row per table cell, in the paper's
row/column order: ``block``, ``row``, ``column`` (display labels), the cell's
keys (``dataset``, ``framework``, ``head``, ``partition``), ``metric``, ``mean``,
``std`` (sample std over seeds, NaN for one seed), ``n`` (number of seeds),
``seeds``, ``run_ids`` and ``status`` (``ok``, or ``missing`` / ``failed`` /
``running`` when no finished run exists: such a cell is kept and marked, never
dropped), ``paper`` (the paper's printed value, :mod:`.paper_results`, or UniMatch V2's published one for its
rows; NaN for a synthetic stand-in or a value the paper does not print) and ``diff`` (mean - paper).
``mean``/``std`` are the MLflow metric times ``scale`` (100: percent, as the paper
prints). Layout metadata (title, caption, column order, row header) lives in
``DataFrame.attrs``. The writers turn a long table into Markdown and LaTeX in the
paper's layout, a ``*_layout.csv`` with the displayed strings, and
CSV / Parquet holding the long numeric frame.

Which runs count is fixed by the tracking schema (``docs/CONTRACTS.md``): cell
runs carry ``npsemiseg.kind = cell`` and the tags ``framework``, ``dataset``,
``partition``, ``head`` (the head's label), ``seed``, ``cell_id``; the final metrics are
``miou`` and ``pavpu``. When several finished runs share a ``cell_id`` the
latest one counts; seeds (different ``cell_id``) are aggregated. Runs are grouped by
their ``protocol`` tag (``released`` | ``corrected``, ``npsemiseg.protocol``) and a table
never mixes two: with several protocols every table exists once per protocol
(``table1_miou_pascal_classic_released``, ...); runs without the tag (written before
protocols existed) form their own group.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd
from mlflow import MlflowClient

from npsemiseg.data import dataset_definition, dataset_info, protocol_partitions
from npsemiseg.heads import head_class, head_names
from semiseg_platform.reports.paper_results import paper_value
from semiseg_platform.tracking import experiment_id, mlflow_names, search_all_runs, submission_runs

PAPER_DATASETS = ("pascal_classic", "pascal_blender", "cityscapes")
ABLATION_DATASET_ORDER = ("cityscapes", "pascal_classic", "pascal_blender")
#: Table number of Tables 1-3 per (real) dataset.
MIOU_TABLE_NUMBER = {"pascal_classic": 1, "pascal_blender": 2, "cityscapes": 3}
#: Frameworks (rows) of Tables 1-3: the supervised reference first, then the paper's four.
PAPER_FRAMEWORKS = ("supervised", "mt", "psmt", "u2pl", "augseg")
#: Frameworks the paper has no rows for, printed after the paper's in Tables 1-3 when their runs exist.
COMPANION_FRAMEWORKS = ("fixmatch", "unimatch", "fixmatch_v2", "unimatch_v2", "unimatch_v2_s")
#: Head variants (row blocks) of Tables 1-3.
PAPER_HEADS = ("baseline", "mc_dropout", "np")
#: The ablation's head variants: NP-SemiSeg with the mean aggregator vs with attention.
ABLATION_HEADS = ("np_mean", "np")
#: The framework that Tables 4-6 fix.
ABLATION_FRAMEWORK = "u2pl"

FRAMEWORK_LABELS = {"supervised": "Supervised", "mt": "MT", "psmt": "PS-MT", "u2pl": "U2PL", "augseg": "AugSeg",
                    "fixmatch": "FixMatch", "unimatch": "UniMatch", "fixmatch_v2": "FixMatch (DINOv2-B)",
                    "unimatch_v2": "UniMatch V2 (DINOv2-B)", "unimatch_v2_s": "UniMatch V2 (DINOv2-S)"}
FRAMEWORK_LATEX = {"u2pl": "U$^2$PL"}
#: Labels of head variants that are no head class of their own (a head class names itself: ``label``)
VARIANT_LABELS = {"np_mean": "NP-SemiSeg (mean aggregator)"}
MISSING_MARK = "—"
CELL_KEYS = mlflow_names.CELL_KEYS
#: the final metrics a cell row holds (NaN when not logged): Tables 1-6's and the reliability table's
RUN_METRICS = ("miou", "pavpu", "ece", "ece_adaptive", "nll", "brier", "auroc", "aupr", "aurc", "pavpu_balanced")
#: the prefixes of the same metrics logged apart: the best evaluation's and the last epoch's (``evaluation.select``),
#: the student's last and best where a framework reports a teacher (``evaluation.also_student``)
LOGGED_APART = ("best/", "last/", "student/", "best_student/")
#: the column naming a cell's dataset instance (its ``data.options``, e.g. the study dataset's ``seed``): the mini
#: study run again at another data seed into the same experiment is a second instance, never a newer run of a cell
DATA_INSTANCE = "data_instance"
#: The order of the protocol groups (runs without the tag last)
PROTOCOL_ORDER = ("released", "corrected")

# ----------------------------------------------------------------------------- reading MLflow


def _escape(value: str) -> str:
    return value.replace("'", "\\'")


def load_cell_runs(tracking_uri: str, experiment: str, *, grid_id: str | None = None) -> pd.DataFrame:
    """One row per cell run of ``experiment`` (optionally only those of one grid or search, ``grid_id``).

    Columns: ``run_id``, ``status``, ``start_time``, ``end_time``, ``cell_id``, ``seed``, ``data_instance``
    (:func:`data_instance`), the cell keys ``dataset``, ``framework`` (the framework's label), ``head`` (the head's
    label), ``partition``, ``protocol`` ("" when untagged), ``framework_name`` (the framework class; the label on
    runs that predate the tag), ``decoder`` (the ``model.decoder`` parameter, ``model.variant`` on runs logged
    before the rename; "" when not logged), the final metrics :data:`RUN_METRICS` and the same prefixed by
    :data:`LOGGED_APART` (NaN when not logged). An unknown experiment gives an empty frame.
    """
    metric_columns = [*RUN_METRICS, *(prefix + m for prefix in LOGGED_APART for m in RUN_METRICS)]
    columns = ["run_id", "status", "start_time", "end_time", "cell_id", "seed", DATA_INSTANCE, *CELL_KEYS, "protocol",
               "framework_name", "decoder", *metric_columns]
    client = MlflowClient(tracking_uri)
    found = experiment_id(client, experiment)
    if found is None:
        return pd.DataFrame(columns=columns)
    kind = f"tags.`{mlflow_names.KIND}` = '{mlflow_names.KIND_CELL}'"
    if grid_id is not None:
        runs = submission_runs(client, [found], _escape(grid_id), f" and {kind}")
    else:
        runs = search_all_runs(client, [found], kind)
    rows = []
    for run in runs:
        tags, metrics = run.data.tags, run.data.metrics
        rows.append({
            "run_id": run.info.run_id,
            "status": run.info.status,
            "start_time": run.info.start_time,
            "end_time": run.info.end_time,
            "cell_id": tags.get(mlflow_names.CELL_ID, run.info.run_id),
            "seed": tags.get(mlflow_names.SEED, ""),
            DATA_INSTANCE: data_instance(run.data.params),
            **{key: tags.get(key, "") for key in CELL_KEYS},
            "protocol": tags.get(mlflow_names.PROTOCOL, ""),
            "framework_name": tags.get(mlflow_names.FRAMEWORK_NAME, tags.get(mlflow_names.FRAMEWORK, "")),
            "decoder": mlflow_names.param_value(run.data.params, "model.decoder") or "",
            **{metric: metrics.get(metric, math.nan) for metric in metric_columns},
        })
    return pd.DataFrame(rows, columns=columns)


def data_instance(params: dict[str, str]) -> str:
    """A run's dataset instance: its ``data.options.*`` parameters as ``key=value`` joined by commas in key order
    (``family=study_textures,seed=0``); "" for a dataset without options."""
    prefix = "data.options."
    return ",".join(f"{key.removeprefix(prefix)}={params[key]}" for key in sorted(params) if key.startswith(prefix))


def latest_per_cell(runs: pd.DataFrame) -> pd.DataFrame:
    """The finished runs, one per ``cell_id`` (the latest to end; of two ending together, the larger run id)."""
    finished = runs[runs["status"] == "FINISHED"]
    finished = finished.sort_values(["end_time", "start_time", "run_id"], na_position="first", kind="stable")
    return finished.drop_duplicates("cell_id", keep="last")


# ----------------------------------------------------------------------------- building tables


@dataclass(frozen=True)
class CellKey:
    """The keys selecting one table cell's runs (one value per seed)."""

    dataset: str
    framework: str
    head: str
    partition: str


@dataclass(frozen=True)
class TableRow:
    """One row: its block (head block or dataset), its label, and both in LaTeX."""

    block: str
    label: str
    latex_block: str
    latex_label: str


@dataclass(frozen=True)
class TableSpec:
    """A table: its rows, its columns and how each (row, column) maps to a cell and a metric."""

    name: str
    title: str
    caption: str
    metric: str
    row_header: tuple[str, ...]
    columns: tuple[str, ...]
    latex_columns: tuple[str, ...]
    rows: tuple[TableRow, ...]
    cells: tuple[tuple[CellKey, ...], ...]  # [row][column]
    block_is_row_header: bool


def _real_dataset(name: str) -> str:
    info = dataset_info(name)
    return getattr(info, "real_dataset", None) or name


def dataset_label(dataset: str, *, latex: bool = False) -> str:
    real = _real_dataset(dataset)
    definition = dataset_definition(real)  # its ``label`` and ``latex_label``
    label = (definition.latex_label if latex else "") or definition.label or real
    if real == dataset:
        return label
    name = dataset.replace("_", "\\_") if latex else dataset
    return f"{label} [{name}]"


def framework_label(framework: str, *, latex: bool = False) -> str:
    if latex and framework in FRAMEWORK_LATEX:
        return FRAMEWORK_LATEX[framework]
    return FRAMEWORK_LABELS.get(framework, framework)


def head_label(head: str) -> str:
    """A head variant's name in the tables: the head class's ``label``, a variant's own, else as given."""
    if head in VARIANT_LABELS:
        return VARIANT_LABELS[head]
    return head_class(head).label if head in head_names() else head


def method_label(framework: str, head: str, *, latex: bool = False) -> str:
    """``"MT"``, ``"MT w/ MC dropout"``, ``"U$^2$PL w/ NP-SemiSeg"`` (the paper's row names)."""
    base = framework_label(framework, latex=latex)
    return base if head == "baseline" else f"{base} w/ {head_label(head)}"


def table_partitions(dataset: str, extra: Sequence[str] = ()) -> list[tuple[str, str]]:
    """``[(partition, label), ...]``: the dataset's partition protocols, then each partition of ``extra`` that is no
    protocol (classic VOC's full 1464: ``"full (1464)"``), in the dataset's order."""
    partitions = protocol_partitions(dataset)
    known = {name for name, _ in partitions}
    info = dataset_info(dataset)
    alias = {name: key for key, name in info.partition_aliases.items()}
    more = [name for name in info.partitions if name in set(extra) - known]
    return partitions + [(name, f"{alias[name]} ({name})" if name in alias else name) for name in more]


def miou_table_spec(dataset: str, frameworks: Sequence[str], heads: Sequence[str],
                    extra_partitions: Sequence[str] = ()) -> TableSpec:
    """Tables 1-3: mIoU, head blocks x framework rows, partition columns (:func:`table_partitions`)."""
    number = MIOU_TABLE_NUMBER.get(_real_dataset(dataset))
    partitions = table_partitions(dataset, extra_partitions)
    rows, cells = [], []
    for head in heads:
        for framework in frameworks:
            block = head_label(head) or "baseline"
            rows.append(TableRow(block, method_label(framework, head), block,
                                 method_label(framework, head, latex=True)))
            cells.append(tuple(CellKey(dataset, framework, head, p) for p, _ in partitions))
    title = f"Table {number}" if number else "Table"
    return TableSpec(
        name=f"table{number or ''}_miou_{dataset}",
        title=f"{title}: mIoU on {dataset_label(dataset)}",
        caption=(f"The mean IoU of different frameworks with either MC dropout or NP-SemiSeg on "
                 f"{dataset_label(dataset)} under different partition protocols."),
        metric="miou",
        row_header=("Method",),
        columns=tuple(label for _, label in partitions),
        latex_columns=tuple(label for _, label in partitions),
        rows=tuple(rows),
        cells=tuple(cells),
        block_is_row_header=False,
    )


def head_comparison_spec(
    name: str, title: str, caption: str, metric: str, datasets: Sequence[str],
    heads: Sequence[str], column_labels: Sequence[str], framework: str = ABLATION_FRAMEWORK,
) -> TableSpec:
    """Tables 4-6: rows = dataset x partition, one column per head variant of ``framework``."""
    rows, cells = [], []
    for dataset in datasets:
        for partition, label in protocol_partitions(dataset):
            rows.append(TableRow(dataset_label(dataset), label, dataset_label(dataset, latex=True), label))
            cells.append(tuple(CellKey(dataset, framework, head, partition) for head in heads))
    return TableSpec(
        name=name, title=title, caption=caption, metric=metric,
        row_header=("Dataset", "Label Amount"),
        columns=tuple(column_labels), latex_columns=tuple(column_labels),
        rows=tuple(rows), cells=tuple(cells), block_is_row_header=True,
    )


def paper_table_specs(datasets: Sequence[str], frameworks: Sequence[str] = PAPER_FRAMEWORKS,
                      heads: Sequence[str] = PAPER_HEADS,
                      extra_partitions: dict[str, Sequence[str]] | None = None) -> list[TableSpec]:
    """The specs of Tables 1-6 for ``datasets`` (real datasets or their synthetic stand-ins); ``extra_partitions``:
    per dataset, partitions beyond its protocols that Tables 1-3 get columns for."""
    by_real = sorted(datasets, key=lambda d: (PAPER_DATASETS.index(_real_dataset(d))
                                              if _real_dataset(d) in PAPER_DATASETS else len(PAPER_DATASETS), d))
    ablation = sorted(datasets, key=lambda d: (ABLATION_DATASET_ORDER.index(_real_dataset(d))
                                               if _real_dataset(d) in ABLATION_DATASET_ORDER
                                               else len(ABLATION_DATASET_ORDER), d))
    u2pl = framework_label(ABLATION_FRAMEWORK)
    specs = [miou_table_spec(d, frameworks, heads, (extra_partitions or {}).get(d, ())) for d in by_real]
    specs.append(head_comparison_spec(
        "table4_pavpu", f"Table 4: PAvPU of {u2pl}, MC dropout vs NP-SemiSeg",
        f"The PAvPU of {u2pl} with either MC dropout or NP-SemiSeg on different datasets.",
        "pavpu", ablation, ("mc_dropout", "np"), ("MC Dropout", "NP-SemiSeg")))
    for number, metric, metric_name in ((5, "miou", "mean IoU"), (6, "pavpu", "PAvPU")):
        specs.append(head_comparison_spec(
            f"table{number}_attention_{metric}",
            f"Table {number}: attention vs mean aggregator ({metric_name}, {u2pl} + NP-SemiSeg)",
            f"Ablation of the attention aggregator; {u2pl}, {metric_name} reported.",
            metric, ablation, ABLATION_HEADS, ("w/o Attention", "w/ Attention")))
    return specs


def _cell_status(all_runs: pd.DataFrame, key: CellKey) -> str:
    """``missing`` when no run exists at all, else the best status among unfinished runs."""
    match = all_runs[(all_runs["dataset"] == key.dataset) & (all_runs["framework"] == key.framework)
                     & (all_runs["head"] == key.head) & (all_runs["partition"] == key.partition)]
    statuses = set(match["status"])
    if "RUNNING" in statuses or "SCHEDULED" in statuses:
        return "running"
    if statuses:
        return "failed"
    return "missing"


def build_table(spec: TableSpec, runs: pd.DataFrame, *, scale: float = 100.0) -> pd.DataFrame:
    """The long frame of one table (see the module docstring) from ``runs`` (`load_cell_runs`)."""
    finished = latest_per_cell(runs)
    grouped = {key: group for key, group in finished.groupby(list(CELL_KEYS), sort=False)}
    records = []
    for row, row_cells in zip(spec.rows, spec.cells):
        for column, key in zip(spec.columns, row_cells):
            group = grouped.get((key.dataset, key.framework, key.head, key.partition))
            values = [] if group is None else group[spec.metric].dropna()
            if len(values):
                group = group.loc[values.index].sort_values("seed", kind="stable")
                values = group[spec.metric].astype(float) * scale
                mean = float(values.mean())
                std = float(values.std(ddof=1)) if len(values) > 1 else math.nan
                status, seeds, run_ids = "ok", ",".join(group["seed"]), ",".join(group["run_id"])
            else:
                mean = std = math.nan
                status, seeds, run_ids = _cell_status(runs, key), "", ""
            paper = _paper(key, spec.metric, scale)
            records.append({
                "block": row.block, "row": row.label, "column": column,
                "dataset": key.dataset, "framework": key.framework, "head": key.head,
                "partition": key.partition, "metric": spec.metric,
                "mean": mean, "std": std, "n": len(values), "seeds": seeds, "run_ids": run_ids,
                "status": status, "paper": paper, "diff": mean - paper,
            })
    table = pd.DataFrame.from_records(records)
    table.attrs.update({
        "name": spec.name, "title": spec.title, "caption": spec.caption, "metric": spec.metric,
        "scale": scale, "row_header": list(spec.row_header), "columns": list(spec.columns),
        "latex_columns": list(spec.latex_columns), "latex_rows": [(r.latex_block, r.latex_label) for r in spec.rows],
        "block_is_row_header": spec.block_is_row_header,
    })
    return table


def for_protocol(table: pd.DataFrame, protocol: str) -> pd.DataFrame:
    """``table`` marked with its protocol group (attrs and title)."""
    table.attrs["protocol"] = protocol
    if protocol:
        table.attrs["title"] += f" [protocol {protocol}]"
    return table


def _paper(key: CellKey, metric: str, scale: float) -> float:
    """The paper's value of a cell in the table's scale (NaN for stand-ins and values the paper lacks)."""
    value = paper_value(key.dataset, key.framework, key.head, key.partition, metric)
    return math.nan if value is None else value / 100.0 * scale


def protocol_groups(runs: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """``[(protocol, its runs), ...]``: released, corrected, any other, untagged (""); one empty group
    ("", runs) when there are no runs."""
    found = list(dict.fromkeys(runs["protocol"])) if len(runs) else []
    order = [p for p in PROTOCOL_ORDER if p in found] + sorted(p for p in found if p not in PROTOCOL_ORDER and p)
    order += [""] if "" in found or not found else []
    return [(protocol, runs[runs["protocol"] == protocol] if found else runs) for protocol in order]


def discover_datasets(runs: pd.DataFrame) -> list[str]:
    """The datasets that cell runs exist for, or the paper's three when there are none."""
    found = sorted({d for d in runs["dataset"] if d})
    return found or list(PAPER_DATASETS)


def table_frameworks(runs: pd.DataFrame) -> list[str]:
    """The framework rows of Tables 1-3 for ``runs``: the paper's, then each of :data:`COMPANION_FRAMEWORKS`
    that has a run (under any protocol, so that every protocol's tables have the same rows); the companions alone
    where no run is of the paper's frameworks (UniMatch V2's own experiment)."""
    found = set(runs["framework"]) if len(runs) else set()
    companions = [f for f in COMPANION_FRAMEWORKS if f in found]
    paper = list(PAPER_FRAMEWORKS) if found & set(PAPER_FRAMEWORKS) or not companions else []
    return [*paper, *companions]


def run_partitions(runs: pd.DataFrame) -> dict[str, list[str]]:
    """Per dataset, the partitions its cell runs have (the columns a table may add: :func:`table_partitions`)."""
    if not len(runs):
        return {}
    return {d: sorted(set(group["partition"])) for d, group in runs.groupby("dataset") if d}


def build_tables(
    tracking_uri: str, experiment: str, *, grid_id: str | None = None,
    datasets: Sequence[str] | None = None, frameworks: Sequence[str] | None = None,
    heads: Sequence[str] = PAPER_HEADS, scale: float = 100.0,
) -> dict[str, pd.DataFrame]:
    """The paper's Tables 1-6 from the cell runs of ``experiment`` (see the module docstring).

    ``datasets`` defaults to those the runs cover; ``frameworks`` / ``heads`` are the rows of
    Tables 1-3 (``frameworks`` None: :func:`table_frameworks`). The result maps table names (``table1_miou_pascal_classic``, ...,
    ``table4_pavpu``, ``table5_attention_miou``, ``table6_attention_pavpu``; suffixed ``_<protocol>``
    when the runs hold several protocols) to long frames (``attrs["protocol"]``), plus ``cells``: every
    cell run read (one row per run, metrics unscaled).
    """
    runs = load_cell_runs(tracking_uri, experiment, grid_id=grid_id)
    datasets = list(datasets) if datasets is not None else discover_datasets(runs)
    frameworks = list(frameworks) if frameworks is not None else table_frameworks(runs)
    groups = protocol_groups(runs)
    tables = {}
    for protocol, group in groups:
        suffix = f"_{protocol or 'untagged'}" if len(groups) > 1 else ""
        for spec in paper_table_specs(datasets, frameworks, heads, run_partitions(runs)):
            tables[spec.name + suffix] = for_protocol(build_table(spec, group, scale=scale), protocol)
    tables["cells"] = runs
    return tables
