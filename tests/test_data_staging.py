"""Datasets on every node: the manifest of a tree, and an S3 data root staged once per node.

The manifest tests need nothing but a folder. The staging tests (integration) run against the local
stack's S3 store (SeaweedFS, started alone for this module) with a VOC tree in the real formats:
upload, stage (a download, then a cache hit), two concurrent stagings making one copy, a corrupt or
missing object named by the staging and by ``npsemiseg data check``, the readers on the staged copy, and a
cell launched on an S3 root whose training loop opens the staged copy.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import threading
import time
from pathlib import Path

import pyarrow.fs as pafs
import pytest
from data_fixtures import make_cityscapes_split, make_voc_split
from stack_fixtures import reachable_home, stack_settings
from typer.testing import CliRunner

from npsemiseg.config import cell_config
from npsemiseg.data import build_dataset, partition_ids
from npsemiseg.data.check import check_file_list
from npsemiseg.data.manifest import MANIFEST_NAME, Manifest, build_manifest, verify_tree, write_manifest
from semiseg_platform.cli.main import app
from semiseg_platform.data_staging import DataStagingError, check_remote, copy_name, read_remote_manifest, stage
from semiseg_platform.devstack import Stack
from semiseg_platform.launch.cell import staged_config
from semiseg_platform.preflight import PreflightError, check_data
from semiseg_platform.storage import parse_storage

N = 3  # entries per list of the fixture tree
FILES = 5 * N  # images of val, labeled and unlabeled, labels of val and labeled
PARTITION = "92"


def voc_tree(root: Path) -> Path:
    for split in ("val", "labeled", "unlabeled"):
        make_voc_split(root, "pascal_classic", split, None if split == "val" else PARTITION, max_items=N)
    return root


# ----------------------------------------------------------------------------- the manifest (no services)
def test_manifest_lists_every_file_with_size_and_digest_and_verifies_a_copy(tmp_path):
    tree = voc_tree(tmp_path / "VOC2012")
    (tree / ".partial.tmp").write_bytes(b"x")  # hidden: never listed
    result = CliRunner().invoke(app, ["data", "manifest", str(tree), "--no-progress"])
    assert result.exit_code == 0, result.output
    manifest = Manifest.from_json((tree / MANIFEST_NAME).read_text())
    files = sorted(p.relative_to(tree).as_posix() for p in tree.rglob("*") if p.is_file()
                   and p.name not in (MANIFEST_NAME, ".partial.tmp"))
    assert [e.path for e in manifest.files] == files and len(files) == FILES
    assert f"{len(files)} files" in result.output
    assert manifest == build_manifest(tree)  # deterministic
    assert verify_tree(tree, manifest) == []
    label = next(e for e in manifest.files if e.path.startswith("SegmentationClassAug/"))
    (tree / label.path).write_bytes(b"\0" * label.size)  # same size, other bytes
    problems = verify_tree(tree, manifest)
    assert len(problems) == 1 and problems[0].startswith(f"{label.path} has SHA-256 ")
    assert verify_tree(tree, manifest, digests=False) == []  # sizes only: the quick check of a staged copy
    (tree / label.path).unlink()
    assert verify_tree(tree, manifest, digests=False) == [f"{label.path} is missing (the manifest lists {label.size} bytes)"]


def test_a_file_list_is_checked_against_the_dataset_lists_without_opening_a_file(tmp_path):
    voc = voc_tree(tmp_path / "datasets" / "VOC2012")
    write_manifest(tmp_path / "datasets")  # one manifest above the dataset folder
    paths = [e.path for e in Manifest.from_json((tmp_path / "datasets" / MANIFEST_NAME).read_text()).files]
    assert check_file_list("pascal_classic", paths, partitions=["1/16"], max_items=N) == ("VOC2012", {})
    folder, missing = check_file_list("pascal_classic", [p for p in paths if not p.endswith(".png")],
                                      partitions=["1/16"], max_items=N)
    assert folder == "VOC2012" and sorted(missing) == ["92/labeled", "val"]
    assert all(path.startswith("SegmentationClassAug/") for path in missing["val"]) and len(missing["val"]) == N
    assert check_file_list("cityscapes", paths) == (None, {})
    assert voc.is_dir()

    city = tmp_path / "cityscapes"
    for split in ("val", "labeled", "unlabeled"):
        make_cityscapes_split(city, split, None if split == "val" else "186", max_items=N, label_kind="labelIds")
    paths = [e.path for e in build_manifest(city).files]  # labelIds files only: converted when read, accepted
    assert check_file_list("cityscapes", paths, partitions=["186"], max_items=N) == ("", {})
    _, missing = check_file_list("cityscapes", paths, partitions=["186"], max_items=N + 1)
    assert [len(lacking) for lacking in missing.values()] == [2, 2, 1]  # one more entry: image + label, image


def test_a_bad_manifest_or_directory_is_one_clear_error(tmp_path):
    with pytest.raises(ValueError, match="not a dataset manifest"):
        Manifest.from_json('{"format": 1, "files": [{"path": "../x", "size": 1, "sha256": "0"}]}')
    with pytest.raises(ValueError, match="is not a directory"):
        write_manifest(tmp_path / "nothing")


def test_a_local_root_or_a_generated_dataset_is_not_staged(tmp_path, monkeypatch):
    config = cell_config("smoke", framework="supervised", dataset="pascal_classic", partition=PARTITION,
                         **{"data.root": str(tmp_path)})
    assert staged_config(config) is config
    monkeypatch.setenv("NPSEMISEG_DATA", "s3://nowhere/datasets")  # a cluster's root: synthetic cells ignore it
    synthetic = cell_config("smoke", framework="supervised", dataset="synthetic", partition="1/16")
    assert staged_config(synthetic) is synthetic


# ----------------------------------------------------------------------------- S3 staging (integration)
@pytest.fixture(scope="module")
def s3():
    """The stack's S3 store alone, this process's AWS settings pointed at it (restored afterwards)."""
    home = reachable_home()
    stack = Stack(stack_settings(home))
    saved = dict(os.environ)
    try:
        stack.up(("seaweedfs",))
        for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL", "AWS_PROFILE", "NPSEMISEG_DATA"):
            os.environ.pop(key, None)
        env = stack.client_env(include_secrets=False)
        os.environ.update({key: env[key] for key in ("AWS_ENDPOINT_URL_S3", "AWS_SHARED_CREDENTIALS_FILE", "AWS_REGION")})
        yield stack
    finally:
        os.environ.clear()
        os.environ.update(saved)
        stack.down()
        shutil.rmtree(home, ignore_errors=True)


def upload(stack: Stack, tree: Path, prefix: str) -> str:
    """Write the tree's manifest and copy the tree to ``s3://<bucket>/<prefix>``; returns that URI."""
    write_manifest(tree)
    uri = f"s3://{stack.settings.bucket}/{prefix}"
    storage = parse_storage(uri)
    pafs.copy_files(str(tree), storage.root, source_filesystem=pafs.LocalFileSystem(),
                    destination_filesystem=storage.filesystem)
    return uri


