"""RunConfig: validation errors name the key, YAML round trip, cell ids, presets."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import BaseModel

from npsemiseg.config import IDENTITY_EXCLUDED, RunConfig, cell_config, config_params, with_overrides
from npsemiseg.data import dataset_info, dataset_names, protocol_partitions
from npsemiseg.data.augmentation import AUGMENTATION_CHOICES
from npsemiseg.frameworks import framework_names
from npsemiseg.heads import head_names
from npsemiseg.presets import preset_names

REPO = Path(__file__).resolve().parents[1]


def test_smoke_preset_resolves_dependent_fields(smoke_config):
    config = smoke_config(head="np")
    assert config.head.label == "np"
    assert config.evaluation.mode == "whole" and config.evaluation.crop_size is not None
    assert config.model.representation_head is False  # supervised needs none
    assert config.data.augmentation["resize"] == "rescale_balanced"
    assert config.data.labeled_strong_view is False
    assert config.cell_name == f"supervised/synthetic/{config.partition}/np"


def test_partition_alias_resolves_to_the_canonical_name():
    config = cell_config("paper", framework="supervised", dataset="pascal_classic", partition="1/16")
    assert config.partition == "92"
    same = cell_config("paper", framework="supervised", dataset="pascal_classic", partition=92)
    assert same == config and same.cell_id == config.cell_id


def test_partition_not_in_dataset_is_rejected_by_name():
    with pytest.raises(ValueError, match=r"partition '1/3'"):
        cell_config("paper", framework="supervised", dataset="cityscapes", partition="1/3")
    with pytest.raises(ValueError, match=r"partition '92' is not a partition of 'cityscapes'"):
        cell_config("paper", framework="supervised", dataset="cityscapes", partition="92")


def test_unknown_keys_are_rejected_naming_the_key(smoke_config):
    config = smoke_config()
    with pytest.raises(ValueError, match=r"'optim\.lrr'.*no field 'lrr'"):
        with_overrides(config, {"optim.lrr": 0.1})
    with pytest.raises(ValueError, match=r"'bogus'"):
        with_overrides(config, {"bogus": 1})
    with pytest.raises(ValueError, match=r"optim\.lr.*is a value"):
        with_overrides(config, {"optim.lr.x": 1})
    data = config.model_dump(mode="json")
    data["schedule"]["epoch"] = 3
    with pytest.raises(ValueError, match=r"schedule\.epoch\b"):
        RunConfig.model_validate(data)


def test_bad_values_are_rejected_naming_the_key(smoke_config):
    config = smoke_config()
    with pytest.raises(ValueError, match=r"optim\.lr"):
        with_overrides(config, {"optim.lr": -1.0})
    with pytest.raises(ValueError, match=r"schedule\.batch_size"):
        with_overrides(config, {"schedule.batch_size": "many"})
    with pytest.raises(ValueError, match=r"head\.sample_ce"):
        with_overrides(config, {"head.sample_ce": "median"})
    with pytest.raises(ValueError, match=r"(?s)framework.*'nope'"):
        with_overrides(config, {"framework": "nope"})


def test_unknown_framework_and_head_options_are_named(smoke_config):
    with pytest.raises(ValueError, match=r"(?s)options of framework 'supervised'.*bogus"):
        smoke_config(framework_options={"bogus": 1})
    with pytest.raises(ValueError, match=r"(?s)head\.options.*memory_sise"):
        smoke_config(head="np", **{"head.options.memory_sise": 8})
    with pytest.raises(ValueError, match=r"(?s)head\.options.*memory_size"):
        smoke_config(head="np", **{"head.options.memory_size": 0})
    with pytest.raises(ValueError, match=r"data\.augmentation.*zoom"):
        smoke_config(**{"data.augmentation.zoom": 2})


def test_overrides_parse_strings_and_accept_sections(smoke_config):
    config = smoke_config()
    changed = with_overrides(config, {"optim.lr": "0.05", "optim.grad_clip": "5", "schedule.max_steps": "7"})
    assert changed.optim.lr == 0.05 and changed.optim.grad_clip == 5.0 and changed.schedule.max_steps == 7
    assert with_overrides(changed, {"optim.grad_clip": "null"}).optim.grad_clip is None
    u2pl = smoke_config(framework="u2pl", framework_options={"ema_buffers": "none"})
    assert u2pl.framework_options["ema_buffers"] == "none"  # a string, not null
    sectioned = smoke_config(optim={"lr": 0.05, "grad_clip": 5.0}, schedule={"max_steps": 7})
    assert sectioned.optim == changed.optim and sectioned.schedule == changed.schedule
    with pytest.raises(ValueError, match="frozen"):
        config.seed = 3  # type: ignore[misc]


def test_labeled_strong_view_follows_the_framework(smoke_config):
    assert smoke_config(framework="psmt").data.labeled_strong_view is True
    assert smoke_config(framework="psmt", framework_options={"strong_labeled": False}).data.labeled_strong_view is False
    assert smoke_config(framework="augseg").data.labeled_strong_view is False
    assert smoke_config(framework="augseg").data.augmentation["strong"] == "augseg"


def test_option_dicts_are_merged_into_the_preset(smoke_config):
    paper = smoke_config(framework="psmt").framework_options
    changed = smoke_config(framework="psmt", framework_options={"tvat": False})
    assert changed.framework_options == {**paper, "tvat": False}
    head = smoke_config(head="np", **{"head.options": {"memory_size": 32}}).head.options
    assert head["memory_size"] == 32 and head["lambda_kl"] == 0.005


def test_switching_head_or_framework_starts_their_options_afresh(smoke_config):
    config = smoke_config(head="np")
    baseline = with_overrides(config, {"head.name": "baseline"})
    assert baseline.head.options == {} and baseline.head.label == "baseline"
    named = smoke_config(head="np", **{"head.label": "np_mean"})
    assert named.head.label == "np_mean" and named.cell_name.endswith("/np_mean")


def test_yaml_round_trip_text_and_file(smoke_config, tmp_path):
    config = smoke_config(head="np", seed=3, **{"optim.lr": 0.02})
    text = config.to_yaml()
    again = RunConfig.from_yaml(text)
    assert again == config and again.cell_id == config.cell_id
    path = tmp_path / "cell.yaml"
    path.write_text(text)
    assert RunConfig.from_yaml(path) == config
    assert RunConfig.from_yaml(str(path)) == config
    import pickle

    assert pickle.loads(pickle.dumps(config)) == config  # Ray ships configs to its workers by pickling
    with pytest.raises(ValueError, match="does not exist"):
        RunConfig.from_yaml(tmp_path / "missing.yaml")
    with pytest.raises(ValueError, match="mapping"):
        RunConfig.from_yaml("- a\n- b\n")


def test_flat_gives_dotted_string_params(smoke_config):
    flat = config_params(smoke_config(head="np"))
    assert flat["optim.lr"] == "0.01"
    assert flat["framework"] == "supervised" and flat["head.options.memory_size"] == "64"
    assert flat["schedule.max_steps"] == "3" and flat["runtime.output_dir"] == "null"
    assert all(isinstance(v, str) for v in flat.values())


def test_cell_id_ignores_runtime_and_data_location(smoke_config):
    config = smoke_config()
    same = with_overrides(config, {"runtime.device": "cpu", "runtime.output_dir": "/tmp/x", "runtime.stop_at_step": 2,
                                  "data.root": "/data", "data.num_workers": 7, "runtime.progress": "off"})
    assert same.cell_id == config.cell_id
    assert len(config.cell_id) == 12 and int(config.cell_id, 16) >= 0


def _leaves(model: BaseModel, prefix: str = ""):
    for name in type(model).model_fields:
        value = getattr(model, name)
        dotted = f"{prefix}{name}"
        if isinstance(value, BaseModel):
            yield from _leaves(value, dotted + ".")
        else:
            yield dotted, value


def _mutated(value):
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1
    if isinstance(value, str):
        return value + "x"
    if isinstance(value, dict):
        return {**value, "extra": 1}
    if value is None:
        return 1
    if isinstance(value, tuple):
        return (*value, "x")
    raise AssertionError(f"no mutation for {value!r}")


def _replace(model: BaseModel, dotted: str, value):
    head, _, rest = dotted.partition(".")
    if not rest:
        return model.model_copy(update={head: value})
    return model.model_copy(update={head: _replace(getattr(model, head), rest, value)})


@pytest.mark.filterwarnings("ignore::UserWarning")  # mutated values of the wrong type serialise with a warning
def test_cell_id_is_sensitive_to_every_identity_field(smoke_config):
    """Every leaf outside runtime / data location changes the id (a field left out of identity() fails)."""
    config = smoke_config(head="np")
    excluded = set(IDENTITY_EXCLUDED)
    checked = 0
    for dotted, value in _leaves(config):
        if dotted == "runtime.planned_schedule":  # read in place of the schedule's batches (test_hardware_plan)
            continue
        changed = _replace(config, dotted, _mutated(value))
        # lr_scaling = none: the reference batch has no effect, so it is left out of the id
        unused = dotted == "optim.reference_batch" and config.optim.lr_scaling == "none"
        if dotted in excluded or dotted.split(".")[0] in excluded or unused:
            assert changed.cell_id == config.cell_id, dotted
        else:
            assert changed.cell_id != config.cell_id, dotted
            checked += 1
    assert checked > 40


@pytest.mark.integration  # a fresh interpreter importing torch: ~15 s on the shared CPU
def test_cell_id_is_stable_across_processes(smoke_config):
    config = smoke_config(head="np")
    code = (
        "from npsemiseg.config import RunConfig; import sys; "
        "print(RunConfig.from_yaml(sys.stdin.read()).cell_id)"
    )
    out = subprocess.run([sys.executable, "-c", code], input=config.to_yaml(), capture_output=True, text=True,
                         cwd=REPO, check=True, env={"PYTHONHASHSEED": "123", "PATH": ""})
    assert out.stdout.strip() == config.cell_id


def test_paper_preset_values_per_dataset_family():
    voc = cell_config("paper", framework="supervised", dataset="pascal_blender", partition="1/8", head="np")
    assert (voc.schedule.crop_size, voc.schedule.batch_size, voc.schedule.epochs) == (480, 3, 80)
    assert (voc.optim.lr, voc.optim.head_lr_mult, voc.optim.weight_decay, voc.optim.momentum) == (1e-3, 10.0, 1e-4, 0.9)
    assert voc.optim.grad_clip == 5.0 and voc.head.options["lambda_kl"] == 0.005
    assert voc.head.options["memory_size"] == 2560 and voc.evaluation.num_samples == 5
    assert (voc.evaluation.mode, voc.evaluation.crop_size) == ("center_crop", 513)
    assert voc.loss.ohem is False and voc.model.aux_head is False and voc.model.backbone == "resnet50"
    city = cell_config("paper", framework="supervised", dataset="cityscapes", partition="1/16")
    assert (city.schedule.crop_size, city.schedule.batch_size, city.schedule.epochs) == (580, 2, 200)
    assert (city.optim.lr, city.optim.head_lr_mult, city.optim.weight_decay) == (5e-3, 1.0, 5e-4)
    assert city.loss.ohem and city.loss.ohem_thresh == 0.7 and city.model.aux_head and city.loss.aux_weight == 0.4
    assert (city.evaluation.mode, city.evaluation.crop_size, city.evaluation.stride) == ("sliding", 769, 513)
    assert city.optim.grad_clip == 5.0  # corrected: every head clipped alike (switch grad_clip_per_head)
    released = cell_config("paper", framework="supervised", dataset="cityscapes", partition="1/16", protocol="released")
    assert released.optim.grad_clip is None  # released: the baseline head is not clipped, as its own trainers
    assert city.partition == "186"


@pytest.mark.parametrize("framework", framework_names())
@pytest.mark.parametrize("preset", preset_names())
def test_presets_resolve_for_every_framework_dataset_and_head(preset, framework):
    for dataset in dataset_names():
        partition = "1/8" if "1/8" in dataset_info(dataset).partition_aliases else protocol_partitions(dataset)[0][0]
        for head in head_names():
            config = cell_config(preset, framework=framework, dataset=dataset, partition=partition, head=head)
            assert config.framework == framework and config.head.name == head
            assert RunConfig.from_yaml(config.to_yaml()).cell_id == config.cell_id
    u2pl_like = cell_config(preset, framework=framework, dataset="synthetic", partition="1/8")
    assert u2pl_like.model.representation_head is (framework == "u2pl")


def test_unknown_preset_and_head_names():
    with pytest.raises(ValueError, match=r"preset.*'tiny'"):
        cell_config("tiny")
    with pytest.raises(ValueError, match=r"head.*'gp'"):
        cell_config("smoke", head="gp")


def test_creating_a_config_leaves_the_global_rng_alone(smoke_config):
    import torch

    state = torch.get_rng_state()
    smoke_config(head="np")
    assert torch.equal(state, torch.get_rng_state())


def test_identity_is_json_of_the_resolved_config(smoke_config):
    config = smoke_config()
    identity = config.identity()
    assert "runtime" not in identity and "root" not in identity["data"]
    assert json.loads(json.dumps(identity)) == identity


def test_dependent_defaults_follow_what_they_depend_on():
    """Defaults that depend on another value follow it: the paper's sliding stride follows a smaller crop,
    an NP memory smaller than 256 takes the NP head's default enqueue; only explicit contradictions are errors."""
    city = cell_config("paper", framework="u2pl", dataset="cityscapes", partition="1/16", head="np")
    small = with_overrides(city, {"evaluation.crop_size": "385", "head.options.memory_size": "64"})
    assert (small.evaluation.crop_size, small.evaluation.stride) == (385, 257)
    assert with_overrides(city, {"evaluation.crop_size": "769"}).cell_id == city.cell_id
    with pytest.raises(ValueError, match=r"evaluation.stride: expected at most evaluation.crop_size=385.*got 513"):
        with_overrides(city, {"evaluation.crop_size": "385", "evaluation.stride": "513"})
    with pytest.raises(ValueError, match="enqueue_per_class: expected at most memory_size=64, got 256"):
        with_overrides(city, {"head.options.memory_size": "64", "head.options.enqueue_per_class": "256"})


@pytest.mark.parametrize(("key", "value"), [("resize_resample", "bogus"), ("crop_fill", "grey"), ("resize", "half")])
def test_an_unknown_augmentation_value_is_one_error_at_configuration_time_naming_it(key, value):
    from npsemiseg.data.transforms import CROP_FILLS

    assert set(CROP_FILLS) == set(AUGMENTATION_CHOICES["crop_fill"])  # one source for the transforms and the check
    with pytest.raises(ValueError, match=rf"data\.augmentation: {key}='{value}' \(expected one of \["):
        cell_config("smoke", framework="u2pl", dataset="synthetic_voc", partition="1464", head="baseline",
                    **{f"data.augmentation.{key}": value})
