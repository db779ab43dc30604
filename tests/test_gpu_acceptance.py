"""``benchmarks/gpu_acceptance.py`` (``make gpu-check``) in its CPU mode, so the GPU acceptance run cannot rot:
every framework x head stepped, the ratios, the one-rank DDP cell (gloo), predict / evaluate / export on the
device and a GPU-hours figure of ``jobs/specs/paper.yaml``, in the JSON and the Markdown it writes; with ``--vit``
UniMatch V2's step per head on the tiny ViT and the GPU-hours of ``jobs/specs/paper_unimatch_v2.yaml``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from benchmark_scripts import load_benchmark

from npsemiseg.frameworks import framework_names
from npsemiseg.heads import head_names


def _script():
    return load_benchmark("gpu_acceptance")


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="the CPU peak needs Linux's /proc")
def test_cpu_peak_memory_is_reset_per_cell() -> None:
    """The CPU peak (RSS high-water mark) counts what a cell allocates after the reset, not what came before."""
    script = _script()
    cpu = torch.device("cpu")
    script.reset_peak_memory(cpu)
    before = script.peak_memory_mib(cpu)
    big = torch.ones(64, 2**20)  # 256 MiB, touched
    with_big = script.peak_memory_mib(cpu)
    assert with_big - before > 200
    del big
    script.reset_peak_memory(cpu)
    assert script.peak_memory_mib(cpu) < with_big - 200  # the freed tensor no longer counts


@pytest.mark.integration  # about a minute on a loaded 2-core machine
def test_tiny_cpu_run_reports_every_part(tmp_path: Path) -> None:
    _script().main(["--device", "cpu", "--tiny", "--host-work", "--flops", "--vit", "dinov2_s", "dinov2_b",
                    "--vit-np-pools", "1", "--out", str(tmp_path)])
    report = json.loads((tmp_path / "gpu_acceptance.json").read_text())
    assert report["errors"] == []
    assert report["date"] and report["machine"] and "--tiny" in report["command"]
    cells = {(c["framework"], c["head"]): c for c in report["cells"]}
    assert set(cells) == {(f, h) for f in framework_names() for h in head_names()}
    for cell in cells.values():
        assert cell["step_s"] > 0 and cell["images_per_s"] > 0 and cell["loss"] is not None
        assert cell["first_step_s"] > 0 and cell["host_work"]["ops"] > 100 and cell["host_work"]["reads"] >= 1
        assert cell["step_cpu_s"] > 0 and cell["peak_memory_measure"] == "peak RSS"
        operators = {e["operator"] for e in cell["flops"]["by_operator"]}
        assert cell["flops"]["gflop"] > 0 and {"aten.convolution", "aten.convolution_backward"} <= operators
        assert cell["peak_memory_mib"] is None or cell["peak_memory_mib"] > 100  # the process: torch and the model
    for framework in framework_names():
        assert report["ratios"][framework]["np_step_ratio"] > 0
        assert report["ratios"][framework]["mc_dropout_step_ratio"] > 0
        assert report["ratios"][framework]["np_ops_ratio"] > 1.0  # the NP head's layers and memories
        assert report["ratios"][framework]["np_flops_ratio"] > 0
        assert report["ratios"][framework]["np_memory_ratio"] is None or report["ratios"][framework]["np_memory_ratio"] > 0
    ddp = report["ddp"]
    assert ddp["backend"] == "gloo" and ddp["world_size"] == 1 and ddp["steps"] == 2
    assert ddp["all_reduce_ok"] and ddp["broadcast_unchanged"]
    inference = report["inference"]
    assert inference["device"] == "cpu" and inference["predict_labels_in_range"] and inference["uncertainty_finite"]
    assert inference["evaluate_miou"] is not None and inference["export_roundtrip_equal"]
    estimate = report["gpu_hours"]
    assert estimate["cells"] > 0 and estimate["unmeasured_cells"] == 0
    assert estimate["total_steps"] > 0 and estimate["gpu_hours"] > 0 and estimate["assumptions"]
    assert set(estimate["gpu_hours_by_dataset"]) == {"pascal_classic", "pascal_blender", "cityscapes"}
    text = (tmp_path / "gpu_acceptance.md").read_text()
    assert "GPU-hours" in text and report["machine"] in text and "FLOPs by operator" in text
    # --vit: tiny mode measures both as vit_tiny, once per head; each V2 spec cell takes that step
    vit = {(c["backbone"], c["head"]): c for c in report["vit_cells"]}
    assert set(vit) == {("vit_tiny", h) for h in [*head_names(), "np_pool1"]}
    assert all(c["framework"] == "unimatch_v2" and c["crop"] == 28 and c["step_s"] > 0 for c in vit.values())
    # the NP head at the corrected default (the DPT's 1/7 map) and again on the map as it is (--vit-np-pools 1)
    assert vit["vit_tiny", "np"]["np_feature_pool"] == "coarse" and vit["vit_tiny", "np_pool1"]["np_feature_pool"] == 1
    assert report["vit_ratios"]["unimatch_v2 vit_tiny"]["np_step_ratio"] > 0
    assert report["vit_ratios"]["unimatch_v2 vit_tiny"]["np_pool1_flops_ratio"] > 0
    v2 = report["vit_gpu_hours"]
    assert v2["cells"] == 57 and v2["unmeasured_cells"] == 0 and v2["gpu_hours"] > 0
    assert set(v2["gpu_hours_by_dataset"]) == {"pascal_classic", "cityscapes", "ade20k", "coco"}
    assert "unimatch_v2 on DINOv2" in text and "paper_unimatch_v2.yaml: 57 cells" in text
