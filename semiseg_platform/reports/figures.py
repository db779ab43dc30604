"""The paper's figures from MLflow runs: the uncertainty-time figure (benchmark runs) and the
hyper-parameter figure (search trials), both drawn by :func:`line_panels`."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from matplotlib.figure import Figure
from mlflow import MlflowClient

from semiseg_platform.reports.tables import dataset_label, head_label, protocol_partitions
from semiseg_platform.tracking import experiment_id, mlflow_names, search_all_runs


def line_panels(
    panels: Mapping[str, Mapping[str, tuple[Sequence[float], Sequence[float]]]], *,
    xlabel: str, ylabel: str, title: str | None = None, logx: bool = False,
) -> Figure:
    """One subplot per panel, one line per series: ``{panel: {label: (xs, ys)}}``.

    Serves the uncertainty-time figure (panels = evaluation modes, series = heads) and
    the hyper-parameter figure (panels = hyper-parameters, series = datasets/frameworks).
    Uses ``matplotlib.figure.Figure`` directly (no pyplot global state).
    """
    if not panels:
        raise ValueError("panels: expected at least one panel to plot, got none")
    figure = Figure(figsize=(4.0 * len(panels), 3.2), layout="constrained")
    axes = figure.subplots(1, len(panels), squeeze=False)[0]
    for ax, (panel, series) in zip(axes, panels.items()):
        for label, (xs, ys) in series.items():
            ax.plot(list(xs), list(ys), marker="o", label=label)
        ax.set_title(panel)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        if logx:
            ax.set_xscale("log", base=2)
        ax.grid(alpha=0.3)
        ax.legend()
    if title:
        figure.suptitle(title)
    return figure


#: Tracking schema of the uncertainty-time benchmark (docs/CONTRACTS.md).
UNCERTAINTY_TIME_BENCHMARK = mlflow_names.UNCERTAINTY_TIME_BENCHMARK
UNCERTAINTY_TIME_METRIC = mlflow_names.UNCERTAINTY_TIME_METRIC


def log_uncertainty_time_run(
    tracking_uri: str, experiment: str, *, head: str, eval_mode: str, seconds_by_t: Mapping[int, float],
    dataset: str = "", framework: str = "u2pl", tags: Mapping[str, str] | None = None,
) -> str:
    """Record one uncertainty-time benchmark series as a FINISHED MLflow run (the schema the figure reads).

    ``seconds_by_t``: ``{T: seconds per image}``; logged as ``uncertainty_seconds`` with ``step = T``.
    ``tags``: extra tags (device, crop size, ...). Creates the experiment if needed; returns the run id.
    For ``benchmarks/uncertainty_time.py`` and anything else measuring the figure's numbers.
    """
    if not seconds_by_t:
        raise ValueError("seconds_by_t: expected at least one (T, seconds) pair, got none")
    client = MlflowClient(tracking_uri)
    found = experiment_id(client, experiment) or client.create_experiment(experiment)
    run = client.create_run(found, run_name=f"benchmark/{UNCERTAINTY_TIME_BENCHMARK}/{eval_mode}/{head}", tags={
        mlflow_names.KIND: mlflow_names.KIND_BENCHMARK, mlflow_names.BENCHMARK: UNCERTAINTY_TIME_BENCHMARK,
        mlflow_names.HEAD: head, mlflow_names.EVAL_MODE: eval_mode, mlflow_names.DATASET: dataset,
        mlflow_names.FRAMEWORK: framework, **dict(tags or {})})
    for t, seconds in sorted(seconds_by_t.items()):
        client.log_metric(run.info.run_id, UNCERTAINTY_TIME_METRIC, float(seconds), step=int(t))
    client.set_terminated(run.info.run_id, "FINISHED")
    return run.info.run_id


def load_uncertainty_times(tracking_uri: str, experiment: str) -> dict[str, dict[str, tuple[list[int], list[float]]]]:
    """``{eval_mode: {head label: (Ts, seconds)}}`` from the uncertainty-time benchmark runs.

    Reads runs tagged ``npsemiseg.kind = benchmark`` and ``benchmark = uncertainty_time``; each
    logs ``uncertainty_seconds`` once per number of predictions T with ``step = T``. When several
    finished runs share (eval_mode, head, dataset), the latest counts.
    """
    client = MlflowClient(tracking_uri)
    found = experiment_id(client, experiment)
    if found is None:
        return {}
    runs = search_all_runs(client, [found],
                           f"tags.`{mlflow_names.KIND}` = '{mlflow_names.KIND_BENCHMARK}' and tags.{mlflow_names.BENCHMARK} = "
                           f"'{UNCERTAINTY_TIME_BENCHMARK}' and attributes.status = 'FINISHED'")
    latest: dict[tuple[str, str], object] = {}
    for run in sorted(runs, key=lambda r: r.info.end_time or 0):
        tags = run.data.tags
        label = head_label(tags.get(mlflow_names.HEAD, "?")) or "baseline"
        if tags.get(mlflow_names.DATASET):
            label = f"{label} ({dataset_label(tags[mlflow_names.DATASET])})"
        latest[(tags.get(mlflow_names.EVAL_MODE, "?"), label)] = run
    panels: dict[str, dict[str, tuple[list[int], list[float]]]] = {}
    for (mode, label), run in sorted(latest.items()):
        history = sorted(client.get_metric_history(run.info.run_id, UNCERTAINTY_TIME_METRIC), key=lambda m: m.step)
        if history:
            panels.setdefault(mode, {})[label] = ([m.step for m in history], [m.value for m in history])
    return panels


def uncertainty_time_figure(tracking_uri: str, experiment: str) -> Figure | None:
    """The paper's uncertainty-time figure (seconds vs T, MC dropout vs NP-SemiSeg), or None
    when the experiment holds no uncertainty-time benchmark runs."""
    panels = load_uncertainty_times(tracking_uri, experiment)
    if not panels:
        return None
    return line_panels(panels, xlabel="number of predictions T", ylabel="seconds per image",
                       title="Time to estimate uncertainty")


# ----------------------------------------------------------------------------- the hyper-parameter figure
#: The paper's hyper-parameter figure: panel title per searched key (Appendix, "Hyper-parameter Exploration")
PAPER_PANELS: dict[str, str] = {
    "head.options.memory_size": "(a) memory length Q",
    "head.options.lambda_kl": "(b) lambda_kl",
    "head.options.training_samples": "(c) latent samples T (training)",
}


def load_search_trials(tracking_uri: str, experiment: str, *, search: str | None = None,
                       keys: Sequence[str] = tuple(PAPER_PANELS), metric: str = "miou") -> list[dict[str, Any]]:
    """The FINISHED trial runs of the searches in ``experiment`` (cell runs tagged ``search_id``;
    only ``search`` when given) as ``{dataset, partition, framework, head, search_id, metric, <key>...}``.

    Values of ``keys`` come from the run's params (``npsemiseg.config.config_params``), so a key that a search did
    not vary still has the value it ran with.
    """
    client = MlflowClient(tracking_uri)
    found = client.get_experiment_by_name(experiment)
    if found is None:
        return []
    rows = []
    for run in _search_trial_runs(client, found.experiment_id, search):
        if metric not in run.data.metrics or mlflow_names.SEARCH_STOPPED in run.data.tags:
            continue
        tags, params = run.data.tags, run.data.params
        row = {k: tags.get(k, "")
               for k in (mlflow_names.DATASET, mlflow_names.PARTITION, mlflow_names.FRAMEWORK, mlflow_names.HEAD)}
        row[mlflow_names.SEARCH_ID] = mlflow_names.submission_of(tags) or ""
        row["metric"] = float(run.data.metrics[metric])
        for key in keys:
            row[key] = _number(mlflow_names.param_value(params, key))
        rows.append(row)
    return rows


def _search_trial_runs(client: MlflowClient, experiment: str, search: str | None) -> list:
    """FINISHED cell runs of one search, or of every search (trial runs carry ``search_id``)."""
    finished = f"tags.`{mlflow_names.KIND}` = '{mlflow_names.KIND_CELL}' and attributes.status = 'FINISHED'"
    which = f"tags.{mlflow_names.SEARCH_ID} = '{search}'" if search else f"tags.{mlflow_names.SEARCH_ID} != ''"
    return search_all_runs(client, [experiment], f"{finished} and {which}")


def _number(text: str | None) -> float | None:
    try:
        value = float(json.loads(text)) if text is not None else None
    except (ValueError, TypeError):
        return None
    return value if value is not None and math.isfinite(value) else None


def profile(xs: Sequence[float], ys: Sequence[float], *, aggregate: Literal["max", "mean"] = "max",
            max_points: int = 8) -> tuple[list[float], list[float]]:
    """``y`` per value of ``x`` (best or mean), sorted by ``x``; more than ``max_points`` distinct
    values (a continuous parameter such as lambda_kl) are binned on a log scale (linear when some
    value is <= 0), each bin plotted at the geometric (arithmetic) mean of its values."""
    pairs = sorted((float(x), float(y)) for x, y in zip(xs, ys) if x is not None)
    if not pairs:
        return [], []
    groups: dict[Any, list[tuple[float, float]]] = {}
    if len({x for x, _ in pairs}) <= max_points:
        for x, y in pairs:
            groups.setdefault(x, []).append((x, y))
    else:
        log = pairs[0][0] > 0
        scale = (lambda v: math.log(v)) if log else (lambda v: v)
        low, high = scale(pairs[0][0]), scale(pairs[-1][0])
        width = (high - low) / max_points
        for x, y in pairs:
            groups.setdefault(min(int((scale(x) - low) / width), max_points - 1), []).append((x, y))
    out_x, out_y = [], []
    for members in (groups[k] for k in sorted(groups)):
        xs_ = [x for x, _ in members]
        ys_ = [y for _, y in members]
        if len(set(xs_)) == 1:
            centre = xs_[0]
        elif all(x > 0 for x in xs_):
            centre = math.exp(sum(math.log(x) for x in xs_) / len(xs_))
        else:
            centre = sum(xs_) / len(xs_)
        out_x.append(centre)
        out_y.append(max(ys_) if aggregate == "max" else sum(ys_) / len(ys_))
    return out_x, out_y


def hparams_figure(tracking_uri: str, experiment: str, *, search: str | None = None,
                   panels: Mapping[str, str] = PAPER_PANELS, metric: str = "miou",
                   aggregate: Literal["max", "mean"] = "max", scale: float = 100.0) -> Any:
    """The paper's hyper-parameter figure from MLflow: one panel per key (mIoU against Q, lambda_kl, T),
    one line per dataset x partition, ``aggregate`` of the FINISHED trials at each value (x ``scale``).

    Returns a matplotlib ``Figure`` (``tables.line_panels``), or None when no finished trial exists.
    """
    rows = load_search_trials(tracking_uri, experiment, search=search, keys=tuple(panels), metric=metric)
    if not rows:
        return None
    series_of: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in rows:
        series_of.setdefault((row["dataset"], row["partition"]), []).append(row)
    data: dict[str, dict[str, tuple[list[float], list[float]]]] = {}
    for key, title in panels.items():
        for (dataset, partition), members in sorted(series_of.items()):
            xs, ys = profile([m[key] for m in members], [m["metric"] * scale for m in members], aggregate=aggregate)
            if xs:
                labels = dict(protocol_partitions(dataset)) if dataset else {}
                data.setdefault(title, {})[f"{dataset_label(dataset)} {labels.get(partition, partition)}"] = (xs, ys)
    if not data:
        return None
    return line_panels(data, xlabel="value (log scale)", ylabel=f"{metric} ({aggregate}, x{scale:g})",
                       title="mIoU under different hyper-parameter settings", logx=True)


def write_hparams_figure(tracking_uri: str, experiment: str, out_dir: str | Path, *, search: str | None = None,
                         aggregate: Literal["max", "mean"] = "max") -> Path | None:
    """Write ``hparams.png`` into ``out_dir``; returns its path, or None when no finished trial exists."""
    figure = hparams_figure(tracking_uri, experiment, search=search, aggregate=aggregate)
    if figure is None:
        return None
    path = Path(out_dir) / "hparams.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    return path
