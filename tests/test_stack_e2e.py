"""End to end on the local stack: real PostgreSQL, SeaweedFS (S3), MLflow server and Ray head (integration).

One stack on free loopback ports for the module. A reduced grid (supervised x synthetic_voc x
92 x {baseline, np} at smoke scale, 48 steps, checkpoints every 16) is submitted with
``ray job submit``; the MLflow server is restarted while the cells train. Then: the server holds
both runs FINISHED with every step's metric, their artifacts and the checkpoints are objects in
the bucket (boto3), the tables build through the server. A second grid has its S3 store stopped for a few seconds
while its cells train: uploads retry, or the cells fail cleanly and a re-submission finishes them,
with nothing lost. Security: the Jobs API, the MLflow server and S3 reject requests without
credentials (and MLflow a foreign Host header); no credential appears in MLflow params, tags,
artifacts or in the services' and jobs' logs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
import yaml
from stack_fixtures import reachable_home, stack_settings

from semiseg_platform.devstack import MLFLOW_ADMIN, Stack, basic_auth_header, http_status

pytestmark = pytest.mark.integration

MAX_STEPS = 48
HEADS = ["baseline", "np"]
JOB_TIMEOUT_S = 420


@pytest.fixture(scope="module")
def stack():
    home = reachable_home()
    stack = Stack(stack_settings(home, ray_num_cpus=2))
    try:
        stack.up()
        yield stack
    finally:
        stack.down()
        shutil.rmtree(stack.settings.ray_temp_dir, ignore_errors=True)
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="module")
def client_env(stack):
    """This process's environment pointed at the stack (restored afterwards)."""
    saved = dict(os.environ)
    os.environ.update(stack.client_env(include_secrets=True))
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL", "RAY_ADDRESS", "RAY_AUTH_TOKEN"):
        os.environ.pop(key, None)
    yield dict(os.environ)
    os.environ.clear()
    os.environ.update(saved)


