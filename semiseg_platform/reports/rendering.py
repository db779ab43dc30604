"""The tables as the paper prints them: Markdown, LaTeX (booktabs + multirow), layout CSV, and the
long numeric frames as CSV / Parquet; :func:`write_report` writes a whole report."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from pathlib import Path

import pandas as pd

from semiseg_platform.reports.figures import uncertainty_time_figure
from semiseg_platform.reports.reliability import with_reliability_tables
from semiseg_platform.reports.reliability_figure import write_reliability_figures
from semiseg_platform.reports.shift import shift_tables
from semiseg_platform.reports.tables import (
    MISSING_MARK,
    PAPER_HEADS,
    build_tables,
    discover_datasets,
    table_frameworks,
)
from semiseg_platform.storage import atomic_write


def format_cell(mean: float, std: float, status: str, *, latex: bool = False, digits: int = 2) -> str:
    """``"48.37"``, ``"48.37 ± 0.52"`` (several seeds) or the missing mark / run status."""
    if status != "ok":
        mark = "--" if latex else MISSING_MARK
        return mark if status == "missing" else f"{mark} ({status})"
    text = f"{mean:.{digits}f}"
    if not math.isnan(std):
        text += f" $\\pm$ {std:.{digits}f}" if latex else f" ± {std:.{digits}f}"
    return text


def format_versus_paper(paper: float, mean: float, status: str, *, digits: int = 2) -> str:
    """``"48.37 / 47.10 (-1.27)"``: the paper's value / ours (ours - paper); the mark where either is missing."""
    if math.isnan(paper):
        return MISSING_MARK
    ours = f"{mean:.{digits}f} ({mean - paper:+.{digits}f})" if status == "ok" else MISSING_MARK
    return f"{paper:.{digits}f} / {ours}"


def format_protocol_pair(released: float, corrected: float, *, digits: int = 2) -> str:
    """``"61.00 / 55.00 (-6.00)"``: the released protocol's value / the corrected one's (corrected -
    released); the missing mark for a side without a finished run."""
    sides = [MISSING_MARK if math.isnan(v) else f"{v:.{digits}f}" for v in (released, corrected)]
    difference = "" if math.isnan(released) or math.isnan(corrected) else f" ({corrected - released:+.{digits}f})"
    return f"{sides[0]} / {sides[1]}{difference}"


