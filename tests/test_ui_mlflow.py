"""The MLflow UI over a reduced grid, as a person uses it: open the link ``npsemiseg ui`` prints,
search the experiment, compare two cells.

A real grid job (``run_grid``, local Ray, MLflow SQLite store) trains 5 smoke cells on
``synthetic_voc`` partition 92: U2PL with the baseline, MC dropout and NP heads and the
``np_mean`` ablation, and supervised with the NP head; submitted again, it finds every cell
finished and opens no second parent run. The store is read through the API (run shape, the
README's searches) and through the UI: ``mlflow server`` (the command ``semiseg_platform.ui``
runs) on loopback, driven by headless Chromium (Debian's package) through Playwright: the
printed link (the training view, the experiment's description, the cells with their mIoU and PAvPU), the
search box, the nested runs table, the Compare button and the compare view. Screenshots go to
``test-artifacts/ui/``.
"""

from __future__ import annotations

import re

import pytest
from mlflow import MlflowClient

from npsemiseg.constants import NOT_APPLICABLE
from semiseg_platform.sweeps.grid_runner import run_grid
from semiseg_platform.sweeps.grid_spec import load_spec
from semiseg_platform.tracking.mlflow_names import FINAL_METRICS, PER_CLASS_IOU_FIGURE
from semiseg_platform.tracking.mlflow_names import NOTE as NOTE_TAG
from semiseg_platform.ui import experiment_url, ready_made_searches, study_links, ui_command
from tests.platform_fixtures import free_ports, fresh_store
from tests.ui_browser import ARTIFACTS, compare_view_metrics, headless_chromium, running_server

pytestmark = pytest.mark.integration

EXPERIMENT = "ui-study"
DATASET = "synthetic_voc"
U2PL = {head: f"u2pl/{DATASET}/92/{head}/corrected" for head in ("baseline", "mc_dropout", "np", "np_mean")}
SUPERVISED_NP = f"supervised/{DATASET}/92/np/corrected"  # run names: cell name / protocol
CELLS = {SUPERVISED_NP, *U2PL.values()}
#: what each of the README's searches must list, and nothing else
EXPECTED = {
    "np_cells": {SUPERVISED_NP, U2PL["np"]},
    "mc_dropout_vs_np": {U2PL["mc_dropout"], U2PL["np"]},
    "attention_ablation": {U2PL["np"], U2PL["np_mean"]},
}
TIMEOUT_MS = 120_000  # the shared 2-core machine renders MLflow's React app slowly


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A fresh MLflow store and ``mlflow server`` starting on it (free loopback port), so the
    server comes up while the grid trains: ``(tracking_uri, base_url, ready)``."""
    uri = fresh_store(tmp_path_factory, "ui-study")
    (port,) = free_ports(1)
    base = f"http://127.0.0.1:{port}"
    with running_server(ui_command(uri, port=port), f"{base}/health", ARTIFACTS / "mlflow-server.log") as ready:
        yield uri, base, ready


@pytest.fixture(scope="module")
def submissions(store, tmp_path_factory):
    """The reduced grid submitted twice: ``(first, second)`` summaries (the second finds every cell finished)."""
    import ray

    uri = store[0]
    root = tmp_path_factory.mktemp("ui-grid")
    spec = load_spec({
        "name": "ui", "experiment": EXPERIMENT, "preset": "smoke",
        "frameworks": ["supervised", "u2pl"], "datasets": {DATASET: ["92"]},
        "heads": {"baseline": None, "mc_dropout": None, "np": None,
                  "np_mean": {"head": "np", "options": {"attention": "mean"}}},
        "rules": [{"when": {"frameworks": ["supervised"]}, "only": {"heads": ["np"]}}],
        "overrides": {"runtime.device": "cpu", "evaluation.figures": True},
        "resources": {"workers": 1, "cpus_per_worker": 1},
        "tracking_uri": uri, "storage": str(root / "ray_results"),
    })
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        first = run_grid(spec, tables_dir=root / "tables", emit=lambda line: None)
        second = run_grid(spec, tables_dir=root / "tables-again", emit=lambda line: None)
    finally:
        ray.shutdown()
    return first, second


@pytest.fixture(scope="module")
def study(store, submissions):
    """The reduced grid's runs: ``(tracking_uri, experiment_id, parent_run_id, {run name: Run})``."""
    uri = store[0]
    summary = submissions[0]
    assert summary.ok, summary.format()
    client = MlflowClient(uri)
    experiment_id = client.get_experiment_by_name(EXPERIMENT).experiment_id
    runs = {run.info.run_name: run for run in client.search_runs([experiment_id], "tags.`npsemiseg.kind` = 'cell'")}
    return uri, experiment_id, summary.parent_run_id, runs


