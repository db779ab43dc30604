"""Unit tests of what the MLflow UI shows: one parameter key set per study, the server command,
the README's searches, the UI's URLs, the experiment's kind, description and saved views (on a real
MLflow store), the cell description and the per-class IoU figure."""

from __future__ import annotations

import json
import math
import sys
from urllib.parse import unquote

import pytest
from mlflow import MlflowClient
from mlflow.utils.search_utils import SearchUtils
from platform_fixtures import fresh_store

from npsemiseg.config import config_params, with_overrides
from npsemiseg.constants import NOT_APPLICABLE
from npsemiseg.frameworks import framework_names
from semiseg_platform.sweeps.grid_spec import expand, load_spec
from semiseg_platform.tracking import cell_description, mlflow_names, per_class_iou_figure, prepare_experiment
from semiseg_platform.tracking.experiment_page import CELLS_VIEW, CELLS_VIEWS, ECE_VIEW, experiment_tags
from semiseg_platform.ui import compare_url, experiment_url, ready_made_searches, study_links, ui_command


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
    assert experiment_url("http://h:1", "7", view="npsemiseg-cells") == \
        "http://h:1/#/experiments/7/runs?workflowType=machine_learning&viewStateShareKey=npsemiseg-cells"
    url = compare_url("http://h:1", ["a1", "b2"], ["7"])
    assert unquote(url) == 'http://h:1/#/compare-runs?runs=["a1","b2"]&experiments=["7"]'
    with pytest.raises(ValueError, match="run_ids"):
        compare_url("http://h:1", ["a1"], ["7"])


def _saved_view(tags: dict[str, str], view: str) -> tuple[str, dict]:
    """A saved view's name and state, read back as MLflow's UI reads the experiment tag."""
    envelope = json.loads(tags[mlflow_names.SAVED_VIEW_PREFIX + view])
    assert isinstance(envelope["createdAt"], int)  # the UI drops a view without a number there
    return envelope["name"], json.loads(envelope["state"])


def test_a_study_experiment_opens_on_its_cells_in_the_training_view(tmp_path_factory):
    """A new experiment gets its kind, description and saved view; one created before gets them too,
    keeping a description someone wrote."""
    uri = fresh_store(tmp_path_factory, "experiment-tags")
    client = MlflowClient(uri)
    tags = client.get_experiment(prepare_experiment(uri, "study")).tags
    assert tags[mlflow_names.EXPERIMENT_KIND] == "custom_model_development"
    assert tags[mlflow_names.NOTE].startswith("**study**") and "claims/claims.md" in tags[mlflow_names.NOTE]
    assert "npsemiseg tables --experiment study" in tags[mlflow_names.NOTE]
    name, state = _saved_view(tags, CELLS_VIEW)
    assert name == "Cells by mIoU"
    assert SearchUtils.parse_search_filter(state["searchFilter"]) == [
        {"type": "tag", "key": "npsemiseg.kind", "comparator": "=", "value": "cell"}]
    assert (state["orderByKey"], state["orderByAsc"]) == ("metrics.`miou`", False)
    assert state["selectedColumns"][:2] == ["metrics.`miou`", "metrics.`pavpu`"]

    older = client.create_experiment("older", tags={mlflow_names.NOTE: "written by hand"})
    prepare_experiment(uri, "older")
    tags = client.get_experiment(older).tags
    assert tags[mlflow_names.NOTE] == "written by hand"
    assert tags[mlflow_names.EXPERIMENT_KIND] == "custom_model_development" and _saved_view(tags, CELLS_VIEW)


def test_cells_by_ece_lists_the_best_calibrated_first_with_the_reliability_columns():
    tags = experiment_tags("study", CELLS_VIEWS)
    name, state = _saved_view(tags, ECE_VIEW)
    assert name == "Cells by ECE"
    assert (state["orderByKey"], state["orderByAsc"]) == ("metrics.`ece`", True)
    assert {"metrics.`ece_adaptive`", "metrics.`auroc`", "metrics.`aupr`", "metrics.`aurc`"} <= set(
        state["selectedColumns"])
    assert state["searchFilter"] == _saved_view(tags, CELLS_VIEW)[1]["searchFilter"]  # the same cell runs
    assert "**Cells by ECE**" in tags[mlflow_names.NOTE]


def test_study_links_open_saved_views_of_the_experiments_with_cells(tmp_path_factory):
    uri = fresh_store(tmp_path_factory, "links")
    client = MlflowClient(uri)
    with_cells = client.create_experiment("with-cells")  # as a store written before the UI tags
    client.create_run(with_cells, tags={mlflow_names.KIND: mlflow_names.KIND_CELL, mlflow_names.DATASET: "pascal_classic"})
    client.create_run(client.create_experiment("benchmarks"), tags={mlflow_names.KIND: mlflow_names.KIND_BENCHMARK})

    links = study_links(uri, "http://127.0.0.1:5123")

    assert list(links) == ["with-cells"]
    assert links["with-cells"]["Cells by mIoU"] == experiment_url("http://127.0.0.1:5123", with_cells, view=CELLS_VIEW)
    tags = client.get_experiment(with_cells).tags
    assert tags[mlflow_names.EXPERIMENT_KIND] == "custom_model_development" and mlflow_names.NOTE in tags
    name, state = _saved_view(tags, "npsemiseg-np-cells")
    assert name == "NP cells (pascal_classic)" and links["with-cells"][name].endswith("viewStateShareKey=npsemiseg-np-cells")
    assert state["searchFilter"] == ready_made_searches("pascal_classic", "u2pl")["np_cells"]
    missing = tmp_path_factory.mktemp("none") / "mlruns.db"
    assert study_links(f"sqlite:///{missing}", "http://h:1") == {} and not missing.exists()  # no store created


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
