"""MLflow tracking of a cell against a real SQLite store, driving the training hooks directly."""

from __future__ import annotations

import contextlib
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from platform_fixtures import fresh_store

from npsemiseg.config import RunConfig, cell_config, config_params, explain, with_overrides
from npsemiseg.training import RunResult
from semiseg_platform.tracking import (
    CellKilled,
    CellRun,
    MLflowCallbacks,
    artifact_path,
    ending_run,
    error_reason,
    find_cell_run,
    format_error,
    resolve_tracking_uri,
    sweep_orphaned_runs,
)
from semiseg_platform.tracking.logged_models import BEST_ALIAS, CHECKPOINT_STEP_TAG, MODEL_ID_TAG, registered_name
from semiseg_platform.tracking.mlflow_names import ERROR as ERROR_TAG
from semiseg_platform.tracking.mlflow_names import FINAL_METRICS, PROVENANCE_ARTIFACT
from semiseg_platform.tracking.mlflow_names import OWNER_HOST as OWNER_HOST_TAG
from semiseg_platform.tracking.mlflow_names import OWNER_PID as OWNER_PID_TAG
from semiseg_platform.tracking.mlflow_names import OWNER_START as OWNER_START_TAG


@pytest.fixture(scope="module")
def tracking_uri(tmp_path_factory) -> str:
    return fresh_store(tmp_path_factory, "tracking")


@pytest.fixture(scope="module")
def config() -> RunConfig:
    return cell_config("smoke", framework="supervised", dataset="synthetic", partition="1/16", head="np")


def _runs(uri: str, experiment: str):
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    return client.search_runs([exp.experiment_id])


def _history(uri: str, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in MlflowClient(uri).get_metric_history(run_id, key))


def test_resolve_tracking_uri_is_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert resolve_tracking_uri() == f"sqlite:///{tmp_path}/mlruns.db"
    assert resolve_tracking_uri("sqlite:///rel/x.db") == f"sqlite:///{tmp_path}/rel/x.db"
    assert resolve_tracking_uri("other.db") == f"sqlite:///{tmp_path}/other.db"
    assert resolve_tracking_uri("file:/abs/mlruns") == "file:/abs/mlruns"  # a URI without "//", not a path
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://tracking.example:5000")
    assert resolve_tracking_uri() == "http://tracking.example:5000"
    assert resolve_tracking_uri("sqlite:////abs/y.db") == "sqlite:////abs/y.db"


def test_artifact_paths_are_stable():
    assert artifact_path("uncertainty_maps", Path("/tmp/x.png")) == "figures/uncertainty_maps.png"
    assert artifact_path("reliability.png", Path("/tmp/r.png")) == "figures/reliability.png"
    assert artifact_path("per_class_iou", Path("/tmp/t.csv")) == "tables/per_class_iou.csv"
    assert artifact_path("figures/custom.png", Path("/tmp/a.png")) == "figures/custom.png"
    assert artifact_path("notes", Path("/tmp/n.txt")) == "notes.txt"


