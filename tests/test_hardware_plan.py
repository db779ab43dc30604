"""``npsemiseg plan``: every paper cell planned on 1x24GB, 2x24GB, 4x80GB and 8x80GB keeps the publication's global
batch within the GPU's memory, or says in one line which GPU would; the memory model reproduces the steps it was
fitted to and grows with the batch; bad ``--gpus`` values are one clear error."""

from __future__ import annotations

import glob
import json
from functools import cache
from pathlib import Path

import pytest
from benchmark_scripts import load_benchmark
from typer.testing import CliRunner

from npsemiseg.config import RunConfig, cell_config
from npsemiseg.hardware_plan import (
    Gpus,
    memory_table,
    parse_gpus,
    plan_cell,
    predict_peak_mib,
    publication_batches,
    elastic_world_size_problem,
    replan_for_world_size,
    replanned_config,
)
from semiseg_platform.cli.main import app
from semiseg_platform.sweeps.grid_spec import expand, load_spec

ROOT = Path(__file__).resolve().parents[1]
SETUPS = ("1x24GB", "2x24GB", "4x80GB", "8x80GB")
runner = CliRunner()


@cache
def paper_cells() -> list[RunConfig]:
    """Every cell of the paper specs (``jobs/specs/paper*.yaml``), one per distinct planning input."""
    cells: dict[str, RunConfig] = {}
    for spec in sorted(glob.glob(str(ROOT / "jobs" / "specs" / "paper*.yaml"))):
        for config in expand(load_spec(spec)):
            schedule = config.schedule
            key = (config.framework, config.head.name, config.model.backbone, schedule.crop_size,
                   schedule.batch_size, schedule.unlabeled_batch_size, config.optim.reference_batch,
                   config.optim.name, config.runtime.amp, config.runtime.sync_bn)
            cells.setdefault(repr(key), config)
    return list(cells.values())


@pytest.mark.parametrize("setup", SETUPS)
def test_every_paper_cell_gets_a_plan_keeping_its_global_batch_or_a_no_plan_line(setup):
    gpus = parse_gpus(setup)
    for config in paper_cells():
        planned = plan_cell(config, gpus)
        global_batch, batch0, unlabeled0 = publication_batches(config)
        if planned.fits:
            assert planned.processes <= gpus.count
            assert planned.processes * planned.batch * planned.accumulation_steps == global_batch
            assert planned.unlabeled_batch * batch0 == planned.batch * unlabeled0
            assert planned.peak_mib <= gpus.memory_gb * 1024
            assert planned.peak_mib == pytest.approx(predict_peak_mib(config, planned.batch, planned.unlabeled_batch))
            assert f"global batch {global_batch}" in planned.describe()
        else:
            line = planned.describe()
            assert "\n" not in line and "the smallest GPU that would" in line
            assert planned.peak_mib > gpus.usable_mib
            if planned.smallest_gpu_gb is not None:
                assert Gpus(1, planned.smallest_gpu_gb).usable_mib >= planned.peak_mib


def test_the_largest_setup_plans_every_paper_cell_at_the_publications_processes_or_more():
    gpus = parse_gpus("8x80GB")
    for config in paper_cells():
        planned = plan_cell(config, gpus)
        assert planned.fits, (config.cell_name, planned.describe())
        assert planned.accumulation_steps == 1 or planned.processes == gpus.count


def test_fewer_and_smaller_gpus_take_accumulation_and_say_so():
    config = cell_config("paper", framework="u2pl", dataset="pascal_classic", partition="92", head="np")
    on_four = plan_cell(config, parse_gpus("4x80GB"))
    on_one = plan_cell(config, parse_gpus("1x24GB"))
    assert (on_four.processes, on_four.accumulation_steps) == (4, 1) and not on_four.differences
    assert on_one.processes == 1 and on_one.accumulation_steps > 1
    assert on_one.batch * on_one.accumulation_steps == on_four.batch * 4
    assert any("micro-batches per optimiser step" in line for line in on_one.differences)
    assert any("batch normalisation over" in line for line in on_one.differences)


