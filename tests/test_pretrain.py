"""The pretraining cache of the mini-study's backbone: miss trains, hit loads, a corrupted or partial file is rebuilt."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient
from platform_fixtures import fresh_store
from typer.testing import CliRunner

from npsemiseg.models.backbones import build_backbone
from npsemiseg.pretrain import CHECKSUM_SUFFIX, WEIGHTS_FILE, PretrainConfig, pretrain
from semiseg_platform.cli.main import app
from semiseg_platform.pretrain_runs import pretrain_command, pretrain_tracked
from semiseg_platform.tracking.mlflow_names import PRETRAIN_KEY

TINY = PretrainConfig(corpus_size=8, holdout_size=2, image_size=32, steps=2, batch_size=2, log_every=1)


def test_miss_then_hit_and_the_file_loads_as_model_weights(tmp_path):
    first = pretrain(TINY, cache_dir=tmp_path)
    assert not first.cache_hit and first.path.name == WEIGHTS_FILE and first.path.parent.name == TINY.key
    assert set(first.metrics) == {"miou", "pixel_acc"}
    second = pretrain(TINY, cache_dir=tmp_path)
    assert second.cache_hit and second.path == first.path and second.metrics == first.metrics
    backbone = build_backbone("resnet_small", weights=str(first.path))
    saved = torch.load(first.path, weights_only=True)
    assert torch.equal(backbone.state_dict()["conv1.weight"], saved["conv1.weight"])


def test_another_configuration_is_another_key(tmp_path):
    other = PretrainConfig(**{**TINY.__dict__, "seed": TINY.seed + 1})
    assert other.key != TINY.key
    assert PretrainConfig(**{**TINY.__dict__, "log_every": 7}).key == TINY.key  # logging is not part of it


def test_the_optimizer_is_part_of_the_recipe_and_changes_the_weights(tmp_path):
    sgd = PretrainConfig(**{**TINY.__dict__, "optimizer": "sgd"})
    assert sgd.key != TINY.key and TINY.optimizer == "adamw"
    adamw_state = torch.load(pretrain(TINY, cache_dir=tmp_path).path, weights_only=True)
    sgd_state = torch.load(pretrain(sgd, cache_dir=tmp_path).path, weights_only=True)
    assert not torch.equal(adamw_state["conv1.weight"], sgd_state["conv1.weight"])
    with pytest.raises(ValueError, match="optimizer: expected one of \\['adamw', 'sgd'\\], got 'adam'"):
        PretrainConfig(optimizer="adam")


def test_corrupted_or_partial_file_is_rebuilt_never_loaded(tmp_path):
    first = pretrain(TINY, cache_dir=tmp_path)
    first.path.write_bytes(first.path.read_bytes()[:100])  # truncated
    rebuilt = pretrain(TINY, cache_dir=tmp_path)
    assert not rebuilt.cache_hit
    build_backbone("resnet_small", weights=str(rebuilt.path))  # a complete file again
    (rebuilt.path.parent / (WEIGHTS_FILE + CHECKSUM_SUFFIX)).unlink()  # crash before the checksum was written
    assert not pretrain(TINY, cache_dir=tmp_path).cache_hit
    assert pretrain(TINY, cache_dir=tmp_path).cache_hit


def test_tracked_pretraining_is_one_mlflow_run_and_a_hit_reuses_it(tmp_path_factory, tmp_path):
    uri = fresh_store(tmp_path_factory, "pretrain")
    result, run_id = pretrain_tracked(TINY, cache_dir=tmp_path, tracking=uri, experiment="pre")
    client = MlflowClient(uri)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.tags[PRETRAIN_KEY] == TINY.key
    assert run.data.tags["pretrain.cache_hit"] == "false" and run.data.params["steps"] == "2"
    assert run.data.metrics["pretrain/miou"] == result.metrics["miou"]
    assert [m.step for m in client.get_metric_history(run_id, "pretrain/loss")] == [1, 2]
    again, again_id = pretrain_tracked(TINY, cache_dir=tmp_path, tracking=uri, experiment="pre")
    assert again.cache_hit and again_id == run_id
    lines: list[str] = []
    path = pretrain_command(steps=2, corpus_size=8, image_size=32, batch_size=2, cache_dir=str(tmp_path / "cli"),
                            tracking=uri, experiment="pre", emit=lines.append)
    assert lines[-1] == f"model.weights={path}" and path.exists()
    # a training prints its progress (the last step at least); the cache hit above printed none
    assert [line.split(":")[0] for line in lines[:-2]] == ["pretrain step 2/2"]
    assert "elapsed, ETA 0m00s" in lines[0]


def test_pretrained_name_resolves_to_the_cached_file(tmp_path, monkeypatch):
    import pytest

    from npsemiseg import pretrain as module

    monkeypatch.setitem(module.PRETRAINED, "tiny", TINY)
    path = module.resolve_weights("pretrained:tiny", cache_dir=tmp_path)
    assert path == str(tmp_path / TINY.key / WEIGHTS_FILE)
    assert module.resolve_weights("imagenet") == "imagenet" and module.resolve_weights(None) is None
    with pytest.raises(ValueError, match="unknown pretraining 'nope'"):
        module.resolve_weights("pretrained:nope")


def test_a_cell_trains_from_a_pretrained_name(tmp_path, monkeypatch, smoke_config):
    from npsemiseg import pretrain as module
    from npsemiseg.training import train

    monkeypatch.setenv(module.CACHE_ENV, str(tmp_path))
    monkeypatch.setitem(module.PRETRAINED, "tiny", TINY)
    config = smoke_config(dataset="study", **{"model.weights": "pretrained:tiny", "runtime.device": "cpu"})
    assert 0.0 <= train(config).metrics["miou"] <= 1.0
    assert (tmp_path / "pretrain" / TINY.key / WEIGHTS_FILE).exists()


def test_cli_prints_the_weights_path_and_rejects_bad_options_before_anything(tmp_path_factory, tmp_path):
    uri = fresh_store(tmp_path_factory, "pretrain_cli")
    args = ["pretrain", "--steps", "2", "--corpus-size", "8", "--image-size", "32", "--batch-size", "2",
            "--cache-dir", str(tmp_path / "cache"), "--tracking", uri, "--experiment", "pre"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    weights = result.output.strip().splitlines()[-1].removeprefix("model.weights=")
    assert Path(weights).is_file() and "cache hit" not in result.output
    assert "cache hit" in CliRunner().invoke(app, args).output
    bad = CliRunner().invoke(app, ["pretrain", "--steps", "0", "--cache-dir", str(tmp_path / "bad")])
    assert bad.exit_code == 2 and bad.stderr.strip() == "error: steps: expected a positive integer, got 0"
    assert not (tmp_path / "bad").exists()


def test_preflight_accepts_a_pretrained_name_before_its_file_exists(tmp_path, monkeypatch, smoke_config):
    from semiseg_platform.preflight import check_weights

    monkeypatch.setenv("NPSEMISEG_CACHE", str(tmp_path))  # an empty cache: nothing built yet
    check_weights([smoke_config(dataset="study", **{"model.weights": "pretrained:default"})])
    assert not (tmp_path / "pretrain").exists()  # preflight does not build it


def test_a_grid_builds_its_named_pretrainings_once_before_its_cells(tmp_path_factory, tmp_path, monkeypatch, smoke_config):
    from npsemiseg import pretrain as module
    from semiseg_platform.pretrain_runs import build_named_pretrainings

    uri = fresh_store(tmp_path_factory, "pretrain_grid")
    monkeypatch.setenv(module.CACHE_ENV, str(tmp_path))
    monkeypatch.setitem(module.PRETRAINED, "tiny", TINY)
    cells = [smoke_config(dataset="study", **{"model.weights": "pretrained:tiny"}),
             smoke_config(dataset="study", framework="mt", **{"model.weights": "pretrained:tiny"}),
             smoke_config(dataset="study")]  # random init: nothing to build
    lines: list[str] = []
    runs = build_named_pretrainings(cells, tracking=uri, experiment="pre", emit=lines.append)
    assert list(runs) == ["tiny"] and len(lines) == 3 and "trained in" in lines[2]
    assert lines[1].startswith("pretrained:tiny: pretrain step 2/2: loss ")  # its progress, named
    assert (tmp_path / "pretrain" / TINY.key / WEIGHTS_FILE).exists()
    assert MlflowClient(uri).get_run(runs["tiny"]).data.tags[PRETRAIN_KEY] == TINY.key
    assert build_named_pretrainings(cells, tracking=uri, experiment="pre", emit=lines.append) == runs
    assert "cache hit" in lines[-1]


def test_the_thread_count_is_fixed_by_the_config_and_part_of_the_key():
    import hashlib

    from npsemiseg.pretrain import train_backbone

    def digest(state):
        return hashlib.sha256(b"".join(v.numpy().tobytes() for v in state.values())).hexdigest()

    config = PretrainConfig(corpus_size=16, holdout_size=2, image_size=32, steps=6, batch_size=4, threads=1)
    previous = torch.get_num_threads()
    runs = []
    for caller_threads in (1, 2):  # whatever the caller set, the training runs on config.threads
        torch.set_num_threads(caller_threads)
        runs.append(digest(train_backbone(config)[0]))
        assert torch.get_num_threads() == caller_threads  # restored
    torch.set_num_threads(previous)
    assert runs[0] == runs[1]
    assert PretrainConfig(threads=1).key != PretrainConfig(threads=2).key
    with pytest.raises(ValueError, match="threads"):
        PretrainConfig(threads=0)


def _ship_tiny(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """TINY built into a scratch cache and shipped as ``pretrained:tiny`` from a scratch weights folder."""
    from npsemiseg import pretrain as module

    monkeypatch.setitem(module.PRETRAINED, "tiny", TINY)
    monkeypatch.setattr(module, "WEIGHTS_DIR", tmp_path / "weights")
    built = pretrain(TINY, cache_dir=tmp_path / "build").path
    entry = module.ship_pretraining("tiny", built, command="npsemiseg pretrain --steps 2")
    monkeypatch.setitem(module.SHIPPED, "tiny", entry)
    assert entry.path == tmp_path / "weights" / f"tiny_{TINY.key}.pt" and entry.key == TINY.key
    assert entry.path.read_bytes() == built.read_bytes()
    return entry.path


def test_a_shipped_pretraining_loads_its_file_after_checking_its_sha256(tmp_path, monkeypatch):
    from npsemiseg import pretrain as module

    shipped = _ship_tiny(tmp_path, monkeypatch)
    cache = tmp_path / "cache"
    assert module.resolve_weights("pretrained:tiny", cache_dir=cache) == str(shipped)
    assert not cache.exists()  # nothing trained, nothing cached
    build_backbone("resnet_small", weights=module.resolve_weights("pretrained:tiny"))
    data = bytearray(shipped.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one byte changed
    shipped.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"pretrained:tiny: .* has SHA-256 [0-9a-f]{64}, expected .*npsemiseg pretrain"):
        module.resolve_weights("pretrained:tiny", cache_dir=cache)
    shipped.unlink()
    with pytest.raises(ValueError, match=r"pretrained:tiny: the shipped file .* is missing; reinstall"):
        module.resolve_weights("pretrained:tiny", cache_dir=cache)
    assert not cache.exists()  # never a silent rebuild: the weights would differ by machine


def test_a_grid_checks_a_shipped_pretraining_and_builds_nothing(tmp_path_factory, tmp_path, monkeypatch, smoke_config):
    from npsemiseg import pretrain as module
    from semiseg_platform.pretrain_runs import build_named_pretrainings

    shipped = _ship_tiny(tmp_path, monkeypatch)
    monkeypatch.setenv(module.CACHE_ENV, str(tmp_path / "cache"))
    lines: list[str] = []
    cells = [smoke_config(dataset="study", **{"model.weights": "pretrained:tiny"})]
    assert build_named_pretrainings(cells, tracking=fresh_store(tmp_path_factory, "shipped"), experiment="pre",
                                    emit=lines.append) == {}
    assert lines == [f"pretrained:tiny: shipped {shipped} (SHA-256 {module.SHIPPED['tiny'].sha256})"]
    assert not (tmp_path / "cache").exists()


def test_ship_is_for_a_named_configuration_only(tmp_path_factory, tmp_path):
    with pytest.raises(ValueError, match=r"--ship: only a named configuration is shipped \(--name, one of "
                                         r"\['default', 'vit_mini'\]"):
        pretrain_command(steps=2, cache_dir=str(tmp_path), tracking=fresh_store(tmp_path_factory, "ship"), ship=True)
    with pytest.raises(ValueError, match=r"--name: unknown pretraining 'nope', expected one of \['default', 'vit_mini'\]"):
        pretrain_command(name="nope", cache_dir=str(tmp_path), tracking=fresh_store(tmp_path_factory, "ship"))
    assert not any(tmp_path.iterdir())


def test_every_shipped_pretraining_is_package_data_with_its_recorded_checksum():
    import tomllib

    from npsemiseg.pretrain import PRETRAINED, SHIPPED, WEIGHTS_DIR, file_sha256

    package_data = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    assert "weights/*.pt" in package_data["tool"]["setuptools"]["package-data"]["npsemiseg"]
    for name, entry in SHIPPED.items():
        assert entry.path.parent == WEIGHTS_DIR and entry.path.exists(), name
        assert file_sha256(entry.path) == entry.sha256 and entry.key == PRETRAINED[name].key, name
        assert entry.path.stat().st_size < 2_000_000, name  # a few hundred KB, not a checkpoint


@pytest.mark.integration
def test_one_mini_cell_repeats_exactly_at_one_thread_count_and_nearly_across_counts(tmp_path, monkeypatch):
    """Two runs of a shortened mini-study cell from the shipped backbone agree bit for bit at 1 thread and at 2;
    1 and 2 threads differ slightly (the conv / matmul kernels split their float sums by thread, so the sums are
    added in another order): benchmarks/thread_repeatability.py measures it on the full-length backbone."""
    from benchmark_scripts import load_benchmark

    benchmark = load_benchmark("thread_repeatability")
    compare, mini_cell = benchmark.compare, benchmark.mini_cell
    monkeypatch.setenv("NPSEMISEG_CACHE", str(tmp_path))  # the shipped file: nothing is built into the cache
    result = compare(mini_cell(weights="pretrained:default", steps=4, images=8))
    assert not any(tmp_path.iterdir())
    assert result["repeatable_at_each_count"] == {1: True, 2: True}
    assert max(result["metric_differences"].values()) < 0.01
