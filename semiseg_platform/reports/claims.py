"""The paper's claims checked from MLflow runs only: ``npsemiseg claims``.

Every claim compares two groups of runs. A *pair* is two finished cell runs that differ only in
what the claim compares (same dataset, partition and seed, and the same framework unless the
framework is what is compared); its *difference* is oriented so that a positive value is what
the paper claims (e.g. NP minus baseline for C1, baseline minus MC dropout for "MC dropout
lowers mIoU"). Several experiments can be checked together as *replicates* of one study (the same
spec on another pretrained backbone or another dataset instance): pairs are formed within each
experiment, never across, and every claim pools the pairs of all. mIoU and PAvPU differences are
in points (x 100, the paper's unit); C5's in seconds per image. Over the pairs: the mean, a 95 %
percentile bootstrap interval (10,000 resamples of the pairs, seeded and sorted: the same runs give the same
interval) and a verdict:

* ``supported``: the interval lies above 0; ``contradicted``: it lies below 0;
* ``inconclusive``: it contains 0, or fewer than 2 pairs exist;
* ``no data``: no pair exists (the cells were not run).

A claim made of parts (per framework, per partition, per metric) is supported when every part
is, contradicted when one part is, no data when every part has no data, inconclusive otherwise;
its top-level numbers pool the pairs of all its parts. The claims: S0 (every SSL framework beats
supervised, baseline heads), S1 (supervised with all labels beats supervised at 1/16), C1 (NP > baseline
in mIoU, Tables 1-3), C2 (MC dropout < baseline and
NP > MC dropout in mIoU), C3 (NP's PAvPU > MC dropout's at every partition, Table 4; every SSL
framework's cells), C4 (attention > mean aggregator in mIoU and PAvPU, U2PL, Tables 5-6), C5 (NP
quantifies uncertainty faster than MC dropout and the gap grows with T and with sliding
evaluation; uncertainty-time benchmark runs), C6 (small Q, lambda_kl = 0.1 and T = 1 hurt; search
trial runs, compared unpaired: their "pairs" count runs), R1 (NP's ECE, AUROC and AURC beat the baseline head's and
MC dropout's, per framework; the reliability tables), R2 (NP's ECE and AUROC under shift beat the baseline head's
and MC dropout's per framework, :mod:`.shift`). Where the runs hold FixMatch or UniMatch cells
(frameworks the paper has no rows for), S0+, C1+, C2+ and C3+ check S0 and C1-C3 on them, each beside the
paper's claim, which stays on the paper's four frameworks; their supervised reference is ``supervised_unimatch``
where the grid ran it.

The pairs, intervals and verdicts are :mod:`.claim_evidence`'s; this module defines the claims, reads the runs
and writes the report.
"""

from __future__ import annotations

import json
import math
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from mlflow.tracking import MlflowClient

from npsemiseg.heads import PAPER_MEMORY_SIZE
from semiseg_platform.reports.claim_evidence import (
    REPLICATE,
    Claim,
    Evidence,
    evidence,
    finished_cells,
    paired_diffs,
    per_part,
    pool_parts,
    reliability_frameworks,
    s0_evidence,
    unpaired,
)
from semiseg_platform.reports.shift import load_shift_metrics, shift_claim
from semiseg_platform.reports.claims_figure import FOREST_PLOT, forest_rows, write_forest_plot
from semiseg_platform.reports.reliability import reliability_tables
from semiseg_platform.reports.rendering import to_markdown
from semiseg_platform.reports.tables import (
    ABLATION_FRAMEWORK,
    COMPANION_FRAMEWORKS,
    DATA_INSTANCE,
    FRAMEWORK_LABELS,
    PAPER_FRAMEWORKS,
    load_cell_runs,
)
from semiseg_platform.tracking import resolve_tracking_uri, search_all_runs
from semiseg_platform.tracking.mlflow_names import GRID_CLAIMS_DIR, KIND, KIND_BENCHMARK, KIND_CELL, param_value

SSL_FRAMEWORKS = tuple(f for f in PAPER_FRAMEWORKS if f != "supervised")
PAPER_Q = PAPER_MEMORY_SIZE

# ----------------------------------------------------------------------------- cell-run claims


