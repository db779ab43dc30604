"""Re-submitting a grid resumes an interrupted cell from its checkpoint (integration, real Ray + MLflow).

The first cell's process dies abruptly after step 2 (the tests' fault injection,
``platform_fixtures.FaultInjection``, ``os._exit``), leaving its MLflow run RUNNING and a checkpoint at step 1 in the
storage. The re-submission skips the finished cell and continues the interrupted one in the
same MLflow run, from step 1.
"""

from __future__ import annotations

import pytest
from mlflow import MlflowClient
from platform_fixtures import FaultInjection

from semiseg_platform.sweeps.grid_runner import run_grid
from semiseg_platform.sweeps.grid_spec import load_spec

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def ray_with_fault(tmp_path_factory):
    """Ray, and the marker of the fault injected into the first submission's cells."""
    import ray

    marker = tmp_path_factory.mktemp("fault") / "fired"
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield marker
    ray.shutdown()


def test_resubmission_resumes_the_interrupted_cell_from_its_checkpoint(tmp_path, ray_with_fault):
    spec = load_spec({
        "name": "resume",
        "experiment": "resume",
        "preset": "smoke",
        "frameworks": ["supervised"],
        "datasets": {"synthetic_cityscapes": ["186", "372"]},
        "heads": ["baseline"],
        "overrides": {"runtime.device": "cpu", "schedule.checkpoint_every_steps": 1},
        "resources": {"workers": 1, "cpus_per_worker": 1},
        "max_concurrent": 1,  # the first cell meets the fault
        "max_failures": 0,  # no retry in the same submission: the next submission resumes it
        "tracking_uri": f"sqlite:///{tmp_path}/mlruns.db",
        "storage": str(tmp_path / "ray_results"),
    })
    fault = FaultInjection(rank=0, step=2, marker=str(ray_with_fault), action="exit")
    first = run_grid(spec, tables_dir=tmp_path / "tables1", emit=lambda line: None, cell_callbacks=(fault,))
    assert ray_with_fault.exists()
    [interrupted] = first.cells("failed")
    assert interrupted.cell_name == "supervised/synthetic_cityscapes/186/baseline"
    assert [o.cell_name for o in first.cells("finished")] == ["supervised/synthetic_cityscapes/372/baseline"]
    client = MlflowClient(spec.tracking_uri)
    run = client.get_run(interrupted.run_id)
    assert run.info.status != "FINISHED"  # left RUNNING by the dead process

    second = run_grid(spec, tables_dir=tmp_path / "tables2", emit=lambda line: None)
    assert second.ok
    assert [o.cell_name for o in second.cells("skipped")] == ["supervised/synthetic_cityscapes/372/baseline"]
    [resumed] = second.cells("finished")
    assert resumed.run_id == interrupted.run_id  # the same MLflow run continues
    run = client.get_run(resumed.run_id)
    assert run.info.status == "FINISHED" and run.data.tags["npsemiseg.attempts"] == "2"
    assert run.data.tags["mlflow.parentRunId"] == second.parent_run_id
    # each attempt logs train/total_steps at its start step: 0, then 1 (the checkpoint)
    starts = sorted(m.step for m in client.get_metric_history(resumed.run_id, "train/total_steps"))
    assert starts == [0, 1]
    assert len(client.search_runs([run.info.experiment_id], "tags.`npsemiseg.kind` = 'cell'")) == 2
