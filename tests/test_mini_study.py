"""The mini-study's spec (``jobs/specs/mini.yaml``) end to end, reduced to two cells (integration).

Supervised and MT with the baseline head at 1/16 of the ``study`` dataset, one seed, 4 steps,
from a random start (the pretrained start has tests of its own: ``tests/test_pretrain.py``),
through ``run_grid`` on a real local Ray and MLflow store: both cells finish, the tables hold
them (the shifted table too: the cells are evaluated under shift) and the claims report pairs the two cells
for S0 (MT against supervised, seed 0), written
beside the tables and logged on the grid's parent run.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from mlflow import MlflowClient

from semiseg_platform.sweeps.grid_runner import run_grid
from semiseg_platform.sweeps.grid_spec import expand, load_spec

pytestmark = pytest.mark.integration

MINI = Path(__file__).resolve().parents[1] / "jobs" / "specs" / "mini.yaml"


def reduced_mini_spec(root: Path) -> dict:
    """mini.yaml with two cells (supervised and MT, baseline head, 1/16, seed 0) of 4 steps, evaluated under shift
    on two corruptions at two severities."""
    spec = yaml.safe_load(MINI.read_text())
    frameworks = ["supervised", "mt"]
    spec.update(frameworks=frameworks, datasets={"study": ["1/16"]}, heads={"baseline": None}, seeds=[0],
                rules=[], tracking_uri=f"sqlite:///{root}/mlruns.db", storage=str(root / "ray_results"))
    # the time-scaled settings of the frameworks kept (MT's EMA warm-up among them)
    spec["cell_overrides"] = [entry for entry in spec.get("cell_overrides", [])
                              if set(entry["when"].get("frameworks", frameworks)) <= set(frameworks)
                              and set(entry["when"].get("heads", ["baseline"])) <= {"baseline"}]
    spec["overrides"].update({"model.weights": None, "schedule.max_steps": 4, "schedule.checkpoint_every_steps": 0,
                              "evaluation.max_images": 8, "evaluation.corruptions": ["gaussian_noise", "fog"],
                              "evaluation.corruption_severities": [1, 5]})
    return spec


@pytest.fixture(scope="module")
def ray_cluster():
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_two_cells_of_the_mini_study_train_and_the_claims_pair_them(tmp_path, ray_cluster):
    spec = load_spec(reduced_mini_spec(tmp_path))
    cells = expand(spec)
    assert sorted((c.framework, c.dataset, c.partition, c.head.name, c.model.weights) for c in cells) == [
        ("mt", "study", "1/16", "baseline", None), ("supervised", "study", "1/16", "baseline", None)]
    assert next(c for c in cells if c.framework == "mt").framework_options["ema_decay"] == 0.9  # scaled to the run
    summary = run_grid(spec, tables_dir=tmp_path / "tables")
    assert summary.ok and len(summary.cells("finished")) == 2

    by_id = {claim["id"]: claim for claim in json.loads((tmp_path / "tables" / "claims.json").read_text())}
    sanity = by_id["S0"]
    assert sanity["per_framework"]["mt"]["pairs"] == 1  # MT against supervised, same partition and seed
    assert sanity["per_framework"]["augseg"]["pairs"] == 0  # a framework not run has no data
    assert by_id["C1"]["verdict"] == "no data"  # no NP-SemiSeg cell
    client = MlflowClient(spec.tracking_uri)
    assert {a.path for a in client.list_artifacts(summary.parent_run_id, "claims")} == {
        "claims/claims.md", "claims/claims.json", "claims/claims_forest.png"}  # S0's MT pair is drawn
    assert "study" in summary.tables_markdown and "| MT |" in summary.tables_markdown
    assert "Shifted table: study" in summary.tables_markdown and by_id["R2"]["verdict"] == "no data"  # no NP cell
