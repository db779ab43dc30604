"""Where checkpoints live: a local directory or an ``s3://bucket/prefix`` (S3-compatible stores too).

A :class:`Storage` is parsed once from a URI (:func:`parse_storage`) and hands the same
location to Ray (``storage_path`` + ``storage_filesystem``) and to the platform's own
checkpoint helpers (:class:`CheckpointStore`, used where Ray Train does not persist
checkpoints: its local mode and the in-process launcher).

S3 endpoint override (MinIO, SeaweedFS, ...), first match wins: the URI's query
``?endpoint_override=http://127.0.0.1:8333`` (``endpoint_url=`` is accepted as a synonym;
``scheme=http`` sets the transport when the endpoint has no scheme), the ``endpoint_url``
argument, ``AWS_ENDPOINT_URL_S3``, ``AWS_ENDPOINT_URL``. Credentials come from the usual
AWS variables / files. A URI that others wrote (an MLflow tag, a checkpoint's configuration) is parsed with
``named_by``: it may not name an endpoint other than the user's own (``endpoint_url``, the environment).

Every file that comes from a store to local disk goes through :func:`download_file`: its name must stay
below the local folder, and it is created new, never through a symlink. A checkpoint download
(:func:`download_checkpoint`) asks for :data:`CHECKPOINT_FILES` by name and takes nothing else the
store's listing may hold.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pyarrow.fs as pafs

from npsemiseg.constants import CONFIG_FILE, STATE_FILE

#: Default local storage (relative to the working directory of the driver)
DEFAULT_STORAGE_DIR = "ray_results"

#: Name of a checkpoint directory for ``step``: sortable, shared by every launcher
CHECKPOINT_DIR_FORMAT = "checkpoint_{step:09d}"
_CHECKPOINT_DIR_RE = re.compile(r"^checkpoint_(\d{9})$")
#: Written last into an uploaded checkpoint: a directory without it is incomplete
COMPLETE_MARKER = ".complete"
#: Every file a checkpoint directory has: the only names a checkpoint download takes
CHECKPOINT_FILES = (STATE_FILE, CONFIG_FILE, COMPLETE_MARKER)
_DOWNLOAD_CHUNK = 1 << 20

_QUERY_KEYS = {"endpoint_override", "endpoint_url", "scheme", "region"}


def checkpoint_dir_name(step: int) -> str:
    """``checkpoint_000000123`` for step 123."""
    return CHECKPOINT_DIR_FORMAT.format(step=step)


def checkpoint_step(name: str) -> int | None:
    """The step of a directory named by :func:`checkpoint_dir_name`, else None."""
    match = _CHECKPOINT_DIR_RE.match(name)
    return int(match.group(1)) if match else None


def atomic_write(path: str | Path, write: Callable[[Path], object]) -> Path:
    """Write ``path`` through ``write(temporary path)`` then rename it into place, so that a reader
    sees the old file or the whole new one, never a half-written one (a process killed while it
    writes leaves only a hidden ``.<name>.tmp-*`` file behind). The temporary file keeps the suffix
    (writers pick their format by it)."""
    path = Path(path)
    temporary = path.with_name(f".{path.stem}.tmp-{os.getpid()}-{uuid.uuid4().hex[:6]}{path.suffix}")
    try:
        write(temporary)
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)
    return path


def mark_complete(directory: Path, step: int) -> None:
    """Write the completion marker into a local checkpoint ``directory`` (before Ray uploads it)."""
    (Path(directory) / COMPLETE_MARKER).write_text(str(step))


@dataclass(frozen=True)
class Storage:
    """A storage location.

    ``uri``: canonical form (an absolute local path, or ``s3://bucket/prefix`` without the
    query); ``root``: the same location as a path inside ``filesystem`` (``/abs/dir`` or
    ``bucket/prefix``); ``endpoint_url``: the S3 endpoint override, if any.
    """

    uri: str
    root: str
    filesystem: pafs.FileSystem
    endpoint_url: str | None = None

    @property
    def is_local(self) -> bool:
        return isinstance(self.filesystem, pafs.LocalFileSystem)

    def path(self, *parts: str) -> str:
        """A path inside ``filesystem`` below the root."""
        return "/".join([self.root.rstrip("/"), *(p.strip("/") for p in parts if p)])

    def uri_of(self, *parts: str) -> str:
        """A URI below the root (``/abs/dir/a/b`` or ``s3://bucket/prefix/a/b``)."""
        return "/".join([self.uri.rstrip("/"), *(p.strip("/") for p in parts if p)])

    def check(self, wait_s: float = 0.0) -> None:
        """Raise ``ValueError`` naming the storage unless it can be reached and written.

        Local: the directory is created (with parents) and a probe file written. S3: the bucket
        must exist and a probe object is written and deleted under the prefix. ``wait_s``: an
        unreachable S3 store is tried again every 2 s for that long (a store restarting); a missing
        bucket or a local error is not.
        """
        deadline = time.monotonic() + wait_s
        while True:
            try:
                return self._probe()
            except OSError as error:  # pyarrow raises OSError subclasses with the SDK's message
                if not self.is_local and time.monotonic() + 2.0 <= deadline:
                    time.sleep(2.0)
                    continue
                where = f" (endpoint {self.endpoint_url})" if self.endpoint_url else ""
                message = " ".join(str(error).split())
                raise ValueError(f"storage {self.uri!r}{where} is not reachable or not writable: {message}") from None

    def _probe(self) -> None:
        probe = self.path(f".probe-{uuid.uuid4().hex}")
        if self.is_local:
            Path(self.root).mkdir(parents=True, exist_ok=True)
        else:
            bucket = self.root.split("/", 1)[0]
            if self.filesystem.get_file_info(bucket).type == pafs.FileType.NotFound:
                raise ValueError(f"storage {self.uri!r}: bucket {bucket!r} does not exist")
        with self.filesystem.open_output_stream(probe) as stream:
            stream.write(b"ok")
        self.filesystem.delete_file(probe)

    def ray_arguments(self) -> dict[str, object]:
        """``storage_path`` / ``storage_filesystem`` keyword arguments for ``ray.train.RunConfig``."""
        if self.is_local:
            return {"storage_path": self.root}
        return {"storage_path": self.root, "storage_filesystem": self.filesystem}


def parse_storage(uri: str | os.PathLike | Storage | None = None, *, endpoint_url: str | None = None,
                  timeout_s: float = 10.0, named_by: str | None = None) -> Storage:
    """A :class:`Storage` from a local path or ``s3://bucket/prefix[?endpoint_override=...]``.

    ``None`` = ``<cwd>/ray_results``. Relative local paths are made absolute (Ray workers run
    in other working directories). ``timeout_s`` bounds S3 connects and requests. Other
    schemes -> ``ValueError``. ``named_by``: who wrote ``uri`` when it is not the user (``the
    checkpoint_uri tag of run ...``): its query may name no endpoint (or transport) other than the
    user's own, ``endpoint_url`` else ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL`` (``ValueError``):
    requests to it would be signed with the user's key id.
    """
    if isinstance(uri, Storage):
        return uri
    if uri is None:
        uri = Path.cwd() / DEFAULT_STORAGE_DIR
    text = os.fspath(uri)
    if not text:
        raise ValueError("storage: expected a local directory or s3://bucket/prefix, got an empty string")
    parsed = urlparse(text)
    if parsed.scheme in ("", "file"):
        local = Path(parsed.path if parsed.scheme == "file" else text).expanduser().resolve()
        return Storage(uri=str(local), root=str(local), filesystem=pafs.LocalFileSystem())
    if parsed.scheme != "s3":
        raise ValueError(f"storage: expected a local directory or s3://bucket/prefix, got scheme {parsed.scheme!r} in {text!r}")
    bucket = parsed.netloc
    if not bucket:
        raise ValueError(f"storage: {text!r} names no bucket (expected s3://bucket/prefix)")
    query = {key: values[-1] for key, values in parse_qs(parsed.query).items()}
    unknown = sorted(set(query) - _QUERY_KEYS)
    if unknown:
        raise ValueError(f"storage: unknown query parameter(s) {unknown} in {text!r} (known: {sorted(_QUERY_KEYS)})")
    user_endpoint = endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    own = _endpoint(user_endpoint, query.get("scheme") if named_by is None else None)
    named = _endpoint(query.get("endpoint_override") or query.get("endpoint_url"), query.get("scheme"))
    if named_by is not None and (named or "scheme" in query) and (named is None or named != own):
        raise ValueError(f"{named_by} names the S3 endpoint {named or query['scheme'] + '://'} ({text}); an endpoint "
                         f"comes from your own configuration ({own or 'AWS'}), never from a tag or a file: refused")
    endpoint = named or own
    options: dict[str, object] = {
        "connect_timeout": timeout_s,
        "request_timeout": timeout_s,
        "retry_strategy": pafs.AwsStandardS3RetryStrategy(max_attempts=2),
    }
    if query.get("region") or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION"):
        options["region"] = query.get("region") or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if endpoint:
        options["scheme"], options["endpoint_override"] = endpoint.split("://", 1)
    elif "scheme" in query:
        options["scheme"] = query["scheme"]
    root = f"{bucket}/{parsed.path.strip('/')}".rstrip("/")
    filesystem = pafs.S3FileSystem(**options)
    return Storage(uri=f"s3://{root}", root=root, filesystem=filesystem, endpoint_url=endpoint)


def _endpoint(endpoint: str | None, scheme: str | None) -> str | None:
    """``scheme://host[:port]`` of an endpoint override given as that or as ``host[:port]`` (then ``scheme``,
    default https); None for none."""
    if not endpoint:
        return None
    parsed = urlparse(endpoint if "://" in endpoint else f"{scheme or 'https'}://{endpoint}")
    if not parsed.netloc:
        raise ValueError(f"storage: endpoint override {endpoint!r} is not host[:port] or scheme://host[:port]")
    return f"{parsed.scheme}://{parsed.netloc}"


def local_path_below(folder: Path, name: str, *, source: str) -> Path:
    """``folder/name`` for a file that ``source`` (a store, a manifest) names: ``name`` must be a relative path
    of plain parts (no ``..``, ``.``, empty part or NUL) and stay below ``folder`` once resolved (symlinks
    followed); else ``ValueError`` naming both."""
    parts = name.split("/")
    base = Path(folder).resolve()
    path = base.joinpath(*parts)
    if any(part in ("", ".", "..") or "\x00" in part for part in parts) or not path.resolve().is_relative_to(base):
        raise ValueError(f"{source} names the file {name!r}, which is not below the download folder {base}; "
                         "refused, nothing written there")
    return path


def download_file(storage: Storage, name: str, folder: Path, *, on_chunk: Callable[[bytes], object] | None = None) -> Path:
    """Download the file ``name`` below ``storage`` to ``folder/name``: the one way a file from a store reaches
    local disk. ``name`` must stay below ``folder`` (:func:`local_path_below`); the file is created new and never
    through a symlink (``O_EXCL | O_NOFOLLOW``). ``on_chunk`` sees every chunk (a digest); ``OSError`` from the
    store (a missing file: ``FileNotFoundError``) or the disk."""
    destination = local_path_below(folder, name, source=storage.uri)
    destination.parent.mkdir(parents=True, exist_ok=True)
    with storage.filesystem.open_input_stream(storage.path(name)) as source:
        descriptor = os.open(destination, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        with os.fdopen(descriptor, "wb") as out:
            while chunk := source.read(_DOWNLOAD_CHUNK):
                if on_chunk is not None:
                    on_chunk(chunk)
                out.write(chunk)
    return destination


def download_checkpoint(storage: Storage, folder: Path) -> Path:
    """The checkpoint at ``storage`` in the local ``folder`` (created): a directory's :data:`CHECKPOINT_FILES`,
    asked for by name (whatever else its listing holds is not taken), or a single file (an exported model) as
    ``folder/<its name>``. Returns the local checkpoint: ``folder`` or the file."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    kind = storage.filesystem.get_file_info(storage.root).type
    if kind == pafs.FileType.File:
        parent, _, name = storage.root.rpartition("/")
        return download_file(Storage(storage.uri.rpartition("/")[0], parent, storage.filesystem, storage.endpoint_url),
                             name, folder)
    for name in CHECKPOINT_FILES:
        if storage.filesystem.get_file_info(storage.path(name)).type == pafs.FileType.File:
            download_file(storage, name, folder)
    return folder


class CheckpointStore:
    """Checkpoints of one run under ``<storage>/<name>/checkpoint_<step>`` (sortable by step).

    Used where Ray Train does not persist checkpoints itself (its local mode, the in-process
    launcher). Ray Train's own reports use the same directory names
    (``ray.train.report(..., checkpoint_dir_name=checkpoint_dir_name(step))``) and carry the
    marker (:func:`mark_complete`), so a run started by one launcher resumes under the other.
    """

    def __init__(self, storage: Storage, name: str) -> None:
        self.storage = storage
        self.name = name

    def save(self, step: int, directory: Path) -> str:
        """Upload (copy) ``directory``'s files as the checkpoint of ``step``; returns its URI.

        The completion marker is written last, so a crash during the upload leaves a directory
        that :meth:`latest` ignores.
        """
        target = self.storage.path(self.name, checkpoint_dir_name(step))
        fs = self.storage.filesystem
        fs.create_dir(target, recursive=True)
        pafs.copy_files(str(Path(directory).resolve()), target, source_filesystem=pafs.LocalFileSystem(),
                        destination_filesystem=fs)
        with fs.open_output_stream(f"{target}/{COMPLETE_MARKER}") as stream:
            stream.write(str(step).encode())
        return self.storage.uri_of(self.name, checkpoint_dir_name(step))

    def steps(self) -> list[int]:
        """Steps of every complete checkpoint under this run, ascending."""
        fs = self.storage.filesystem
        base = self.storage.path(self.name)
        if fs.get_file_info(base).type != pafs.FileType.Directory:
            return []
        steps = []
        for info in fs.get_file_info(pafs.FileSelector(base, allow_not_found=True)):
            step = checkpoint_step(info.base_name)
            if step is not None and info.type == pafs.FileType.Directory and self._is_complete(info.path):
                steps.append(step)
        return sorted(steps)

    def _is_complete(self, path: str) -> bool:
        return self.storage.filesystem.get_file_info(f"{path}/{COMPLETE_MARKER}").type == pafs.FileType.File

    def latest(self) -> tuple[int, str] | None:
        """``(step, uri)`` of the newest complete checkpoint, or None."""
        steps = self.steps()
        if not steps:
            return None
        return steps[-1], self.storage.uri_of(self.name, checkpoint_dir_name(steps[-1]))

    def local_copy(self, step: int, destination: Path | None = None) -> Path:
        """The checkpoint of ``step`` as a local directory (the stored one itself when local)."""
        source = self.storage.path(self.name, checkpoint_dir_name(step))
        if self.storage.is_local:
            return Path(source)
        where = dataclasses.replace(self.storage, uri=self.storage.uri_of(self.name, checkpoint_dir_name(step)), root=source)
        return download_checkpoint(where, Path(destination or tempfile.mkdtemp(prefix="npsemiseg-ckpt-")))

    def prune(self, keep: int) -> None:
        """Delete all but the newest ``keep`` checkpoints (``keep`` >= 1)."""
        if keep < 1:
            raise ValueError(f"keep: expected >= 1, got {keep}")
        for step in self.steps()[:-keep]:
            path = self.storage.path(self.name, checkpoint_dir_name(step))
            if self.storage.is_local:
                shutil.rmtree(path, ignore_errors=True)
            else:
                self.storage.filesystem.delete_dir(path)