#: the suffix of the ids of the claims checked on the frameworks the paper has no rows for (S0+, C1+, C2+, C3+)
COMPANION_SUFFIX = "+"


def framework_claims(cells: pd.DataFrame, frameworks: Sequence[str], *, own: pd.DataFrame, suffix: str = "",
                     who: str = "every SSL framework", source_note: str = "") -> dict[str, Claim]:
    """S0, C1, C2 and C3 on ``frameworks`` (ids with ``suffix``; ``who`` names them in the statements). C3's
    partitions: those where one of its compared heads ran in ``own`` (the cells these claims are about: not e.g.
    the all-labels supervised reference, nor a partition that only the other claims' frameworks ran)."""
    frameworks = list(frameworks)
    # the paper's statements as they were; the others name their frameworks
    subject, scope, named = (who, "", "") if not suffix else (
        f"each of {who}" if len(frameworks) > 1 else who, f"; {who}", f" ({who})")
    partitions = sorted(set(own.loc[own["head"].isin(["np", "mc_dropout"]), "partition"]))
    s0 = Claim("S0" + suffix, f"{subject} beats supervised at the same partition (baseline heads; mIoU; supervised on "
               "the framework's network where the grid ran it)", "sanity" + source_note, "mIoU points", "framework",
               [s0_evidence(cells, f) for f in frameworks])
    # "in most cells": one pooled comparison over the frameworks; per framework shown as detail
    c1 = Claim("C1" + suffix, f"NP-SemiSeg improves mIoU over the baseline head (in most cells{scope})",
               "Tables 1-3" + source_note, "mIoU points", "framework", detail=per_part(frameworks, lambda f: paired_diffs(
                   cells, "miou", {"head": "np"}, {"head": "baseline"}, where={"framework": f})))
    c1.pooled = evidence("all", [d for e in c1.detail for d in e.diffs])
    c2 = Claim("C2" + suffix, "MC dropout lowers mIoU against the baseline (baseline - MC dropout), and NP-SemiSeg "
               f"beats MC dropout (NP - MC dropout{scope})", "Tables 1-3" + source_note, "mIoU points", "comparison", [
                   evidence("baseline - mc_dropout", paired_diffs(cells, "miou", {"head": "baseline"},
                                                                  {"head": "mc_dropout"}, where={"framework": frameworks})),
                   evidence("np - mc_dropout", paired_diffs(cells, "miou", {"head": "np"}, {"head": "mc_dropout"},
                                                            where={"framework": frameworks}))])
    c3 = Claim("C3" + suffix, f"NP-SemiSeg's PAvPU is higher than MC dropout's at every partition{named}",
               "Table 4" + source_note, "PAvPU points", "partition",
               per_part(partitions, lambda p: paired_diffs(cells, "pavpu", {"head": "np"}, {"head": "mc_dropout"},
                                                           where={"partition": p, "framework": frameworks})))
    return {"S0": pool_parts(s0), "C1": c1, "C2": pool_parts(c2), "C3": pool_parts(c3)}


def companion_frameworks(cells: pd.DataFrame) -> list[str]:
    """The frameworks the paper has no rows for (FixMatch, UniMatch) that have cells, in their tables' order."""
    found = set(cells["framework"]) if len(cells) else set()
    return [f for f in COMPANION_FRAMEWORKS if f in found]