def layout(table: pd.DataFrame, *, latex: bool = False, versus_paper: bool = False,
           display: list[str] | None = None) -> pd.DataFrame:
    """The table as the paper prints it: one string per cell, rows and columns in order
    (``versus_paper``: each cell as "paper / ours (difference)"; ``display``: the cells' strings given)."""
    attrs = table.attrs
    columns = attrs["latex_columns"] if latex else attrs["columns"]
    if display is None and versus_paper:
        display = [format_versus_paper(p, m, st) for p, m, st in zip(table["paper"], table["mean"], table["status"])]
    elif display is None:
        display = [format_cell(m, s, st, latex=latex) for m, s, st in zip(table["mean"], table["std"], table["status"])]
    width = len(columns)
    rows = []
    for index in range(0, len(display), width):
        row = table.iloc[index]
        block, label = attrs["latex_rows"][index // width] if latex else (row["block"], row["row"])
        header = [block, label] if attrs["block_is_row_header"] else [label]
        rows.append([*header, *display[index:index + width]])
    return pd.DataFrame(rows, columns=[*attrs["row_header"], *columns])


def _blocks(table: pd.DataFrame) -> list[str]:
    width = len(table.attrs["columns"])
    return list(table["block"].iloc[::width])


def has_paper_values(table: pd.DataFrame) -> bool:
    """Whether any cell of the table has a value printed in the paper (a real dataset's table)."""
    return "paper" in table and bool(table["paper"].notna().any())


def to_markdown(table: pd.DataFrame, *, versus_paper: bool = False, display: list[str] | None = None,
                title: str | None = None) -> str:
    """A Markdown table in the paper's layout, preceded by its title (``versus_paper``: "paper / ours";
    ``display`` and ``title``: the cells' strings and the title given, as :func:`protocols_side_by_side`)."""
    frame = layout(table, versus_paper=versus_paper, display=display)
    blocks = _blocks(table)
    title = title or table.attrs["title"] + (" — paper / ours (ours − paper)" if versus_paper else "")
    lines = [f"### {title}", "",
             "| " + " | ".join(frame.columns) + " |",
             "| " + " | ".join("---" for _ in frame.columns) + " |"]
    for index, values in enumerate(frame.itertuples(index=False)):
        values = list(values)
        if table.attrs["block_is_row_header"] and index and blocks[index] == blocks[index - 1]:
            values[0] = ""
        lines.append("| " + " | ".join(str(v) for v in values) + " |")
    metric = table.attrs["metric"]
    unit = table.attrs.get("note") or ("x 100" if table.attrs["scale"] == 100 else f"x {table.attrs['scale']:g}")
    lines += ["", f"{metric} ({unit}); mean ± std over seeds where several; {MISSING_MARK} = no finished run."]
    return "\n".join(lines) + "\n"


def _latex_escape(text: str) -> str:
    return text.replace("_", "\\_")


def to_latex(table: pd.DataFrame) -> str:
    """A LaTeX table in the paper's layout (booktabs + multirow)."""
    frame = layout(table, latex=True)
    blocks = _blocks(table)
    n_columns = len(frame.columns)
    align = "|".join("c" for _ in range(n_columns)) if table.attrs["block_is_row_header"] else "c" * n_columns
    lines = ["% requires \\usepackage{booktabs,multirow}", "\\begin{table}", "\\centering",
             f"\\begin{{tabular}}{{@{{}}{align}@{{}}}}", "\\toprule[1pt]",
             " & ".join(frame.columns) + " \\\\", "\\hline"]
    block_sizes = pd.Series(blocks).value_counts(sort=False).to_dict()
    for index, values in enumerate(frame.itertuples(index=False)):
        values = [str(v) for v in values]
        new_block = index == 0 or blocks[index] != blocks[index - 1]
        if new_block and index:
            lines.append("\\hline")
        if table.attrs["block_is_row_header"]:
            values[0] = (f"\\multirow{{{block_sizes[blocks[index]]}}}{{*}}{{{values[0]}}}"
                         if new_block else "")
        lines.append(" & ".join(values) + " \\\\")
    lines += ["\\bottomrule[1pt]", "\\end{tabular}",
              f"\\caption{{{_latex_escape(table.attrs['caption'])}}}",
              f"\\label{{tab:{table.attrs['name']}}}", "\\end{table}"]
    return "\n".join(lines) + "\n"


def protocols_side_by_side(tables: Mapping[str, pd.DataFrame]) -> dict[str, str]:
    """``{NAME: markdown}`` for every table built under both protocols (``NAME_released`` and
    ``NAME_corrected``): one table whose cells read "released / corrected (corrected - released)"."""
    compared = {}
    for name, released in tables.items():
        corrected = tables.get(name.removesuffix("_released") + "_corrected")
        if released.attrs.get("protocol") != "released" or corrected is None:
            continue
        values = [[m if st == "ok" else math.nan for m, st in zip(t["mean"], t["status"])] for t in (released, corrected)]
        display = [format_protocol_pair(r, c) for r, c in zip(*values)]
        title = corrected.attrs["title"].replace(" [protocol corrected]", "")
        compared[name.removesuffix("_released")] = to_markdown(
            corrected, display=display, title=f"{title} — released / corrected (corrected − released)")
    return compared


def write_tables(tables: Mapping[str, pd.DataFrame], out_dir: str | Path) -> list[Path]:
    """Write every table as ``NAME.md``, ``NAME.tex``, ``NAME_layout.csv``, ``NAME.csv`` and
    ``NAME.parquet`` (long numeric frame), ``NAME_vs_paper.md`` where the paper prints values,
    ``NAME_protocols.md`` where both protocols ran (:func:`protocols_side_by_side`), the cell
    runs as ``cells.csv`` / ``cells.parquet``, and all Markdown tables together as ``tables.md``. Returns
    the written paths. Each file is replaced atomically (:func:`~semiseg_platform.storage.atomic_write`):
    never read half-written.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    markdown = []
    for name, table in tables.items():
        if name != "cells":
            text = to_markdown(table)
            markdown.append(text)
            if has_paper_values(table):
                versus = to_markdown(table, versus_paper=True)
                markdown.append(versus)
                written.append(_write_text(out / f"{name}_vs_paper.md", versus))
            written += [_write_text(out / f"{name}.md", text), _write_text(out / f"{name}.tex", to_latex(table))]
            written.append(atomic_write(out / f"{name}_layout.csv", lambda p, t=table: layout(t).to_csv(p, index=False)))
        plain = pd.DataFrame(table)  # attrs (dicts) are not part of the CSV / Parquet files
        plain.attrs = {}
        written += [atomic_write(out / f"{name}.csv", lambda p, f=plain: f.to_csv(p, index=False)),
                    atomic_write(out / f"{name}.parquet", lambda p, f=plain: f.to_parquet(p, index=False, engine="pyarrow"))]
    for name, text in protocols_side_by_side(tables).items():
        markdown.append(text)
        written.append(_write_text(out / f"{name}_protocols.md", text))
    written.append(_write_text(out / "tables.md", "\n".join(markdown)))
    return written


def _write_text(path: Path, text: str) -> Path:
    return atomic_write(path, lambda p: p.write_text(text, encoding="utf-8"))


def markdown_report(tables: Mapping[str, pd.DataFrame]) -> str:
    """All tables as one Markdown document (what ``make demo`` prints), then every table of a real dataset
    once more as "paper / ours (difference)" against the paper's printed numbers, and every table built
    under both protocols as "released / corrected (difference)"."""
    shown = [t for name, t in tables.items() if name != "cells"]
    return "\n".join([*(to_markdown(t) for t in shown),
                      *(to_markdown(t, versus_paper=True) for t in shown if has_paper_values(t)),
                      *protocols_side_by_side(tables).values()])


def write_report(tracking_uri: str, experiment: str, out_dir: str | Path, *, grid_id: str | None = None,
                 datasets: Iterable[str] | None = None, **table_options) -> tuple[dict[str, pd.DataFrame], list[Path]]:
    """Build the tables (Tables 1-6, the reliability tables with their figures where the cells logged the curve
    data, the shifted tables where runs were evaluated under shift: :mod:`.shift`; the uncertainty-time figure when
    benchmark runs exist) and write them to ``out_dir``; returns the tables and the written paths. What
    ``npsemiseg tables`` runs."""
    tables = with_reliability_tables(build_tables(tracking_uri, experiment, grid_id=grid_id,
                                                  datasets=None if datasets is None else list(datasets),
                                                  **table_options))
    tables = {**tables, **shifted_tables(tracking_uri, tables["cells"], datasets, **table_options)}
    written = write_tables(tables, out_dir)
    written += write_reliability_figures(tracking_uri, tables, out_dir)
    figure = uncertainty_time_figure(tracking_uri, experiment)
    if figure is not None:
        path = Path(out_dir) / "uncertainty_time.png"
        written.append(atomic_write(path, lambda p: figure.savefig(p, dpi=120)))
    return tables, written


def shifted_tables(tracking_uri: str, runs: pd.DataFrame, datasets: Iterable[str] | None = None, *,
                   frameworks: Iterable[str] | None = None, heads: Iterable[str] = PAPER_HEADS,
                   **_: object) -> dict[str, pd.DataFrame]:
    """The shifted tables (:func:`.shift.shift_tables`) with Tables 1-3's datasets, rows and head blocks."""
    return shift_tables(tracking_uri, runs, list(datasets) if datasets is not None else discover_datasets(runs),
                        list(frameworks) if frameworks is not None else table_frameworks(runs), list(heads))
