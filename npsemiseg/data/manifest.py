"""The manifest of a dataset tree: every file's relative path, size and SHA-256, in ``manifest.json``.

Written once next to the data (``npsemiseg data manifest DIR``, before uploading ``DIR`` to an
object store), it is what a copy of the tree is verified against: a staged copy on a training node
must hold exactly these files with these sizes and digests, and a listing of the store can be
compared with it without downloading anything. The format::

    {"format": 1, "files": [{"path": "JPEGImages/2007_000032.jpg", "size": 12345, "sha256": "..."}, ...]}

Paths are relative, ``/``-separated, sorted; the manifest itself, hidden files and folders
(``.*``: temporary files of an interrupted copy) are not listed. Every path stays inside the tree
(:func:`npsemiseg.data.paths.inside_root`): an entry with ``..`` or an absolute path is refused when the manifest
is read, a symlink leading out of the tree when it is written or verified.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from npsemiseg.data.paths import OutsideRootError, inside_root, unsafe_relative

#: The manifest's file name, at the top of the tree it describes
MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = 1
_CHUNK = 1 << 20


@dataclass(frozen=True)
class ManifestEntry:
    """One file of the tree: relative ``/`` path, size in bytes, hex SHA-256."""

    path: str
    size: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    """The files of a tree, sorted by path."""

    files: tuple[ManifestEntry, ...]

    @property
    def total_bytes(self) -> int:
        return sum(entry.size for entry in self.files)

    def to_json(self) -> str:
        files = [{"path": e.path, "size": e.size, "sha256": e.sha256} for e in self.files]
        return json.dumps({"format": MANIFEST_FORMAT, "files": files}, indent=0) + "\n"

    @property
    def digest(self) -> str:
        """SHA-256 of the manifest's content: names this version of the tree."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()

    @classmethod
    def from_json(cls, text: str | bytes, where: str = MANIFEST_NAME) -> Manifest:
        """Parse a manifest; ``ValueError`` naming ``where`` and what is wrong."""
        try:
            data = json.loads(text)
            if data.get("format") != MANIFEST_FORMAT:
                raise ValueError(f"format {data.get('format')!r}, expected {MANIFEST_FORMAT}")
            files = []
            for item in data["files"]:
                path, size, digest = item["path"], item["size"], item["sha256"]
                if (not isinstance(path, str) or unsafe_relative(path) is not None
                        or not isinstance(size, int) or size < 0 or not isinstance(digest, str) or len(digest) != 64):
                    raise ValueError(f"bad entry {item!r}")
                files.append(ManifestEntry(path, size, digest))
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise ValueError(f"manifest {where} is not a dataset manifest ({error}); "
                             "expected the output of `npsemiseg data manifest DIR`") from None
        return cls(tuple(sorted(files, key=lambda e: e.path)))


def file_sha256(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        while chunk := stream.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def tree_files(root: str | os.PathLike) -> list[str]:
    """The relative ``/`` paths of the files under ``root`` a manifest lists, sorted."""
    root = Path(root)
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        relative = Path(folder).relative_to(root)
        for name in files:
            if name.startswith(".") or (relative == Path(".") and name == MANIFEST_NAME):
                continue
            found.append((relative / name).as_posix())
    return sorted(found)


def build_manifest(root: str | os.PathLike, progress: Callable[[int, int], None] | None = None) -> Manifest:
    """The manifest of the tree under ``root`` (reads every file once)."""
    root = Path(root)
    if not root.is_dir():
        raise ValueError(f"manifest: {root} is not a directory (expected a dataset tree, e.g. .../VOC2012)")
    paths = tree_files(root)
    if not paths:
        raise ValueError(f"manifest: {root} holds no files")
    entries = []
    for done, path in enumerate(paths, 1):
        file = inside_root(root, path, what="manifest file")
        entries.append(ManifestEntry(path, file.stat().st_size, file_sha256(file)))
        if progress is not None:
            progress(done, len(paths))
    return Manifest(tuple(entries))


def write_manifest(root: str | os.PathLike, progress: Callable[[int, int], None] | None = None) -> tuple[Path, Manifest]:
    """Build the manifest of ``root`` and write it to ``root/manifest.json`` (atomically); returns both."""
    manifest = build_manifest(root, progress)
    target = Path(root) / MANIFEST_NAME
    temporary = target.with_name(f".{MANIFEST_NAME}.tmp-{os.getpid()}")
    temporary.write_text(manifest.to_json())
    os.replace(temporary, target)
    return target, manifest


def compare_sizes(manifest: Manifest, sizes: dict[str, int]) -> list[str]:
    """Problems of a listing (relative path -> size) against ``manifest``: missing files, other sizes.
    Files the listing has beyond the manifest are not a problem (nothing reads them from the copy)."""
    problems = []
    for entry in manifest.files:
        size = sizes.get(entry.path)
        if size is None:
            problems.append(f"{entry.path} is missing (the manifest lists {entry.size} bytes)")
        elif size != entry.size:
            problems.append(f"{entry.path} is {size} bytes, the manifest says {entry.size}")
    return problems


def verify_tree(root: str | os.PathLike, manifest: Manifest, *, digests: bool = True,
                entries: Iterable[ManifestEntry] | None = None) -> list[str]:
    """Problems of the tree under ``root`` against ``manifest`` (missing files, sizes, and SHA-256 when
    ``digests``), each naming the file; ``entries``: only these of the manifest's files."""
    root = Path(root)
    problems = []
    for entry in manifest.files if entries is None else entries:
        try:
            file = inside_root(root, entry.path, what="manifest entry")
            size = file.stat().st_size
        except OutsideRootError as error:
            problems.append(str(error))
            continue
        except FileNotFoundError:
            problems.append(f"{entry.path} is missing (the manifest lists {entry.size} bytes)")
            continue
        if size != entry.size:
            problems.append(f"{entry.path} is {size} bytes, the manifest says {entry.size}")
        elif digests and file_sha256(file) != entry.sha256:
            problems.append(f"{entry.path} has SHA-256 {file_sha256(file)[:12]}..., the manifest says {entry.sha256[:12]}...")
    return problems
