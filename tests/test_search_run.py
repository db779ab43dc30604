"""The search job end to end on a real local Ray, a real Optuna SQLite study and a real MLflow
SQLite store (integration).

``jobs/specs/search_smoke.yaml`` runs 4 smoke trials one at a time: the first point (a sane
learning rate) sets ASHA's rung at evaluation 2, the second (learning rate 1e-7) stays below it
and is stopped there. Running the spec again continues the same study with new configurations
only. The best configuration's YAML trains again through ``npsemiseg run --config``.
"""

from __future__ import annotations

import optuna
import pandas as pd
import pytest
from mlflow import MlflowClient
from test_search_spec import SMOKE_SPEC
from typer.testing import CliRunner

from semiseg_platform.sweeps.search_runner import run_search
from semiseg_platform.sweeps.search_spec import load_search_spec
from semiseg_platform.sweeps.search_study import CELL_ATTR, DUPLICATE_ATTR
from semiseg_platform.tracking.mlflow_names import SEARCH_ID as SEARCH_ID_TAG
from semiseg_platform.tracking.mlflow_names import SEARCH_STOPPED as STOPPED_TAG

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def ray_cluster():
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def searched(tmp_path_factory, ray_cluster):
    root = tmp_path_factory.mktemp("search")
    settings = dict(tracking_uri=f"sqlite:///{root}/mlruns.db", storage=str(root / "ray_results"),
                    optuna_storage=f"sqlite:///{root}/optuna.db")
    spec = load_search_spec(SMOKE_SPEC)
    first = run_search(spec, out_dir=root / "out1", emit=lambda line: None, **settings)
    second = run_search(load_search_spec(SMOKE_SPEC, trials=2), out_dir=root / "out2", emit=lambda line: None,
                        **settings)
    return spec, root, first, second, settings


def _trial_runs(settings, summary) -> pd.DataFrame:
    import mlflow
    from mlflow.tracking._tracking_service.utils import _use_tracking_uri

    # scoped, not mlflow.set_tracking_uri: a process-wide URI would leak into every later test
    with _use_tracking_uri(settings["tracking_uri"]):
        return mlflow.search_runs(experiment_names=[summary.experiment],
                                  filter_string=f"tags.{SEARCH_ID_TAG} = '{summary.search_id}' and "
                                                "tags.`npsemiseg.kind` = 'cell'")


def test_asha_stops_the_bad_point_and_mlflow_records_it(searched):
    spec, root, first, second, settings = searched
    statuses = {t.optuna_trial: t.status for t in first.trials}
    assert len(first.trials) == 4 and first.count("failed") == 0
    assert statuses[0] == "finished" and statuses[1] == "stopped"  # lr 1e-7 below the rung at evaluation 2
    runs = _trial_runs(settings, first)
    first_runs = runs[runs["tags.mlflow.parentRunId"] == first.parent_run_id]
    assert len(first_runs) == 4
    stopped = first_runs[first_runs[f"tags.{STOPPED_TAG}"] == "asha"]
    assert set(stopped["status"]) == {"KILLED"} and len(stopped) == first.count("stopped")
    assert set(stopped["tags.search.optim.lr"]) >= {"1e-07"}
    assert (stopped["tags.search.stopped_after_evaluation"] == "2").all()
    finished = first_runs[first_runs["status"] == "FINISHED"]
    assert len(finished) == first.count("finished") and finished["metrics.miou"].notna().all()
    assert finished[f"tags.{STOPPED_TAG}"].isna().all()
    # the sampled values are the run's params (config_params(config)) and search.<key> tags
    for _, run in first_runs.iterrows():
        assert run["params.optim.lr"] == run["tags.search.optim.lr"]
        assert run["params.head.options.memory_size"] == run["tags.search.head.options.memory_size"]
    parent = MlflowClient(settings["tracking_uri"]).get_run(first.parent_run_id)
    assert parent.data.tags["npsemiseg.kind"] == "search" and parent.info.status == "FINISHED"
    assert parent.data.metrics["trials_stopped"] == first.count("stopped")


