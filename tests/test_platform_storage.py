"""Storage URIs (local, s3:// with endpoint override) and the platform's checkpoint store."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pyarrow.fs as pafs
import pytest

from platform_fixtures import running_seaweedfs
from semiseg_platform.storage import (
    COMPLETE_MARKER,
    CheckpointStore,
    checkpoint_dir_name,
    checkpoint_step,
    parse_storage,
)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # nothing listens once the socket is closed


def test_local_storage_is_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    storage = parse_storage("results/x")
    assert storage.is_local and storage.uri == str(tmp_path / "results" / "x")
    assert parse_storage(None).uri == str(tmp_path / "ray_results")
    assert parse_storage(f"file://{tmp_path}/y").uri == str(tmp_path / "y")
    assert storage.uri_of("cell", "checkpoint_000000001") == f"{tmp_path}/results/x/cell/checkpoint_000000001"
    assert storage.ray_arguments() == {"storage_path": str(tmp_path / "results" / "x")}
    storage.check()
    assert (tmp_path / "results" / "x").is_dir()


def test_s3_uri_with_endpoint_override(monkeypatch):
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    storage = parse_storage("s3://bucket/some/prefix/?endpoint_override=http://127.0.0.1:8333")
    assert not storage.is_local
    assert storage.uri == "s3://bucket/some/prefix" and storage.root == "bucket/some/prefix"
    assert storage.endpoint_url == "http://127.0.0.1:8333"
    assert isinstance(storage.filesystem, pafs.S3FileSystem)
    assert storage.ray_arguments()["storage_path"] == "bucket/some/prefix"
    assert parse_storage("s3://b/p?endpoint_override=127.0.0.1:9000&scheme=http").endpoint_url == "http://127.0.0.1:9000"
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://minio.local:9000")
    assert parse_storage("s3://b/p").endpoint_url == "http://minio.local:9000"


@pytest.mark.parametrize("uri, message", [
    ("gs://bucket/x", "scheme 'gs'"),
    ("s3:///prefix", "names no bucket"),
    ("s3://b/p?endpoint=x", "unknown query parameter"),
    ("", "empty string"),
])
def test_bad_storage_uris_are_named(uri, message):
    with pytest.raises(ValueError, match=message):
        parse_storage(uri)


def test_unreachable_s3_endpoint_is_one_clear_error():
    uri = f"s3://bucket/prefix?endpoint_override=http://127.0.0.1:{_closed_port()}"
    storage = parse_storage(uri, timeout_s=2)
    with pytest.raises(
        ValueError, match=r"storage 's3://bucket/prefix' \(endpoint http://127.0.0.1:\d+\) is not reachable"
    ) as info:
        storage.check()
    assert "\n" not in str(info.value)


def test_an_unreachable_store_is_retried_for_wait_s_then_named():
    storage = parse_storage(f"s3://bucket/prefix?endpoint_override=http://127.0.0.1:{_closed_port()}", timeout_s=1)
    began = time.monotonic()
    with pytest.raises(ValueError, match="is not reachable"):
        storage.check(wait_s=5)
    assert time.monotonic() - began >= 3  # tried again every 2 s, not given up at the first refusal


def test_unwritable_local_storage_is_an_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(ValueError, match="is not reachable or not writable"):
        parse_storage(blocker / "sub").check()


def test_checkpoint_store_round_trip(tmp_path):
    store = CheckpointStore(parse_storage(tmp_path / "storage"), "cell-abc")
    assert store.latest() is None
    for step in (2, 10, 4):
        source = tmp_path / f"src{step}"
        (source / "nested").mkdir(parents=True)
        (source / "state.pt").write_bytes(bytes([step]))
        (source / "nested" / "extra.txt").write_text(str(step))
        uri = store.save(step, source)
        assert uri.endswith(checkpoint_dir_name(step))
    # an upload that never completed is ignored
    (tmp_path / "storage" / "cell-abc" / checkpoint_dir_name(99)).mkdir()
    assert store.steps() == [2, 4, 10]
    step, uri = store.latest()
    assert step == 10 and uri == str(tmp_path / "storage" / "cell-abc" / "checkpoint_000000010")
    local = store.local_copy(10)
    assert (local / "state.pt").read_bytes() == bytes([10]) and (local / "nested" / "extra.txt").read_text() == "10"
    assert (local / COMPLETE_MARKER).exists()
    store.prune(keep=2)
    assert store.steps() == [4, 10]
    with pytest.raises(ValueError, match="keep"):
        store.prune(keep=0)


def test_checkpoint_names_sort_by_step():
    names = [checkpoint_dir_name(s) for s in (1, 20, 300)]
    assert names == sorted(names)
    assert [checkpoint_step(n) for n in names] == [1, 20, 300]
    assert checkpoint_step("checkpoint_2026-11-21_08-24-58.628667") is None
    assert Path(checkpoint_dir_name(5)).name == "checkpoint_000000005"


@pytest.mark.integration
def test_two_s3_stores_run_side_by_side_on_one_host(tmp_path, monkeypatch):
    """Two SeaweedFS servers at once (as two xdist workers start them) both serve: no listener of
    either sits on a fixed default port (the Lance namespace's 9101 once killed the second)."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")  # the servers take their one identity from these
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    with running_seaweedfs(tmp_path / "first") as (first, first_endpoint), \
            running_seaweedfs(tmp_path / "second") as (second, second_endpoint):
        time.sleep(2.0)  # a listener that dies on a taken port does so a moment after S3 answers
        assert first.poll() is None and second.poll() is None
        for endpoint in (first_endpoint, second_endpoint):
            filesystem = pafs.S3FileSystem(endpoint_override=endpoint.removeprefix("http://"), scheme="http",
                                           access_key="test", secret_key="test")
            with filesystem.open_output_stream("npsemiseg-test/probe.txt") as stream:
                stream.write(endpoint.encode())
            with filesystem.open_input_stream("npsemiseg-test/probe.txt") as stream:
                assert stream.read() == endpoint.encode()
