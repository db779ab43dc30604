"""Every file a dataset's lists, symlinks or manifest name stays inside the dataset's folder.

A list line, a manifest entry or a symlink under ``images/`` is written by whoever shared the dataset: a line
``../../etc/passwd`` or a link to ``/home/someone/x.jpg`` must not make a node read files outside the tree it
was given (``docs/reliability.md``, "Dataset folders"). Every reader of a dataset of files asks
:func:`inside_root` for the path of a relative name (``DatasetDef.item_files``: the training and evaluation
readers, ``data check``, the folder datasets' partitioning; the manifest's writer and verifier), so one rule holds
everywhere: the path, with every symlink resolved, lies under the dataset's folder, itself resolved.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path, PurePosixPath


class OutsideRootError(ValueError):
    """A path a dataset names that leaves its folder (``..``, absolute, or a symlink pointing out); refused."""


def unsafe_relative(relative: str) -> str | None:
    """Why ``relative`` (a ``/`` path from a list or a manifest) cannot name a file inside a tree, or None:
    empty, absolute, or holding a ``..`` part (checked on the text, before any file is looked at)."""
    parts = PurePosixPath(relative.replace("\\", "/")).parts
    if not relative or relative.startswith(("/", "\\")) or (parts and parts[0].endswith(":")):
        return "an absolute path"
    if ".." in parts:
        return "a '..' part"
    return None


@lru_cache(maxsize=4096)
def _real_folder(folder: str) -> str:
    """A folder's path with its symlinks resolved (cached: a dataset's files share a few folders, and resolving
    costs a system call per path component)."""
    return os.path.realpath(folder)


def inside_root(root: str | os.PathLike, relative: str, *, what: str) -> Path:
    """``root / relative``, refused with :class:`OutsideRootError` when ``relative`` is absolute or has a ``..``
    part, or when the file (its symlinks resolved) lies outside ``root`` (resolved too, so a root reached through
    a link is fine). ``what`` names the source in the message (``"list entry"``, ``"manifest entry"``). The
    returned path is the unresolved ``root / relative``: messages and ids keep the names the user gave."""
    reason = unsafe_relative(relative)
    path = os.path.join(os.fspath(root), relative)
    if reason is None:
        real_root = _real_folder(os.fspath(root))
        real = (os.path.realpath(path) if os.path.islink(path)
                else os.path.join(_real_folder(os.path.dirname(path)), os.path.basename(path)))
        if real == real_root or real.startswith(real_root.rstrip(os.sep) + os.sep):
            return Path(path)
        reason = f"a symlink to {real}"
    raise OutsideRootError(f"{what} {relative!r} names a file outside the dataset folder {root} ({reason}); "
                           "a dataset's files must lie inside its folder (copy the file in; for data on another "
                           "disk, make the dataset's folder itself the link, not a file or subfolder in it)")