def test_rerun_continues_the_study_without_repeating_a_configuration(searched):
    spec, root, first, second, settings = searched
    assert second.search_id == first.search_id and second.study_name == first.study_name
    study = optuna.load_study(study_name=first.study_name, storage=settings["optuna_storage"])
    evaluated = [t for t in study.trials if t.state != optuna.trial.TrialState.FAIL]
    assert len(evaluated) == 6 == second.study_trials - sum(DUPLICATE_ATTR in t.user_attrs for t in study.trials)
    cells = [t.user_attrs[CELL_ATTR] for t in evaluated]
    assert len(set(cells)) == 6  # no configuration evaluated twice
    assert {t.cell_id for t in second.trials}.isdisjoint({t.cell_id for t in first.trials})
    runs = _trial_runs(settings, second)
    assert len(runs) == 6 and runs["tags.cell_id"].is_unique  # one cell run per configuration, none trained twice
    # the points to evaluate were not enqueued again
    assert all(t.optuna_trial >= 4 for t in second.trials)


def test_best_config_round_trips_through_the_cli(searched, tmp_path):
    spec, root, first, second, settings = searched
    path = second.best_config_path
    assert path is not None and path.is_file() and second.figure_path.is_file()
    client = MlflowClient(settings["tracking_uri"])
    artifacts = {a.path for a in client.list_artifacts(second.parent_run_id, "search")}
    assert {"search/best_config.yaml", "search/trials.csv"} <= artifacts
    best_cell = client.get_run(second.parent_run_id).data.tags["best_cell_id"]
    study = optuna.load_study(study_name=first.study_name, storage=settings["optuna_storage"])
    assert study.best_trial.user_attrs[CELL_ATTR] == best_cell and study.best_value == pytest.approx(second.best_value)

    from semiseg_platform.cli.main import app

    tracking = f"sqlite:///{tmp_path}/mlruns.db"
    result = CliRunner().invoke(app, ["run", "--config", str(path), "--workers", "0", "--tracking", tracking,
                                      "--experiment", "roundtrip", "--storage", str(tmp_path / "ckpt")])
    assert result.exit_code == 0, result.output
    assert f"({best_cell})" in result.output
    runs = MlflowClient(tracking).search_runs([MlflowClient(tracking).get_experiment_by_name("roundtrip").experiment_id])
    assert [r.data.tags["cell_id"] for r in runs] == [best_cell] and runs[0].info.status == "FINISHED"


def test_multi_worker_trials_report_evaluations_so_asha_stops_them(ray_cluster, tmp_path):
    """Two DDP trials (2 workers each, one TorchTrainer per trial): the good point finishes, the
    bad one is stopped at evaluation 2 through the trainer's EvaluationsToTune callback."""
    import yaml

    data = yaml.safe_load(SMOKE_SPEC.read_text())
    data.update(name="ddp", trials=2, resources={"workers": 2, "cpus_per_worker": 0.5})
    tracking = f"sqlite:///{tmp_path}/mlruns.db"
    summary = run_search(load_search_spec(data), tracking_uri=tracking, storage=str(tmp_path / "ray_results"),
                         optuna_storage=f"sqlite:///{tmp_path}/optuna.db", out_dir=tmp_path / "out",
                         emit=lambda line: None)
    assert [t.status for t in sorted(summary.trials, key=lambda t: t.optuna_trial)] == ["finished", "stopped"]
    client = MlflowClient(tracking)
    runs = {r.data.tags["search.optim.lr"]: r for r in client.search_runs(
        [client.get_experiment_by_name(summary.experiment).experiment_id], "tags.`npsemiseg.kind` = 'cell'")}
    assert runs["0.05"].info.status == "FINISHED" and runs["0.05"].data.tags["world_size"] == "2"
    stopped = runs["1e-07"]
    assert stopped.info.status == "KILLED" and stopped.data.tags[STOPPED_TAG] == "asha"
    assert stopped.data.tags["search.stopped_after_evaluation"] == "2"
