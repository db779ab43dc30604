"""Chaos, reduced (integration): ``benchmarks/chaos.py`` on a fresh local stack (real PostgreSQL,
SeaweedFS, MLflow server, Ray head) with one kill of each kind (the grid driver, a cell's worker,
the MLflow server, the S3 server, the Ray head), in two bursts of simultaneous kills, while a
one-cell grid trains; the study then ends exactly as its undisturbed run: the cell FINISHED with
identical final metrics, identical tables, one run per cell, no run left RUNNING, one complete
checkpoint lineage. The kind ``node`` kills a worker node of the cluster (a second raylet) under a
training cell: the grid retries the cell in the same submission (no resubmission) and ends the same."""

from __future__ import annotations


import pytest
from benchmark_scripts import load_benchmark



def _chaos_module():
    return load_benchmark("chaos")


def test_identical_metrics_count_nan_as_equal_to_nan():
    chaos = _chaos_module()
    nan = float("nan")
    assert chaos.same_metrics({"miou": 0.5, "auroc": nan}, {"miou": 0.5, "auroc": nan})
    assert not chaos.same_metrics({"miou": 0.5, "auroc": nan}, {"miou": 0.5, "auroc": 0.7})
    assert not chaos.same_metrics({"miou": 0.5}, {"miou": 0.5000001})
    assert not chaos.same_metrics({"miou": 0.5}, {"miou": 0.5, "ece": 0.1})


@pytest.mark.integration
def test_a_grid_killed_in_every_way_ends_as_the_undisturbed_one():
    chaos = _chaos_module()
    args = chaos.parse_args(["--only", "synthetic_voc=92", "--frameworks", "supervised", "--heads", "baseline",
                             "--protocols", "corrected", "--steps", "40", "--checkpoint-every", "4", "--interval", "4",
                             "--burst", "3", "--seed", "3", "--max-kills", str(len(chaos.KINDS)), "--timeout", "900"])
    report = chaos.run_on_stack(args)
    assert report["kills"] == dict.fromkeys(chaos.KINDS, 1), report["events"]
    assert report["cells"] == 1 and report["burst"] == 3
    assert report["resubmissions"].get("driver killed") == 1 and report["submissions"] >= 2
    assert report["checks"] == dict.fromkeys(report["checks"], "ok"), report
    assert set(report["checks"]) == {"finished_cells", "final_metrics", "one_run_per_cell", "none_running", "tables",
                                     "checkpoint_lineages"}


def test_node_is_a_kind_to_ask_for_not_a_default_one():
    chaos = _chaos_module()
    assert "node" not in chaos.KINDS and chaos._kinds("driver,node") == ("driver", "node")
    with pytest.raises(ValueError, match="--kinds: unknown"):
        chaos._kinds("nodes")


@pytest.mark.integration
def test_a_grid_whose_worker_node_dies_under_a_cell_ends_as_the_undisturbed_one_in_one_submission():
    chaos = _chaos_module()
    # three cells at once on the head's 2 CPUs and the worker node's 1: one of them trains on the worker node
    args = chaos.parse_args(["--only", "synthetic_voc=92", "--frameworks", "supervised", "--heads", "baseline,mc_dropout,np",
                             "--protocols", "corrected", "--steps", "40", "--checkpoint-every", "4", "--interval", "3",
                             "--kinds", "node", "--max-kills", "1", "--seed", "0", "--timeout", "600"])
    report = chaos.run_on_stack(args)
    assert report["kills"] == {"node": 1}, report["events"]
    assert any("with 1 cell worker(s)" in event for event in report["events"]), report["events"]
    assert report["submissions"] == 1 and report["resubmissions"] == {}, report  # retried inside the submission
    assert report["cells"] == 3 and report["checks"] == dict.fromkeys(report["checks"], "ok"), report
