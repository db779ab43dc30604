"""Renamed configuration keys: ``npsemiseg.renames`` is the one map old -> new, and every reader goes through it.

An old name composes to the same record as the new one (a record, an override, a grid spec), an old run's MLflow
parameter reads back under the new key, and the cell id is the same whichever name wrote the value (hashed under the
version-1 names). Negative cases: a key that was never a name is still refused, a renamed value is read only under
the key that carried it.
"""

from __future__ import annotations

import pytest

from npsemiseg.config import cell_config, compose
from npsemiseg.renames import RENAMED_KEYS, current_key, earlier_names, read_renamed
from semiseg_platform.tracking.mlflow_names import param_value


def test_read_renamed_maps_dotted_keys_and_sections_and_keeps_the_order():
    old = {"framework_options.cutmix_variant": "voc", "head": {"options": {"num_samples": 3}}, "seed": 1}
    assert read_renamed(old) == {"framework_options.cutmix_boxes": "beta_box", "head": {"options": {"training_samples": 3}},
                                 "seed": 1}
    assert list(read_renamed({"seed": 1, "head.options.num_samples": 2})) == ["seed", "head.options.training_samples"]


def test_the_current_key_wins_over_its_earlier_name_in_either_order():
    both = {"head.options.num_samples": 2, "head.options.training_samples": 7}
    assert read_renamed(both) == {"head.options.training_samples": 7}
    assert read_renamed(dict(reversed(both.items()))) == {"head.options.training_samples": 7}


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
