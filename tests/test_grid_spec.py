"""Grid specs: validation (clear errors before anything starts), rules, expansion, identity."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from semiseg_platform.sweeps.grid_spec import cell_keys, expand, grid_id, load_spec
from semiseg_platform.sweeps.spec_base import Resources, cells_at_once, trial_resources

ROOT = Path(__file__).resolve().parents[1]
SPECS = ROOT / "jobs" / "specs"
PAPER_HEADS = ("baseline", "mc_dropout", "np")


def _spec(**changes):
    data = {
        "name": "tiny",
        "preset": "smoke",
        "frameworks": ["supervised", "u2pl"],
        "datasets": {"synthetic_voc": ["92", "1/8"]},
        "heads": {"baseline": None, "np": None, "np_mean": {"head": "np", "options": {"attention": "mean"}}},
        "rules": [{"when": {"heads": ["np_mean"]}, "only": {"frameworks": ["u2pl"]}}],
        "overrides": {"runtime.device": "cpu"},
    }
    data.update(changes)
    return data


def test_expansion_applies_rules_variants_seeds_and_overrides():
    spec = load_spec(_spec(seeds=[0, 1], overrides={"runtime.device": "cpu", "optim.lr": 0.05}))
    configs = expand(spec)
    # 2 partitions x (2 frameworks x 2 heads + u2pl x np_mean) x 2 seeds
    assert len(configs) == 2 * (2 * 2 + 1) * 2
    names = Counter(c.cell_name for c in configs)
    assert names["u2pl/synthetic_voc/183/np_mean"] == 2 and "supervised/synthetic_voc/92/np_mean" not in names
    mean = next(c for c in configs if c.head.label == "np_mean")
    assert mean.head.name == "np" and mean.head.options["attention"] == "mean"
    # the variant's options are merged over the preset's NP options, not replacing them
    plain = next(c for c in configs if c.head.label == "np" and c.framework == "u2pl")
    # (the protocol writes the plain head's attention switch: compare the other options)
    assert {k: v for k, v in mean.head.options.items() if k != "attention"} == {
        k: v for k, v in plain.head.options.items() if k != "attention"}
    assert {c.seed for c in configs} == {0, 1}
    assert all(c.optim.lr == 0.05 and c.runtime.device == "cpu" for c in configs)
    assert len({c.cell_id for c in configs}) == len(configs)


def test_duplicate_cells_collapse_by_cell_id_and_grid_id_is_stable():
    spec = load_spec(_spec(datasets={"synthetic_voc": ["92", "1/16", 92]}))
    configs = expand(spec)
    assert len(configs) == 5 and {c.partition for c in configs} == {"92"}
    reordered = load_spec(_spec(frameworks=["u2pl", "supervised"], datasets={"synthetic_voc": ["92"]}))
    assert grid_id(expand(reordered)) == grid_id(configs)
    assert grid_id(configs[:-1]) != grid_id(configs)


def test_heads_as_a_list_and_all_partitions():
    spec = load_spec(_spec(heads=["baseline", "mc_dropout"], rules=[], datasets={"synthetic_cityscapes": "all"}))
    assert spec.resolved_partitions == {"synthetic_cityscapes": ["186", "372", "744", "1488"]}
    assert set(spec.heads) == {"baseline", "mc_dropout"}
    assert sum(1 for _ in cell_keys(spec)) == 4 * 2 * 2


def test_rule_without_only_excludes_cells():
    spec = load_spec(_spec(rules=[{"when": {"frameworks": ["supervised"], "heads": ["np", "np_mean"]}}]))
    keys = list(cell_keys(spec))
    assert not any(k.framework == "supervised" and k.head.startswith("np") for k in keys)
    assert any(k.framework == "u2pl" and k.head == "np_mean" for k in keys)


@pytest.mark.parametrize(("changes", "message"), [
    ({"framework": ["mt"]}, "framework"),  # unknown key
    ({"frameworks": ["mt", "no_such_framework"]}, "no_such_framework"),
    ({"datasets": {"voc": "all"}}, "voc"),
    ({"datasets": {"pascal_classic": ["662"]}}, "'662' is not a partition of 'pascal_classic'"),
    ({"datasets": {"synthetic_voc": []}}, "non-empty"),
    ({"heads": {"dropout": None}}, "dropout"),
    ({"heads": {"np_mean": {"head": "np", "opts": {}}}}, "opts"),
    ({"preset": "tiny"}, "tiny"),
    ({"rules": [{"when": {"heads": ["np_max"]}, "only": {"frameworks": ["u2pl"]}}]}, "np_max"),
    ({"rules": [{"when": {"heads": ["np"]}, "only": {"frameworks": ["augseg"]}}]}, "augseg"),
    ({"resources": {"workers": 2, "launcher": "in_process"}}, "in_process"),
    ({"resources": {"workers": 2, "min_workers": 3}}, "resources.min_workers: expected at most workers"),
    ({"resources": {"workers": 1, "min_workers": 0}}, "min_workers"),
    ({"seeds": []}, "seeds"),
])
def test_invalid_specs_fail_with_the_offending_key(changes, message):
    with pytest.raises(ValueError, match=message):
        load_spec(_spec(**changes))


def test_invalid_cell_settings_fail_at_expansion_naming_the_cell():
    spec = load_spec(_spec(heads={"np_bad": {"head": "np", "options": {"attention": "sideways"}}}, rules=[]))
    with pytest.raises(ValueError, match="supervised/synthetic_voc/92/np_bad.*attention"):
        expand(spec)
    spec = load_spec(_spec(overrides={"optim.learning_rate": 0.1}))
    with pytest.raises(ValueError, match="learning_rate"):
        expand(spec)


def test_spec_files_errors_name_the_file(tmp_path):
    with pytest.raises(ValueError, match="no such file"):
        load_spec(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nframeworks: [mt\n")
    with pytest.raises(ValueError, match=f"{bad}.*YAML"):
        load_spec(bad)
    bad.write_text("- a\n- b\n")
    with pytest.raises(ValueError, match="mapping"):
        load_spec(bad)


def test_shipped_specs_cover_the_papers_study():
    paper, smoke = load_spec(SPECS / "paper.yaml"), load_spec(SPECS / "smoke.yaml")
    for spec in (paper, smoke):
        keys = list(cell_keys(spec))
        # (5 frameworks x 3 datasets x 4 partitions x 3 heads, + U2PL x np_mean x 12) per protocol
        assert len(keys) == (5 * 3 * 4 * 3 + 12) * len(spec.protocols)
        assert {k.framework for k in keys if k.head == "np_mean"} == {"u2pl"}
        assert [len(p) for p in spec.resolved_partitions.values()] == [4, 4, 4]
    assert set(paper.datasets) == {"pascal_classic", "pascal_blender", "cityscapes"}
    assert set(smoke.datasets) == {"synthetic_voc", "synthetic_blender", "synthetic_cityscapes"}
    assert paper.preset == "paper" and not paper.resources.in_process and paper.resources.gpus_per_worker == 1
    assert smoke.preset == "smoke" and smoke.resources.in_process and smoke.resources.gpus_per_worker == 0
    # the reproduction runs released, its twin corrected, make demo both
    corrected = load_spec(SPECS / "paper_corrected.yaml")
    assert paper.protocols == ["released"] and corrected.protocols == ["corrected"]
    assert smoke.protocols == ["released", "corrected"]
    assert [(k.framework, k.dataset, k.partition, k.head) for k in cell_keys(corrected)] == [
        (k.framework, k.dataset, k.partition, k.head) for k in cell_keys(paper)]


def test_the_unimatch_companion_spec_covers_the_papers_datasets_and_partitions():
    """FixMatch and UniMatch x the three heads x paper.yaml's datasets and partitions, under both protocols, in the
    paper's experiment; the mini-study runs both with the three heads and the supervised reference on their network."""
    paper, companion = load_spec(SPECS / "paper.yaml"), load_spec(SPECS / "paper_unimatch.yaml")
    keys = list(cell_keys(companion))
    assert len(keys) == 2 * 3 * 4 * 3 * 2
    assert {k.framework for k in keys} == {"fixmatch", "unimatch"} and {k.head for k in keys} == set(PAPER_HEADS)
    assert companion.resolved_partitions == paper.resolved_partitions and companion.protocols == ["released", "corrected"]
    assert companion.experiment == paper.experiment and companion.preset == paper.preset
    assert Counter((k.framework, k.dataset, k.head, k.protocol) for k in keys) == {
        (f, d, h, p): 4 for f in ("fixmatch", "unimatch") for d in paper.datasets for h in PAPER_HEADS
        for p in ("released", "corrected")}
    mini = list(cell_keys(load_spec(SPECS / "mini.yaml")))
    for framework in ("fixmatch", "unimatch"):
        assert {(k.head, k.partition) for k in mini if k.framework == framework} == {(h, "1/16") for h in PAPER_HEADS}
    assert not any(k.framework == "supervised_unimatch" for k in mini)  # supervised_augseg is their network under corrected


