"""The shifted table and claim R2, from a real MLflow SQLite store holding cell runs evaluated under shift."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from mlflow import MlflowClient
from mlflow.entities import Metric

from semiseg_platform.reports import markdown_report, write_report
from semiseg_platform.reports.claim_evidence import CONTRADICTED, NO_DATA, SUPPORTED
from semiseg_platform.reports.claims import check_claims
from semiseg_platform.reports.shift import shift_claim, with_mce
from semiseg_platform.reports.tables import load_cell_runs

SEEDS = (0, 1)
#: per head: clean mIoU, mIoU under fog / snow (means over severities), ECE and AUROC under shift
HEADS = {"baseline": (0.50, 0.30, 0.40, 0.10, 0.70), "mc_dropout": (0.48, 0.28, 0.38, 0.08, 0.72),
         "np": (0.49, 0.44, 0.46, 0.05, 0.80)}


def _cell(client, experiment_id, framework, head, seed, *, shifted=True):
    clean, fog, snow, ece, auroc = HEADS[head]
    run = client.create_run(experiment_id, tags={
        "npsemiseg.kind": "cell", "framework": framework, "dataset": "study", "partition": "1/16", "head": head,
        "seed": str(seed), "cell_id": f"{framework}-{head}-{seed}"})
    values = {"miou": clean, "pavpu": 0.5}
    if shifted:
        wobble = seed / 1000  # seeds differ, so the bootstrap has something to resample
        values |= {"shift/fog/1/miou": fog + 0.05, "shift/fog/5/miou": fog - 0.05, "shift/fog/mean/miou": fog,
                   "shift/snow/mean/miou": snow, "shift/mean/miou": (fog + snow) / 2,
                   "shift/mean/ece": ece + wobble, "shift/mean/auroc": auroc + wobble}
    client.log_batch(run.info.run_id, metrics=[Metric(k, v, 0, 0) for k, v in values.items()])
    client.set_terminated(run.info.run_id, "FINISHED")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """Experiment ``shifted``: MT and U2PL, three heads, two seeds, all evaluated under shift; experiment ``clean``:
    the same cells without the evaluation under shift."""
    uri = f"sqlite:///{tmp_path_factory.mktemp('mlflow')}/mlflow.db"
    client = MlflowClient(uri)
    shifted, clean = client.create_experiment("shifted"), client.create_experiment("clean")
    for framework in ("mt", "u2pl"):
        for head in HEADS:
            for seed in SEEDS:
                _cell(client, shifted, framework, head, seed)
                _cell(client, clean, framework, head, seed, shifted=False)
    return uri


def test_mce_is_the_mean_corruption_error_over_the_baseline_heads(store):
    cells = with_mce(_shift_cells(store, "shifted"))
    np_cell = cells[(cells["head"] == "np") & (cells["framework"] == "mt")].iloc[0]
    # fog: (1 - 0.44) / (1 - 0.30); snow: (1 - 0.46) / (1 - 0.40)
    assert np_cell["mce"] == pytest.approx(((0.56 / 0.70) + (0.54 / 0.60)) / 2)
    assert (cells.loc[cells["head"] == "baseline", "mce"] == 1.0).all()


def test_mce_takes_the_baseline_of_the_same_dataset_instance(store):
    """Two dataset instances in one frame (the study at data seeds 0 and 1): each cell's reference is its own
    instance's baseline, so an NP cell as robust as its instance's baseline has an mCE of 1."""
    cells = _shift_cells(store, "shifted")
    cells = cells[cells["framework"] == "mt"]
    harder = cells.assign(data_instance="seed=1")
    for column in [c for c in cells.columns if c.startswith("shift/") and c.endswith("/miou")]:
        harder[column] = harder[column] - 0.2
    both = with_mce(pd.concat([cells.assign(data_instance="seed=0"), harder], ignore_index=True))
    baseline = both[both["head"] == "baseline"]
    assert (baseline["mce"] == 1.0).all()
    np_harder = both[(both["head"] == "np") & (both["data_instance"] == "seed=1")].iloc[0]
    assert np_harder["mce"] == pytest.approx(((0.76 / 0.90) + (0.74 / 0.80)) / 2)


def _shift_cells(uri, experiment):
    from semiseg_platform.reports.shift import load_shift_metrics

    return load_shift_metrics(uri, load_cell_runs(uri, experiment))


def test_the_report_prints_the_shifted_table_beside_tables_1_to_6(store, tmp_path):
    tables, written = write_report(store, "shifted", tmp_path, frameworks=["mt", "u2pl"])
    table = tables["table_shift_study_1_16"]
    row = table[(table["framework"] == "u2pl") & (table["head"] == "np")].set_index("column")
    assert row.loc["mIoU clean", "mean"] == pytest.approx(49.0)
    assert row.loc["mIoU shift", "mean"] == pytest.approx(45.0)
    assert row.loc["ECE shift", "mean"] == pytest.approx(5.05)
    assert row.loc["ECE shift", "n"] == 2 and not math.isnan(row.loc["ECE shift", "std"])
    assert row.loc["mCE", "mean"] == pytest.approx(100 * ((0.56 / 0.70) + (0.54 / 0.60)) / 2)
    report = markdown_report(tables)
    assert "Shifted table: study" in report and "| AUROC shift |" in report
    assert tmp_path / "table_shift_study_1_16.md" in written
    assert not any(name.startswith("table_shift") for name in write_report(store, "clean", tmp_path / "c")[0])


def test_r2_judges_np_against_both_heads_per_framework(store):
    claim = shift_claim(_shift_cells(store, "shifted"))
    assert claim.verdict == SUPPORTED
    assert [p.name for p in claim.parts][:4] == ["mt: ECE vs baseline", "mt: ECE vs MC dropout",
                                                 "mt: AUROC vs baseline", "mt: AUROC vs MC dropout"]
    assert claim.parts[0].mean_diff == pytest.approx(5.0) and claim.parts[0].pairs == 2
    assert claim.parts[3].mean_diff == pytest.approx(8.0)
    assert shift_claim(_shift_cells(store, "clean")).verdict == NO_DATA


def test_r2_judges_the_same_frameworks_as_r1_supervised_included(store):
    """R1 judges every framework with NP-SemiSeg cells, supervised (no teacher) among them; R2 judges the same
    frameworks under shift, so supervised's parts stand beside the SSL frameworks' in both."""
    cells = _shift_cells(store, "shifted")
    with_supervised = pd.concat([cells, cells[cells["framework"] == "mt"].assign(framework="supervised")],
                                ignore_index=True)
    names = [p.name for p in shift_claim(with_supervised).parts]
    assert names[:4] == ["supervised: ECE vs baseline", "supervised: ECE vs MC dropout",
                         "supervised: AUROC vs baseline", "supervised: AUROC vs MC dropout"]
    assert [n.split(":")[0] for n in names[::4]] == ["supervised", "mt", "u2pl"]


def test_r2_is_contradicted_when_np_is_worse_calibrated_under_shift(store):
    cells = _shift_cells(store, "shifted")
    worse = cells.assign(**{"shift/mean/ece": [0.30 + i / 1000 if h == "np" else 0.10 + i / 1000
                                               for i, h in enumerate(cells["head"])]})
    assert shift_claim(worse).verdict == CONTRADICTED


def test_the_claims_report_holds_r2(store):
    claims = {c.id: c for c in check_claims(store, "shifted")}
    assert claims["R2"].verdict == SUPPORTED and claims["R2"].pooled.pairs == 16
