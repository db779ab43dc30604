"""The verdict and the reports: the equivalence test of official against project, the records and curves drawn of
reports, their joining (``--combine``) and provenance."""

from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from official.study import SIDES, SUPERVISED

def equivalence(official: list[float], project: list[float], margin: float = 1.0) -> dict[str, float]:
    """Two one-sided tests (Welch) that the mean mIoU of ``project`` minus ``official`` lies within ``±margin``:
    ``p`` the larger of the two one-sided p-values (equivalent at level alpha when ``p < alpha``), with the mean
    difference and its 90 % confidence interval (Welch). Needs two values per side."""
    a, b = np.asarray(project, dtype=float), np.asarray(official, dtype=float)
    if min(a.size, b.size) < 2:
        raise ValueError(f"equivalence: expected at least 2 runs per side, got {b.size} official and {a.size} project")
    lower = stats.ttest_ind(a + margin, b, equal_var=False, alternative="greater")
    upper = stats.ttest_ind(a - margin, b, equal_var=False, alternative="less")
    diff = stats.ttest_ind(a, b, equal_var=False)
    interval = diff.confidence_interval(0.90)
    return {"margin": margin, "difference": float(a.mean() - b.mean()), "p": float(max(lower.pvalue, upper.pvalue)),
            "ci90_low": float(interval.low), "ci90_high": float(interval.high)}


def is_supervised(framework: str) -> bool:
    """Whether ``framework`` is a supervised reference (:data:`SUPERVISED`'s values)."""
    return framework in SUPERVISED.values()