def cell_claims(cells: pd.DataFrame) -> list[Claim]:
    """S0, S1 and C1-C4 from the finished cell runs; where FixMatch or UniMatch ran, S0+, C1+, C2+ and C3+ (the
    same claims on them, each beside the paper's)."""
    # every one of the paper's: a framework not run is "no data"
    paper = framework_claims(cells, SSL_FRAMEWORKS, own=cells[~cells["framework"].isin(COMPANION_FRAMEWORKS)])
    companions = companion_frameworks(cells)
    who = " and ".join(FRAMEWORK_LABELS[f] for f in companions)
    extra = framework_claims(cells, companions, own=cells[cells["framework"].isin(companions)], suffix=COMPANION_SUFFIX,
                             who=who, source_note="; frameworks the paper has no rows for") if companions else {}
    ablation = {"framework": ABLATION_FRAMEWORK}
    c4 = Claim("C4", "the attention aggregator beats the mean aggregator in mIoU and PAvPU (U2PL)", "Tables 5-6",
               "points", "metric", per_part(("miou", "pavpu"), lambda m: paired_diffs(
                   cells, m, {"head": "np"}, {"head": "np_mean"}, where=ablation)))
    s1 = Claim("S1", "labels are the bottleneck: supervised with all labels ('full') beats supervised at 1/16 "
               "(mIoU)", "sanity", "mIoU points")
    s1.pooled = evidence("all", paired_diffs(cells, "miou", {"partition": "full"}, {"partition": "1/16"},
                                             where={"framework": "supervised", "head": "baseline"}))
    return [*_with(paper, extra, "S0"), s1, *_with(paper, extra, "C1"), *_with(paper, extra, "C2"),
            *_with(paper, extra, "C3"), pool_parts(c4), reliability_claim(cells)]


#: R1's metrics and their orientation: True where higher is better (the difference is NP - reference), False where
#: lower is (reference - NP); so a positive difference is always NP-SemiSeg doing better
R1_METRICS = {"ece": False, "auroc": True, "aurc": False}
#: the heads R1 compares NP-SemiSeg with
R1_REFERENCES = ("baseline", "mc_dropout")


def reliability_claim(cells: pd.DataFrame) -> Claim:
    """R1: NP-SemiSeg's ECE, AUROC and AURC beat the baseline head's and MC dropout's, per framework: one part per
    framework x metric x reference head (x 100 points, oriented so that > 0 favours NP); supported when every
    part is."""
    def diffs(framework: str, metric: str, reference: str) -> list[float]:
        if metric not in cells.columns:  # cells read before these metrics were logged
            return []
        np_head, other = {"head": "np"}, {"head": reference}
        better, worse = (np_head, other) if R1_METRICS[metric] else (other, np_head)
        return paired_diffs(cells, metric, better, worse, where={"framework": framework})

    parts = [evidence(f"{framework}: {metric} vs {reference}", diffs(framework, metric, reference))
             for framework in reliability_frameworks(cells) for metric in R1_METRICS for reference in R1_REFERENCES]
    claim = Claim("R1", "NP-SemiSeg's calibration (ECE, lower) and error detection (AUROC higher, AURC lower) beat "
                  "the baseline head's and MC dropout's, per framework (differences oriented: > 0 favours NP-SemiSeg)",
                  "reliability tables", "points", "framework x metric x reference", parts)
    return pool_parts(claim)


def _with(paper: dict[str, Claim], extra: dict[str, Claim], claim: str) -> list[Claim]:
    """The paper's claim, then the same claim on the companion frameworks where they ran."""
    return [paper[claim], *([extra[claim]] if claim in extra else [])]


# ----------------------------------------------------------------------------- benchmark and search claims


def load_benchmark_gaps(client: MlflowClient, experiment_ids: list[str]) -> dict[tuple[str, str], dict[int, float]]:
    """``{(eval_mode, dataset): {T: MC dropout seconds - NP seconds}}`` from the latest finished
    uncertainty-time benchmark run of each (eval_mode, head, dataset)."""
    runs = search_all_runs(client, experiment_ids, f"tags.`{KIND}` = '{KIND_BENCHMARK}' and "
                                                   "tags.benchmark = 'uncertainty_time' and attributes.status = 'FINISHED'")
    latest: dict[tuple[str, str, str], str] = {}
    for run in sorted(runs, key=lambda r: r.info.end_time or 0):
        tags = run.data.tags
        latest[(tags.get("eval_mode", ""), tags.get("dataset", ""), tags.get("head", ""))] = run.info.run_id
    seconds = {key: {int(m.step): m.value for m in client.get_metric_history(run_id, "uncertainty_seconds")}
               for key, run_id in latest.items()}
    gaps: dict[tuple[str, str], dict[int, float]] = {}
    for (mode, dataset, head), by_t in seconds.items():
        np_times = seconds.get((mode, dataset, "np"))
        if head == "mc_dropout" and np_times:
            gaps[(mode, dataset)] = {t: by_t[t] - np_times[t] for t in sorted(set(by_t) & set(np_times))}
    return gaps