def test_the_unimatch_companion_cells_take_the_unimatch_switches():
    configs = {(c.framework, c.dataset, c.partition, c.head.label, c.protocol): c
               for c in expand(load_spec(SPECS / "paper_unimatch.yaml"))}
    assert len(configs) == 144
    released = configs[("unimatch", "cityscapes", "744", "np", "released")]
    corrected = configs[("unimatch", "cityscapes", "744", "np", "corrected")]
    assert (released.evaluation.crop_size, released.loss.ohem_min_kept, released.partition_lists) == (801, 200_000, "cps")
    assert (corrected.evaluation.crop_size, corrected.loss.ohem_min_kept, corrected.partition_lists) == (769, 100_000, "u2pl")
    baseline = configs[("fixmatch", "pascal_blender", "662", "baseline", "released")]
    assert (baseline.schedule.crop_size, baseline.evaluation.mode, baseline.evaluation.select) == (321, "whole", "best")


@pytest.mark.integration
def test_shipped_specs_expand_to_valid_unique_cells():
    for name, protocols in (("paper.yaml", 1), ("paper_corrected.yaml", 1), ("smoke.yaml", 2)):
        configs = expand(load_spec(SPECS / name))
        assert len(configs) == 192 * protocols and len({c.cell_id for c in configs}) == 192 * protocols


