"""Chaos, reduced (integration): ``benchmarks/chaos.py`` on a fresh local stack (real PostgreSQL,
SeaweedFS, MLflow server, Ray head) with one kill of each kind (the grid driver, a cell's worker,
the MLflow server, the S3 server, the Ray head), in two bursts of simultaneous kills, while a
one-cell grid trains; the study then ends exactly as its undisturbed run: the cell FINISHED with
identical final metrics, identical tables, one run per cell, no run left RUNNING, one complete
checkpoint lineage."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _chaos_module():
    spec = importlib.util.spec_from_file_location("chaos_benchmark", ROOT / "benchmarks" / "chaos.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


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