def timing_claim(gaps: dict[tuple[str, str], dict[int, float]]) -> Claim:
    """C5: NP faster (gap > 0 at every T), the gap grows with T (increments between consecutive
    Ts) and with sliding evaluation (sliding gap - center-crop gap at the same dataset and T)."""
    faster = [g for by_t in gaps.values() for g in by_t.values()]
    growth = [b - a for by_t in gaps.values() for a, b in zip(list(by_t.values()), list(by_t.values())[1:])]
    sliding = [by_t[t] - gaps[("center_crop", dataset)][t] for (mode, dataset), by_t in gaps.items()
               if mode == "sliding" and ("center_crop", dataset) in gaps
               for t in by_t if t in gaps[("center_crop", dataset)]]
    claim = Claim("C5", "NP-SemiSeg quantifies uncertainty faster than MC dropout (MC dropout - NP seconds per image), "
                  "and the gap grows with T and with sliding evaluation", "uncertainty-time figure", "seconds per image",
                  "comparison", [evidence("faster", faster), evidence("gap grows with T", growth),
                                 evidence("gap larger with sliding evaluation", sliding)])
    claim.pooled = claim.parts[0]
    return claim


def load_search_trials(client: MlflowClient, experiment_ids: list[str]) -> pd.DataFrame:
    """Finished, unstopped search-trial runs: their Q, lambda_kl, T params and final mIoU."""
    runs = search_all_runs(client, experiment_ids, f"tags.`{KIND}` = '{KIND_CELL}' and attributes.status = 'FINISHED'")
    rows = []
    for run in runs:
        tags, params = run.data.tags, run.data.params
        if "search_id" not in tags or "search.stopped" in tags or "miou" not in run.data.metrics:
            continue
        rows.append({key: _number(param_value(params, param)) for key, param in (
            ("q", "head.options.memory_size"), ("lambda_kl", "head.options.lambda_kl"),
            ("t", "head.options.training_samples"))}
                    | {"miou": run.data.metrics["miou"]})
    return pd.DataFrame(rows, columns=["q", "lambda_kl", "t", "miou"])


def _number(text: str | None) -> float:
    try:
        return float(text) if text is not None else math.nan
    except ValueError:
        return math.nan




def hyperparameter_claim(trials: pd.DataFrame) -> Claim:
    """C6: runs at the paper's setting against runs at the harmful one (small Q, lambda_kl = 0.1, T = 1)."""
    def parts_of(bad: pd.Series, good: pd.Series, name: str) -> Evidence:
        return unpaired(name, trials.loc[good, "miou"], trials.loc[bad, "miou"])

    claim = Claim("C6", "small Q, lambda_kl = 0.1 and T = 1 each lower mIoU (runs at other values - runs at it)",
                  "hyper-parameter figure", "mIoU points", "hyper-parameter", [
                      parts_of(trials["q"] < PAPER_Q, trials["q"] >= PAPER_Q, f"Q < {PAPER_Q} hurts"),
                      parts_of(np.isclose(trials["lambda_kl"], 0.1), trials["lambda_kl"] < 0.1,
                               "lambda_kl = 0.1 hurts"),
                      parts_of(trials["t"] == 1, trials["t"] > 1, "T = 1 hurts")])
    claim.pooled = Evidence("all", count=sum(p.pairs for p in claim.parts))
    return claim


# ----------------------------------------------------------------------------- report


def experiment_names(experiment: str | Sequence[str]) -> list[str]:
    """One experiment name or several (replicates), as a list without repeats."""
    names = list(dict.fromkeys([experiment] if isinstance(experiment, str) else experiment))
    if not names or not all(isinstance(n, str) and n for n in names):
        raise ValueError(f"experiment: expected one or more experiment names, got {experiment!r}")
    return names