def test_cells_are_children_of_the_submission_with_one_key_set(study):
    uri, experiment_id, parent_id, runs = study
    assert set(runs) == CELLS
    assert {run.data.tags["mlflow.parentRunId"] for run in runs.values()} == {parent_id}
    params = [set(run.data.params) for run in runs.values()]
    assert all(keys == params[0] for keys in params), "cells differ in their parameter keys"
    # the metrics the study compares: final, evaluation and timing keys are the same in every cell
    compared = [{k for k in run.data.metrics if not k.startswith("train/")} for run in runs.values()]
    differing = [sorted(keys ^ compared[0]) for keys in compared]
    assert not any(differing), f"cells differ in their metric keys: {differing}"
    assert set(FINAL_METRICS) <= compared[0] and "eval/miou" in compared[0]
    assert runs[SUPERVISED_NP].data.params["framework_options.ema_decay"] == NOT_APPLICABLE
    assert runs[U2PL["np_mean"]].data.params["framework_options.ema_decay"] != NOT_APPLICABLE
    assert runs[U2PL["np_mean"]].data.params["head.options.attention"] == "mean"
    assert runs[U2PL["np"]].data.params["head.options.attention"] == "euclidean"
    assert runs[U2PL["baseline"]].data.params["head.options.attention"] == NOT_APPLICABLE


def test_every_cell_describes_itself_and_carries_its_figures(study):
    uri, experiment_id, parent_id, runs = study
    client = MlflowClient(uri)
    for name, run in runs.items():
        note = run.data.tags[NOTE_TAG]
        assert note.startswith(f"**{name}**") and run.data.tags["cell_id"] in note
        figures = {item.path for item in client.list_artifacts(run.info.run_id, "figures")}
        assert figures == {"figures/uncertainty_maps.png", "figures/reliability.png", "figures/risk_coverage.png",
                           "figures/reliability_curves.json", PER_CLASS_IOU_FIGURE}, name
    assert "attention = mean" in runs[U2PL["np_mean"]].data.tags[NOTE_TAG]


def test_a_resubmission_that_runs_nothing_opens_no_parent_run(study, submissions):
    uri, experiment_id, parent_id, runs = study
    first, second = submissions
    assert second.ok and len(second.cells("skipped")) == len(CELLS) and second.parent_run_id is None
    assert "no new parent run (nothing ran)" in second.format()
    parents = MlflowClient(uri).search_runs([experiment_id], "tags.`npsemiseg.kind` = 'grid'")
    assert [run.info.run_id for run in parents] == [parent_id]
    # the tables and claims still come from the store: the same as the first submission's
    assert "| U2PL w/ NP-SemiSeg |" in second.tables_markdown and second.tables_markdown == first.tables_markdown
    assert second.claims_markdown == first.claims_markdown and (second.tables_dir / "claims.md").is_file()


@pytest.mark.parametrize("search", sorted(EXPECTED))
def test_ready_made_searches_select_exactly_their_cells(study, search):
    uri, experiment_id, parent_id, runs = study
    found = MlflowClient(uri).search_runs([experiment_id], ready_made_searches(DATASET, "u2pl")[search])
    assert {run.info.run_name for run in found} == EXPECTED[search]


@pytest.fixture(scope="module")
def ui_server(store, study):
    """The base URL of the MLflow server over the study's store, once it answers."""
    uri, base, ready = store
    ready()
    return base


@pytest.fixture(scope="module")
def browser(ui_server):
    with headless_chromium() as browser:
        yield browser


@pytest.fixture
def page(browser):
    """A page in a fresh browser profile (the UI keeps each experiment's table state in local storage)."""
    context = browser.new_context(viewport={"width": 1600, "height": 1000})
    context.set_default_timeout(TIMEOUT_MS)
    yield context.new_page()
    context.close()


