"""``benchmarks/loader_throughput.py`` kept from rotting: one framework's streams at paper scale, one batch, no workers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from benchmark_scripts import load_benchmark


@pytest.mark.integration  # a few seconds: VOC-sized images at crop 480
def test_loader_throughput_measures_the_cells_streams_against_the_step(tmp_path: Path):
    """FixMatch's paper-scale streams (crop 480, 3 + 3 images, the strong view) with the raw items cached: the batch
    carries the framework's views, the rates and the headroom follow from the step time given."""
    bench = load_benchmark("loader_throughput")
    report = bench.main(["--frameworks", "fixmatch", "--workers", "0", "--raw", "cached", "--raw-items", "1",
                         "--batches", "1", "--rounds", "1", "--step-ms", "fixmatch=100", "--out", str(tmp_path)])
    (row,) = report["results"]
    assert "error" not in row, row
    assert row["images_per_batch"] == 6 and row["crop"] == 480 and "u/image_strong" in row["views"]
    assert row["step_images_per_s"] == pytest.approx(60.0)
    assert row["headroom"] == pytest.approx(row["loader_images_per_s"] / 60.0)
    assert row["ideal_images_per_s"] == pytest.approx(1 / row["cpu_s_per_image"])  # 0 workers: the one process
    assert json.loads((tmp_path / "loader_throughput.json").read_text())["results"][0]["framework"] == "fixmatch"
    assert "| fixmatch | cached | 0 | 6 |" in (tmp_path / "loader_throughput.md").read_text()


def test_step_times_name_the_framework_or_fail_with_the_expected_form():
    bench = load_benchmark("loader_throughput")
    assert bench.step_seconds(bench.parse_args(["--step-ms", "unimatch=141"])) == {"unimatch": pytest.approx(0.141)}
    with pytest.raises(SystemExit, match="expected FRAMEWORK=MS"):
        bench.step_seconds(bench.parse_args(["--step-ms", "nosuch=3"]))