def test_cell_run_logs_the_schema(tracking_uri, config, tmp_path):
    experiment = "schema"
    figure = tmp_path / "uncertainty_0000.png"
    figure.write_bytes(b"\x89PNG fake bytes")
    table = tmp_path / "per_class_iou.csv"
    table.write_text("class,iou\nbackground,0.5\ncat,0.0\n")
    with CellRun.open(config, tracking=tracking_uri, experiment=experiment, grid_id="g1", parent_run_id=None) as run:
        callbacks = MLflowCallbacks(tracking_uri, run.run_id, flush_every_s=3600)
        callbacks.on_start(config, total_steps=3, start_step=0, rank=0, world_size=2)
        for step in range(3):
            callbacks.on_step(step, 3, {"loss": 1.0 / (step + 1), "lr": 0.01, "sec_per_iter": 0.5, "nan_metric": float("nan")})
        callbacks.on_evaluation(2, {"miou": 0.25, "iou/background": 0.5, "iou/cat": 0.0})
        callbacks.on_artifact("figures/uncertainty_maps.png", figure)  # the names training uses
        callbacks.on_artifact("tables/per_class_iou.csv", table)
        final = {name: 0.1 * (i + 1) for i, name in enumerate(FINAL_METRICS)} | {"iou/background": 0.5, "iou/cat": 0.0}
        callbacks.on_end(RunResult(metrics=final, steps=3, checkpoint=None, seconds=2.0, train_seconds=1.5))
        run.log_checkpoint_uri("/storage/cell/checkpoint_000000003")

    runs = _runs(tracking_uri, experiment)
    assert len(runs) == 1
    stored = runs[0]
    assert stored.info.status == "FINISHED"
    assert stored.info.run_name == config.run_name
    tags = stored.data.tags
    expected_tags = {"framework": "supervised", "dataset": "synthetic", "partition": config.partition, "head": "np",
                     "head_name": "np", "seed": "0", "cell_id": config.cell_id, "grid_id": "g1", "npsemiseg.kind": "cell",
                     "world_size": "2"}
    assert {k: tags.get(k) for k in expected_tags} == expected_tags
    assert tags["git_commit"] and tags["npsemiseg_version"]
    assert ERROR_TAG not in tags
    assert stored.data.params == config_params(config)
    # buffered step metrics were flushed at the evaluation, NaN dropped
    assert _history(tracking_uri, run.run_id, "train/loss") == [(0, 1.0), (1, 0.5), (2, pytest.approx(1 / 3))]
    assert "train/nan_metric" not in stored.data.metrics
    assert _history(tracking_uri, run.run_id, "eval/miou") == [(2, 0.25)]
    assert _history(tracking_uri, run.run_id, "eval/iou/cat") == [(2, 0.0)]
    for name in FINAL_METRICS:
        assert stored.data.metrics[name] == pytest.approx(final[name])
    assert stored.data.metrics["time/train_seconds"] == 1.5
    client = MlflowClient(tracking_uri)
    artifacts = {
        a.path for folder in ("", "config", "figures", "tables") for a in client.list_artifacts(run.run_id, folder or None)
    }
    assert {"config/config.yaml", "figures/uncertainty_maps.png", "tables/per_class_iou.csv", "checkpoint_uri.txt"} <= artifacts
    local = client.download_artifacts(run.run_id, "config/config.yaml", str(tmp_path))
    assert RunConfig.from_yaml(Path(local).read_text()) == config
    provenance = json.loads(Path(client.download_artifacts(run.run_id, PROVENANCE_ARTIFACT, str(tmp_path))).read_text())
    assert provenance == explain(config).to_json()
    assert provenance["evaluation.num_samples"]["set_by"][-1]["step"] == "scale"  # the smoke preset's T = 2
    assert provenance["evaluation.num_samples"]["value"] == config.evaluation.num_samples
    figure_copy = Path(client.download_artifacts(run.run_id, "figures/uncertainty_maps.png", str(tmp_path / "dl")))
    assert figure_copy.read_bytes() == figure.read_bytes()


def test_restarted_cell_reuses_its_run(tracking_uri, config):
    experiment = "reuse"
    with pytest.raises(RuntimeError):
        with CellRun.open(config, tracking=tracking_uri, experiment=experiment) as first:
            callbacks = MLflowCallbacks(tracking_uri, first.run_id, flush_every_s=3600)
            callbacks.on_start(config, total_steps=4, start_step=0, rank=0, world_size=1)
            callbacks.on_step(0, 4, {"loss": 2.0})
            callbacks.on_step(1, 4, {"loss": 1.5})
            try:
                raise RuntimeError("worker lost")
            finally:
                callbacks.close()  # the launcher's finally: buffered steps survive the failure
    assert MlflowClient(tracking_uri).get_run(first.run_id).info.status == "FAILED"

    with CellRun.open(config, tracking=tracking_uri, experiment=experiment) as second:
        assert second.run_id == first.run_id and second.reused
        assert ERROR_TAG not in MlflowClient(tracking_uri).get_run(second.run_id).data.tags
        callbacks = MLflowCallbacks(tracking_uri, second.run_id)
        callbacks.on_start(config, total_steps=4, start_step=2, rank=0, world_size=1)
        callbacks.on_step(2, 4, {"loss": 1.0})
        callbacks.close()
    runs = _runs(tracking_uri, experiment)
    assert [r.info.run_id for r in runs] == [first.run_id]
    assert runs[0].info.status == "FINISHED"
    assert runs[0].data.tags["npsemiseg.attempts"] == "2"
    assert _history(tracking_uri, first.run_id, "train/loss") == [(0, 2.0), (1, 1.5), (2, 1.0)]

    # the same cell in a grid is another run; outside the grid the first one is still found
    with CellRun.open(config, tracking=tracking_uri, experiment=experiment, grid_id="grid-a") as in_grid:
        pass
    assert in_grid.run_id != first.run_id
    client = MlflowClient(tracking_uri)
    exp_id = client.get_experiment_by_name(experiment).experiment_id
    assert find_cell_run(client, exp_id, config.cell_id).info.run_id == first.run_id
    assert find_cell_run(client, exp_id, config.cell_id, "grid-a").info.run_id == in_grid.run_id