def check_claims(tracking_uri: str | None, experiment: str | Sequence[str], *, grid_id: str | None = None,
                 search_experiment: str | None = None) -> list[Claim]:
    """Every claim, from the runs of ``experiment`` (cells: optionally one grid's; benchmark runs) and the
    search trials of ``search_experiment`` (default: ``experiment``). Several experiments are replicates:
    their cells pair within each (column ``replicate``) and every claim pools their pairs."""
    uri = resolve_tracking_uri(tracking_uri)
    client = MlflowClient(uri)
    names = experiment_names(experiment)
    frames = [finished_cells(load_cell_runs(uri, name, grid_id=grid_id)).assign(**{REPLICATE: name}) for name in names]
    cells = frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)
    cells = cells[cells["miou"].notna() | cells["pavpu"].notna()]
    gaps = load_benchmark_gaps(client, _experiment_ids(client, names))
    search_ids = _experiment_ids(client, [search_experiment] if search_experiment else names)
    trials = load_search_trials(client, search_ids) if search_ids else pd.DataFrame(
        columns=["q", "lambda_kl", "t", "miou"])
    shift = shift_claim(pd.concat([load_shift_metrics(uri, frame) for frame in frames], ignore_index=True))
    return [*cell_claims(cells), shift, timing_claim(gaps), hyperparameter_claim(trials)]


def _experiment_ids(client: MlflowClient, names: Sequence[str]) -> list[str]:
    """The ids of the experiments of ``names`` that exist."""
    return [found.experiment_id for found in map(client.get_experiment_by_name, names) if found is not None]


def _fmt(value: float | None, digits: int = 2) -> str:
    return "—" if value is None or math.isnan(value) else f"{value:+.{digits}f}"


def _row(label: str, e: Evidence, digits: int) -> str:
    interval = "—" if e.ci_low is None else f"[{_fmt(e.ci_low, digits)}, {_fmt(e.ci_high, digits)}]"
    return f"| {label} | {e.verdict} | {_fmt(e.mean_diff, digits)} | {interval} | {e.pairs} |"


def claims_markdown(claims: Sequence[Claim], *, title: str = "The paper's claims, checked",
                    experiments: Sequence[str] = (), instances: Sequence[str] = (), figure: str | None = None) -> str:
    """The report for people: one summary table, then each claim's parts and details (``experiments``: the
    experiments the runs came from, and ``instances`` the dataset instances, named under the title; ``figure``: the
    forest plot's file, shown under the summary table)."""
    head = "| claim | verdict | mean difference | 95 % interval | pairs |\n| --- | --- | --- | --- | --- |"
    runs = [_sources_line(experiments, instances), ""] if experiments else []
    lines = [f"# {title}", "", *runs, "Differences are oriented so that a positive value is what the paper claims; "
             "intervals: 95 % percentile bootstrap over the pairs (seeded). Supported = interval above 0, "
             "contradicted = below 0, inconclusive = contains 0 or fewer than 2 pairs, no data = no pair.", "", head]
    for claim in claims:
        digits = 4 if claim.unit.startswith("seconds") else 2
        lines.append(_row(f"{claim.id}", claim.pooled, digits).replace(f"| {claim.pooled.verdict} |",
                                                                       f"| **{claim.verdict}** |", 1))
    if figure:
        lines += ["", f"![Forest plot: each claim's mean difference and 95 % interval, coloured by verdict]({figure})"]
    for claim in claims:
        digits = 4 if claim.unit.startswith("seconds") else 2
        lines += ["", f"## {claim.id}: {claim.statement}", "",
                  f"Source: {claim.source}. Unit: {claim.unit}. Verdict: **{claim.verdict}**."]
        for label, rows in (("per " + claim.by, claim.parts), ("detail per " + claim.by, claim.detail)):
            if rows:
                lines += ["", head.replace("| claim |", f"| {label} |")] + [_row(e.label, e, digits) for e in rows]
    return "\n".join(lines) + "\n"


def _sources_line(experiments: Sequence[str], instances: Sequence[str] = ()) -> str:
    """The report's line naming the experiments its runs came from, and their dataset instances when several."""
    sources = ", ".join(f"`{name}`" for name in experiments)
    line = (f"Runs: experiment {sources}." if len(experiments) == 1 else
            f"Runs: experiments {sources}, replicates of one study: pairs are formed within each, and every claim "
            "pools the pairs of all.")
    if len(instances) > 1:
        line += (f" Dataset instances {', '.join(f'`{name}`' for name in instances)}: the two cells of a pair share "
                 "one, and every claim pools the pairs of all.")
    return line


