"""Composition of a cell's configuration: the order of the steps, the provenance of every key, recomposition,
files, the cell ids every spec's cells keep, and ``npsemiseg config show``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from npsemiseg.config import (
    IDENTITY_VERSION,
    RunConfig,
    compose,
    explain,
    read_config,
    recompose,
    switches,
    with_overrides,
)
from npsemiseg.config.compose import STEPS
from npsemiseg.frameworks import framework_names
from npsemiseg.heads import head_names
from semiseg_platform.sweeps.grid_spec import cell_config as grid_cell_config
from semiseg_platform.sweeps.grid_spec import cell_keys, load_spec

REPO = Path(__file__).resolve().parents[1]
GOLDEN_IDS = REPO / "tests" / "golden" / "cell_ids.json"


def _steps(composition, key: str) -> list[str]:
    return [setting.step for setting in composition.provenance[key]]


def test_a_switch_beats_the_preset_and_a_user_override_beats_the_switch():
    cell = dict(framework="u2pl", dataset="synthetic", partition="1/16", head="np", protocol="released")
    released = compose("paper", **cell)
    assert released.config.evaluation.num_samples == 20  # switch np_eval_samples over the preset's T = 5
    assert _steps(released, "evaluation.num_samples") == ["preset", "switch"]
    assert released.provenance["evaluation.num_samples"][0].value == 5
    overridden = compose("paper", **cell, overrides={"switches.np_eval_samples": 7})
    assert overridden.config.evaluation.num_samples == 7
    assert _steps(overridden, "evaluation.num_samples") == ["preset", "switch", "override"]
    by_key = compose("paper", **cell, overrides={"head.options.attention": "euclidean"})
    assert by_key.config.head.options["attention"] == "euclidean"  # the switch's released value is per_channel
    assert _steps(by_key, "head.options.attention") == ["switch", "override"]


def test_the_mt_framework_switch_chooses_the_framework_class_at_the_cell_step():
    """Switch mt_framework picks the class of a cell asked as ``mt`` before its defaults are written; the cell keeps
    ``mt`` as its label; an override of the switch by name wins; ``mt_cps`` asked for by name runs as asked."""
    cell = dict(framework="mt", dataset="pascal_classic", partition="92", head="baseline")
    released = compose("paper", **cell, protocol="released")
    config = released.config
    assert (config.framework, config.framework_label, config.cell_name) == ("mt_cps", "mt", "mt/pascal_classic/92/baseline")
    assert [(s.step, s.value) for s in released.provenance["framework"]] == [("cell", "mt"), ("switch", "mt_cps")]
    assert "switch mt_framework (released" in released.provenance["framework"][-1].why
    assert set(config.framework_options) == {"ema_decay", "mse_weight", "passes", "ema_timing", "train_dropout"}
    assert config.inputs.framework == "mt"
    assert switches(config)["mt_framework"] == "mt_cps" and switches(config)["mt_single_lr"] == "single_lr"
    assert config.schedule.epochs == 34  # CPS's MeanTeacher's publication epochs (per_head, baseline head)
    corrected = compose("paper", **cell, protocol="corrected")
    assert corrected.config.framework == "mt" and _steps(corrected, "framework") == ["cell", "switch"]
    assert with_overrides(config, protocol="corrected") == corrected.config
    # an explicit switch wins over the protocol, and composing again keeps it
    shared = compose("paper", **cell, protocol="released", overrides={"switches.mt_framework": "mt"})
    assert shared.config.framework == "mt" and shared.config.protocol == "released"
    assert _steps(shared, "framework") == ["cell", "switch", "override"]
    assert "sup_only_epochs" in shared.config.framework_options and switches(shared.config)["mt_framework"] == "mt"
    assert with_overrides(config, {"switches.mt_framework": "mt"}) == shared.config
    assert with_overrides(shared.config, {"seed": 1}).framework == "mt"
    assert shared.explain("switches.mt_framework").startswith("framework = mt")
    # asked for by name: that class under either protocol, labelled with its own name
    for protocol in ("released", "corrected"):
        named = compose("smoke", **{**cell, "framework": "mt_cps"}, protocol=protocol)
        assert (named.config.framework, named.config.framework_label) == ("mt_cps", "mt_cps")
        assert _steps(named, "framework") == ["cell"] and switches(named.config)["mt_framework"] == "mt_cps"
    with pytest.raises(ValueError, match="chooses between frameworks mt/mt_cps"):
        compose("smoke", **{**cell, "framework": "u2pl"}, overrides={"switches.mt_framework": "mt_cps"})
    with pytest.raises(ValueError, match="expected 'mt_cps' .released. or 'mt' .corrected., got 'cps'"):
        compose("smoke", **cell, overrides={"switches.mt_framework": "cps"})


def test_the_head_schedule_follows_an_overridden_switch():
    cell = dict(framework="u2pl", dataset="pascal_blender", partition="1/8", head="baseline")
    shared = compose("paper", **cell).config
    per_head = compose("paper", **cell, overrides={"switches.head_settings": "per_head"})
    assert (shared.schedule.crop_size, per_head.config.schedule.crop_size) == (480, 513)  # U2PL's publication crop
    assert per_head.config.optim.reference_batch == 16 and per_head.config.schedule.batch_size == 4
    assert _steps(per_head, "schedule.crop_size") == ["preset", "scale"]
    assert "per_head" in per_head.provenance["schedule.crop_size"][-1].why
    explicit = compose("paper", **cell, overrides={"switches.head_settings": "per_head", "schedule.crop_size": 321})
    assert explicit.config.schedule.crop_size == 321 and explicit.config.schedule.batch_size == 4


def test_a_derived_field_follows_its_inputs_unless_set():
    cell = dict(framework="u2pl", dataset="cityscapes", partition="1/8", head="baseline")
    assert compose("paper", **cell).config.evaluation.stride == 513  # ceil(2/3 x 769)
    moved = compose("paper", **cell, overrides={"evaluation.crop_size": 600})
    assert moved.config.evaluation.stride == 400 and _steps(moved, "evaluation.stride") == ["derived"]
    pinned = compose("paper", **cell, overrides={"evaluation.crop_size": 600, "evaluation.stride": 300})
    assert pinned.config.evaluation.stride == 300
    with pytest.raises(ValueError, match=r"evaluation\.stride.*at most evaluation\.crop_size=600"):
        compose("paper", **cell, overrides={"evaluation.crop_size": 600, "evaluation.stride": 700})
    psmt = compose("smoke", framework="psmt", dataset="synthetic", partition="1/16", head="baseline")
    assert psmt.config.data.labeled_strong_view is True
    off = compose("smoke", framework="psmt", dataset="synthetic", partition="1/16", head="baseline",
                  overrides={"framework_options.strong_labeled": False})
    assert off.config.data.labeled_strong_view is False


@pytest.mark.parametrize("head", head_names())
@pytest.mark.parametrize("framework", framework_names())
def test_every_key_has_a_provenance_ending_in_its_value(framework, head):
    for protocol in ("released", "corrected"):
        composition = compose("smoke", framework=framework, dataset="synthetic_cityscapes", partition="1/8",
                              head=head, protocol=protocol, overrides={"optim.lr": "0.02"})
        record = composition.config.model_dump(mode="json", exclude={"inputs"})
        assert set(composition.provenance) == set(_leaf_keys(record))
        for key, history in composition.provenance.items():
            assert all(setting.step in STEPS and setting.why for setting in history)
            if history and key.split(".")[0] != "framework_options":  # options are completed by their model
                assert history[-1].value == composition.value(key), key
            assert [STEPS.index(s.step) for s in history] == sorted(STEPS.index(s.step) for s in history), key
        assert composition.config.optim.lr == 0.02 and _steps(composition, "optim.lr")[-1] == "override"


def _leaf_keys(tree, prefix=""):
    for key, value in tree.items():
        dotted = f"{prefix}.{key}" if prefix else key
        if isinstance(value, dict) and value:
            yield from _leaf_keys(value, dotted)
        else:
            yield dotted


def test_explain_prints_every_setting_of_a_key_and_names_an_unknown_one():
    composition = compose("paper", framework="mt", dataset="pascal_classic", partition="92", head="baseline",
                          protocol="released")
    text = composition.explain("schedule.epochs")
    assert text.splitlines()[0] == "schedule.epochs = 34"  # CPS's MeanTeacher under per_head
    assert [line.split()[0] for line in text.splitlines()[1:]] == ["preset", "scale"]
    assert composition.explain("switches.mt_single_lr").startswith("optim.parameter_groups = single_lr")
    assert len(composition.explain("optim").splitlines()) > 10
    with pytest.raises(ValueError, match=r"unknown configuration key 'optim\.lrr'"):
        composition.explain("optim.lrr")


def test_with_overrides_composes_again_without_resets():
    config = compose("smoke", framework="u2pl", dataset="synthetic", partition="1/16", head="np",
                     overrides={"optim.lr": 0.02}).config
    baseline = with_overrides(config, {"head.name": "baseline"})
    fresh = compose("smoke", framework="u2pl", dataset="synthetic", partition="1/16", head="baseline",
                    overrides={"optim.lr": 0.02}).config
    assert baseline == fresh and baseline.optim.grad_clip == 5.0  # corrected: every head alike (grad_clip_per_head)
    released = with_overrides(config, protocol="released")
    assert with_overrides(released, {"head.name": "baseline"}).optim.grad_clip is None  # the NP head's went with it
    assert released == compose("smoke", framework="u2pl", dataset="synthetic", partition="1/16", head="np",
                               protocol="released", overrides={"optim.lr": 0.02}).config
    assert with_overrides(config, {"optim.lr": 0.03}).inputs.overrides == {"optim.lr": 0.03}
    memory = with_overrides(config, {"head.options.memory_size": 32})
    with pytest.raises(ValueError, match=r"(?s)head\.options for head 'baseline'.*memory_size"):
        with_overrides(memory, {"head.name": "baseline"})  # no implicit reset: the override stays and is refused


def test_files_round_trip_and_a_hand_edited_file_is_taken_as_it_is(tmp_path):
    config = compose("smoke", framework="mt", dataset="synthetic", partition="1/16", head="mc_dropout").config
    path = tmp_path / "cell.yaml"
    path.write_text(config.to_yaml())
    again = read_config(path)
    assert again == config and again.inputs == config.inputs
    assert explain(again).provenance == explain(config).provenance
    edited = tmp_path / "edited.yaml"
    edited.write_text(config.to_yaml().replace("poly_power: 0.9", "poly_power: 0.5"))
    hand = read_config(edited)
    assert hand.schedule.poly_power == 0.5 and hand.inputs is None
    changed = recompose(hand, {"seed": 3})
    assert changed.config.schedule.poly_power == 0.5 and changed.config.seed == 3
    assert _steps(changed, "schedule.poly_power") == ["record"] and _steps(changed, "seed")[-1] == "override"
    sliding = with_overrides(config, {"evaluation.mode": "sliding"}, from_inputs=False)
    assert sliding.evaluation.stride == sliding.evaluation.crop_size * 2 // 3 + (sliding.evaluation.crop_size % 3 > 0)


def test_every_cell_of_every_spec_keeps_its_id():
    """The golden ids are the current ones; each of its ``changes`` lists cells whose values changed (with their
    earlier ids, when and why): every listed cell is a cell of its spec whose id did change."""
    golden = json.loads(GOLDEN_IDS.read_text())
    assert golden["identity_version"] == IDENTITY_VERSION == 1
    specs = sorted(p for p in (REPO / "jobs" / "specs").glob("*.yaml") if not p.name.startswith("search"))
    assert {p.name for p in specs} == set(golden["cells"])
    for path in specs:
        spec = load_spec(path)
        ids = {f"{k.framework}/{k.dataset}/{k.partition}/{k.head}/{k.seed}/{k.protocol}":
               grid_cell_config(spec, k).cell_id for k in cell_keys(spec)}
        assert ids == golden["cells"][path.name], path.name
    for change in golden["changes"]:
        assert change["date"] and change["why"]
        for spec_name, earlier in change["cells"].items():
            current = golden["cells"][spec_name]
            assert earlier and all(current[cell] != old for cell, old in earlier.items()), spec_name


def test_mt_cells_changed_id_only_under_released():
    """2026-11-25: the released MT cells run framework mt_cps (new ids); the corrected ones keep theirs, MT's removed
    options restored in the identity at the values they had."""
    change = next(c for c in json.loads(GOLDEN_IDS.read_text())["changes"] if c["date"] == "2026-11-25")
    cells = [cell for earlier in change["cells"].values() for cell in earlier]
    assert cells and all(cell.startswith("mt/") and cell.endswith("/released") for cell in cells)
    corrected = compose("paper", framework="mt", dataset="pascal_classic", partition="92", head="np").config
    assert "variant" not in corrected.framework_options
    assert corrected.identity()["framework_options"]["variant"] == "shared"
    released = compose("paper", framework="mt", dataset="pascal_classic", partition="92", head="np",
                       protocol="released").config
    assert "variant" not in released.identity()["framework_options"]


def test_inputs_and_runtime_leave_the_id_alone():
    config = compose("smoke", framework="supervised", dataset="synthetic", partition="1/16", head="np").config
    assert with_overrides(config, {"runtime.device": "cpu"}).cell_id == config.cell_id
    assert config.model_copy(update={"inputs": None}).cell_id == config.cell_id
    assert with_overrides(config, {"optim.lr_scaling": "linear"}).cell_id != config.cell_id
    assert isinstance(RunConfig.model_validate(config.model_dump()), RunConfig)


def test_config_show_prints_every_key_and_explains_one(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from semiseg_platform.cli.main import app

    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    cell = ["config", "show", "--framework", "u2pl", "--dataset", "pascal_blender", "--partition", "1/8",
            "--head", "baseline", "--preset", "paper", "--protocol", "released"]
    whole = runner.invoke(app, cell)
    assert whole.exit_code == 0, whole.output
    expected = compose("paper", framework="u2pl", dataset="pascal_blender", partition="1/8", head="baseline",
                       protocol="released")
    assert whole.output.splitlines()[0] == f"# cell {expected.config.run_name} ({expected.config.cell_id})"
    assert len(whole.output.splitlines()) == len(expected.provenance) + 1
    assert "schedule.crop_size = 513" in whole.output and "<- scale: head_settings per_head" in whole.output
    one = runner.invoke(app, [*cell, "--set", "optim.lr=0.02", "--explain", "optim.lr"])
    assert one.exit_code == 0, one.output
    assert [line.split()[0] for line in one.output.splitlines()[2:]] == ["preset", "scale", "override"]
    as_json = runner.invoke(app, [*cell, "--json", "--explain", "evaluation"])
    assert set(json.loads(as_json.output)) == set(expected.keys("evaluation"))
    path = tmp_path / "cell.yaml"
    path.write_text(expected.config.to_yaml())
    from_file = runner.invoke(app, ["config", "show", "--config", str(path), "--explain", "schedule.crop_size"])
    assert from_file.exit_code == 0 and "scale" in from_file.output  # its inputs composed again
    bad = runner.invoke(app, [*cell, "--explain", "optim.lrr"])
    assert bad.exit_code == 2 and "unknown configuration key 'optim.lrr'" in bad.output
    unknown = runner.invoke(app, [*cell, "--set", "optim.lrr=1"])
    assert unknown.exit_code == 2 and "optim.lrr" in unknown.output