def test_failed_and_killed_cells_end_with_their_status(tracking_uri, config):
    failing = with_overrides(config, {"seed": 1})
    with pytest.raises(ValueError):
        with CellRun.open(failing, tracking=tracking_uri, experiment="outcomes") as failed:
            raise ValueError("learning rate exploded at step 7")
    killed_config = with_overrides(config, {"seed": 2})
    with pytest.raises(CellKilled):
        with CellRun.open(killed_config, tracking=tracking_uri, experiment="outcomes") as killed:
            raise CellKilled("terminated by signal 15")
    client = MlflowClient(tracking_uri)
    failed_run = client.get_run(failed.run_id)
    assert failed_run.info.status == "FAILED"
    assert failed_run.data.tags[ERROR_TAG] == "ValueError: learning rate exploded at step 7"
    assert "error/traceback.txt" in {a.path for a in client.list_artifacts(failed.run_id, "error")}
    assert client.get_run(killed.run_id).info.status == "KILLED"


def test_a_run_another_party_ended_killed_stays_killed_when_its_teardown_raises(tracking_uri, config):
    """A search driver records an ASHA stop (KILLED, with its reason) while the cell is still being
    torn down; the teardown's exception must not turn the run FAILED or replace the reason."""
    client = MlflowClient(tracking_uri)
    with pytest.raises(RuntimeError):
        with CellRun.open(with_overrides(config, {"seed": 3}), tracking=tracking_uri, experiment="outcomes") as run:
            client.set_tag(run.run_id, ERROR_TAG, "stopped early by the ASHA scheduler after evaluation 2")
            client.set_terminated(run.run_id, status="KILLED")
            raise RuntimeError("training worker group shut down")
    stopped = client.get_run(run.run_id)
    assert stopped.info.status == "KILLED"
    assert stopped.data.tags[ERROR_TAG] == "stopped early by the ASHA scheduler after evaluation 2"


def test_only_rank_zero_logs(tracking_uri, config):
    with CellRun.open(with_overrides(config, {"seed": 3}), tracking=tracking_uri, experiment="ranks") as run:
        callbacks = MLflowCallbacks(tracking_uri, run.run_id, flush_every_s=0)
        callbacks.on_start(config, total_steps=2, start_step=0, rank=1, world_size=2)
        callbacks.on_step(0, 2, {"loss": 1.0})
        callbacks.on_evaluation(0, {"miou": 0.1})
        callbacks.on_end(RunResult(metrics={"miou": 0.1}, steps=2, checkpoint=None, seconds=1.0, train_seconds=1.0))
    assert MlflowClient(tracking_uri).get_run(run.run_id).data.metrics == {}


def test_sweep_ends_runs_whose_owner_is_gone(tracking_uri, config):
    experiment = "sweep"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = dead.stdout.strip()
    orphan = CellRun.open(with_overrides(config, {"seed": 4}), tracking=tracking_uri, experiment=experiment)
    alive = CellRun.open(with_overrides(config, {"seed": 5}), tracking=tracking_uri, experiment=experiment)
    client = MlflowClient(tracking_uri)
    client.set_tag(orphan.run_id, OWNER_PID_TAG, dead_pid)
    client.set_tag(orphan.run_id, OWNER_START_TAG, "")
    remote = CellRun.open(with_overrides(config, {"seed": 6}), tracking=tracking_uri, experiment=experiment)
    client.set_tag(remote.run_id, OWNER_HOST_TAG, "some-other-host")

    # a cell still running under a live process is not taken over
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        client.set_tag(alive.run_id, OWNER_PID_TAG, str(live.pid))
        client.set_tag(alive.run_id, OWNER_START_TAG, "")
        with pytest.raises(RuntimeError, match="is already running"):
            CellRun.open(with_overrides(config, {"seed": 5}), tracking=tracking_uri, experiment=experiment)
    finally:
        live.kill()
        live.wait()
    client.set_tag(alive.run_id, OWNER_PID_TAG, str(os.getpid()))

    assert sweep_orphaned_runs(experiment, tracking=tracking_uri) == [orphan.run_id]
    assert client.get_run(orphan.run_id).info.status == "KILLED"
    assert client.get_run(orphan.run_id).data.tags[ERROR_TAG].startswith("orphaned: owner process")
    assert client.get_run(alive.run_id).info.status == "RUNNING"
    assert client.get_run(remote.run_id).info.status == "RUNNING"
    assert sweep_orphaned_runs(experiment, tracking=tracking_uri, stale_after_s=0) == [remote.run_id]
    alive.finish("FINISHED")
    assert sweep_orphaned_runs("no-such-experiment", tracking=tracking_uri) == []


