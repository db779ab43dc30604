"""Running a grid: the Ray Tune job that runs the cells of a grid spec.

A :class:`~.grid_spec.GridSpec` (:mod:`.grid_spec`) lists the axes, rules, preset, overrides and
resources; :func:`~.grid_spec.expand` turns it into the cells' RunConfigs.

:func:`run_grid` runs the cells under Ray Tune, as many at once as the cluster's resources
allow: a cell with several DDP workers is a Tune trial that launches the cell's
``TorchTrainer`` (``semiseg_platform.launch.run_cell``); a single-device cell trains in-process
in a reused Tune actor (about 1 s of overhead instead of about 27 s, ``benchmarks/RESULTS.md``).
A parent MLflow run per submission holds every cell's run as its child; re-submission skips
cells whose run FINISHED and resumes interrupted ones from their checkpoints; one failing cell
does not stop the others. The tables are built last and logged as the parent run's artifacts. A
re-submission whose cells all finished earlier runs nothing and opens no parent run: its tables and
claims are built from the store all the same. What grid and search
share (submission, parent run, Tuner, progress, reconciliation, summary) is :mod:`.submission`.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ray import tune

from npsemiseg.config import RunConfig
from semiseg_platform.launch import CellFailedError
from semiseg_platform.preflight import RESOURCE_TIMEOUT_S
from semiseg_platform.pretrain_runs import build_named_pretrainings
from semiseg_platform.reports import ABLATION_HEADS, PAPER_FRAMEWORKS, PAPER_HEADS, markdown_report, write_report
from semiseg_platform.reports.claims import (
    check_claims,
    claims_markdown,
    log_claims,
    reliability_markdown,
    write_claims,
)
from semiseg_platform.sweeps.grid_spec import GridSpec, expand, grid_id, load_spec
from semiseg_platform.sweeps.submission import (
    CELL_ERROR,
    Outcome,
    Submission,
    SweepContext,
    SweepProgress,
    csv_text,
    duration,
    fit,
    log_line,
    log_summary,
    lost_process,
    open_parent,
    open_submission,
    reconcile,
    start_ray,
    trial_dirname,
)
from semiseg_platform.tracking import RunEnd, ending_run, error_reason, mlflow_names, submission_runs

__all__ = ["CellOutcome", "GridProgress", "GridSummary", "run_grid", "table_layout"]


# ----------------------------------------------------------------------------- running a grid
@dataclass
class CellOutcome(Outcome):
    """What happened to one cell in a submission.

    status: ``finished`` | ``failed`` | ``skipped`` (finished under an earlier submission);
    trial_seconds: the cell's wall time as the grid driver saw it (start to end of its Tune
    trial); loop_seconds: ``train()``'s own wall time; overhead = the difference.
    """

    cell_name: str = ""
    trial_seconds: float | None = None
    loop_seconds: float | None = None

    @property
    def overhead_seconds(self) -> float | None:
        if self.trial_seconds is None or self.loop_seconds is None:
            return None
        return self.trial_seconds - self.loop_seconds


@dataclass
class GridSummary:
    """The result of :func:`run_grid`: one outcome per cell, the parent run and the tables."""

    spec_name: str
    grid_id: str
    submission_id: str
    experiment: str
    tracking_uri: str
    #: None when the submission ran nothing (every cell finished earlier): it opened no parent run
    parent_run_id: str | None
    outcomes: list[CellOutcome]
    wall_seconds: float
    concurrency: int
    tables_dir: Path | None = None
    tables_markdown: str = ""
    claims_markdown: str = ""

    def cells(self, status: str) -> list[CellOutcome]:
        return [o for o in self.outcomes if o.status == status]

    @property
    def ok(self) -> bool:
        """True when no cell failed."""
        return not self.cells("failed")

    @property
    def median_overhead_seconds(self) -> float | None:
        """Median per-cell orchestration overhead of the cells trained in this submission."""
        values = [o.overhead_seconds for o in self.cells("finished") if o.overhead_seconds is not None]
        return statistics.median(values) if values else None

    def format(self) -> str:
        """The end-of-job summary: counts, timing, and every failed cell with its reason."""
        counts = {s: len(self.cells(s)) for s in ("finished", "failed", "skipped")}
        overhead = self.median_overhead_seconds
        lines = [
            f"grid {self.spec_name} ({self.grid_id}), submission {self.submission_id}: {len(self.outcomes)} cells: "
            f"{counts['finished']} finished, {counts['failed']} failed, {counts['skipped']} skipped "
            f"(finished earlier)",
            f"wall {duration(self.wall_seconds)}, {self.concurrency} cell(s) at once"
            + (f", median orchestration overhead {overhead:.2f} s per cell" if overhead is not None else ""),
            f"MLflow: experiment {self.experiment!r}, "
            + (f"parent run {self.parent_run_id}" if self.parent_run_id else "no new parent run (nothing ran)")
            + f" ({self.tracking_uri})",
        ]
        for outcome in self.cells("failed"):
            lines.append(f"  FAILED {outcome.cell_name} [{outcome.cell_id}]: {outcome.reason}")
        if self.tables_dir is not None:
            lines.append(f"tables: {self.tables_dir}")
        return "\n".join(lines)


class GridProgress(SweepProgress):
    """Tune callback logging one line per started / finished / failed cell: counts and ETA."""

    def __init__(self, names: Mapping[str, str], *, skipped: int, label: str,
                 emit: Callable[[str], None] = log_line) -> None:
        super().__init__(emit)
        self.names = dict(names)
        self.total = len(names)
        self.skipped = skipped
        self.label = label
        self.done = self.failed = 0

    def line(self, trial: Any, event: str, seconds: float | None) -> str:
        name = self.names[self.key(trial)]
        if event == "finished":
            self.done += 1
            event = f"finished {name} in {seconds:.1f} s"
        elif event == "failed":
            self.failed += 1
            event = f"FAILED {name} after {seconds:.1f} s"
        else:
            event = f"{event} {name}"
        elapsed = time.monotonic() - self.started
        ended = self.done + self.failed
        eta = duration(elapsed / ended * (self.total - ended)) if ended else "?"
        return (f"[grid {self.label}] {ended + self.skipped}/{self.total + self.skipped} done "
                f"({self.done} finished, {self.failed} failed, {self.skipped} skipped), "
                f"{len(self.starts)} running | {duration(elapsed)} elapsed, ETA {eta} | {event}")


def _cell_trainable(tune_config: dict[str, Any], *, configs: dict[str, RunConfig], context: SweepContext) -> None:
    """One Tune trial = one cell: in-process (reused actor) or through the cell's TorchTrainer.

    A cell that fails on its own (its MLflow run ended FAILED: a bad setting, an error in the
    training code) ends its trial with a result carrying :data:`CELL_ERROR`, so Tune does not retry
    it. What Tune retries (``max_failures``) is a trial error: the trial's process or node died (or a
    TorchTrainer cell's worker did: :func:`lost_process`), or the launch failed before the cell's run
    ended; the retry resumes the cell's run from its last checkpoint.
    """
    config = configs[tune_config["cell_id"]]
    try:
        result = context.launch(config)
    except CellFailedError as error:
        if lost_process(error):
            raise
        failed = error.result
        tune.report({"cell_id": config.cell_id, "run_id": failed.run_id, CELL_ERROR: failed.error or failed.status})
        return
    tune.report({"cell_id": config.cell_id, "run_id": result.run_id, "loop_seconds": result.loop_seconds,
                 "cell_wall_seconds": result.wall_seconds,
                 **{key: result.metrics[key] for key in mlflow_names.TRIAL_METRICS if key in result.metrics}})


def previous_cell_runs(sub: Submission, grid: str) -> dict[str, Any]:
    """The newest MLflow run of every cell of grid ``grid`` (by ``cell_id``)."""
    runs = submission_runs(sub.client, [sub.experiment_id], grid, f" and tags.`{mlflow_names.KIND}` = '{mlflow_names.KIND_CELL}'")
    newest: dict[str, Any] = {}
    for run in sorted(runs, key=lambda r: r.info.start_time or 0):
        newest[run.data.tags.get(mlflow_names.CELL_ID, "")] = run
    return newest


def table_layout(spec: GridSpec) -> dict[str, Any]:
    """``build_tables`` arguments for a spec: its datasets, its frameworks and heads in the paper's order."""
    frameworks = [f for f in PAPER_FRAMEWORKS if f in spec.frameworks]
    frameworks += [f for f in spec.frameworks if f not in frameworks]
    heads = [h for h in PAPER_HEADS if h in spec.heads]
    heads += [h for h in spec.heads if h not in heads and h not in ABLATION_HEADS]
    return {"datasets": list(spec.datasets), "frameworks": frameworks, "heads": heads}


