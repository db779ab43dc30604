"""The hyper-parameter figure from a real MLflow store filled with runs following the tracking schema."""

from __future__ import annotations

import json

import pytest
from mlflow import MlflowClient
from mlflow.entities import Metric, Param
from platform_fixtures import fresh_store
from typer.testing import CliRunner

from semiseg_platform.reports import PAPER_PANELS, hparams_figure, load_search_trials
from semiseg_platform.tracking.mlflow_names import SEARCH_ID as SEARCH_ID_TAG
from semiseg_platform.tracking.mlflow_names import SEARCH_STOPPED as STOPPED_TAG

Q, KL, T = "head.options.memory_size", "head.options.lambda_kl", "head.options.training_samples"


def _trial_run(client, experiment_id, *, search, dataset, partition, q, kl, t, miou, status="FINISHED", stopped=False):
    """A search trial's cell run as the tracking schema writes it (tags, params, final metric)."""
    tags = {"npsemiseg.kind": "cell", "framework": "u2pl", "dataset": dataset, "partition": partition, "head": "np",
            "cell_id": f"{search}{q}{kl}{t}", SEARCH_ID_TAG: search}
    if stopped:
        tags[STOPPED_TAG] = "asha"
    run = client.create_run(experiment_id, run_name=f"u2pl/{dataset}/{partition}/np",
                            tags=tags)
    params = {Q: json.dumps(q), KL: json.dumps(kl), T: json.dumps(t), "optim.lr": "0.001"}
    client.log_batch(run.info.run_id, params=[Param(k, v) for k, v in params.items()],
                     metrics=[Metric("miou", miou, 0, 4)])
    client.set_terminated(run.info.run_id, status)
    return run.info.run_id


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    uri = fresh_store(tmp_path_factory, "search-figure")
    client = MlflowClient(uri)
    experiment_id = client.create_experiment("hp")
    blender = dict(search="s1", dataset="pascal_blender", partition="1323")
    _trial_run(client, experiment_id, **blender, q=2560, kl=0.005, t=5, miou=0.70)
    _trial_run(client, experiment_id, **blender, q=2560, kl=0.05, t=1, miou=0.60)
    _trial_run(client, experiment_id, **blender, q=640, kl=0.005, t=5, miou=0.65)
    # never plotted: stopped by ASHA (KILLED), or FINISHED but tagged stopped, or still running
    _trial_run(client, experiment_id, **blender, q=640, kl=0.002, t=2, miou=0.99, status="KILLED", stopped=True)
    _trial_run(client, experiment_id, **blender, q=320, kl=0.002, t=2, miou=0.99, stopped=True)
    _trial_run(client, experiment_id, **blender, q=320, kl=0.002, t=10, miou=0.99, status="RUNNING")
    cityscapes = dict(search="s2", dataset="cityscapes", partition="372")
    _trial_run(client, experiment_id, **cityscapes, q=2560, kl=0.005, t=5, miou=0.75)
    _trial_run(client, experiment_id, **cityscapes, q=2560, kl=0.005, t=2, miou=0.74)
    # a grid cell (no search_id): not a search trial
    grid = client.create_run(experiment_id, run_name="u2pl/cityscapes/372/np", tags={
        "npsemiseg.kind": "cell", "dataset": "cityscapes", "partition": "372", "head": "np"})
    client.log_batch(grid.info.run_id, params=[Param(Q, "2560")], metrics=[Metric("miou", 0.9, 0, 0)])
    client.set_terminated(grid.info.run_id, "FINISHED")
    return uri


def test_only_finished_unstopped_trials_are_read(store):
    rows = load_search_trials(store, "hp")
    assert sorted(r["metric"] for r in rows) == [0.60, 0.65, 0.70, 0.74, 0.75]
    assert {r[Q] for r in rows} == {640.0, 2560.0}
    assert sorted(r["metric"] for r in load_search_trials(store, "hp", search="s2")) == [0.74, 0.75]
    assert load_search_trials(store, "missing-experiment") == []


def test_figure_panels_hold_the_best_miou_per_value(store):
    figure = hparams_figure(store, "hp")
    axes = figure.axes
    assert [ax.get_title() for ax in axes] == list(PAPER_PANELS.values())
    lines = {(ax.get_title(), line.get_label()): (list(line.get_xdata()), list(line.get_ydata()))
             for ax in axes for line in ax.get_lines()}
    blender = next(label for _, label in lines if label.startswith("VOC (blender)"))
    city = next(label for _, label in lines if label.startswith("Cityscapes"))
    assert "1/8" in blender and "1/8" in city
    xs, ys = lines[(PAPER_PANELS[Q], blender)]
    assert xs == [640.0, 2560.0] and ys == pytest.approx([65.0, 70.0])  # max over the trials at each Q
    xs, ys = lines[(PAPER_PANELS[T], blender)]
    assert xs == [1.0, 5.0] and ys == pytest.approx([60.0, 70.0])
    xs, ys = lines[(PAPER_PANELS[T], city)]
    assert xs == [2.0, 5.0] and ys == pytest.approx([74.0, 75.0])
    mean = hparams_figure(store, "hp", aggregate="mean")
    xs, ys = next((list(line.get_xdata()), list(line.get_ydata())) for ax in mean.axes if ax.get_title() == PAPER_PANELS[KL]
                  for line in ax.get_lines() if line.get_label() == blender)
    assert xs == [0.005, 0.05] and ys == pytest.approx([67.5, 60.0])
    assert hparams_figure(store, "hp", search="nothing") is None


def test_cli_writes_the_png(store, tmp_path):
    from semiseg_platform.cli.main import app

    runner = CliRunner()
    result = runner.invoke(app, ["hparams-figure", "--experiment", "hp", "--out", str(tmp_path), "--tracking", store])
    assert result.exit_code == 0, result.output
    png = tmp_path / "hparams.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    result = runner.invoke(app, ["hparams-figure", "--experiment", "other", "--out", str(tmp_path), "--tracking", store])
    assert result.exit_code == 1 and "no finished search trial" in result.output
