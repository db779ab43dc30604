"""The tracking schema as code: the parameter layout, and stores written before searches had their own tag."""

from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient
from platform_fixtures import fresh_store

from npsemiseg.config import cell_config, config_params
from npsemiseg.constants import NOT_APPLICABLE
from semiseg_platform.reports import load_cell_runs
from semiseg_platform.tracking import find_cell_run, mlflow_names, prepare_experiment, submission_runs


@pytest.mark.parametrize(("framework", "head"), [("supervised", "baseline"), ("u2pl", "np"), ("mt", "mc_dropout")])
def test_config_params_is_the_library_layout(framework, head):
    config = cell_config("smoke", framework=framework, dataset="synthetic", partition="1/16", head=head)
    params = config_params(config)
    reference = config_params(cell_config("smoke", framework="supervised", dataset="synthetic", partition="1/16"))
    assert set(params) == set(reference)  # one key set for every cell: the compare view lines them up
    assert not any(key.startswith("inputs") for key in params)  # how a record was composed is an artifact
    assert params["framework"] == framework and any(v == NOT_APPLICABLE for v in params.values())


def test_runs_tagged_the_old_way_still_read(tmp_path_factory):
    """A search trial written before ``search_id`` was its own tag carries ``grid_id`` = the search id."""
    uri = fresh_store(tmp_path_factory, "old-store")
    client = MlflowClient(uri)
    experiment = prepare_experiment(uri, "old")
    old = client.create_run(experiment, tags={mlflow_names.KIND: mlflow_names.KIND_CELL, mlflow_names.CELL_ID: "c1",
                                              mlflow_names.GRID_ID: "s1", mlflow_names.DATASET: "synthetic"})
    client.set_terminated(old.info.run_id, "FINISHED")
    new = client.create_run(experiment, tags={mlflow_names.KIND: mlflow_names.KIND_CELL, mlflow_names.CELL_ID: "c2",
                                              mlflow_names.SEARCH_ID: "s1", mlflow_names.DATASET: "synthetic"})
    outside = client.create_run(experiment, tags={mlflow_names.KIND: mlflow_names.KIND_CELL, mlflow_names.CELL_ID: "c1"})
    assert find_cell_run(client, experiment, "c1", "s1").info.run_id == old.info.run_id
    assert find_cell_run(client, experiment, "c2", "s1").info.run_id == new.info.run_id
    assert find_cell_run(client, experiment, "c1").info.run_id == outside.info.run_id
    assert {r.info.run_id for r in submission_runs(client, [experiment], "s1")} == {old.info.run_id, new.info.run_id}
    assert set(load_cell_runs(uri, "old", grid_id="s1")["run_id"]) == {old.info.run_id, new.info.run_id}
    assert mlflow_names.submission_of({mlflow_names.GRID_ID: "s1"}) == "s1"
    assert mlflow_names.submission_of({mlflow_names.SEARCH_ID: "s1"}) == "s1"