def test_cell_overrides_apply_to_the_selected_cells_only():
    spec = load_spec(_spec(cell_overrides=[{"when": {"frameworks": ["u2pl"], "partitions": [183]},
                                            "overrides": {"optim.lr": 0.5}}]))
    configs = expand(spec)
    changed = {c.cell_name for c in configs if c.optim.lr == 0.5}
    assert changed == {"u2pl/synthetic_voc/183/baseline", "u2pl/synthetic_voc/183/np", "u2pl/synthetic_voc/183/np_mean"}
    with pytest.raises(ValueError, match=r"cell_overrides\[0\].when.partitions: '366'"):
        load_spec(_spec(cell_overrides=[{"when": {"partitions": ["366"]}, "overrides": {"optim.lr": 0.5}}]))


def test_invalid_spec_file_fails_before_anything_starts(tmp_path, capsys):
    from jobs.grid import main

    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\npreset: smoke\nframeworks: [supervised]\ndatasets: {synthetic_voc: [99]}\n"
                   f"heads: [baseline]\ntracking_uri: sqlite:///{tmp_path}/mlruns.db\nstorage: {tmp_path}/ray_results\n")
    assert main([str(bad)]) == 2
    assert "99 is not a partition of 'synthetic_voc'" in capsys.readouterr().err
    assert not (tmp_path / "mlruns.db").exists() and not (tmp_path / "ray_results").exists()


def test_cells_at_once_follows_the_cluster_resources():
    ddp = Resources(workers=4, gpus_per_worker=1, cpus_per_worker=6)
    assert not ddp.in_process and trial_resources(ddp) == {"CPU": 0.5, "GPU": 0.0}
    assert cells_at_once(ddp, {"CPU": 64.0, "GPU": 8.0}) == 2  # GPUs bound it
    assert cells_at_once(ddp, {"CPU": 20.0, "GPU": 8.0}) == 1  # CPUs bound it (4 x 6 + 0.5 > 20: still one)
    assert cells_at_once(ddp, {"CPU": 64.0, "GPU": 8.0}, limit=1) == 1
    single = Resources(workers=1, cpus_per_worker=1)
    assert single.in_process and trial_resources(single) == {"CPU": 1.0, "GPU": 0.0}
    assert cells_at_once(single, {"CPU": 2.0}) == 2
    assert cells_at_once(Resources(workers=1, gpus_per_worker=1), {"CPU": 16.0, "GPU": 3.0}) == 3
    assert cells_at_once(Resources(workers=1, launcher="trainer"), {"CPU": 2.0}) == 1