def test_the_printed_link_opens_the_cells_with_their_miou_and_pavpu(study, ui_server, page):
    """The link ``npsemiseg ui`` prints first: the training view's runs table, the experiment's
    description, and every cell run listed with its mIoU and PAvPU, best mIoU first."""
    uri, experiment_id, parent_id, runs = study
    page.goto(study_links(uri, ui_server)[EXPERIMENT]["Cells by mIoU"])
    page.get_by_text(f"{len(CELLS)} matching runs").wait_for()  # the view's search: the cells themselves
    for run in runs.values():  # the runs table of the training view (the GenAI overview lists no runs)
        page.locator(f'[role="row"][row-id="{run.info.run_id}"]').first.wait_for()
    page.screenshot(path=str(ARTIFACTS / "cells_view.png"))
    assert re.search(rf"#/experiments/{experiment_id}/runs\?.*workflowType=machine_learning", page.url), page.url
    page.get_by_text("npsemiseg cell runs, one per framework", exact=False).first.wait_for()  # the description
    listed = page.locator('[role="row"][row-id]').evaluate_all("rows => rows.map(r => r.getAttribute('row-id'))")
    assert set(listed) == {run.info.run_id for run in runs.values()}  # no parent run among them
    for metric in ("miou", "pavpu"):
        column = _column_id(page, metric)
        for name, run in runs.items():
            cell = page.locator(f'[role="row"][row-id="{run.info.run_id}"] [col-id="{column}"]').first
            assert float(cell.inner_text()) == pytest.approx(run.data.metrics[metric], abs=1e-3), (name, metric)
    # best mIoU first (the view's order), as the table lists the cells
    miou = {run.info.run_id: run.data.metrics["miou"] for run in runs.values()}
    assert [miou[row] for row in dict.fromkeys(listed)] == sorted(miou.values(), reverse=True)


def _column_id(page, header: str) -> str:
    """The column id of the runs table's column headed ``header`` (fails when the column is not shown)."""
    cell = page.locator(".ag-header-cell[col-id]").filter(has_text=re.compile(rf"^\s*{re.escape(header)}\s*$")).first
    cell.wait_for()
    return cell.get_attribute("col-id")


def test_search_then_compare_two_cells_in_the_browser(study, ui_server, page):
    """Paste the README's NP search, expand the submission, tick its two cells, press Compare."""
    uri, experiment_id, parent_id, runs = study
    page.goto(experiment_url(ui_server, experiment_id))
    parent_row = page.locator(f'[role="row"][row-id="{parent_id}"]').first
    parent_row.wait_for()  # before any search the table lists the submission's parent run
    box = page.get_by_placeholder(re.compile("metrics.rmse", re.IGNORECASE)).first
    box.fill(ready_made_searches(DATASET, "u2pl")["np_cells"])
    box.press("Enter")
    page.get_by_text(f"{len(EXPECTED['np_cells']) + 1} matching runs").wait_for()  # the cells and their parent
    parent_row.locator("button").first.click()  # expand the submission's children
    for name in EXPECTED["np_cells"]:
        page.locator(f'[role="row"][row-id="{runs[name].info.run_id}"]').first.wait_for()
    page.screenshot(path=str(ARTIFACTS / "search_np_cells.png"))
    listed = set(page.locator('[role="row"][row-id]').evaluate_all("rows => rows.map(r => r.getAttribute('row-id'))"))
    assert listed == {parent_id} | {runs[name].info.run_id for name in EXPECTED["np_cells"]}

    for name in sorted(EXPECTED["np_cells"]):
        page.locator(f'[role="row"][row-id="{runs[name].info.run_id}"]').first.locator('input[type="checkbox"]').first.check()
    page.get_by_role("button", name="Compare", exact=True).click()
    page.get_by_text("Comparing 2 Runs", exact=False).wait_for()
    attention = page.get_by_text("head.options.attention", exact=True).first
    attention.wait_for()
    attention.scroll_into_view_if_needed()
    page.screenshot(path=str(ARTIFACTS / "compare_np_cells_params.png"))
    columns = _row_cells(page, "Run Name:")
    assert set(columns) == EXPECTED["np_cells"]
    compared = [runs[name] for name in columns]
    # one row per parameter key, one column per run: framework options the cell lacks read n/a
    for key in ("framework", "framework_options.ema_decay", "head.options.attention", "head.options.training_samples"):
        assert _row_cells(page, key) == [run.data.params[key] for run in compared], key
    assert _row_cells(page, "framework_options.ema_decay") == [
        NOT_APPLICABLE if run.data.tags["framework"] == "supervised" else "0.99" for run in compared]
    page.locator(".ReactVirtualized__Grid").first.scroll_into_view_if_needed()  # the metrics table
    page.screenshot(path=str(ARTIFACTS / "compare_np_cells_metrics.png"))
    metrics = compare_view_metrics(page)
    for key in (*FINAL_METRICS, "eval/miou"):
        shown = [float(value) for value in metrics[key]]
        assert shown == pytest.approx([run.data.metrics[key] for run in compared], rel=5e-3, abs=1e-3, nan_ok=True), key


def _row_cells(page, label: str) -> list[str]:
    """The values of the compare view's table row headed ``label`` (one per run, in column order)."""
    header = page.locator("th", has_text=re.compile(rf"^\s*{re.escape(label)}\s*$"))
    row = page.locator("tr").filter(has=header).first
    return [text.strip() for text in row.locator("td").all_inner_texts()]
