"""``make demo``'s printout (jobs/demo.py), with the grid replaced by a finished summary: no cell runs."""

from __future__ import annotations

from pathlib import Path

from jobs import demo
from semiseg_platform.sweeps.grid_runner import GridSummary

TABLES = "## Table 1: mIoU (smoke)\n\n| framework | 1/16 |\n| --- | --- |\n| Supervised | 1.00 |"


def test_the_note_saying_what_the_demo_is_comes_before_the_tables(monkeypatch, capsys, tmp_path):
    summary = GridSummary(spec_name="smoke", grid_id="g", submission_id="s", experiment="npsemiseg-smoke",
                          tracking_uri=f"sqlite:///{tmp_path / 'mlruns.db'}", parent_run_id="p", outcomes=[],
                          wall_seconds=1.0, concurrency=1, tables_dir=Path(tmp_path), tables_markdown=TABLES)
    monkeypatch.setattr(demo, "run_grid", lambda *args, **kwargs: summary)
    monkeypatch.setattr(demo, "configure_logging", lambda level: None)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", summary.tracking_uri)
    assert demo.main() == 0
    out = capsys.readouterr().out
    note, tables = out.find(demo.PLUMBING_NOTE), out.find(TABLES)
    assert 0 <= note < tables, out
    assert "synthetic" in demo.PLUMBING_NOTE and "not how the methods compare" in demo.PLUMBING_NOTE