def test_dry_run_lists_the_cells_without_running_them(tmp_path, capsys):
    from jobs.grid import main

    spec = tmp_path / "tiny.yaml"
    spec.write_text("name: tiny\npreset: smoke\nframeworks: [supervised, u2pl]\ndatasets: {synthetic_voc: [92]}\n"
                    f"heads: [baseline, np]\ntracking_uri: sqlite:///{tmp_path}/mlruns.db\n")
    assert main([str(spec), "--dry-run"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "4 cells (a cell whose process or node dies is retried up to 2 times)"
    assert any(line.endswith("u2pl/synthetic_voc/92/np  seed 0") for line in out)
    assert main([str(spec), "--dry-run", "--max-failures", "0"]) == 0  # the option replaces the spec's
    assert capsys.readouterr().out.splitlines()[-1] == "4 cells (a cell whose process or node dies is retried up to 0 times)"
    assert not (tmp_path / "mlruns.db").exists()


def test_protocols_axis_runs_every_cell_under_each_protocol():
    one = expand(load_spec(_spec()))
    both = expand(load_spec(_spec(protocols=["released", "corrected"])))
    assert len(both) == 2 * len(one)
    assert {c.protocol for c in one} == {"corrected"}
    released = [c for c in both if c.protocol == "released"]
    assert len(released) == len(one) and all(c.evaluation.select == "best" for c in released)
    assert all(c.head.options["attention"] in ("per_channel", "mean") for c in released if c.head.name == "np")
    ruled = expand(load_spec(_spec(protocols=["released", "corrected"],
                                   rules=[{"when": {"protocols": ["released"]}, "only": {"frameworks": ["u2pl"]}}])))
    assert {c.framework for c in ruled if c.protocol == "released"} == {"u2pl"}
    with pytest.raises(ValueError, match="protocols: unknown value 'bugged'"):
        load_spec(_spec(protocols=["bugged"]))


def test_a_grid_refuses_oracle_cells_but_runs_measured_ones():
    with pytest.raises(ValueError, match=r"cell_overrides\[0\].overrides: data.unlabeled_truth 'oracle'"):
        load_spec(_spec(cell_overrides=[{"when": {"frameworks": ["u2pl"]},
                                         "overrides": {"data.unlabeled_truth": "oracle"}}]))
    with pytest.raises(ValueError, match="overrides: data.unlabeled_truth 'oracle'"):
        load_spec(_spec(overrides={"data.unlabeled_truth": "oracle"}))
    measured = expand(load_spec(_spec(cell_overrides=[{"when": {"frameworks": ["u2pl"]},
                                                       "overrides": {"data.unlabeled_truth": "measured"}}])))
    assert {c.framework for c in measured if c.data.unlabeled_truth == "measured"} == {"u2pl"}


def test_framework_labels_label_their_cells_and_carry_options_and_overrides():
    spec = load_spec(_spec(
        frameworks={"supervised": None, "u2pl": None,
                    "supervised_psmt": {"framework": "supervised", "overrides": {"model.decoder": "psmt"}},
                    "u2pl_no_contrast": {"framework": "u2pl", "options": {"contrastive": False}}},
        heads=["baseline"], rules=[{"when": {"frameworks": ["supervised_psmt"]}, "only": {"partitions": ["92"]}}],
        cell_overrides=[{"when": {"frameworks": ["u2pl_no_contrast"]}, "overrides": {"optim.lr": 0.5}}]))
    configs = {c.cell_name: c for c in expand(spec)}
    assert set(configs) == {f"{f}/synthetic_voc/{p}/baseline" for f in ("supervised", "u2pl", "u2pl_no_contrast")
                            for p in ("92", "183")} | {"supervised_psmt/synthetic_voc/92/baseline"}
    reference = configs["supervised_psmt/synthetic_voc/92/baseline"]
    assert reference.framework == "supervised" and reference.model.decoder == "psmt"
    assert reference.run_name == "supervised_psmt/synthetic_voc/92/baseline/corrected"
    plain = configs["supervised/synthetic_voc/92/baseline"]
    assert plain.framework_label == "supervised" and plain.model.decoder == "u2pl"
    ablation = configs["u2pl_no_contrast/synthetic_voc/92/baseline"]
    assert ablation.framework == "u2pl" and ablation.framework_options["contrastive"] is False
    assert ablation.optim.lr == 0.5 and configs["u2pl/synthetic_voc/92/baseline"].optim.lr != 0.5
    # a plain cell keeps the id it has outside a grid; a variant with nothing changed is still its own cell
    from npsemiseg.config import cell_config, with_overrides
    alone = cell_config("smoke", framework="supervised", dataset="synthetic_voc", partition="92",
                                  **{"runtime.device": "cpu"})
    assert plain.cell_id == alone.cell_id
    assert with_overrides(alone, {"framework_label": "supervised_again"}).cell_id != alone.cell_id
    with pytest.raises(ValueError, match="frameworks.bad.framework"):
        load_spec(_spec(frameworks={"bad": {"framework": "no_such_framework"}}))


def test_the_spec_and_its_expansion_import_neither_ray_nor_mlflow() -> None:
    """The GPU acceptance run sizes the paper grid on a machine that may hold PyTorch alone."""
    code = ("import sys; import semiseg_platform.sweeps.grid_spec; "
            "print(sorted({'ray', 'mlflow', 'optuna'} & {m.split('.')[0] for m in sys.modules}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]", out.stdout


def test_custom_per_worker_resources_reach_the_trial_and_the_preflight():
    """``resources.custom_per_worker``: Ray custom resources per worker (one-per-node placement, a node type's
    stand-in); an in-process cell's trial reserves them, the preflight waits for them and asks an autoscaler
    for them as one bundle per worker; concurrency stays bound by CPUs and GPUs only."""
    from semiseg_platform.reservations import Needed

    single = Resources(workers=1, custom_per_worker={"gpu_standin": 4})
    assert trial_resources(single) == {"CPU": 1.0, "GPU": 0.0, "gpu_standin": 4.0}
    assert cells_at_once(single, {"CPU": 2.0}) == 2  # Tune queues what does not fit: the autoscaler's demand
    needed = Needed.of(1, 0, 1, in_process=True, custom_per_worker=single.custom_per_worker)
    assert needed.bundles() == [{"CPU": 1.0, "gpu_standin": 4.0}]
    assert needed.missing({"CPU": 4.0}) == ["4 gpu_standin (has 0)"] and needed.missing({"CPU": 1, "gpu_standin": 4}) == []
    assert "4 gpu_standin per cell" in needed.describe()
    ddp = Needed.of(2, 0, 0.5, in_process=False, custom_per_worker={"one_per_node": 1})
    assert ddp.bundles() == [{"CPU": 0.5}, {"CPU": 0.5, "one_per_node": 1.0}, {"CPU": 0.5, "one_per_node": 1.0}]
    assert Needed(1, 2).bundles() == [{"CPU": 1, "GPU": 2}]
    with pytest.raises(ValueError, match="Ray's own resources"):
        Resources(custom_per_worker={"GPU": 1})


def test_a_trial_cancelled_before_it_ran_is_a_failed_cell_named_from_its_folder() -> None:
    """Tune reports no config for a trial whose actor never started; the grid still names its cell (the
    trial folder is ``cell_<id>``) and records it failed instead of crashing on the summary."""
    from ray.tune import Result

    from semiseg_platform.sweeps.grid_runner import GridProgress, _trial_outcome

    names = {"abc123": "supervised/synthetic/1/16/baseline"}
    result = Result(metrics=None, checkpoint=None, error=RuntimeError("actor cancelled"),
                    path="/tmp/ray_results/grid-x/cell_abc123")
    outcome = _trial_outcome(result, names, GridProgress(names, skipped=0, label="x", emit=lambda line: None))
    assert (outcome.cell_id, outcome.status, outcome.cell_name) == ("abc123", "failed", names["abc123"])


def test_the_ade_coco_spec_expands_and_every_cell_composes_at_its_datasets_official_config():
    """ADE20K and COCO's companion grid: UniMatch V2 (ADE20K 1/64 .. 1/4, COCO 1/512 .. 1/32) and FixMatch on DINOv2-B
    (the partitions of UniMatch V2's Table 5 logs) x the three heads, 18 x 3 = 54 cells composed without training at
    UniMatch V2's configs (crop 518; ADE20K 2 per GPU for 60 epochs, COCO 4 for 20), in UniMatch V2's experiment with
    the same ids as its own spec's cells; every baseline cell has a published value to print beside it."""
    from semiseg_platform.reports.paper_results import paper_value

    spec = load_spec(SPECS / "paper_ade_coco.yaml")
    configs = expand(spec)
    assert len(configs) == (10 + 8) * 3 == len({c.cell_id for c in configs})
    assert Counter((c.framework, c.dataset) for c in configs) == {
        ("unimatch_v2", "ade20k"): 15, ("unimatch_v2", "coco"): 15, ("fixmatch_v2", "ade20k"): 15,
        ("fixmatch_v2", "coco"): 9}
    assert {c.partition for c in configs if c.framework == "fixmatch_v2" and c.dataset == "coco"} == {"232", "463", "925"}
    assert {c.head.label for c in configs} == set(PAPER_HEADS) and {c.protocol for c in configs} == {"released"}
    assert spec.experiment == load_spec(SPECS / "paper_unimatch_v2.yaml").experiment
    for config in configs:
        schedule = config.schedule
        assert (config.model.backbone, config.optim.name, config.optim.lr, schedule.crop_size) == (
            "dinov2_b", "adamw", 5e-6, 518)
        assert (schedule.batch_size, schedule.epochs) == {"ade20k": (2, 60), "coco": (4, 20)}[config.dataset]
        assert (config.evaluation.mode, config.evaluation.resize_multiple) == ("whole", 14)
        if config.head.label == "baseline":
            assert paper_value(config.dataset, config.framework, "baseline", config.partition, "miou") is not None
    v2 = {c.cell_id for c in expand(load_spec(SPECS / "paper_unimatch_v2.yaml"))}
    assert {c.cell_id for c in configs if c.framework == "unimatch_v2"} <= v2
    assert paper_value("ade20k", "fixmatch_v2", "baseline", "316", "miou") == 37.8  # table05-fixmatch_ade20k_1_64 log
    assert paper_value("coco", "fixmatch_v2", "baseline", "1849", "miou") is None  # no Table 5 log: no cell either


def test_the_unimatch_v2_spec_covers_its_papers_partitions_with_every_head():
    """UniMatch V2 x the three heads x the partitions its paper reports (VOC with the full 1464, Cityscapes, ADE20K
    1/64 .. 1/4, COCO 1/512 .. 1/32): 19 x 3 = 57 cells under released, each composed at its dataset's official
    config, in its own experiment; every baseline cell has a published value to print beside it."""
    from semiseg_platform.reports.paper_results import paper_value

    spec = load_spec(SPECS / "paper_unimatch_v2.yaml")
    configs = expand(spec)
    assert len(configs) == 19 * 3 == len({c.cell_id for c in configs})
    assert Counter(c.dataset for c in configs) == {"pascal_classic": 15, "cityscapes": 12, "ade20k": 15, "coco": 15}
    assert {c.head.label for c in configs} == set(PAPER_HEADS) and {c.protocol for c in configs} == {"released"}
    assert spec.experiment == "npsemiseg-unimatch-v2" and spec.resources.workers == 4
    crops = {"pascal_classic": 518, "cityscapes": 798, "ade20k": 518, "coco": 518}
    for config in configs:
        assert (config.framework, config.model.backbone, config.optim.name, config.optim.lr) == (
            "unimatch_v2", "dinov2_b", "adamw", 5e-6)
        assert config.schedule.crop_size == crops[config.dataset] and config.schedule.lr_timing == "after_step"
        if config.head.label == "baseline":
            assert paper_value(config.dataset, "unimatch_v2", "baseline", config.partition, "miou") is not None