def _skipped(configs: list[RunConfig], previous: Mapping[str, Any]) -> dict[str, CellOutcome]:
    """The cells whose run in this grid FINISHED under an earlier submission."""
    outcomes = {}
    for config in configs:
        run = previous.get(config.cell_id)
        if run is not None and run.info.status == "FINISHED":
            outcomes[config.cell_id] = CellOutcome(config.cell_id, "skipped", f"finished in run {run.info.run_id}",
                                                   run.info.run_id, dict(run.data.metrics), config.cell_name)
    return outcomes


def _trial_cell_id(result: Any) -> str:
    """The cell of a Tune trial's result: from its config, else from its folder ``cell_<id>`` (a trial whose actor
    was cancelled before it ran reports no config)."""
    config = result.config or {}
    return config["cell_id"] if "cell_id" in config else Path(result.path).name.removeprefix("cell_")


def _trial_outcome(result: Any, names: Mapping[str, str], progress: GridProgress) -> CellOutcome:
    cell_id = _trial_cell_id(result)
    metrics = dict(result.metrics or {})
    if result.error is not None:
        status, reason = "failed", error_reason(result.error)
    elif metrics.get(CELL_ERROR):
        status, reason = "failed", str(metrics[CELL_ERROR])
    else:
        status, reason = "finished", ""
    return CellOutcome(cell_id, status, reason, metrics.get("run_id"),
                       {k: metrics[k] for k in mlflow_names.TRIAL_METRICS if k in metrics}, names.get(cell_id, cell_id),
                       trial_seconds=progress.durations.get(cell_id), loop_seconds=metrics.get("loop_seconds"))