def dataset_instances(cells: Sequence[pd.DataFrame]) -> list[str]:
    """The dataset instances (``data.options``, :func:`~.tables.data_instance`) of the finished runs among ``cells``
    (``load_cell_runs`` frames), sorted; "" (a dataset without options) left out."""
    found: set[str] = set()
    for frame in cells:
        found |= set(finished_cells(frame)[DATA_INSTANCE])
    return sorted(found - {""})


def reliability_markdown(tables: Mapping[str, pd.DataFrame]) -> str:
    """The reliability tables among ``tables`` as one Markdown section for the claims report (R1's numbers), or ""."""
    shown = [to_markdown(t) for name, t in tables.items() if name != "cells" and t.attrs.get("metric") == "reliability"]
    return "\n".join(["## The reliability tables", "", *shown]) if shown else ""


def experiment_reliability_markdown(cells: Sequence[pd.DataFrame]) -> str:
    """:func:`reliability_markdown` of each experiment's cell runs (``load_cell_runs`` frames)."""
    return "\n".join(filter(None, (reliability_markdown(reliability_tables(frame)) for frame in cells)))


def write_claims(claims: Sequence[Claim], out_dir: str | Path, *, experiments: Sequence[str] = (),
                 instances: Sequence[str] = (), appendix: str = "") -> list[Path]:
    """``out_dir/claims.md`` (``appendix``, e.g. :func:`reliability_markdown`, after the claims),
    ``out_dir/claims.json`` (a list with one object per claim) and, when a claim has a difference, the forest plot
    ``out_dir/claims_forest.png`` (:mod:`.claims_figure`); returns the files written."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    markdown, data, figure = out / "claims.md", out / "claims.json", out / FOREST_PLOT
    objects = [c.to_dict() for c in claims]
    drawn = bool(forest_rows(objects))
    if drawn:
        write_forest_plot(objects, figure)
    else:
        figure.unlink(missing_ok=True)  # a report without differences keeps no older report's picture
    text = claims_markdown(claims, experiments=experiments, instances=instances, figure=FOREST_PLOT if drawn else None)
    markdown.write_text(text + ("\n" + appendix if appendix else ""))
    data.write_text(json.dumps(objects, indent=2) + "\n")
    return [markdown, data, figure] if drawn else [markdown, data]


def log_claims(tracking_uri: str | None, run_id: str, claims: Sequence[Claim], *,
               experiments: Sequence[str] = (), instances: Sequence[str] = (), appendix: str = "") -> None:
    """Log ``claims.md``, ``claims.json`` and the forest plot as artifacts (``claims/``) of ``run_id`` (a grid's
    parent run)."""
    client = MlflowClient(resolve_tracking_uri(tracking_uri))
    with tempfile.TemporaryDirectory() as scratch:
        for path in write_claims(claims, scratch, experiments=experiments, instances=instances, appendix=appendix):
            client.log_artifact(run_id, str(path), artifact_path=GRID_CLAIMS_DIR)


def claims_command(experiment: str | Sequence[str], *, tracking: str | None = None, out: str | Path = "claims",
                   grid_id: str | None = None, search_experiment: str | None = None,
                   parent_run_id: str | None = None, emit: Callable[[str], None] = print) -> list[Claim]:
    """``npsemiseg claims --experiment E [--experiment E2 ...] [--tracking URI] [--out DIR]``: check, write (the
    reliability tables of the experiments after the claims), print (and log on ``parent_run_id`` when given: what
    the grid job does at its end)."""
    names = experiment_names(experiment)
    claims = check_claims(tracking, names, grid_id=grid_id, search_experiment=search_experiment)
    uri = resolve_tracking_uri(tracking)
    cells = [load_cell_runs(uri, name, grid_id=grid_id) for name in names]  # read once for the appendix and instances
    appendix, instances = experiment_reliability_markdown(cells), dataset_instances(cells)
    markdown = write_claims(claims, out, experiments=names, instances=instances, appendix=appendix)[0]
    if parent_run_id:
        log_claims(tracking, parent_run_id, claims, experiments=names, instances=instances, appendix=appendix)
    emit(markdown.read_text())
    return claims
