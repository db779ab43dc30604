"""A dataset in an object store (``data.root: s3://bucket/prefix/VOC2012``), staged once per node into a local cache.

The tree under the prefix carries a ``manifest.json`` (``npsemiseg data manifest DIR`` before the upload:
every file's relative path, size and SHA-256). :func:`stage` gives the local copy of that version of the
tree, ``<cache>/<name>-<hash>``, where the hash covers the URI, the endpoint and the manifest's digest:

- atomic: the files are downloaded into a hidden temporary folder of the cache (same filesystem), each
  one's size and SHA-256 checked against the manifest as it is written, then the folder is renamed
  into place; a copy that exists is complete;
- one copy per node: the cells of a node take an exclusive ``fcntl`` lock on ``<copy>.lock`` first; the
  first downloads, the others wait (a ``waiting for`` line) and reuse the finished copy (a cache hit:
  one small request, the manifest, and a size check of the local files);
- a file that is missing in the store, or whose size or digest differs from the manifest, fails the
  staging with one :class:`DataStagingError` naming it (nothing is left in the cache).

:func:`check_remote` compares the store's listing with the manifest (sizes) and the manifest with the
dataset's lists (every listed image and label is in it), downloading nothing but the manifest: what
``npsemiseg data check`` and the preflight do for an S3 root. The store is reached as the checkpoint
storage is (:func:`semiseg_platform.storage.parse_storage`: endpoint override in the URI's query or
``AWS_ENDPOINT_URL_S3``, credentials from the usual AWS variables, files or instance profile). The cache
is ``NPSEMISEG_DATA_CACHE`` (default ``~/.cache/npsemiseg/data``): a node's local disk.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import logging
import os
import re
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pyarrow.fs as pafs

from npsemiseg.data.check import check_file_list
from npsemiseg.data.datasets import root_subfolders
from npsemiseg.data.manifest import MANIFEST_NAME, Manifest, ManifestEntry, compare_sizes, verify_tree
from semiseg_platform.logs import PROGRESS
from semiseg_platform.storage import Storage, download_file, parse_storage

#: The node's cache of staged datasets (a folder on local disk)
DATA_CACHE_ENV = "NPSEMISEG_DATA_CACHE"
#: Parallel downloads of one staging
DOWNLOAD_THREADS = 8
#: Seconds between two progress lines of one staging
PROGRESS_EVERY_S = 10.0


class DataStagingError(ValueError):
    """The dataset in the store cannot be staged or does not match its manifest; the message names the file."""


@dataclass(frozen=True)
class StagedData:
    """A staged copy: its local ``path``; ``cache_hit`` (nothing downloaded) or the files and bytes downloaded."""

    uri: str
    path: Path
    cache_hit: bool
    files: int
    downloaded_files: int = 0
    downloaded_bytes: int = 0


def is_remote(root: str | os.PathLike | None) -> bool:
    """True for an object-store data root (``s3://...``)."""
    return root is not None and str(root).startswith("s3://")


def default_cache_dir() -> Path:
    """``$NPSEMISEG_DATA_CACHE``, else ``$XDG_CACHE_HOME/npsemiseg/data`` (``~/.cache/npsemiseg/data``)."""
    if os.environ.get(DATA_CACHE_ENV):
        return Path(os.environ[DATA_CACHE_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "npsemiseg" / "data"


def _emit(line: str) -> None:
    logging.getLogger(PROGRESS).info("%s", line)


def _size(count: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if count < 1000 or unit == "GB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1000
    return str(count)


def _storage(uri: str | Storage) -> Storage:
    try:
        return parse_storage(uri)
    except ValueError as error:
        raise DataStagingError(f"data: {error}") from None


def read_remote_manifest(uri: str | Storage) -> tuple[Storage, Manifest]:
    """The store location and its ``manifest.json``; ``DataStagingError`` when it is missing or unreadable."""
    storage = _storage(uri)
    where = storage.uri_of(MANIFEST_NAME)
    try:
        with storage.filesystem.open_input_stream(storage.path(MANIFEST_NAME)) as stream:
            text = stream.read()
    except FileNotFoundError:
        raise DataStagingError(f"data: {where} does not exist; expected the manifest of the tree under {storage.uri} "
                               "(write it with `npsemiseg data manifest DIR` before uploading DIR)") from None
    except OSError as error:
        endpoint = f" (endpoint {storage.endpoint_url})" if storage.endpoint_url else ""
        raise DataStagingError(f"data: cannot read {where}{endpoint}: {' '.join(str(error).split())}") from None
    try:
        return storage, Manifest.from_json(text, where)
    except ValueError as error:
        raise DataStagingError(f"data: {error}") from None


def remote_sizes(storage: Storage) -> dict[str, int]:
    """Relative path -> size of every object under the store location (one listing)."""
    base = storage.root.rstrip("/") + "/"
    infos = storage.filesystem.get_file_info(pafs.FileSelector(storage.root, recursive=True, allow_not_found=True))
    return {info.path[len(base):]: info.size for info in infos
            if info.type == pafs.FileType.File and info.path.startswith(base)}


@dataclass(frozen=True)
class RemoteReport:
    """What :func:`check_remote` found: the manifest (None when unreadable) and the problems, each naming a file."""

    uri: str
    manifest: Manifest | None
    problems: tuple[str, ...]

    @property
    def usable(self) -> bool:
        return self.manifest is not None and not self.problems

    def format(self, max_lines: int = 5) -> str:
        if self.manifest is None:
            return f"{self.uri}: NOT usable\n  {self.problems[0]}"
        verdict = "usable" if self.usable else "NOT usable"
        lines = [f"{self.uri}: {verdict} (staged on each node before training)",
                 f"  manifest: {len(self.manifest.files)} files, {_size(self.manifest.total_bytes)}"]
        if self.usable:
            lines.append("  every file of the manifest is in the store with its size")
        lines += [f"  {problem}" for problem in self.problems[:max_lines]]
        if len(self.problems) > max_lines:
            lines.append(f"  ... and {len(self.problems) - max_lines} more")
        return "\n".join(lines)

    def first_problem(self) -> str:
        """One line: the first problem, with its file (and how many more)."""
        more = f" (and {len(self.problems) - 1} more)" if len(self.problems) > 1 else ""
        first = self.problems[0] if self.problems else "no problem"
        return f"{first}{more}" if first.startswith("data: ") else f"data: {self.uri}/{first}{more}"


def check_remote(uri: str | Storage, dataset: str | None = None, *, partitions: Iterable[str | int] | None = None,
                 partition_lists: str = "u2pl", max_items: int | None = None) -> RemoteReport:
    """The store's listing under ``uri`` (``dataset``'s tree under it: :func:`locate`) against its manifest
    (sizes), and the manifest against ``dataset``'s lists (``npsemiseg.data.check.check_file_list``: val and
    the ``partitions``' labeled / unlabeled lists name no file it lacks); downloads only the manifest."""
    try:
        storage, manifest = read_remote_manifest(locate(uri, dataset))
    except DataStagingError as error:
        return RemoteReport(str(uri.uri if isinstance(uri, Storage) else uri), None, (str(error),))
    problems = []
    if dataset is not None:
        folder, missing = check_file_list(dataset, (e.path for e in manifest.files), partitions=partitions,
                                          partition_lists=partition_lists, max_items=max_items)
        where = f"data: the manifest of {storage.uri}"
        if folder is None:
            subfolders = ", ".join(f"{sub}/" for sub in root_subfolders(dataset))
            problems.append(f"{where} lists no file of {dataset} (expected its standard layout at the top or under "
                            f"{subfolders})")
        for list_name, lacking in missing.items():
            base = f"{storage.uri}/{folder}" if folder else storage.uri
            problems.append(f"{where} lacks {len(lacking)} files of the {list_name} list of {dataset}, e.g. "
                            f"{base}/{lacking[0]} (expected the standard layout; build it before the manifest)")
    try:
        sizes = remote_sizes(storage)
    except OSError as error:
        return RemoteReport(storage.uri, None, (f"data: cannot list {storage.uri}: {' '.join(str(error).split())}",))
    return RemoteReport(storage.uri, manifest, tuple(compare_sizes(manifest, sizes) + problems))


def locate(root: str | Storage, dataset: str | None = None) -> Storage:
    """The store location of ``dataset`` under the S3 ``root``: ``root`` itself when it holds a manifest, else
    its conventional subfolder that does (``s3://bucket/datasets`` -> ``.../datasets/VOC2012`` for VOC,
    ``.../datasets/cityscapes``), so one root serves every dataset and a node stages only the one its cell reads.
    Neither: ``root`` (whose missing manifest is then the error)."""
    storage = _storage(root)
    if dataset is None:
        return storage
    candidates = [storage] + [dataclasses.replace(storage, uri=storage.uri_of(sub), root=storage.path(sub))
                              for sub in root_subfolders(dataset)]
    for candidate in candidates:
        try:
            if candidate.filesystem.get_file_info(candidate.path(MANIFEST_NAME)).type == pafs.FileType.File:
                return candidate
        except OSError:
            break  # unreachable: reading the root's manifest names the store
    return storage


def copy_name(storage: Storage, manifest: Manifest) -> str:
    """The cache folder of this version of the tree: readable tail of the URI + a hash of URI, endpoint, manifest."""
    key = hashlib.sha256(f"{storage.uri}\n{storage.endpoint_url or ''}\n{manifest.digest}".encode()).hexdigest()[:16]
    tail = re.sub(r"[^A-Za-z0-9_.-]+", "_", storage.root.rsplit("/", 1)[-1]).strip("_.") or "data"
    return f"{tail}-{key}"


class _Lock:
    """An exclusive ``fcntl.flock`` on ``path`` (per open file: threads and processes exclude each other)."""

    def __init__(self, path: Path, on_wait: Callable[[], None]) -> None:
        self.path, self.on_wait = path, on_wait

    def __enter__(self) -> _Lock:
        self.file = open(self.path, "a+")  # noqa: SIM115 - closed in __exit__
        try:
            fcntl.flock(self.file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.on_wait()
            fcntl.flock(self.file, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc: object) -> None:
        fcntl.flock(self.file, fcntl.LOCK_UN)
        self.file.close()


def stage(uri: str | Storage, cache_dir: str | os.PathLike | None = None, *, emit: Callable[[str], None] = _emit,
          threads: int = DOWNLOAD_THREADS, every_s: float = PROGRESS_EVERY_S) -> StagedData:
    """The local copy of the tree at ``uri`` in ``cache_dir`` (default :func:`default_cache_dir`), downloaded
    and verified unless this node has it already. ``DataStagingError`` names the file that is missing or differs."""
    storage, manifest = read_remote_manifest(uri)
    cache = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise DataStagingError(f"data: cannot create the data cache {cache} ({error}); set {DATA_CACHE_ENV} "
                               "to a writable folder on the node's local disk") from None
    name = copy_name(storage, manifest)
    target = cache / name

    def waiting() -> None:
        emit(f"data: waiting for another cell on this node staging {storage.uri} into {target}")

    with _Lock(cache / f".{name}.lock", waiting):
        if target.is_dir() and not verify_tree(target, manifest, digests=False):
            emit(f"data: {storage.uri} already staged at {target} ({len(manifest.files)} files), reused")
            return StagedData(storage.uri, target, True, len(manifest.files))
        for stale in cache.glob(f".{name}.tmp-*"):  # left by a killed staging: we hold the lock
            shutil.rmtree(stale, ignore_errors=True)
        if target.exists():  # an incomplete copy (files deleted by hand): replaced
            shutil.rmtree(target)
        temporary = cache / f".{name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        temporary.mkdir()
        try:
            downloaded = _download(storage, manifest, temporary, emit=emit, threads=threads, every_s=every_s,
                                   target=target)
            (temporary / MANIFEST_NAME).write_text(manifest.to_json())
            os.rename(temporary, target)
        finally:
            shutil.rmtree(temporary, ignore_errors=True)
    return StagedData(storage.uri, target, False, len(manifest.files), len(manifest.files), downloaded)


def _download(storage: Storage, manifest: Manifest, into: Path, *, emit: Callable[[str], None], threads: int,
              every_s: float, target: Path) -> int:
    """Download every file of ``manifest`` into ``into``, checking each one's size and SHA-256; returns the bytes."""
    total_files, total_bytes = len(manifest.files), manifest.total_bytes
    emit(f"data: staging {storage.uri} ({total_files} files, {_size(total_bytes)}) into {target}")
    started = time.monotonic()
    state = {"files": 0, "bytes": 0, "line": started}
    guard = threading.Lock()
    failed = threading.Event()

    def one(entry: ManifestEntry) -> None:
        if failed.is_set():
            return
        digest, size = hashlib.sha256(), 0

        def seen(chunk: bytes) -> None:
            nonlocal size
            digest.update(chunk)
            size += len(chunk)

        try:
            download_file(storage, entry.path, into, on_chunk=seen)
        except FileNotFoundError:
            failed.set()
            raise DataStagingError(f"data: {storage.uri_of(entry.path)} is missing from the store but listed in its "
                                   f"manifest ({entry.size} bytes); upload it again or rewrite the manifest") from None
        except (OSError, ValueError) as error:  # ValueError: a name that would leave the staging folder
            failed.set()
            raise DataStagingError(f"data: cannot download {storage.uri_of(entry.path)}: "
                                   f"{' '.join(str(error).split())}") from None
        if size != entry.size or digest.hexdigest() != entry.sha256:
            failed.set()
            got = f"{size} bytes" if size != entry.size else f"SHA-256 {digest.hexdigest()[:12]}..."
            expected = f"{entry.size} bytes" if size != entry.size else f"SHA-256 {entry.sha256[:12]}..."
            raise DataStagingError(f"data: {storage.uri_of(entry.path)} does not match the manifest: {got}, expected "
                                   f"{expected} (a corrupt or replaced object: upload it again or rewrite the manifest)")
        with guard:
            state["files"] += 1
            state["bytes"] += size
            now = time.monotonic()
            if now - state["line"] >= every_s:
                state["line"] = now
                emit(f"data: staging {storage.uri}: {state['files']}/{total_files} files, "
                     f"{_size(state['bytes'])} of {_size(total_bytes)} ({now - started:.0f} s)")

    with ThreadPoolExecutor(max_workers=max(1, threads), thread_name_prefix="npsemiseg-stage") as pool:
        futures = [pool.submit(one, entry) for entry in manifest.files]
        errors = [future.exception() for future in futures]
    first = next((error for error in errors if error is not None), None)
    if first is not None:
        raise first
    elapsed = time.monotonic() - started
    emit(f"data: staged {storage.uri}: {total_files} files, {_size(state['bytes'])} in {elapsed:.1f} s, "
         f"verified against its manifest, at {target}")
    return state["bytes"]


def resolve_data_root(root: str | Storage | None, dataset: str | None = None, cache_dir: str | os.PathLike | None = None,
                      *, emit: Callable[[str], None] = _emit) -> str | None:
    """``root`` itself unless it is an S3 root (a URI or a parsed :class:`Storage`); then the local path of the
    staged copy (:func:`stage`) of ``dataset``'s tree under it (:func:`locate`)."""
    if isinstance(root, Storage):
        return str(stage(locate(root, dataset), cache_dir, emit=emit).path)
    if not is_remote(root):
        return root
    return str(stage(locate(str(root), dataset), cache_dir, emit=emit).path)