def _run_cells(spec: GridSpec, to_run: list[RunConfig], context: SweepContext, sub: Submission, *, skipped: int,
               emit: Callable[[str], None], ray_init: Mapping[str, Any] | None) -> tuple[list[CellOutcome], int]:
    """Run ``to_run`` as Tune trials; returns their outcomes and how many ran at once."""
    concurrency = start_ray(spec.resources, spec.max_concurrent, ray_init)
    emit(f"[grid {spec.name}] running {concurrency} cell(s) at once "
         f"({'in-process, reused actors' if spec.resources.in_process else 'one TorchTrainer per cell'})")
    names = {c.cell_id: c.cell_name for c in to_run}
    progress = GridProgress(names, skipped=skipped, label=spec.name, emit=emit)
    results = fit(_cell_trainable, context, name=f"grid-{spec.name}-{context.sweep_id}-{sub.submission_id}",
                  progress=progress, store=sub.store, concurrency=concurrency,
                  parameters={"configs": {c.cell_id: c for c in to_run}},
                  trial_failures=spec.max_failures,
                  param_space={"cell_id": tune.grid_search([c.cell_id for c in to_run])},
                  reuse_actors=True, trial_dirname_creator=trial_dirname("cell", "cell_id"))
    return [_trial_outcome(result, names, progress) for result in results], concurrency