def test_the_model_reproduces_its_measured_steps_and_grows_with_the_batch():
    config = cell_config("paper", framework="psmt", dataset="pascal_classic", partition="92", head="baseline",
                         **{"model.backbone": "resnet101", "schedule.crop_size": 480, "runtime.amp": True})
    measured = memory_table()["measured"]["psmt|baseline|resnet101"]["peak_mib"]
    assert predict_peak_mib(config, 3, 3) == pytest.approx(measured)
    assert predict_peak_mib(config, 1, 1) < predict_peak_mib(config, 2, 2) < measured
    fp32 = cell_config("paper", framework="psmt", dataset="pascal_classic", partition="92", head="baseline",
                       **{"model.backbone": "resnet101", "schedule.crop_size": 480, "runtime.amp": False})
    assert predict_peak_mib(fp32, 3, 3) > measured


@pytest.mark.parametrize("value", ["24GB", "2x", "0x24GB", "2x0GB", "twox24GB", "2*24GB", ""])
def test_a_bad_gpus_value_is_one_line_naming_it(value):
    with pytest.raises(ValueError, match=r"--gpus: expected COUNTxMEMORY, e.g. 2x24GB"):
        parse_gpus(value)
    result = runner.invoke(app, ["plan", "--gpus", value, "--framework", "u2pl", "--dataset", "pascal_classic",
                                 "--partition", "92"])
    assert result.exit_code == 2
    assert result.output.strip().count("\n") == 0 and repr(value) in result.output


def test_plan_prints_the_plan_and_what_differs():
    result = runner.invoke(app, ["plan", "--gpus", "2x24GB", "--framework", "unimatch", "--dataset", "cityscapes",
                                 "--partition", "186", "--head", "np"])
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    assert lines[0].startswith("# cell ") and "on 2x24GB" in lines[0]
    assert "global batch 8" in lines[1] and "predicted peak" in lines[1]
    assert all(line.startswith("  differs: ") for line in lines[2:])


