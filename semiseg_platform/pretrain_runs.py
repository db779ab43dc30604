"""The pretraining of the mini-study's backbone as an MLflow run of its own.

``pretrain_tracked(config, ...)`` runs ``npsemiseg.pretrain.pretrain`` and records it: a run
tagged ``npsemiseg.kind = pretrain`` and ``pretrain_key`` (the cache key), params = the
``PretrainConfig``, metrics ``pretrain/loss`` / ``pretrain/lr`` per logged step and the held-out
corpus ``pretrain/miou`` / ``pretrain/pixel_acc``, tag ``weights_path``, artifact
``pretrain/pretrain.json``. A cache hit trains nothing and logs nothing new when a FINISHED run of
the same key exists (its id is returned); otherwise it records a run tagged
``pretrain.cache_hit = true`` with the cached metrics. ``pretrain_command`` is what
``npsemiseg pretrain`` calls; ``build_named_pretrainings`` is what a grid calls before its cells (a name the
package ships, ``npsemiseg.pretrain.SHIPPED``, is checked, not built).
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, fields
from pathlib import Path

from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient

from npsemiseg.callbacks import Callbacks
from npsemiseg.config import RunConfig
from npsemiseg.pretrain import (
    PRETRAINED,
    PRETRAINED_PREFIX,
    RECORD_FILE,
    SHIPPED,
    PretrainConfig,
    PretrainResult,
    file_sha256,
    pretrain,
    pretraining_name,
    ship_pretraining,
    shipped_weights,
)
from semiseg_platform.tracking import DEFAULT_EXPERIMENT, ending_run, prepare_experiment, resolve_tracking_uri, search_all_runs
from semiseg_platform.tracking.mlflow_names import KIND, KIND_PRETRAIN, PRETRAIN_KEY

log = logging.getLogger(__name__)

CACHE_HIT_TAG = "pretrain.cache_hit"
WEIGHTS_PATH_TAG = "weights_path"


class PretrainMLflow(Callbacks):
    """Logs the pretraining's step and held-out metrics to one MLflow run; with ``emit``, also a progress line
    (step, loss, elapsed, ETA) about every ``progress_every_s`` seconds and at the last step."""

    def __init__(self, client: MlflowClient, run_id: str, *, emit: Callable[[str], None] | None = None,
                 progress_every_s: float = 30.0) -> None:
        self.client, self.run_id = client, run_id
        self.emit, self.progress_every_s = emit, progress_every_s
        self.started = self.last_line = time.monotonic()

    def _log(self, step: int, values: dict[str, float]) -> None:
        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, float(v), now, step) for k, v in values.items()])

    def on_step(self, step: int, total_steps: int, logs: dict[str, float]) -> None:
        self._log(step, logs)
        now = time.monotonic()
        if self.emit is not None and (now - self.last_line >= self.progress_every_s or step == total_steps):
            self.last_line, elapsed = now, now - self.started
            eta = elapsed / step * (total_steps - step)
            self.emit(f"pretrain step {step}/{total_steps}: loss {logs.get('pretrain/loss', float('nan')):.4f} | "
                      f"{_minutes(elapsed)} elapsed, ETA {_minutes(eta)}")

    def on_evaluation(self, step: int, metrics: dict[str, float]) -> None:
        self._log(step, {f"pretrain/{k}": v for k, v in metrics.items()})


def _minutes(seconds: float) -> str:
    return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"


def find_pretrain_run(client: MlflowClient, experiment_id: str, key: str) -> str | None:
    """The latest FINISHED pretraining run of cache key ``key``, or None."""
    runs = search_all_runs(client, [experiment_id], f"tags.`{KIND}` = '{KIND_PRETRAIN}' and "
                                                     f"tags.{PRETRAIN_KEY} = '{key}' and attributes.status = 'FINISHED'")
    return max(runs, key=lambda r: r.info.end_time or 0).info.run_id if runs else None


def pretrain_tracked(config: PretrainConfig | None = None, *, cache_dir: str | os.PathLike | None = None,
                     tracking: str | None = None, experiment: str = DEFAULT_EXPERIMENT,
                     emit: Callable[[str], None] | None = None) -> tuple[PretrainResult, str]:
    """Pretrain (or hit the cache) and record it in MLflow; returns the result and the run id. ``emit``: where the
    progress lines of a training go (none on a cache hit)."""
    config = config or PretrainConfig()
    uri = resolve_tracking_uri(tracking)
    experiment_id = prepare_experiment(uri, experiment)
    client = MlflowClient(uri)
    existing = find_pretrain_run(client, experiment_id, config.key)
    if existing is not None:
        result = pretrain(config, cache_dir=cache_dir)
        if result.cache_hit:
            log.info("pretraining %s: cache hit, recorded by run %s", config.key, existing)
            return result, existing
    run = client.create_run(experiment_id, run_name=f"pretrain/{config.backbone}/{config.key}",
                            tags={KIND: KIND_PRETRAIN, PRETRAIN_KEY: config.key})
    run_id = run.info.run_id
    with ending_run(client, run_id):
        client.log_batch(run_id, params=[Param(f.name, str(getattr(config, f.name))) for f in fields(config)])
        result = pretrain(config, cache_dir=cache_dir, callbacks=PretrainMLflow(client, run_id, emit=emit))
        client.set_tag(run_id, CACHE_HIT_TAG, str(result.cache_hit).lower())
        client.set_tag(run_id, WEIGHTS_PATH_TAG, str(result.path))
        PretrainMLflow(client, run_id).on_evaluation(config.steps, result.metrics)
        client.log_metric(run_id, "pretrain/seconds", result.seconds)
        with tempfile.TemporaryDirectory() as scratch:
            record = Path(scratch) / RECORD_FILE
            record.write_text(json.dumps({"key": result.key, "config": asdict(config), "metrics": result.metrics,
                                          "path": str(result.path), "cache_hit": result.cache_hit}, indent=2))
            client.log_artifact(run_id, str(record), artifact_path="pretrain")
    return result, run_id


def pretrain_command(*, backbone: str = "resnet_small", steps: int = PretrainConfig.steps,
                     seed: int = PretrainConfig.seed, corpus_size: int = PretrainConfig.corpus_size,
                     image_size: int = PretrainConfig.image_size, batch_size: int = PretrainConfig.batch_size,
                     lr: float = PretrainConfig.lr, optimizer: str = PretrainConfig.optimizer,
                     threads: int = PretrainConfig.threads,
                     cache_dir: str | None = None, tracking: str | None = None,
                     experiment: str = DEFAULT_EXPERIMENT, emit: Callable[[str], None] = print,
                     ship: bool = False, name: str | None = None) -> Path:
    """``npsemiseg pretrain``: print and return the path to give as ``model.weights=PATH``; say whether the build
    is the file the package ships for its configuration; with ``ship`` (a named configuration of ``PRETRAINED``
    only), copy it into the package's weights folder and print the ``SHIPPED`` entry to record. ``name``: build
    ``PRETRAINED[name]`` (the configuration arguments are then not used)."""
    if name is not None and name not in PRETRAINED:
        raise ValueError(f"--name: unknown pretraining {name!r}, expected one of {sorted(PRETRAINED)}")
    config = PRETRAINED[name] if name is not None else PretrainConfig(
        backbone=backbone, steps=steps, seed=seed, corpus_size=corpus_size, image_size=image_size,
        batch_size=batch_size, lr=lr, optimizer=optimizer, threads=threads)
    shipped_name = pretraining_name(config)
    if ship and shipped_name is None:
        raise ValueError(f"--ship: only a named configuration is shipped (--name, one of {sorted(PRETRAINED)}; without "
                         "--name, the default's)")
    result, run_id = pretrain_tracked(config, cache_dir=cache_dir, tracking=tracking, experiment=experiment,
                                      emit=emit)
    source = "cache hit" if result.cache_hit else f"trained in {result.seconds:.0f} s"
    emit(f"pretrained {config.backbone} (key {result.key}, {source}; corpus mIoU {result.metrics.get('miou', float('nan')):.3f}, "
         f"MLflow run {run_id})")
    emit(f"model.weights={result.path}")
    for name, entry in SHIPPED.items():
        if entry.key == result.key:
            same = file_sha256(result.path) == entry.sha256
            emit(f"{PRETRAINED_PREFIX}{name} ships this configuration: the build here is "
                 f"{'the same file' if same else 'another file'} (shipped SHA-256 {entry.sha256})")
    if ship:
        entry = ship_pretraining(shipped_name, result.path, command=ship_command(shipped_name))
        emit(f"shipped {entry.path} ({entry.path.stat().st_size} bytes, SHA-256 {entry.sha256}); record it as "
             f"SHIPPED[{shipped_name!r}] = {entry!r} in npsemiseg/pretrain.py")
    return result.path


#: the command that builds (or finds cached) the default pretraining and copies it into the package
SHIP_COMMAND = "npsemiseg pretrain --ship"


def ship_command(name: str) -> str:
    """The command that builds (or finds cached) ``PRETRAINED[name]`` and copies it into the package."""
    return SHIP_COMMAND if name == "default" else f"npsemiseg pretrain --name {name} --ship"


def build_named_pretrainings(configs: Iterable[RunConfig], *, tracking: str, experiment: str,
                             emit: Callable[[str], None] = print) -> dict[str, str]:
    """Build (or find cached) every ``pretrained:<name>`` the cells' ``model.weights`` name, in this process, each
    recorded as its MLflow run, so a first ``make study`` shows the pretraining instead of a cell that seems to hang
    for its first minutes. Returns name -> run id. Each node of a cluster still builds its own cache on first use."""
    names = sorted({w[len(PRETRAINED_PREFIX):] for w in (c.model.weights for c in configs)
                    if isinstance(w, str) and w.startswith(PRETRAINED_PREFIX)})
    runs = {}
    for name in names:
        if name in SHIPPED:  # nothing to build: the package's file (a missing or changed file fails here, early)
            emit(f"{PRETRAINED_PREFIX}{name}: shipped {shipped_weights(name)} (SHA-256 {SHIPPED[name].sha256})")
            continue
        config = PRETRAINED[name]
        emit(f"{PRETRAINED_PREFIX}{name}: {config.backbone}, {config.steps} steps on {config.corpus_size} corpus images "
             f"(key {config.key}; nothing to do when cached)")
        result, runs[name] = pretrain_tracked(config, tracking=tracking, experiment=experiment,
                                              emit=lambda line, name=name: emit(f"{PRETRAINED_PREFIX}{name}: {line}"))
        source = "cache hit" if result.cache_hit else f"trained in {result.seconds:.0f} s"
        emit(f"{PRETRAINED_PREFIX}{name}: {source}, corpus mIoU {result.metrics.get('miou', float('nan')):.3f}, "
             f"MLflow run {runs[name]}")
    return runs