def test_format_error_is_one_line():
    assert format_error(RuntimeError("a\n  b")) == "RuntimeError: a b"
    assert len(format_error("x" * 10_000)) == 4000


def test_ending_run_ends_with_the_blocks_outcome(tracking_uri):
    client = MlflowClient(tracking_uri)
    experiment_id = client.create_experiment("ending")

    def ended(body) -> str:
        run_id = client.create_run(experiment_id).info.run_id
        with contextlib.suppress(ValueError, KeyboardInterrupt, CellKilled):
            with ending_run(client, run_id) as end:
                body(end)
        return client.get_run(run_id).info.status

    def fail(end):
        raise ValueError("boom")

    def interrupt(end):
        raise KeyboardInterrupt

    def terminate(end):
        raise CellKilled("terminated by signal 15")

    def some_cells_failed(end):
        end.status = "FAILED"

    assert ended(lambda end: None) == "FINISHED"
    assert ended(fail) == "FAILED"
    assert ended(interrupt) == "KILLED"
    assert ended(terminate) == "KILLED"
    assert ended(some_cells_failed) == "FAILED"


def test_error_reason_is_the_innermost_cause():
    class Wrapper(Exception):
        def __init__(self, cause):
            super().__init__("trial failed")
            self.cause = cause

    try:
        try:
            raise KeyError("lr")
        except KeyError as inner:
            raise RuntimeError("cell failed") from inner
    except RuntimeError as error:
        assert error_reason(Wrapper(error)) == "KeyError: 'lr'"


def test_kept_checkpoints_are_logged_models_and_the_best_is_registered_as_best(tracking_uri, config, tmp_path):
    client = MlflowClient(tracking_uri)
    with CellRun.open(config, tracking=tracking_uri, experiment="models", grid_id=None, parent_run_id=None) as run:
        callbacks = MLflowCallbacks(tracking_uri, run.run_id, flush_every_s=3600)
        callbacks.on_start(config, total_steps=3, start_step=0, rank=0, world_size=1)
        for step, miou in ((1, 0.2), (2, 0.4), (3, 0.3)):
            callbacks.on_checkpoint(step, tmp_path, {"miou": miou, "nll": float("nan")})
        callbacks.on_end(RunResult(metrics={"miou": 0.3}, steps=3, checkpoint=None, seconds=2.0, train_seconds=1.5))
    experiment = client.get_experiment_by_name("models").experiment_id
    models = client.search_logged_models([experiment], filter_string=f"source_run_id = '{run.run_id}'")
    by_step = {int(m.tags[CHECKPOINT_STEP_TAG]): m for m in models}
    assert sorted(by_step) == [1, 2, 3]
    assert all(str(m.status) == "READY" for m in models)
    assert {m.key: m.value for m in by_step[2].metrics} == {"checkpoint/miou": 0.4}  # NaN left out of the model
    assert math.isnan(client.get_run(run.run_id).data.metrics["checkpoint/nll"])  # but on the run, as evaluations
    best = client.get_model_version_by_alias(registered_name(config.cell_id), BEST_ALIAS)
    assert best.tags[MODEL_ID_TAG] == by_step[2].model_id and best.source == by_step[2].artifact_location
    assert best.run_id == run.run_id
    # a rank other than 0 logs nothing
    other = MLflowCallbacks(tracking_uri, run.run_id)
    other.on_start(config, total_steps=3, start_step=0, rank=1, world_size=2)
    other.on_checkpoint(4, tmp_path, {"miou": 0.9})
    assert len(client.search_logged_models([experiment], filter_string=f"source_run_id = '{run.run_id}'")) == 3
