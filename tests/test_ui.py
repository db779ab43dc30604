"""Unit tests of what the MLflow UI shows: one parameter key set per study, the server command,
the README's searches, the UI's URLs, the cell description and the per-class IoU figure."""

from __future__ import annotations

import json
import math
import sys
from urllib.parse import unquote

import pytest
from mlflow.utils.search_utils import SearchUtils

from npsemiseg.config import config_params, with_overrides
from npsemiseg.constants import NOT_APPLICABLE
from npsemiseg.frameworks import framework_names
from semiseg_platform.sweeps.grid_spec import expand, load_spec
from semiseg_platform.tracking import cell_description, per_class_iou_figure
from semiseg_platform.ui import compare_url, experiment_url, ready_made_searches, ui_command


@pytest.fixture(scope="module")
def study_cells():
    """Every framework x head (and the np_mean ablation) of one dataset and partition, smoke preset."""
    spec = load_spec({"name": "keys", "preset": "smoke", "frameworks": list(framework_names()),
                      "datasets": {"synthetic_voc": ["92"]},
                      "heads": {"baseline": None, "mc_dropout": None, "np": None,
                                "np_mean": {"head": "np", "options": {"attention": "mean"}}}})
    return {config.cell_name: config for config in expand(spec)}


def test_every_cell_of_a_study_has_the_same_parameter_keys(study_cells):
    key_sets = {name: frozenset(config_params(config)) for name, config in study_cells.items()}
    assert len(set(key_sets.values())) == 1, "parameter key sets differ between cells"
    assert not any(key in ("framework_options", "head.options") for key in next(iter(key_sets.values())))


def test_flat_marks_options_the_cell_does_not_take_and_fills_defaults(study_cells):
    supervised = config_params(study_cells["supervised/synthetic_voc/92/baseline"])
    u2pl_np, u2pl_mean = (config_params(study_cells[f"u2pl/synthetic_voc/92/{head}"]) for head in ("np", "np_mean"))
    assert supervised["framework_options.ema_decay"] == NOT_APPLICABLE
    assert u2pl_np["framework_options.ema_decay"] != NOT_APPLICABLE
    assert supervised["head.options.attention"] == NOT_APPLICABLE
    assert supervised["head.options.dropout"] != NOT_APPLICABLE  # the baseline head takes a dropout rate
    assert (u2pl_np["head.options.attention"], u2pl_mean["head.options.attention"]) == ("euclidean", "mean")
    assert json.loads(supervised["data.augmentation.flip"]) is True  # train_transform's default


def test_flat_leaves_the_cell_id_alone(study_cells):
    config = study_cells["u2pl/synthetic_voc/92/np"]
    assert with_overrides(config, {"runtime.device": "cpu"}).cell_id == config.cell_id
    assert len({c.cell_id for c in study_cells.values()}) == len(study_cells)


def test_ui_command_serves_a_local_store_on_loopback(tmp_path):
    command = ui_command(tmp_path / "mlruns.db", port=5123)
    assert command[:4] == [sys.executable, "-m", "mlflow", "server"]
    options = dict(zip(command[4::2], command[5::2]))
    assert options == {"--backend-store-uri": f"sqlite:///{tmp_path / 'mlruns.db'}", "--host": "127.0.0.1",
                       "--port": "5123", "--workers": "1",
                       "--artifacts-destination": (tmp_path / "mlartifacts").as_uri()}
    with pytest.raises(ValueError, match="tracking server"):
        ui_command("http://127.0.0.1:25000")


def test_ready_made_searches_parse_as_mlflow_filters():
    searches = ready_made_searches("pascal_classic", "u2pl")
    assert set(searches) == {"np_cells", "mc_dropout_vs_np", "attention_ablation"}
    for search in searches.values():
        parsed = SearchUtils.parse_search_filter(search)  # raises on what the server would reject
        assert {"key": "dataset", "type": "tag", "comparator": "=", "value": "pascal_classic"} in parsed
    assert searches["np_cells"] == "tags.head = 'np' and tags.dataset = 'pascal_classic'"


def test_urls_point_at_the_runs_table_and_the_compare_view():
    assert experiment_url("http://h:1/", "7") == "http://h:1/#/experiments/7/runs?workflowType=machine_learning"
    url = compare_url("http://h:1", ["a1", "b2"], ["7"])
    assert unquote(url) == 'http://h:1/#/compare-runs?runs=["a1","b2"]&experiments=["7"]'
    with pytest.raises(ValueError, match="run_ids"):
        compare_url("http://h:1", ["a1"], ["7"])


def test_cell_description_says_what_the_cell_is(study_cells):
    config = study_cells["u2pl/synthetic_voc/92/np_mean"]
    text = cell_description(config, grid_id="0123456789ab")
    assert text.startswith("**u2pl/synthetic_voc/92/np_mean/corrected**")  # the run name: cell / protocol
    for fragment in ("`pascal_classic`", "1/16 labeled", "attention = mean", config.cell_id, "0123456789ab",
                     "figures/per_class_iou.png", f"protocol `{config.protocol}`"):
        assert fragment in text, fragment
    plain = cell_description(study_cells["u2pl/synthetic_voc/92/np"])
    assert "attention" not in plain and "grid" not in plain


def test_per_class_iou_figure_draws_one_bar_per_class():
    figure = per_class_iou_figure({"background": 0.9, "cat": math.nan, "dog": 0.25}, title="cell")
    ax = figure.axes[0]
    assert [label.get_text() for label in ax.get_yticklabels()] == ["background", "cat", "dog"]
    assert [round(bar.get_width(), 6) for bar in ax.patches] == [90.0, 0.0, 25.0]
    assert "n/a" in [text.get_text() for text in ax.texts]
    with pytest.raises(ValueError, match="iou"):
        per_class_iou_figure({})


def test_the_readme_searches_are_the_ready_made_ones():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    for name, search in ready_made_searches().items():
        assert f"`{search}`" in text, f"README.md lacks the {name} search {search!r}"
