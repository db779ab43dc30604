"""The grid job end to end on a real local Ray and a real MLflow SQLite store (integration).

One reduced grid (2 frameworks x 1 dataset x 2 partitions x 3 heads = 12 smoke cells, one of
them made to fail) is submitted twice: the first submission trains 11 cells and records one
failure without stopping the others; the second skips the 11 finished cells, creates no new
run and trains the failing cell again in its own run. The tables logged on the parent run
hold exactly the MLflow metrics.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch
from mlflow import MlflowClient

from semiseg_platform.reports.reliability import RELIABILITY_COLUMNS
from semiseg_platform.sweeps.grid_runner import run_grid
from semiseg_platform.sweeps.grid_spec import load_spec

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(torch.cuda.is_available(), reason="the failing cell asks for CUDA, which must be missing"),
]

FAILING = "u2pl/synthetic_voc/183/np"


@pytest.fixture(scope="module")
def ray_cluster():
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def grid(tmp_path_factory, ray_cluster):
    root = tmp_path_factory.mktemp("grid")
    spec = load_spec({
        "name": "reduced",
        "experiment": "reduced",
        "preset": "smoke",
        "frameworks": ["supervised", "u2pl"],
        "datasets": {"synthetic_voc": ["92", "183"]},
        "heads": ["baseline", "mc_dropout", "np"],
        "overrides": {"runtime.device": "cpu"},
        # a cell made to fail: CUDA is not available on this machine
        "cell_overrides": [{"when": {"frameworks": ["u2pl"], "partitions": ["183"], "heads": ["np"]},
                            "overrides": {"runtime.device": "cuda"}}],
        "resources": {"workers": 1, "cpus_per_worker": 1},
        "tracking_uri": f"sqlite:///{root}/mlruns.db",
        "storage": str(root / "ray_results"),
    })
    lines: list[str] = []
    first = run_grid(spec, tables_dir=root / "tables1", emit=lines.append)
    return spec, root, first, lines


def _cell_runs(client: MlflowClient, experiment: str) -> pd.DataFrame:
    experiment_id = client.get_experiment_by_name(experiment).experiment_id
    rows = []
    for run in client.search_runs([experiment_id], "tags.`npsemiseg.kind` = 'cell'", max_results=1000):
        rows.append({"run_id": run.info.run_id, "status": run.info.status, "end_time": run.info.end_time,
                     "name": run.info.run_name, "parent": run.data.tags.get("mlflow.parentRunId"),
                     "cell_id": run.data.tags["cell_id"], "miou": run.data.metrics.get("miou")})
    return pd.DataFrame(rows)


def test_first_submission_runs_every_cell_and_isolates_the_failure(grid):
    spec, root, summary, lines = grid
    assert len(summary.outcomes) == 12
    assert [o.cell_name for o in summary.cells("failed")] == [FAILING]
    assert "CUDA" in summary.cells("failed")[0].reason
    assert len(summary.cells("finished")) == 11 and not summary.cells("skipped")
    assert not summary.ok
    assert all(o.overhead_seconds is not None and o.loop_seconds > 0 for o in summary.cells("finished"))

    client = MlflowClient(spec.tracking_uri)
    runs = _cell_runs(client, spec.experiment)
    assert len(runs) == 12 and runs.cell_id.is_unique
    assert set(runs.parent) == {summary.parent_run_id}
    assert runs.set_index("name").status.to_dict()[f"{FAILING}/corrected"] == "FAILED"  # run name: cell / protocol
    assert (runs[runs.name != f"{FAILING}/corrected"].status == "FINISHED").all()
    parent = client.get_run(summary.parent_run_id)
    assert parent.info.status == "FAILED" and parent.data.tags["grid_id"] == summary.grid_id
    assert parent.data.metrics["cells_finished"] == 11 and parent.data.metrics["cells_failed"] == 1

    # progress lines: one per start and per end, the last one counting everything
    assert sum("started" in line for line in lines) == 12
    assert "12/12 done (11 finished, 1 failed, 0 skipped)" in lines[-1]


def test_tables_on_the_parent_run_equal_the_mlflow_metrics(grid):
    spec, root, summary, _ = grid
    client = MlflowClient(spec.tracking_uri)
    artifacts = {a.path for a in client.list_artifacts(summary.parent_run_id, "tables")}
    assert "tables/table1_miou_synthetic_voc.md" in artifacts and "tables/table4_pavpu.parquet" in artifacts
    local = client.download_artifacts(summary.parent_run_id, "tables/table1_miou_synthetic_voc.csv", str(root))
    table = pd.read_csv(local, dtype={"partition": str, "run_ids": str}, keep_default_na=False,
                        na_values={"mean": [""], "std": [""]})
    runs = _cell_runs(client, spec.experiment).set_index("run_id")
    ok = table[table.status == "ok"]
    assert len(ok) == 11
    for row in ok.itertuples():
        assert row.mean == pytest.approx(100 * runs.loc[row.run_ids, "miou"], abs=1e-9)
    failing = table[(table.framework == "u2pl") & (table["head"] == "np") & (table.partition == "183")]
    assert failing.status.item() == "failed"
    # cells outside the grid (366, 732; psmt, ...) are marked missing, not dropped
    assert (table[table.partition.isin(["366", "732"])].status == "missing").all()
    assert "| U2PL w/ NP-SemiSeg |" in summary.tables_markdown
    # the claims report of the grid's cells: written beside the tables, logged on the parent run
    claims = {a.path for a in client.list_artifacts(summary.parent_run_id, "claims")}
    assert claims == {"claims/claims.md", "claims/claims.json", "claims/claims_forest.png"}
    by_id = {c["id"]: c for c in json.loads((summary.tables_dir / "claims.json").read_text())}
    assert set(by_id) >= {"S0", "C1", "C2", "C3", "C4", "C5"} and "| C1 |" in summary.claims_markdown


def test_resubmission_skips_finished_cells_and_trains_nothing_twice(grid):
    spec, root, first, _ = grid
    client = MlflowClient(spec.tracking_uri)
    before = _cell_runs(client, spec.experiment).set_index("run_id")
    lines: list[str] = []
    second = run_grid(spec, tables_dir=root / "tables2", emit=lines.append)
    after = _cell_runs(client, spec.experiment).set_index("run_id")

    assert second.grid_id == first.grid_id and second.submission_id != first.submission_id
    assert len(second.cells("skipped")) == 11 and [o.cell_name for o in second.cells("failed")] == [FAILING]
    assert sorted(after.index) == sorted(before.index)  # no duplicate runs
    finished = before[before.status == "FINISHED"].index
    # the finished runs were not touched: same end time, still children of the first submission
    assert after.loc[finished, "end_time"].equals(before.loc[finished, "end_time"])
    assert set(after.loc[finished, "parent"]) == {first.parent_run_id}
    # the failing cell ran again in its own run, now a child of the second submission
    failing_run = before.index[before.name == f"{FAILING}/corrected"].item()
    assert after.loc[failing_run, "parent"] == second.parent_run_id
    assert sum("started" in line for line in lines) == 1
    # the tables of the second submission still hold every finished cell (same grid_id): the one
    # failed cell is marked in each table it belongs to (Tables 1, 4, 5, 6), the rest are numbers; in the
    # reliability table its row is marked too
    paper_tables, _, reliability = second.tables_markdown.partition("Reliability: ")
    assert paper_tables.count(" — (failed)") == 4
    assert reliability.count(" — (failed)") >= len(RELIABILITY_COLUMNS)
    table1 = second.tables_markdown.split("### Table 4")[0]
    assert sum(line.count(".") for line in table1.splitlines() if line.startswith("| ")) == 11