@pytest.mark.integration
def test_staging_downloads_once_then_hits_the_cache_and_the_readers_read_it(s3, tmp_path, monkeypatch):
    tree = voc_tree(tmp_path / "VOC2012")
    uri = upload(s3, tree, "datasets/once/VOC2012")
    cache = tmp_path / "cache"
    lines: list[str] = []
    first = stage(uri, cache, emit=lines.append)
    manifest = build_manifest(tree)
    assert not first.cache_hit and first.downloaded_files == len(manifest.files) == FILES
    assert first.downloaded_bytes == manifest.total_bytes
    assert first.path.parent == cache and verify_tree(first.path, manifest) == []
    assert any(line.startswith(f"data: staging {uri} ({FILES} files") for line in lines)
    assert any(line.startswith(f"data: staged {uri}") and "verified" in line for line in lines)
    second = stage(uri, cache, emit=lines.append)
    assert second.cache_hit and second.downloaded_files == 0 and second.path == first.path
    assert lines[-1] == f"data: {uri} already staged at {first.path} ({FILES} files), reused"
    assert sorted(p.name for p in cache.iterdir() if not p.name.endswith(".lock")) == [first.path.name]

    # the launcher's path: an S3 data.root becomes the staged copy before npsemiseg reads it; a root holding
    # the dataset's conventional folder (VOC2012/, cityscapes/) serves every dataset, each staged on its own
    monkeypatch.setenv("NPSEMISEG_DATA_CACHE", str(cache))
    config = cell_config("smoke", framework="supervised", dataset="pascal_classic", partition=PARTITION,
                         **{"data.root": uri.removesuffix("/VOC2012")})
    local = staged_config(config)
    assert local.data.root == str(first.path) and local.cell_id == config.cell_id
    for split in ("val", "labeled", "unlabeled"):
        dataset = build_dataset("pascal_classic", split, local.data.root, None if split == "val" else PARTITION,
                                max_items=N)
        assert len(dataset) == N and dataset[0]["image"].shape[0] == 3
    # the manifest against the lists: the fixture holds the first N entries of each
    assert check_remote(config.data.root, "pascal_classic", partitions=[PARTITION], max_items=N).usable
    full = check_remote(config.data.root, "pascal_classic", partitions=[PARTITION])
    lacking = 2 * (len(partition_ids("pascal_classic", "val")) - N)
    assert full.first_problem().startswith(f"data: the manifest of {uri} lacks {lacking} files of the val list of "
                                           f"pascal_classic, e.g. {uri}/JPEGImages/")
    with pytest.raises(PreflightError, match=f"the manifest of {uri} lacks {lacking} files of the val list"):
        check_data([config])  # the preflight: lists, manifest and listing, nothing downloaded