def test_grid_dry_run_prints_each_cells_plan_and_refuses_gpus_without_it(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text("name: planned\npreset: paper\nframeworks: [u2pl, supervised]\n"
                    "datasets: {pascal_classic: ['92']}\nheads: {np: null}\nprotocols: [corrected]\n")
    result = runner.invoke(app, ["grid", str(spec), "--dry-run", "--gpus", "1x24GB"])
    assert result.exit_code == 0, result.output
    plans = [line for line in result.output.splitlines() if line.startswith("    plan on 1x24GB: ")]
    assert len(plans) == 2 and all("= global batch 12;" in line for line in plans)
    assert "accumulation steps" in plans[0]
    refused = runner.invoke(app, ["grid", str(spec), "--gpus", "1x24GB"])
    assert refused.exit_code == 2 and "--gpus: only with --dry-run" in refused.output


@pytest.mark.parametrize(("obtained", "expected"), [
    (4, (3, 3, 1, 12)),   # as planned
    (3, (2, 2, 2, 12)),   # 3 x 2 x 2: the micro-batch shrinks
    (2, (3, 3, 2, 12)),   # a lost node: twice the accumulation
    (1, (3, 3, 4, 12)),
])
def test_a_plan_remade_for_the_world_size_obtained_keeps_the_global_batch(obtained, expected):
    config = cell_config("paper", framework="u2pl", dataset="pascal_classic", partition="92", head="np")
    replanned = replan_for_world_size(config, 4, obtained)
    assert (replanned.batch, replanned.unlabeled_batch, replanned.accumulation_steps,
            replanned.global_batch) == expected
    assert replanned.kept and replanned.record()["global_batch_kept"] == "True"
    assert replanned.processes * replanned.batch * replanned.accumulation_steps == 12
    rerun = replan_for_world_size(cell_config("paper", framework="u2pl", dataset="pascal_classic", partition="92",
                                              head="np", **replanned.overrides()), obtained, obtained)
    assert rerun == replanned  # re-planning a re-planned run on the same world size changes nothing


def test_a_world_size_that_cannot_keep_the_global_batch_says_so():
    config = cell_config("paper", framework="u2pl", dataset="pascal_classic", partition="92", head="np")
    replanned = replan_for_world_size(config, 4, 5)  # 12 images over 5 processes
    assert not replanned.kept and replanned.record()["global_batch_kept"] == "False"
    assert replanned.global_batch == 15 and replanned.accumulation_steps == 1


def test_a_config_replanned_for_fewer_workers_is_the_same_cell_at_the_same_global_batch():
    """An elastic run's execution details change (per-process batch, accumulation), not its cell: the checkpoints it
    resumes carry the planned cell's id."""
    config = cell_config("paper", framework="u2pl", dataset="pascal_classic", partition="92", head="np")
    replanned, replan = replanned_config(config, 4, 2)
    assert (replanned.schedule.batch_size, replanned.schedule.unlabeled_batch_size,
            replanned.schedule.accumulation_steps) == (3, 3, 2) == (replan.batch, replan.unlabeled_batch,
                                                                    replan.accumulation_steps)
    assert replanned.cell_id == config.cell_id
    assert replanned.runtime.planned_schedule == {"batch_size": 3, "unlabeled_batch_size": 3, "accumulation_steps": 1}
    assert replanned_config(replanned, 4, 2)[0].cell_id == config.cell_id  # re-planning again keeps the plan
    assert replanned_config(config, 4, 4) == (config, replan_for_world_size(config, 4, 4))  # as planned: as it is
    # the same batches set by hand are another cell (batch statistics over fewer images)
    by_hand = cell_config("paper", framework="u2pl", dataset="pascal_classic", partition="92", head="np",
                          **replan.overrides())
    assert by_hand.cell_id != config.cell_id


def test_an_elastic_range_that_cannot_keep_the_global_batch_names_the_world_size():
    config = cell_config("paper", framework="u2pl", dataset="pascal_classic", partition="92", head="np")
    assert elastic_world_size_problem(config, 1, 4) is None  # 12 images on 1, 2, 3 or 4 processes
    assert elastic_world_size_problem(config, 3, 4) is None
    problem = elastic_world_size_problem(config, 1, 5)  # planned 15 = 3 x 5: 4 processes cannot share it
    assert problem is not None and "global batch 15" in problem and "cannot be kept on 2 worker(s)" in problem
    assert "[1, 3, 5]" in problem


def test_gpu_check_compares_a_reports_cuda_steps_and_marks_misses(tmp_path):
    memory_model = load_benchmark("memory_model")
    cell = {"framework": "psmt", "head": "baseline", "backbone": "resnet101", "crop": 480, "labeled_batch": 3,
            "unlabeled_batch": 3, "amp_bf16": True, "peak_memory_measure": "max_memory_allocated"}
    report = {"cells": [{**cell, "peak_memory_mib": 12_076.0}, {**cell, "head": "np", "peak_memory_mib": 20_000.0},
                        {**cell, "peak_memory_measure": "peak RSS", "peak_memory_mib": 1.0}]}
    (tmp_path / "gpu_acceptance.json").write_text(json.dumps(report))
    rows = memory_model.compare_report(tmp_path / "gpu_acceptance.json")
    assert len(rows) == 2 + 2  # the header, then the two CUDA steps (a CPU figure is not compared)
    assert rows[2].endswith("| 12,076 | 12,076 | 1.000 |")
    assert rows[3].endswith("| 20,000 | 0.678 **miss** |")


def test_gpu_check_compares_the_np_head_at_each_feature_pool_it_timed(tmp_path):
    memory_model = load_benchmark("memory_model")
    cell = {"framework": "unimatch_v2", "backbone": "dinov2_s", "crop": 518, "labeled_batch": 4, "unlabeled_batch": 4,
            "amp_bf16": True, "peak_memory_measure": "max_memory_allocated", "peak_memory_mib": 10_000.0}
    report = {"vit_cells": [{**cell, "head": "np"}, {**cell, "head": "np_pool1"}]}
    (tmp_path / "gpu_acceptance.json").write_text(json.dumps(report))
    coarse, full = memory_model.compare_report(tmp_path / "gpu_acceptance.json")[2:]
    assert "| np_pool1 |" in full
    predicted = [float(row.split("|")[5].replace(",", "")) for row in (coarse, full)]
    assert predicted[1] > predicted[0]  # the full 1/14 map holds more than the default pooled one


def test_a_step_on_fake_tensors_counts_the_model_state_a_later_step_holds():
    """The smoke model's step on fake tensors: parameters and buffers, the previous step's gradients and SGD's
    momentum (one copy each of the trainable parameters), the same as the state counted without a step."""
    from npsemiseg.training.fake_memory import measure_step_memory, model_state_mib

    config = cell_config("smoke", framework="supervised", dataset="synthetic", head="baseline",
                         **{"runtime.device": "cpu", "data.num_workers": 0})
    assert config.optim.name == "sgd" and config.optim.momentum > 0
    held, trainable = model_state_mib(config)
    step = measure_step_memory(config, bf16=False)
    assert step.static_mib == pytest.approx(held + 2 * trainable, rel=1e-3)
    assert step.activation_mib >= 0 and step.peak_mib >= step.static_mib