def panels_of(reports: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """The rows of each framework in ``reports`` (``--combine``'s, one per framework), the supervised references
    first (each from the first report holding it: a reference's own, or a framework's ``supervised``), those with
    rows only."""
    panels: dict[str, list[dict[str, Any]]] = {}
    for r in reports:
        reference = r["framework"] if is_supervised(r["framework"]) else SUPERVISED.get(r["framework"], "supervised")
        if not panels.get(reference):
            panels[reference] = r["runs"] if is_supervised(r["framework"]) else r["supervised"]
    panels = dict(sorted(panels.items(), key=lambda item: list(SUPERVISED.values()).index(item[0])))
    panels.update({r["framework"]: r["runs"] for r in reports if not is_supervised(r["framework"])})
    return {name: rows for name, rows in panels.items() if rows}


#: the figure's panels per row (a report of every framework wraps onto several rows)
PANELS_PER_ROW = 4


def plot_curves(reports: list[dict[str, Any]], path: Path) -> None:
    """One panel per framework (the supervised reference first, from the first report holding it): the per-epoch
    validation mIoU of each seed, official solid, project dashed, with the seeds' mean curves bold; rows of at most
    :data:`PANELS_PER_ROW` panels."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = panels_of(reports)
    columns = min(len(panels), PANELS_PER_ROW)
    rows_of_panels = -(-len(panels) // columns)
    figure, axes = plt.subplots(rows_of_panels, columns, figsize=(4.2 * columns, 3.4 * rows_of_panels), sharey=True,
                                squeeze=False)
    for axis in axes.flat[len(panels):]:
        axis.set_visible(False)
    for axis, (name, rows) in zip(axes.flat, panels.items()):
        for side, colour, style in (("official", "tab:blue", "-"), ("project", "tab:orange", "--")):
            curves = [r[f"{side}_curve"] for r in rows if r.get(f"{side}_curve")]
            if not curves:
                continue
            for curve in curves:
                axis.plot(range(1, len(curve) + 1), curve, style, color=colour, alpha=0.35, linewidth=0.8)
            length = min(len(c) for c in curves)
            mean = np.mean([c[:length] for c in curves], axis=0)
            axis.plot(range(1, length + 1), mean, style, color=colour, linewidth=2.0,
                      label=f"{side} ({len(curves)} seed{'s' * (len(curves) > 1)}: best {np.mean([max(c) for c in curves]):.1f})")
        axis.set_title(name)
        axis.set_xlabel("epoch (official length)")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8, loc="lower right")
    for row in axes:
        row[0].set_ylabel("validation mIoU x 100")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)


def provenance(script: str, argv: list[str]) -> dict[str, str]:
    """A report's date, machine (host, CPUs, load average) and the command that made it."""
    return {"date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "machine": f"{platform.node()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}",
            "command": f"python benchmarks/{script} " + shlex.join(argv)}


def records(reports: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The figure's numbers, one JSON object each (the docs cite them): every run's best mIoU (``framework``,
    ``side``, ``seed``, ``miou``), each side's mean difference of a framework from supervised
    (``minus_supervised``, seeds the two have in common) and each framework's project minus official
    (``project_minus_official`` with the TOST ``p`` at 1.0 mIoU, its 90 % interval ``ci90``, ``equivalent_within``:
    the smallest margin at which the two one-sided tests at 5 % show equivalence, the interval's farther end, and each
    side's mean and sample standard deviation over the seeds, where two seeds have both sides)."""
    panels = panels_of(reports)
    out: list[dict[str, Any]] = []
    for name, rows in panels.items():
        for row in rows:
            out += [{"framework": name, "side": side, "seed": row["seed"], "miou": round(row[f"{side}_miou"], 2)}
                    for side in SIDES if row.get(f"{side}_miou") is not None]
        both = [r for r in rows if r.get("official_miou") is not None and r.get("project_miou") is not None]
        if len(both) >= 2:
            sides = {side: [r[f"{side}_miou"] for r in both] for side in SIDES}
            test = equivalence(sides["official"], sides["project"])
            interval = [round(test["ci90_low"], 2), round(test["ci90_high"], 2)]
            out.append({"framework": name, "project_minus_official": round(test["difference"], 2),
                        "p_tost": round(test["p"], 3), "ci90": interval,
                        "equivalent_within": max(abs(bound) for bound in interval), "seeds": len(both),
                        **{f"{side}_{stat}": round(float(fn(values)), 2) for side, values in sides.items()
                           for stat, fn in (("mean", np.mean), ("sd", lambda v: np.std(v, ddof=1)))}})
        if is_supervised(name):
            continue
        for side in SIDES:
            mine = {r["seed"]: r[f"{side}_miou"] for r in rows if r.get(f"{side}_miou") is not None}
            reference = {r["seed"]: r[f"{side}_miou"] for r in panels.get(SUPERVISED.get(name, "supervised"), [])
                         if r.get(f"{side}_miou") is not None}
            common = sorted(set(mine) & set(reference))
            if common:
                out.append({"framework": name, "side": side, "seeds": len(common),
                            **paired_difference([mine[k] - reference[k] for k in common])})
    return out


def paired_difference(differences: list[float]) -> dict[str, Any]:
    """A framework's seeds minus its supervised reference's, seed by seed: the mean (``minus_supervised``), how many
    seeds fall below (``below``) and, from two seeds that differ on, the paired t-test's p and 90 % interval of the
    mean."""
    values = np.asarray(differences, dtype=float)
    out: dict[str, Any] = {"minus_supervised": round(float(values.mean()), 2), "below": int((values < 0).sum())}
    if values.size >= 2 and values.std() > 0:
        test = stats.ttest_1samp(values, 0.0)
        interval = test.confidence_interval(0.90)
        out.update(p=round(float(test.pvalue), 3), ci90=[round(float(interval.low), 2), round(float(interval.high), 2)])
    return out


def with_verdict(report: dict[str, Any]) -> dict[str, Any]:
    """``report`` with ``equivalence`` (:func:`equivalence` of the framework's runs and of the supervised ones, where
    each has two seeds or more)."""
    rows = {"framework": report["runs"], "supervised": report["supervised"]}
    both = {name: [r for r in runs if r.get("official_miou") is not None and r.get("project_miou") is not None]
            for name, runs in rows.items()}
    report["equivalence"] = {name: equivalence([r["official_miou"] for r in runs], [r["project_miou"] for r in runs])
                             for name, runs in both.items() if len(runs) >= 2}
    return report


def combine(paths: list[Path]) -> dict[str, Any]:
    """One report of several (one framework and data seed; their runs and supervised runs by seed, the first
    report's of a seed kept; commands and machines listed)."""
    reports = [json.loads(p.read_text()) for p in paths]
    framework = next((r["framework"] for r in reports if not is_supervised(r["framework"])), reports[0]["framework"])
    if {r["data_seed"] for r in reports} != {reports[0]["data_seed"]}:
        raise ValueError(f"--combine: the reports are of different data seeds: {[r['data_seed'] for r in reports]}")
    regimes = [r.get("regime", {}) for r in reports]
    if any(other != regimes[0] for other in regimes):
        raise ValueError(f"--combine: the reports are of different regimes (--set, --split): {regimes}")
    runs: dict[int, dict] = {}
    supervised: dict[int, dict] = {}

    def add(target: dict[int, dict], row: dict) -> None:  # the sides of a seed may come from different reports
        joined = target.setdefault(row["seed"], {})
        joined.update({k: v for k, v in row.items() if joined.get(k) is None})

    for r in reports:
        for row in r["runs"]:
            add(runs if r["framework"] == framework else supervised, row)
        if not is_supervised(r["framework"]):
            for row in r["supervised"]:
                add(supervised, row)
    combined = {**reports[0], "framework": framework, "runs": [runs[k] for k in sorted(runs)],
                "supervised": [supervised[k] for k in sorted(supervised)],
                "parts": [{k: r[k] for k in ("command", "date", "machine", "seconds")} for r in reports]}
    return with_verdict(combined)
