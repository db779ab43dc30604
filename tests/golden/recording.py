"""What every golden recorder shares: its command line and the official checkout's commit.

A recorder runs as ``PYTHONPATH=$PWD python tests/golden/record_<name>_golden.py CHECKOUT`` and imports this
module from its own folder.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

GOLDEN = Path(__file__).resolve().parent


def official_commit(checkout: Path) -> str:
    """The checkout's HEAD, or a note saying it is not a git work tree."""
    try:
        return subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"


@contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """``torch.set_default_dtype(dtype)`` inside the block (float64 goldens: the tensors official code creates
    without a dtype, ``torch.rand(shape)`` or ``torch.zeros(shape)``, take the run's precision), restored after."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def recorder_arguments(doc: str, checkout_help: str, argv: Sequence[str] | None = None) -> argparse.Namespace:
    """``checkout`` (the official code), ``--out`` (default: this folder) and ``--commit`` (for a checkout that
    is no git work tree)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("checkout", type=Path, help=checkout_help)
    parser.add_argument("--out", type=Path, default=GOLDEN)
    parser.add_argument("--commit", default=None, help="the checkout's commit, where it is not a git work tree")
    return parser.parse_args(argv)


def save_golden(out: Path, stem: str, arrays: Mapping[str, np.ndarray] | None, sidecar: Mapping[str, Any]) -> None:
    """Write ``out/<stem>.npz`` (the recorded ``arrays``, where a recorder has any) and its sidecar ``out/<stem>.json``
    (where they come from and how they were made)."""
    out.mkdir(parents=True, exist_ok=True)
    if arrays is not None:
        np.savez_compressed(out / f"{stem}.npz", **arrays)
    (out / f"{stem}.json").write_text(json.dumps(sidecar, indent=1) + "\n")
    print(f"wrote {out / stem}.npz and .json" if arrays is not None else f"wrote {out / stem}.json", file=sys.stderr)


def sine_pattern(shape: Sequence[int], salt: float) -> np.ndarray:
    """Deterministic float64 values of ``shape``: ``bound * sin(1 + 0.7 i + salt)`` over the flat index i, ``bound``
    the Xavier-uniform bound of the shape (1-d: 0.1); the weights pattern of the recorders that copy weights."""
    numel = int(np.prod(shape))
    if len(shape) == 1:
        bound = 0.1
    else:
        receptive = int(np.prod(shape[2:])) if len(shape) > 2 else 1
        bound = float(np.sqrt(6.0 / (shape[0] * receptive + shape[1] * receptive)))
    return (bound * np.sin(1.0 + 0.7 * np.arange(numel, dtype=np.float64) + float(salt))).reshape(tuple(shape))


def official_sidecar(about: str, repository: str, checkout: Path, commit: str, files: Sequence[str]) -> dict[str, Any]:
    """The sidecar's opening keys: what the golden is, the official repository and commit, and the SHA-256 of the
    official ``files`` it ran (paths in ``checkout``)."""
    return {"about": about, "repository": repository, "commit": commit,
            "official_file_sha256": {f: hashlib.sha256((checkout / f).read_bytes()).hexdigest() for f in files}}
