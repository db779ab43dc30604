"""The ``npsemiseg`` command line: help, one-line errors before anything starts, a local-mode run."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from semiseg_platform.cli.app import parse_assignments
from semiseg_platform.cli.main import app

runner = CliRunner()

CELL = ["run", "--framework", "supervised", "--dataset", "synthetic", "--partition", "1/16", "--head", "baseline"]


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """An empty working directory (where the default store and storage would appear)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    return tmp_path


@pytest.mark.parametrize("command", [[], ["run"], ["config", "show"], ["sweep-orphans"], ["tables"], ["grid"], ["ui"], ["stack"],
                                     ["search"]])
def test_every_command_has_help(command):
    result = runner.invoke(app, [*command, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.output


def test_ui_serves_the_local_store_and_refuses_a_tracking_server(workdir):
    result = runner.invoke(app, ["ui", "--print", "--port", "5011"])
    assert result.exit_code == 0, result.output
    command = result.output.split()
    assert command[1:4] == ["-m", "mlflow", "server"]
    assert command[command.index("--backend-store-uri") + 1] == f"sqlite:///{workdir}/mlruns.db"
    assert command[command.index("--host") + 1] == "127.0.0.1" and command[command.index("--port") + 1] == "5011"
    assert command[command.index("--artifacts-destination") + 1] == (workdir / "mlartifacts").as_uri()
    refused = runner.invoke(app, ["ui", "--tracking", "http://127.0.0.1:5000", "--print"])
    assert refused.exit_code == 2 and "is a tracking server" in refused.output
    assert not (workdir / "mlruns.db").exists()


def test_run_help_lists_the_options():
    text = runner.invoke(app, ["run", "--help"], terminal_width=200).output
    for option in ("--framework", "--dataset", "--partition", "--head", "--preset", "--config", "--set", "--workers",
                   "--gpus-per-worker", "--cpus-per-worker", "--storage", "--max-failures", "--min-workers", "--experiment"):
        assert option in text, option


@pytest.mark.parametrize("extra, message", [
    (["--framework", "nope"], "framework: unknown name 'nope', expected one of"),
    (["--partition", "1/3"], "partition"),
    (["--set", "optim.lr"], "--set: expected key=value (e.g. optim.lr=0.01), got 'optim.lr'"),
    (["--set", "optim.bogus=1"], "unknown configuration key 'optim.bogus'"),
    (["--set", "optim.lr=-1"], "optim.lr"),
    (["--preset", "huge"], "huge"),
    (["--workers", "-1"], "workers: expected an integer >= 0"),
    (["--workers", "2", "--min-workers", "3"], "min_workers: expected an integer from 1 to workers (2"),
    (["--config", "missing.yaml"], "--config: file missing.yaml does not exist"),
    (["--storage", "gs://bucket/x"], "scheme 'gs'"),
])
def test_bad_input_is_one_line_and_starts_nothing(workdir, extra, message):
    args = list(CELL)
    for i in range(0, len(extra), 2):  # replace an option of CELL or add it
        if extra[i] in args:
            args[args.index(extra[i]) + 1] = extra[i + 1]
        else:
            args += extra[i:i + 2]
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert message in lines[0]
    assert list(workdir.iterdir()) == []  # no store, no storage, no Ray session directory


def test_unreachable_storage_is_one_line(workdir):
    uri = f"s3://bucket/prefix?endpoint_override=http://127.0.0.1:{_closed_port()}"
    result = runner.invoke(app, [*CELL, "--storage", uri])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "is not reachable or not writable" in lines[0] and "s3://bucket/prefix" in lines[0]
    assert list(workdir.iterdir()) == []


def test_missing_cell_options_are_named(workdir):
    result = runner.invoke(app, ["run", "--framework", "supervised"])
    assert result.exit_code == 2
    assert result.stderr.strip() == "error: missing option(s) --dataset, --partition, --head (or give --config FILE)"


def test_parse_assignments():
    assert parse_assignments(["optim.lr=0.01", "head.options={a: 1}", "x="]) == {
        "optim.lr": "0.01", "head.options": "{a: 1}", "x": ""}
    for bad in ("=1", "no equals", "a b=1"):
        with pytest.raises(ValueError, match="--set"):
            parse_assignments([bad])


@pytest.mark.integration
def test_console_script_reports_errors(workdir):
    """The installed entry point (``main``) in a fresh process: exit status and one stderr line."""
    proc = subprocess.run([sys.executable, "-c", "from semiseg_platform.cli.main import main; main()",
                           *CELL, "--set", "schedule.max_steps=zero"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "schedule.max_steps" in proc.stderr


@pytest.mark.integration
def test_run_in_local_mode_prints_metrics_and_url(workdir, tmp_path_factory):
    from platform_fixtures import fresh_store

    store = fresh_store(tmp_path_factory, "cli")
    config = workdir / "cell.yaml"
    from npsemiseg.config import cell_config

    config.write_text(cell_config("smoke", framework="supervised", dataset="synthetic", partition="1/16",
                                            head="baseline").to_yaml())
    result = runner.invoke(app, ["run", "--config", str(config), "--head", "mc_dropout", "--set", "schedule.max_steps=2",
                                 "--workers", "0", "--tracking", store, "--storage", "ckpt"])
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "cell supervised/synthetic/1/16/mc_dropout" in out and "FINISHED after 2 steps" in out
    assert "  miou " in out and "  ece " in out
    assert "MLflow run: http://127.0.0.1:5000/#/experiments/" in out
    assert (workdir / "ckpt").is_dir()


@pytest.mark.integration
def test_sigterm_ends_the_run_killed(workdir, tmp_path_factory):
    """A cell stopped by SIGTERM mid-training: exit 130, its MLflow run KILLED (never left RUNNING)."""
    import signal

    from mlflow.tracking import MlflowClient
    from platform_fixtures import fresh_store

    store = fresh_store(tmp_path_factory, "sigterm")
    proc = subprocess.Popen(
        [sys.executable, "-u", "-c", "from semiseg_platform.cli.main import main; main()", *CELL, "--workers", "0",
         "--set", "schedule.epochs=1000", "--set", "schedule.max_steps=100000", "--tracking", store,
         "--experiment", "sigterm"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for line in proc.stdout:  # the first progress line: training is under way
            if line.startswith("step "):
                break
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, stderr[-2000:]
    assert "KILLED (terminated by signal 15)" in stderr
    client = MlflowClient(store)
    runs = client.search_runs([client.get_experiment_by_name("sigterm").experiment_id])
    assert len(runs) == 1 and runs[0].info.status == "KILLED"
    assert runs[0].data.tags["error"] == "CellKilled: terminated by signal 15"


@pytest.mark.parametrize(("option", "shown", "hidden"), [([], "progress", "debug"), (["--quiet"], "warning", "progress"),
                                                          (["--verbose"], "debug", None)])
def test_quiet_and_verbose_decide_what_logging_reaches_the_terminal(option, shown, hidden):
    import logging

    from semiseg_platform.cli.app import main_options

    @app.command("log-probe", hidden=True)
    def log_probe() -> None:
        logging.getLogger("semiseg_platform.progress").info("progress")
        logging.getLogger("semiseg_platform.sweeps.submission").debug("debug")
        logging.getLogger("semiseg_platform.sweeps.submission").warning("warning")

    try:
        result = runner.invoke(app, [*option, "log-probe"])
    finally:
        app.registered_commands[:] = [c for c in app.registered_commands if c.name != "log-probe"]
        main_options(quiet=False, verbose=False)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert shown in lines and "warning" in lines
    assert hidden is None or hidden not in lines


@pytest.mark.integration
def test_one_device_run_trains_in_process_with_its_batch_lr_and_throughput(workdir, tmp_path_factory):
    """The default launcher of a one-device cell on the embedded default: this process (no Ray started),
    same checkpoints and tracking; the start line, the effective batch and LR params and the per-epoch throughput metrics."""
    import ray
    from mlflow.tracking import MlflowClient
    from platform_fixtures import fresh_store

    from semiseg_platform.tracking import mlflow_names

    store = fresh_store(tmp_path_factory, "inproc")
    result = runner.invoke(app, [*CELL, "--set", "schedule.max_steps=2", "--tracking", store, "--storage", "ckpt",
                                 "--experiment", "inproc"])
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "in this process" in out and "FINISHED after 2 steps" in out and not ray.is_initialized()
    assert "global batch 2 (reference 2), lr 0.01 (lr_scaling none)" in out
    assert any(p.name.startswith("checkpoint_") for p in (workdir / "ckpt").rglob("*"))
    client = MlflowClient(store)
    run = client.search_runs([client.get_experiment_by_name("inproc").experiment_id])[0]
    assert run.data.params[mlflow_names.EFFECTIVE_GLOBAL_BATCH] == "2" and run.data.params[mlflow_names.EFFECTIVE_LR] == "0.01"
    assert run.data.metrics[mlflow_names.PEAK_MEMORY_MB] > 10 and run.data.metrics[mlflow_names.EPOCH_IMAGES_PER_SEC] > 0
    # its plan record, and its final checkpoint a LoggedModel registered as the cell's best
    assert (run.data.params["plan.processes"], run.data.params["plan.global_batch"]) == ("1", "2")
    best = client.get_model_version_by_alias(f"npsemiseg-{run.data.tags['cell_id']}", "best")
    assert best.run_id == run.info.run_id
    assert client.get_logged_model(best.tags["npsemiseg.model_id"]).source_run_id == run.info.run_id


@pytest.mark.integration
def test_a_cluster_short_of_resources_prints_waiting_lines_then_fails():
    """``wait_for_resources`` on a real (local) Ray: a line at once and every ``every_s``, then the timeout."""
    import ray

    from semiseg_platform.preflight import Needed, PreflightError, wait_for_resources

    lines: list[str] = []
    started = not ray.is_initialized()
    if started:
        ray.init(address="local", num_cpus=1, num_gpus=0, include_dashboard=False, log_to_driver=False)
    try:
        wait_for_resources(Needed(1, 0), timeout_s=5, emit=lines.append)  # fits: returns at once
        assert lines == []
        with pytest.raises(PreflightError, match=r"resources: the cluster still lacks 2 GPU\(s\) \(has 0\).*after 1.5 s"):
            wait_for_resources(Needed(1, 2), timeout_s=1.5, emit=lines.append, every_s=0.5, poll_s=0.1)
    finally:
        if started:
            ray.shutdown()
    assert 2 <= len(lines) <= 4 and all(line.startswith("waiting for resources: 1 CPU(s) and 2 GPU(s)") for line in lines)
