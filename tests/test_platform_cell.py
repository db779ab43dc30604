"""One cell on real Ray Train (local cluster, 2 CPUs, fractional workers) tracked in a real MLflow store."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from platform_fixtures import FaultInjection, fresh_store, running_seaweedfs

from npsemiseg.config import RunConfig, cell_config, config_params, with_overrides
from npsemiseg.hardware_plan import run_record
from semiseg_platform.launch import CellFailedError, run_cell, run_cell_in_process
from semiseg_platform.storage import CheckpointStore, parse_storage
from semiseg_platform.tracking.mlflow_names import (
    EFFECTIVE_ACCUMULATION,
    EFFECTIVE_GLOBAL_BATCH,
    EFFECTIVE_LR,
    FINAL_METRICS,
    plan_params,
)
from semiseg_platform.tracking.mlflow_names import ERROR as ERROR_TAG

pytestmark = pytest.mark.integration

#: fractional CPUs: two workers fit next to Ray Train's controller on a 2-CPU cluster
CPUS = 0.5


@pytest.fixture(scope="module")
def ray_cluster():
    import ray

    from semiseg_platform.launch.ray_runtime import ensure_ray

    with pytest.MonkeyPatch.context() as env:
        # S3 requests must be signed (any key: the test store has no identities): SeaweedFS keeps
        # unsigned aws-chunked uploads verbatim, framing included. Workers inherit this at ray.init.
        if not os.environ.get("AWS_ACCESS_KEY_ID"):
            env.setenv("AWS_ACCESS_KEY_ID", "test")
            env.setenv("AWS_SECRET_ACCESS_KEY", "test")
        ensure_ray(num_cpus=2)
        yield
        ray.shutdown()


@pytest.fixture(scope="module")
def tracking_uri(tmp_path_factory) -> str:
    return fresh_store(tmp_path_factory, "cells")


@pytest.fixture(scope="module")
def config() -> RunConfig:
    """The smoke cell with a checkpoint after every step (3 steps)."""
    return cell_config("smoke", framework="supervised", dataset="synthetic", partition="1/16", head="np",
                                 **{"schedule.checkpoint_every_steps": 1, "runtime.device": "cpu"})


@pytest.fixture(scope="module")
def ddp_reference(ray_cluster, config, tracking_uri, tmp_path_factory):
    """The uninterrupted two-worker cell (DDP over gloo)."""
    storage = tmp_path_factory.mktemp("storage-ddp")
    return run_cell(config, workers=2, cpus_per_worker=CPUS, storage=storage, tracking=tracking_uri,
                    experiment="ddp"), storage


def _runs(uri: str, experiment: str):
    client = MlflowClient(uri)
    return client.search_runs([client.get_experiment_by_name(experiment).experiment_id])


def test_two_worker_cell_is_one_finished_run(ddp_reference, config, tracking_uri):
    result, storage = ddp_reference
    assert result.status == "FINISHED" and result.steps == 3
    assert set(FINAL_METRICS) <= set(result.metrics)
    assert 0.0 <= result.metrics["miou"] <= 1.0
    assert result.loop_seconds > 0 and result.wall_seconds > result.loop_seconds
    # Ray Train persisted the checkpoints under <storage>/<name>/checkpoint_<step>, the last one complete
    assert result.checkpoint_uri == str(storage / result.name / "checkpoint_000000003")
    assert CheckpointStore(parse_storage(storage), result.name).latest() == (3, result.checkpoint_uri)

    runs = _runs(tracking_uri, "ddp")
    assert len(runs) == 1
    run = runs[0]
    assert run.info.run_id == result.run_id and run.info.status == "FINISHED"
    assert run.info.run_name == config.run_name == f"{config.cell_name}/corrected"
    tags = run.data.tags
    assert {k: tags[k] for k in ("framework", "dataset", "partition", "head", "head_name", "cell_id", "world_size")} == {
        "framework": "supervised", "dataset": "synthetic", "partition": config.partition, "head": "np",
        "head_name": "np", "cell_id": config.cell_id, "world_size": "2"}
    assert ERROR_TAG not in tags and "grid_id" not in tags
    # the configuration, plus what the cell trained with on its 2 workers (global batch 2 x 2, lr unscaled)
    assert run.data.params == {**config_params(config), EFFECTIVE_GLOBAL_BATCH: "4", EFFECTIVE_ACCUMULATION: "1",
                               EFFECTIVE_LR: f"{config.optim.lr:.6g}", **plan_params(run_record(config, 2))}
    assert (run.data.params["plan.processes"], run.data.params["plan.global_batch"],
            run.data.params["plan.accumulation_steps"]) == ("2", "4", "1")
    client = MlflowClient(tracking_uri)
    steps = [m.step for m in client.get_metric_history(run.info.run_id, "train/loss")]
    assert sorted(steps) == [1, 2, 3]
    for key in ("train/sec_per_iter", "train/images_per_sec", "train/lr", "eval/miou", "eval/pavpu",
                "time/orchestration_seconds"):
        assert key in run.data.metrics, key
    for key in FINAL_METRICS:
        assert run.data.metrics[key] == pytest.approx(result.metrics[key], nan_ok=True)  # e.g. no inaccurate patch
    artifacts = {a.path for folder in (None, "config", "tables") for a in client.list_artifacts(run.info.run_id, folder)}
    assert {"config/config.yaml", "tables/per_class_iou.csv", "checkpoint_uri.txt"} <= artifacts


def test_killed_worker_resumes_as_one_run(ddp_reference, config, tracking_uri, tmp_path, monkeypatch):
    reference, _ = ddp_reference
    marker = tmp_path / "fault-happened"
    fault = FaultInjection(rank=1, step=2, marker=str(marker))
    result = run_cell(config, workers=2, cpus_per_worker=CPUS, storage=tmp_path / "storage", tracking=tracking_uri,
                      experiment="resume", max_failures=1, callbacks=[fault])
    assert marker.exists(), "the injected failure did not happen"
    assert result.status == "FINISHED" and result.steps == 3
    for key in FINAL_METRICS:
        assert result.metrics[key] == pytest.approx(reference.metrics[key], rel=1e-5, abs=1e-7), key
    runs = _runs(tracking_uri, "resume")
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    assert runs[0].data.tags["npsemiseg.attempts"] == "2"
    # the second attempt continued from the checkpoint of step 1: every step is in the history
    history = MlflowClient(tracking_uri).get_metric_history(result.run_id, "train/loss")
    assert {m.step for m in history} == {1, 2, 3}


def test_raising_cell_leaves_its_run_failed(ray_cluster, config, tracking_uri, tmp_path, monkeypatch):
    fault = FaultInjection(rank=0, step=1, marker=str(tmp_path / "marker"), action="raise")
    with pytest.raises(CellFailedError) as info:
        run_cell(config, workers=1, cpus_per_worker=CPUS, storage=tmp_path / "storage", tracking=tracking_uri,
                 experiment="failing", callbacks=[fault])
    failed = info.value.result
    assert failed.status == "FAILED"
    assert "InjectedFault: injected failure on rank 0 after step 1" in failed.error
    runs = _runs(tracking_uri, "failing")
    assert len(runs) == 1 and runs[0].info.run_id == failed.run_id
    assert runs[0].info.status == "FAILED"
    assert runs[0].data.tags[ERROR_TAG] == "InjectedFault: injected failure on rank 0 after step 1"


def test_local_mode_cell_resumes_under_the_same_name(config, tracking_uri, tmp_path):
    """``workers=0`` (Ray Train's local mode, no cluster needed): stopped at step 2, run again, resumed;
    the result equals an uninterrupted in-process run of the same cell."""
    storage = tmp_path / "storage"
    stopped = run_cell(with_overrides(config, {"runtime.stop_at_step": 2}), workers=0, storage=storage,
                       tracking=tracking_uri, experiment="local", name="lineage")
    assert stopped.status == "KILLED" and stopped.steps == 2 and stopped.metrics == {}
    assert CheckpointStore(parse_storage(storage), "lineage").steps() == [1, 2]
    resumed = run_cell(config, workers=0, storage=storage, tracking=tracking_uri, experiment="local", name="lineage")
    assert resumed.status == "FINISHED" and resumed.steps == 3 and resumed.run_id == stopped.run_id
    history = MlflowClient(tracking_uri).get_metric_history(resumed.run_id, "train/loss")
    assert sorted(m.step for m in history) == [1, 2, 3]  # step 3 only after the resume: no step twice

    straight = run_cell_in_process(config, storage=tmp_path / "other", tracking=tracking_uri, experiment="straight")
    assert straight.checkpoint_uri == str(tmp_path / "other" / straight.name / "checkpoint_000000003")
    for key in FINAL_METRICS:
        assert resumed.metrics[key] == pytest.approx(straight.metrics[key], rel=1e-6, abs=1e-8), key
    runs = _runs(tracking_uri, "local")
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"


def test_in_process_cell_reports_to_tune(ray_cluster, config, tracking_uri, tmp_path):
    """The grid/search launcher: a Tune trial runs the loop itself, checkpoints through Tune."""
    from ray import tune

    from semiseg_platform.launch import TuneReporter

    def trainable(_):
        run_cell_in_process(config, reporter=TuneReporter(), tracking=tracking_uri, experiment="tune")

    tuner = tune.Tuner(tune.with_resources(trainable, {"CPU": CPUS}),
                       run_config=tune.RunConfig(name="cell", storage_path=str(tmp_path)))
    result = tuner.fit()[0]
    assert result.error is None
    assert set(FINAL_METRICS) <= set(result.metrics) and result.metrics["step"] == 3
    assert (Path(result.checkpoint.path) / "state.pt").is_file()
    runs = _runs(tracking_uri, "tune")
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    assert runs[0].data.metrics["miou"] == pytest.approx(result.metrics["miou"])


@pytest.fixture(scope="module")
def s3_endpoint(tmp_path_factory):
    """A real S3-compatible store (SeaweedFS) for the module; skipped when ``weed`` is not installed."""
    with running_seaweedfs(tmp_path_factory.mktemp("seaweedfs")) as (_, endpoint):
        yield endpoint


def test_s3_storage_with_endpoint_override(ray_cluster, config, tracking_uri, s3_endpoint):
    """Checkpoints on an S3-compatible store through Ray Train, then resumed from there in local mode."""
    uri = f"s3://npsemiseg-test/cells?endpoint_override={s3_endpoint}"
    result = run_cell(config, workers=1, cpus_per_worker=CPUS, storage=uri, tracking=tracking_uri, experiment="s3",
                      name="s3cell")
    assert result.status == "FINISHED"
    assert result.checkpoint_uri == "s3://npsemiseg-test/cells/s3cell/checkpoint_000000003"
    store = CheckpointStore(parse_storage(uri), "s3cell")
    assert store.latest() == (3, result.checkpoint_uri)
    # the same lineage again, in local mode: it resumes from the S3 checkpoint at the last step
    again = run_cell(config, workers=0, storage=uri, tracking=tracking_uri, experiment="s3", name="s3cell")
    assert again.status == "FINISHED" and again.steps == 3 and again.run_id == result.run_id
    assert again.metrics["miou"] == pytest.approx(result.metrics["miou"])
    history = MlflowClient(tracking_uri).get_metric_history(result.run_id, "train/loss")
    assert sorted(m.step for m in history) == [1, 2, 3]  # no step was trained twice