def _reconcile_with_mlflow(outcomes: dict[str, CellOutcome], runs: Mapping[str, Any], configs: list[RunConfig]) -> None:
    """MLflow is the record: fill run ids, prefer the run's ``error`` tag as the failure reason,
    and mark cells that never produced a Tune result as failed."""
    for config in configs:
        outcome = outcomes.get(config.cell_id)
        run = runs.get(config.cell_id)
        if outcome is None:
            reason = "no result from Ray Tune"
            if run is not None:
                reason += f"; MLflow run {run.info.run_id} is {run.info.status}"
            outcomes[config.cell_id] = CellOutcome(config.cell_id, "failed", reason, run.info.run_id if run else None,
                                                   cell_name=config.cell_name)
            continue
        reconcile(outcome, run)
        if run is not None and outcome.status == "finished" and run.info.status != "FINISHED":
            outcome.status, outcome.reason = "failed", f"MLflow run {run.info.run_id} ended {run.info.status}"


def _write_tables(spec: GridSpec, sub: Submission, summary: GridSummary, tables_dir: str | Path | None) -> None:
    out = Path(tables_dir) if tables_dir is not None else sub.out_dir("tables", spec.name, summary.grid_id)
    tables, _ = write_report(sub.tracking_uri, spec.experiment, out, grid_id=summary.grid_id, **table_layout(spec))
    summary.tables_dir, summary.tables_markdown = out, markdown_report(tables)
    claims = check_claims(sub.tracking_uri, spec.experiment, grid_id=summary.grid_id)
    # no experiment name in the grid's report: the same runs under another experiment write the same report
    appendix = reliability_markdown(tables)
    write_claims(claims, out, appendix=appendix)
    if summary.parent_run_id:
        sub.client.log_artifacts(summary.parent_run_id, str(out), mlflow_names.GRID_TABLES_DIR)
        log_claims(sub.tracking_uri, summary.parent_run_id, claims, appendix=appendix)
    summary.claims_markdown = claims_markdown(claims)