@pytest.mark.integration
def test_two_concurrent_stagings_on_one_node_make_one_copy(s3, tmp_path):
    """Two cells start staging while a third holds the node's lock: both wait, one downloads, one reuses."""
    uri = upload(s3, voc_tree(tmp_path / "VOC2012"), "datasets/concurrent/VOC2012")
    cache = tmp_path / "cache"
    cache.mkdir()
    storage, manifest = read_remote_manifest(uri)
    results, errors, lines = [], [], []

    def cell() -> None:
        try:
            results.append(stage(uri, cache, emit=lines.append, threads=1))
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)

    with open(cache / f".{copy_name(storage, manifest)}.lock", "a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        threads = [threading.Thread(target=cell) for _ in range(2)]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 20
        while sum("waiting for another cell" in line for line in lines) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        fcntl.flock(held, fcntl.LOCK_UN)
    for thread in threads:
        thread.join(60)
    assert not errors and len(results) == 2
    assert sum("waiting for another cell on this node" in line for line in lines) == 2
    assert sorted(r.cache_hit for r in results) == [False, True]  # one downloaded, the other reused it
    assert results[0].path == results[1].path
    assert sum(r.downloaded_files for r in results) == FILES
    assert [p.name for p in cache.iterdir() if not p.name.endswith(".lock")] == [results[0].path.name]


@pytest.mark.integration
def test_a_corrupt_or_missing_object_is_named_by_staging_and_by_data_check(s3, tmp_path):
    tree = voc_tree(tmp_path / "VOC2012")
    uri = upload(s3, tree, "datasets/broken/VOC2012")
    runner = CliRunner()
    ok = runner.invoke(app, ["data", "check", "--dataset", "pascal_classic", "--root", uri, "--partition", PARTITION,
                              "--max-items", str(N), "--no-progress"])
    assert ok.exit_code == 0 and f"{uri}: usable" in ok.output and f"{FILES} files" in ok.output, ok.output
    assert check_remote(uri).usable  # no dataset named: the listing against the manifest only

    storage = parse_storage(uri)
    manifest = build_manifest(tree)
    image = next(e for e in manifest.files if e.path.startswith("JPEGImages/"))
    with storage.filesystem.open_output_stream(storage.path(image.path)) as stream:  # same size, other bytes
        stream.write(b"\xff" * image.size)
    with pytest.raises(DataStagingError) as corrupt:
        stage(uri, tmp_path / "cache", emit=lambda line: None)
    assert str(corrupt.value).startswith(f"data: {uri}/{image.path} does not match the manifest: SHA-256 ")
    assert not [p for p in (tmp_path / "cache").iterdir() if not p.name.endswith(".lock")]  # nothing half-staged

    with storage.filesystem.open_output_stream(storage.path(image.path)) as stream:  # repaired
        stream.write((tree / image.path).read_bytes())
    label = next(e for e in manifest.files if e.path.startswith("SegmentationClassAug/"))
    storage.filesystem.delete_file(storage.path(label.path))
    with pytest.raises(DataStagingError, match=f"data: {uri}/{label.path} is missing from the store"):
        stage(uri, tmp_path / "cache", emit=lambda line: None)
    bad = runner.invoke(app, ["data", "check", "--dataset", "pascal_classic", "--root", uri, "--no-progress"])
    assert bad.exit_code == 2 and "NOT usable" in bad.output
    assert f"error: data: {uri}/{label.path} is missing (the manifest lists {label.size} bytes)" in bad.output
    config = cell_config("smoke", framework="supervised", dataset="pascal_classic", partition=PARTITION,
                         **{"data.root": uri})
    with pytest.raises(PreflightError, match=f"{label.path} is missing"):
        check_data([config])

    storage.filesystem.delete_file(storage.path(MANIFEST_NAME))
    bad = runner.invoke(app, ["data", "check", "--dataset", "pascal_classic", "--root", uri, "--no-progress"])
    assert bad.exit_code == 2 and f"{uri}/{MANIFEST_NAME} does not exist" in bad.output


@pytest.mark.integration
def test_a_cell_launched_on_an_s3_root_reads_the_staged_copy(s3, tmp_path, tmp_path_factory, monkeypatch):
    """The launcher stages before npsemiseg reads: the loop opens the staged copy (whose lists are cut short
    here, so the cell fails on the first file it lacks, named under the cache)."""
    from platform_fixtures import fresh_store

    from semiseg_platform.launch import CellFailedError, run_cell_in_process

    uri = upload(s3, voc_tree(tmp_path / "VOC2012"), "datasets/cell/VOC2012")
    cache = tmp_path / "cache"
    monkeypatch.setenv("NPSEMISEG_DATA_CACHE", str(cache))
    config = cell_config("smoke", framework="supervised", dataset="pascal_classic", partition=PARTITION,
                         **{"data.root": uri, "runtime.device": "cpu"})
    with pytest.raises(CellFailedError) as failed:
        run_cell_in_process(config, storage=tmp_path / "checkpoints", tracking=fresh_store(tmp_path_factory, "staging"),
                            experiment="staging")
    staged = [p for p in cache.iterdir() if not p.name.startswith(".")]
    assert len(staged) == 1 and verify_tree(staged[0], build_manifest(tmp_path / "VOC2012")) == []
    error = failed.value.result.error
    assert f"pascal_classic under {staged[0]} is missing" in error and failed.value.result.status == "FAILED"
