"""The claims report as a picture: a forest plot of the claims' differences (``claims_forest.png``).

One row per claim (its pooled difference as a square, coloured by the claim's verdict, which needs every
part supported: a pooled interval above 0 can be grey) and one per part or detail entry (a framework for
S0 and C1, and for S0+ and C1+ on FixMatch and UniMatch; a framework x metric x reference head for R1;
a comparison, partition, metric or hyper-parameter for the others, coloured by the part's own verdict): the
mean difference as a dot, its 95 % interval as a horizontal bar, a line at 0. A positive difference is what
the paper claims, so a bar right of the line is a supported row, left of it a contradicted one, across it an
inconclusive one. Rows without a difference ("no data") are left out. C5's differences are seconds per image, the others points:
they get a panel each. Works on the objects of ``claims.json``, so a recorded report can be drawn again::

    python -m semiseg_platform.reports.claims_figure claims.json claims_forest.png [--title TEXT]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.lines import Line2D

#: the file written beside claims.md
FOREST_PLOT = "claims_forest.png"
#: one colour per verdict of the claims report (its words: supported, contradicted, inconclusive, no data)
VERDICT_COLOURS = {"supported": "#1a9850", "contradicted": "#d73027", "inconclusive": "#7f7f7f", "no data": "#cccccc"}
POOLED = "all pairs"


@dataclass(frozen=True)
class ForestRow:
    """One row of the plot: ``claim`` and ``label`` (``POOLED`` for the claim's pooled row, else the part)."""

    claim: str
    label: str
    unit: str
    verdict: str
    mean: float
    low: float | None
    high: float | None
    pairs: int

    @property
    def text(self) -> str:
        return f"{self.claim} {self.label}"

    @property
    def numbers(self) -> tuple[float, float | None, float | None, int]:
        return self.mean, self.low, self.high, self.pairs

    @property
    def has_interval(self) -> bool:
        return self.low is not None and self.high is not None


def _number(value: object) -> float | None:
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else float(value)


def _row(claim: Mapping, entry: Mapping, label: str, verdict: str) -> ForestRow | None:
    mean = _number(entry.get("mean_diff"))
    if mean is None:
        return None
    return ForestRow(str(claim["id"]), label, str(claim.get("unit", "")), verdict, mean, _number(entry.get("ci_low")),
                     _number(entry.get("ci_high")), int(entry.get("pairs") or 0))


def _part_label(part: Mapping) -> str:
    against = str(part.get("against") or "").split(" (")[0]  # the reference's name, not its explanation
    return f"{part['name']} vs {against}" if against else str(part["name"])


def forest_rows(claims: Sequence[Mapping]) -> list[ForestRow]:
    """The plot's rows from ``claims.json`` objects (``Claim.to_dict()``), in the report's order.

    Per claim: its pooled row (left out where it repeats one part exactly, as C3 with one partition and
    C5, whose pooled numbers are those of "faster"), then its parts, then its details.
    """
    rows: list[ForestRow] = []
    for claim in claims:
        parts = [_row(claim, p, _part_label(p), str(p.get("verdict", ""))) for p in
                 [*claim.get("parts", []), *claim.get("detail", [])]]
        parts = [p for p in parts if p is not None]
        pooled = _row(claim, claim, POOLED, str(claim.get("verdict", "")))
        if pooled is not None and not any(p.numbers == pooled.numbers for p in parts):
            rows.append(pooled)
        rows += parts
    return rows


def _panel(unit: str) -> str:
    return "seconds per image" if unit.startswith("seconds") else "points (mIoU, PAvPU, ECE, AUROC or AURC x 100)"


def forest_figure(rows: Sequence[ForestRow], *, title: str | None = None) -> Figure:
    """The forest plot of ``rows`` (a panel per kind of unit). Refuses an empty list."""
    if not rows:
        raise ValueError("forest plot: no claim has a difference to plot (every claim is 'no data': no pair of "
                         "finished runs compares what it claims); nothing drawn")
    panels: dict[str, list[ForestRow]] = {}
    for row in rows:
        panels.setdefault(_panel(row.unit), []).append(row)
    height = 1.2 + 0.32 * len(rows) + 0.6 * len(panels)
    figure = Figure(figsize=(8.0, height), layout="constrained")
    axes = figure.subplots(len(panels), 1, squeeze=False, height_ratios=[len(r) + 1.5 for r in panels.values()])[:, 0]
    for ax, (unit, panel_rows) in zip(axes, panels.items()):
        ys = list(range(len(panel_rows)))[::-1]
        for y, row in zip(ys, panel_rows):
            colour = VERDICT_COLOURS.get(row.verdict, "black")
            marker = "s" if row.label == POOLED else "o"
            if row.has_interval:
                ax.errorbar(row.mean, y, xerr=[[row.mean - row.low], [row.high - row.mean]], fmt=marker,
                            color=colour, ecolor=colour, capsize=3, markersize=6 if row.label == POOLED else 5)
            else:
                ax.plot(row.mean, y, marker=marker, color=colour, markerfacecolor="none")
            ax.annotate(f"n={row.pairs}", (1.01, y), xycoords=("axes fraction", "data"), va="center", fontsize=7,
                        color="#555555")
        ax.axvline(0.0, color="black", linewidth=0.8)
        ax.set_yticks(ys, [r.text for r in panel_rows], fontsize=8)
        for tick, row in zip(ax.get_yticklabels(), panel_rows):
            if row.label == POOLED:
                tick.set_fontweight("bold")
        ax.set_ylim(-0.7, len(panel_rows) - 0.3)
        ax.set_xlabel(f"difference, {unit} (> 0: as the paper claims)", fontsize=8)
        ax.grid(axis="x", alpha=0.3)
    seen = [v for v in VERDICT_COLOURS if any(r.verdict == v for r in rows)]
    handles = [Line2D([], [], color=VERDICT_COLOURS[v], marker="o", linestyle="-", label=v) for v in seen]
    if any(r.label == POOLED for r in rows):
        handles.append(Line2D([], [], color="black", marker="s", linestyle="none",
                              label="claim, all pairs (colour: its verdict)"))
    axes[0].legend(handles=handles, loc="lower left", bbox_to_anchor=(0.0, 1.0), ncol=len(handles), fontsize=8,
                   frameon=False)
    figure.suptitle(title or "The paper's claims: mean difference and 95 % bootstrap interval", fontsize=10)
    return figure


def write_forest_plot(claims: Sequence[Mapping], path: str | Path, *, title: str | None = None) -> list[ForestRow]:
    """Draw ``claims`` (``claims.json`` objects) into ``path`` (PNG); returns the rows drawn.

    Raises ``ValueError`` (writing nothing) when no claim has a difference.
    """
    rows = forest_rows(claims)
    figure = forest_figure(rows, title=title)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Draw the forest plot of a claims report's claims.json.")
    parser.add_argument("claims_json", type=Path, help="a claims.json written by `npsemiseg claims` or a grid")
    parser.add_argument("out", type=Path, help="the PNG to write")
    parser.add_argument("--title", default=None, help="the figure's title (say where the runs came from)")
    args = parser.parse_args(argv)
    try:
        rows = write_forest_plot(json.loads(args.claims_json.read_text()), args.out, title=args.title)
    except (OSError, ValueError, KeyError, TypeError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"{args.out}: {len(rows)} rows")
    return 0


if __name__ == "__main__":
    sys.exit(main())
