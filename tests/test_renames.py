"""Renamed configuration keys: ``npsemiseg.renames`` is the one map old -> new, and every reader goes through it.

An old name composes to the same record as the new one (a record, an override, a grid spec), an old run's MLflow
parameter reads back under the new key, and the cell id is the same whichever name wrote the value (hashed under the
version-1 names). Negative cases: a key that was never a name is still refused, a renamed value is read only under
the key that carried it.
"""

from __future__ import annotations

import pytest
import yaml

from npsemiseg.config import RunConfig, cell_config, compose
from npsemiseg.renames import RENAMED_KEYS, current_key, earlier_names, read_renamed
from semiseg_platform.tracking.mlflow_names import param_value


def test_read_renamed_maps_dotted_keys_and_sections_and_keeps_the_order():
    old = {"framework_options.cutmix_variant": "voc", "head": {"options": {"num_samples": 3}}, "seed": 1}
    assert read_renamed(old) == {"framework_options.cutmix_boxes": "beta_box", "head": {"options": {"training_samples": 3}},
                                 "seed": 1}
    assert list(read_renamed({"seed": 1, "head.options.num_samples": 2})) == ["seed", "head.options.training_samples"]


def test_of_a_key_given_under_both_names_the_later_one_holds():
    both = {"head.options.num_samples": 2, "head.options.training_samples": 7}
    assert read_renamed(both) == {"head.options.training_samples": 7}
    assert read_renamed(dict(reversed(both.items()))) == {"head.options.training_samples": 2}


def test_a_renamed_value_is_read_only_under_the_earlier_key():
    """``voc`` was a value of ``cutmix_variant``; under ``cutmix_boxes`` it is an error (the option's check)."""
    assert read_renamed({"framework_options": {"cutmix_boxes": "voc"}}) == {"framework_options": {"cutmix_boxes": "voc"}}
    with pytest.raises(ValueError, match="cutmix_boxes"):
        cell_config("smoke", framework="psmt", **{"framework_options.cutmix_boxes": "voc"})


def test_every_renamed_key_stays_in_its_section_and_hashes_under_its_earlier_name():
    for new, old in RENAMED_KEYS.items():
        assert current_key(old) == new and new.rpartition(".")[0] == old.rpartition(".")[0]
    data = {"framework_options": {"cutmix_boxes": "random_boxes"}, "head": {"options": {}}}
    assert earlier_names(data) == {"framework_options": {"cutmix_variant": "cityscapes"}, "head": {"options": {}}}


def test_an_unknown_key_is_still_refused_by_name():
    with pytest.raises(ValueError, match="no_such_key"):
        compose("smoke", framework="supervised", dataset="synthetic", partition="1/16", head="baseline",
                overrides={"head.no_such_key": 1})


def test_old_run_params_read_back_under_the_new_key():
    assert param_value({"head.options.num_samples": "5"}, "head.options.training_samples") == "5"
    assert param_value({"head.options.training_samples": "4", "head.options.num_samples": "5"},
                       "head.options.training_samples") == "4"
    assert param_value({}, "head.options.training_samples") is None


#: ``(earlier key, current key, a value, the cell)``: each rename of "variant", given under its old name
_CASES = [
    ("head.variant", "head.label", "np_mean", dict(framework="u2pl", head="np")),
    ("framework_variant", "framework_label", "supervised_psmt", dict(framework="supervised", head="baseline")),
    ("model.variant", "model.decoder", "psmt", dict(framework="supervised", head="baseline")),
    ("list_variant", "partition_lists", "cps", dict(framework="augseg", head="np", dataset="cityscapes")),
]


def _config(cell, overrides):
    coordinates = {"dataset": "synthetic", "partition": "1/16", **cell}
    return compose("smoke", **coordinates, overrides=overrides).config


@pytest.mark.parametrize(("old", "new", "value", "cell"), _CASES, ids=[case[0] for case in _CASES])
def test_an_old_name_composes_the_same_record_and_cell_id(old, new, value, cell):
    """An override (``--set old=value``), a section override and a record (a YAML file, a checkpoint's stored
    configuration) written with the old name give the record the new name gives, and the same cell id; the id is
    the one hashed under the old name (``cell_ids.json`` holds ids hashed so)."""
    current = _config(cell, {new: value})
    assert _read(current.model_dump(), new) == value
    section, _, leaf = old.rpartition(".")
    for overrides in ({old: value}, {section: {leaf: str(value)}} if section else {old: str(value)}):
        again = _config(cell, overrides)
        assert again == current and again.cell_id == current.cell_id
    record = current.model_dump(mode="json")
    node = record[section] if section else record
    node[leaf] = node.pop(new.rpartition(".")[2])
    assert RunConfig.from_yaml(yaml.safe_dump(record)) == current
    assert _read(current.identity(), old) == value and _read(current.identity(), new) is None


def _read(data, dotted):
    for part in dotted.split("."):
        data = data.get(part) if isinstance(data, dict) else None
    return data


def test_data_check_takes_the_partition_lists_under_either_option_name():
    from typer.testing import CliRunner

    from semiseg_platform.cli.main import app

    for option in ("--partition-lists", "--list-variant"):
        result = CliRunner().invoke(app, ["data", "check", "--dataset", "cityscapes", "--root", "/nonexistent", option, "cps"])
        assert result.exit_code == 2 and "(lists: cps)" in result.output


def test_the_mt_framework_switch_is_read_under_its_earlier_name():
    """``switches.mt_variant`` (an override, ``--explain``, an old run's parameter) is ``switches.mt_framework``."""
    from npsemiseg.protocol import get_switch

    cell = dict(framework="mt", dataset="pascal_classic", partition="92", head="baseline", protocol="released")
    new = compose("smoke", **cell, overrides={"switches.mt_framework": "mt"})
    old = compose("smoke", **cell, overrides={"switches.mt_variant": "mt"})
    assert old.config == new.config and old.config.framework == "mt" and old.config.cell_id == new.config.cell_id
    assert old.explain("switches.mt_variant") == new.explain("switches.mt_framework")
    assert get_switch("mt_variant") is get_switch("mt_framework")
    assert param_value({"switches.mt_variant": "mt_cps"}, "switches.mt_framework") == "mt_cps"
    with pytest.raises(ValueError, match="unknown name 'mt_varient'"):
        get_switch("mt_varient")


def test_a_grid_spec_written_with_the_old_names_expands_to_the_same_cells(tmp_path):
    """A spec with ``model.variant`` (a framework's overrides) and ``list_variant`` (a cell override) expands to the
    cells, records and grid id of the same spec written with the new names."""
    from semiseg_platform.sweeps.grid_spec import expand, grid_id, load_spec

    text = """
name: renamed
preset: smoke
frameworks:
  augseg: null
  supervised_psmt: {{framework: supervised, overrides: {{{decoder}: psmt}}}}
datasets: {{synthetic_cityscapes: [1/8]}}
heads: [baseline]
seeds: [0]
cell_overrides:
  - when: {{frameworks: [augseg]}}
    overrides: {{{lists}: cps}}
"""
    configs = {}
    for names in ({"decoder": "model.variant", "lists": "list_variant"},
                  {"decoder": "model.decoder", "lists": "partition_lists"}):
        path = tmp_path / f"{names['lists']}.yaml"
        path.write_text(text.format(**names))
        configs[names["lists"]] = expand(load_spec(path))
    old, new = configs["list_variant"], configs["partition_lists"]
    assert old == new and grid_id(old) == grid_id(new)
    assert {c.model.decoder for c in new} == {"augseg", "psmt"} and {c.partition_lists for c in new} == {"cps", "u2pl"}