def write_spec(directory: Path, name: str, storage: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    spec = {"name": name, "experiment": name, "preset": "smoke", "frameworks": ["supervised"],
            "datasets": {"synthetic_voc": ["92"]}, "heads": HEADS,
            "overrides": {"runtime.device": "cpu", "schedule.max_steps": MAX_STEPS, "schedule.checkpoint_every_steps": 16},
            "resources": {"workers": 1, "cpus_per_worker": 1, "launcher": "in_process"}, "storage": storage}
    (directory / "spec.yaml").write_text(yaml.safe_dump(spec))
    return directory


def submit(stack: Stack, env: dict[str, str], job_dir: Path) -> str:
    """``ray job submit --no-wait`` of ``python -m jobs.grid spec.yaml``; returns the submission id."""
    ray = str(Path(sys.executable).parent / "ray")
    submission_id = f"npsemiseg-test-{uuid.uuid4().hex[:8]}"
    result = subprocess.run([ray, "job", "submit", "--address", stack.settings.ray_dashboard_url, "--no-wait",
                             "--submission-id", submission_id, "--working-dir", str(job_dir),
                             "--", "python", "-m", "jobs.grid", "spec.yaml"],
                            env=env, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    return submission_id


def jobs_api(stack: Stack, method: str, path: str, timeout: float = 30.0) -> dict:
    """One call of the Ray Jobs REST API with the stack's token as a Bearer header.

    Plain HTTP on purpose: Ray's SDK clients take their auth token from process-wide state
    (RAY_AUTH_MODE / the default token file, read once per process), which another test in the
    same pytest process may have set to a different cluster's token.
    """
    request = urllib.request.Request(f"{stack.settings.ray_dashboard_url}/api/jobs/{path}", method=method,
                                     headers={"Authorization": f"Bearer {stack.secrets.get('ray_token')}"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read() or b"{}")


def wait_job(stack: Stack, submission_id: str, timeout: float = JOB_TIMEOUT_S) -> tuple[str, str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = jobs_api(stack, "GET", submission_id)["status"]
        if status in ("SUCCEEDED", "FAILED", "STOPPED"):
            return status, jobs_api(stack, "GET", f"{submission_id}/logs")["logs"]
        time.sleep(2)
    jobs_api(stack, "POST", f"{submission_id}/stop")
    logs = jobs_api(stack, "GET", f"{submission_id}/logs")["logs"]
    raise AssertionError(f"job {submission_id} still running after {timeout} s:\n{logs[-3000:]}")


def tracking(stack: Stack):
    """A client of the stack's MLflow server, named explicitly: never the process-wide tracking URI,
    which an earlier test in the same pytest process may have set (``mlflow.set_tracking_uri``)."""
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=stack.settings.mlflow_uri)


def cell_runs(stack: Stack, experiment: str) -> list:
    client = tracking(stack)
    found = client.get_experiment_by_name(experiment)
    if found is None:
        return []
    return client.search_runs([found.experiment_id], "tags.`npsemiseg.kind` = 'cell'")


def bucket_keys(stack: Stack, prefix: str) -> list[str]:
    s3 = stack.s3_client()
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=stack.settings.bucket, Prefix=prefix)
    return [item["Key"] for page in pages for item in page.get("Contents", [])]


@pytest.fixture(scope="module")
def restarted_grid(stack, client_env):
    """The reduced grid, with the MLflow server restarted while its cells run."""
    job_dir = write_spec(Path(tempfile.mkdtemp(dir=stack.home)), "stack-e2e", stack.settings.checkpoint_storage)
    submission = submit(stack, client_env, job_dir)
    restarted, job_done = threading.Event(), threading.Event()

    def restart_when_cells_run():
        while not job_done.is_set():
            try:
                if any(run.info.status == "RUNNING" for run in cell_runs(stack, "stack-e2e")):
                    break
            except Exception:  # noqa: BLE001 - the experiment may not exist yet
                pass
            time.sleep(0.5)
        else:
            return
        stack.restart("mlflow")
        restarted.set()

    thread = threading.Thread(target=restart_when_cells_run, daemon=True)
    thread.start()
    try:
        status, logs = wait_job(stack, submission)
    finally:
        job_done.set()
    thread.join(timeout=300)
    return {"status": status, "logs": logs, "restarted": restarted.is_set(), "submission": submission}


def test_grid_job_survives_a_tracking_server_restart(stack, restarted_grid):
    assert restarted_grid["status"] == "SUCCEEDED", restarted_grid["logs"][-4000:]
    assert restarted_grid["restarted"]
    runs = cell_runs(stack, "stack-e2e")
    assert sorted(run.data.tags["head"] for run in runs) == HEADS
    client = tracking(stack)
    for run in runs:
        assert run.info.status == "FINISHED"
        history = client.get_metric_history(run.info.run_id, "train/loss")
        assert sorted(m.step for m in history) == list(range(1, MAX_STEPS + 1)) or \
            sorted(m.step for m in history) == list(range(MAX_STEPS)), sorted(m.step for m in history)
        assert 0.0 <= run.data.metrics["miou"] <= 1.0
        assert run.data.params["schedule.max_steps"] == str(MAX_STEPS)


def test_artifacts_and_checkpoints_are_objects_in_the_bucket(stack, restarted_grid):
    runs = cell_runs(stack, "stack-e2e")
    for run in runs:
        experiment_id, run_id = run.info.experiment_id, run.info.run_id
        keys = bucket_keys(stack, f"mlflow/{experiment_id}/{run_id}/artifacts/")
        assert f"mlflow/{experiment_id}/{run_id}/artifacts/config/config.yaml" in keys
        assert f"mlflow/{experiment_id}/{run_id}/artifacts/checkpoint_uri.txt" in keys
        checkpoint_uri = run.data.tags["checkpoint_uri"]
        assert checkpoint_uri.startswith(f"s3://{stack.settings.bucket}/checkpoints/")
        checkpoint_prefix = checkpoint_uri[len(f"s3://{stack.settings.bucket}/"):].rstrip("/") + "/"
        objects = bucket_keys(stack, checkpoint_prefix)
        assert checkpoint_prefix + ".complete" in objects and any(key.endswith(".pt") for key in objects), objects
    # every cell's newest checkpoints (taken every 16 steps; older ones pruned) are complete in the bucket
    for run in runs:
        lineage = run.data.tags["checkpoint_uri"].rstrip("/").split("/")[-2]
        complete = {key.split("/")[2] for key in bucket_keys(stack, f"checkpoints/{lineage}/") if key.endswith("/.complete")}
        assert f"checkpoint_{MAX_STEPS:09d}" in complete and len(complete) >= 2, complete


def test_tables_are_built_through_the_server(stack, restarted_grid, tmp_path):
    from semiseg_platform.reports import write_report

    tables, written = write_report(stack.settings.mlflow_uri, "stack-e2e", tmp_path)
    cells = tables["cells"]
    runs = {run.data.tags["cell_id"]: run.data.metrics["miou"] for run in cell_runs(stack, "stack-e2e")}
    assert sorted(cells["cell_id"]) == sorted(runs)
    for cell_id, miou in runs.items():
        assert cells.loc[cells.cell_id == cell_id, "miou"].item() == pytest.approx(miou)
    assert any(path.suffix == ".md" for path in written)


def test_s3_outage_mid_grid_loses_nothing(stack, client_env, restarted_grid):
    """S3 stopped for a few seconds while cells train: uploads retry, or the cells fail cleanly and a
    re-submission finishes them from their checkpoints; either way every cell ends FINISHED with
    every step's metric and its checkpoints in the bucket."""
    # its own checkpoint prefix: the same cells' lineages of the first grid would be resumed at their last step
    storage = f"s3://{stack.settings.bucket}/checkpoints-outage"
    job_dir = write_spec(Path(tempfile.mkdtemp(dir=stack.home)), "stack-s3-outage", storage)
    submission = submit(stack, client_env, job_dir)
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while time.monotonic() < deadline and not any(run.info.status == "RUNNING" for run in cell_runs(stack, "stack-s3-outage")):
        time.sleep(0.5)
    stack.stop("seaweedfs")
    try:
        time.sleep(5)
    finally:
        stack.up(("seaweedfs",))
    status, logs = wait_job(stack, submission)
    submissions = 1
    if status != "SUCCEEDED":  # the cells failed cleanly: submit the same grid again
        assert "FAILED" in str([run.info.status for run in cell_runs(stack, "stack-s3-outage")]), logs[-3000:]
        status, logs = wait_job(stack, submit(stack, client_env, job_dir))
        submissions = 2
    assert status == "SUCCEEDED", logs[-4000:]
    print(f"S3 outage: the grid finished after {submissions} submission(s)")  # shown by pytest -rP
    runs = cell_runs(stack, "stack-s3-outage")
    assert sorted(run.data.tags["head"] for run in runs) == HEADS  # one run per cell, reused on re-submission
    client = tracking(stack)
    for run in runs:
        assert run.info.status == "FINISHED" and "miou" in run.data.metrics
        steps = {m.step for m in client.get_metric_history(run.info.run_id, "train/loss")}
        assert steps >= set(range(1, MAX_STEPS)), (submissions, sorted(steps))
        assert run.data.tags["checkpoint_uri"].startswith(storage + "/")
        prefix = run.data.tags["checkpoint_uri"][len(f"s3://{stack.settings.bucket}/"):].rstrip("/") + "/"
        assert prefix + ".complete" in bucket_keys(stack, prefix)


# ----------------------------------------------------------------------------- security
def test_jobs_api_rejects_requests_without_the_token(stack):
    url = f"{stack.settings.ray_dashboard_url}/api/jobs/"
    token = stack.secrets.get("ray_token")
    assert http_status(url) in (401, 403)
    assert http_status(url, headers={"Authorization": "Bearer not-the-token"}) in (401, 403)
    assert http_status(url, headers={"Authorization": f"Bearer {token}"}) == 200
    env = {key: value for key, value in os.environ.items() if not key.startswith("RAY_AUTH")}
    refused = subprocess.run([str(Path(sys.executable).parent / "ray"), "job", "list", "--address",
                              stack.settings.ray_dashboard_url], env=env, capture_output=True, text=True, timeout=120)
    assert refused.returncode != 0


def test_mlflow_server_rejects_anonymous_requests_and_foreign_hosts(stack):
    url = f"{stack.settings.mlflow_uri}/api/2.0/mlflow/experiments/search?max_results=1"
    good = basic_auth_header(MLFLOW_ADMIN, stack.secrets.get("mlflow_admin_password"))
    assert http_status(url) == 401
    assert http_status(url, headers=basic_auth_header(MLFLOW_ADMIN, "wrong")) == 401
    assert http_status(url, headers={**good, "Host": "evil.example:80"}) == 403
    assert http_status(url, headers=good) == 200


def test_s3_rejects_anonymous_requests(stack):
    assert http_status(f"{stack.settings.s3_endpoint}/{stack.settings.bucket}/") == 403


def test_services_listen_on_loopback_only(stack):
    listening = subprocess.run(["ss", "-ltnH"], capture_output=True, text=True).stdout.splitlines()
    local = [line.split()[3] for line in listening if len(line.split()) > 3]
    s = stack.settings
    for port in (s.postgres_port, s.s3_port, s.mlflow_port, s.ray_dashboard_port, s.seaweed_master_port,
                 s.seaweed_volume_port, s.seaweed_filer_port):
        bound = [address for address in local if address.rsplit(":", 1)[1] == str(port)]
        assert bound and all(address.startswith("127.0.0.1:") for address in bound), (port, bound)


def test_no_credential_in_mlflow_or_logs(stack, restarted_grid, tmp_path):
    """Every secret, scanned for in MLflow params / tags / artifacts and every log, job logs included."""
    secrets = stack.secrets.values()
    assert len(secrets) >= 6
    client = tracking(stack)
    texts: dict[str, str] = {"job logs": restarted_grid["logs"]}
    for experiment in client.search_experiments():
        for run in client.search_runs([experiment.experiment_id]):
            texts[f"run {run.info.run_id} params/tags"] = repr(run.data.params) + repr(run.data.tags)
            target = tmp_path / run.info.run_id
            client.download_artifacts(run.info.run_id, "", str(target))
            for path in target.rglob("*"):
                if path.is_file():
                    texts[f"artifact {path}"] = path.read_bytes().decode(errors="replace")
    for path in stack.log_files():
        texts[f"log {path}"] = path.read_bytes().decode(errors="replace")
    assert any(key.startswith("artifact") for key in texts) and any("ray" in key for key in texts)
    leaks = [where for where, text in texts.items() for secret in secrets if secret in text]
    assert not leaks, leaks