def run_grid(
    spec: GridSpec | str | Path, *, tracking_uri: str | None = None, storage: str | None = None,
    tables_dir: str | Path | None = None, emit: Callable[[str], None] = log_line,
    ray_init: Mapping[str, Any] | None = None, cell_callbacks: tuple[Any, ...] = (),
    resource_timeout: float = RESOURCE_TIMEOUT_S, shared_filesystem: bool | None = None,
) -> GridSummary:
    """Run every cell of ``spec`` under Ray Tune; returns the :class:`GridSummary`.

    ``tracking_uri`` / ``storage`` override the spec's (default: ``MLFLOW_TRACKING_URI`` or the
    local store; ``<cwd>/ray_results``). Cells whose run in this grid (same ``grid_id``)
    FINISHED are skipped; the others run, resuming from their last checkpoint. Connects to
    Ray (``RAY_ADDRESS`` / ``ray job submit``) or starts the embedded one (``ray_init``: its
    ``ensure_ray`` arguments). The tables are written to ``tables_dir`` (default: a folder
    next to the storage) and logged as artifacts of the parent run. ``emit``: the progress lines
    (default: the ``semiseg_platform.progress`` logger); ``cell_callbacks``: loop callbacks added to
    every cell (picklable). Never raises for a failing cell: see :attr:`GridSummary.ok`; a cell's data,
    weights or resources that cannot work, an unreachable store or storage raise ``PreflightError`` (a
    ``ValueError``) before anything is written; ``resource_timeout``: how long to wait for a cluster's resources;
    ``shared_filesystem``: the local tracking store and storage paths are reachable from every node
    (needed for them on a cluster of several hosts; None: ``NPSEMISEG_SHARED_FILESYSTEM``). A submission
    whose cells all finished earlier opens no parent run (:attr:`GridSummary.parent_run_id` is None).

    A cell whose trial process or node dies is retried up to ``spec.max_failures`` times in this
    submission, resuming its MLflow run from its last checkpoint; a cell that fails on its own is not.
    """
    started = time.monotonic()
    spec = spec if isinstance(spec, GridSpec) else load_spec(spec)
    configs = expand(spec)  # validates every cell before anything starts
    gid = grid_id(configs)
    sub = open_submission(storage or spec.storage, tracking_uri or spec.tracking_uri, spec.experiment, configs=configs,
                          resources=spec.resources, ray_init=ray_init, resource_timeout=resource_timeout,
                          shared_filesystem=shared_filesystem)
    outcomes: dict[str, CellOutcome] = _skipped(configs, previous_cell_runs(sub, gid))
    to_run = [c for c in configs if c.cell_id not in outcomes]
    parent_id = open_parent(sub, kind=mlflow_names.KIND_GRID, name=spec.name, sweep_id=gid,
                            spec=spec.model_dump(mode="json"),
                            params={mlflow_names.SPEC_NAME: spec.name, "preset": spec.preset, "cells": len(configs),
                                    mlflow_names.GRID_ID: gid}, to_run=len(to_run))
    emit(f"[grid {spec.name}] {len(configs)} cells ({len(outcomes)} finished earlier, {len(to_run)} to run); "
         f"grid_id {gid}, " + (f"parent run {parent_id}" if parent_id else "nothing to run: no new parent run"))
    concurrency = 0
    with ending_run(sub.client, parent_id) if parent_id else contextlib.nullcontext(RunEnd()) as end:
        if to_run:
            build_named_pretrainings(to_run, tracking=sub.tracking_uri, experiment=spec.experiment,
                                     emit=lambda line: emit(f"[grid {spec.name}] {line}"))
            context = SweepContext(mlflow_names.KIND_GRID, gid, sub.trial_storage, sub.tracking_uri, spec.experiment,
                                   parent_id, spec.resources, spec.max_failures, tuple(cell_callbacks))
            ran, concurrency = _run_cells(spec, to_run, context, sub, skipped=len(outcomes), emit=emit,
                                          ray_init=ray_init)
            outcomes.update((o.cell_id, o) for o in ran)
        _reconcile_with_mlflow(outcomes, previous_cell_runs(sub, gid), configs)
        summary = GridSummary(spec.name, gid, sub.submission_id, spec.experiment, sub.tracking_uri, parent_id,
                              [outcomes[c.cell_id] for c in configs], time.monotonic() - started, concurrency)
        _write_tables(spec, sub, summary, tables_dir)
        summary.wall_seconds = time.monotonic() - started
        if parent_id:
            _log_summary(sub, parent_id, summary)
        end.status = "FINISHED" if summary.ok else "FAILED"
        return summary


def _log_summary(sub: Submission, parent_id: str, summary: GridSummary) -> None:
    metrics = {f"cells_{s}": float(len(summary.cells(s))) for s in ("finished", "failed", "skipped")}
    metrics["wall_seconds"] = summary.wall_seconds
    if summary.median_overhead_seconds is not None:
        metrics["median_overhead_seconds"] = summary.median_overhead_seconds
    rows = [(o.cell_id, o.cell_name, o.status, o.run_id, _num(o.trial_seconds), _num(o.loop_seconds), o.reason)
            for o in summary.outcomes]
    body = csv_text(("cell_id", "cell_name", "status", "run_id", "trial_seconds", "loop_seconds", "reason"), rows)
    log_summary(sub.client, parent_id, mlflow_names.KIND_GRID, metrics=metrics, text=summary.format(),
                csv_name=mlflow_names.GRID_CELLS_FILE, csv_body=body)


def _num(value: float | None) -> str:
    return "" if value is None else f"{value:.3f}"
