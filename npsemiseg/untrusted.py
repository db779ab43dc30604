"""Files from others are read as data, never as code: torch files and images.

Checkpoints, weights and images reach a node from colleagues, shared buckets and a tracking server whose
tags anyone with write access can change. Unpickling a torch file can call any function (a ``__reduce__``
calling ``os.system``), and an image header can declare more pixels than the node has memory. Every reader
of such files in the project goes through this module (``docs/reliability.md``, "Threat model"):

- :func:`load_torch_file`: ``torch.load(..., weights_only=True)``: tensors, plain containers, numbers,
  strings and optimiser states; a file that asks for any other global (a function to call, a class to
  build) is refused with :class:`UnsafeFileError` naming the file and that global, before anything of it runs.
- :func:`open_image`: PIL with an explicit pixel limit (:data:`MAX_IMAGE_PIXELS`) checked from the header,
  before any pixel is decoded; PIL's ``DecompressionBombWarning`` is an error here.
"""

from __future__ import annotations

import contextlib
import os
import re
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from PIL import Image

#: The most pixels (width x height) an image may declare: 8192 x 8192, 4x a 4K frame, 32x a Cityscapes
#: image; 256 MiB decoded as RGB. Below PIL's own warning (89.5 M) so PIL's global setting never decides.
MAX_IMAGE_PIXELS = 8192 * 8192

#: how torch's weights-only unpickler names what it refused: a global to import, or a type to build
_REFUSED = re.compile(r"GLOBAL\s+([\w.]+)|but got <class '([\w.]+)'>")
_PIXELS = re.compile(r"\((\d+) pixels\)")


class UnsafeFileError(ValueError):
    """A file that would need code run (or more memory than any image may take) to be read; refused."""


def load_torch_file(path: str | os.PathLike, *, what: str, allow: Sequence[Any] = ()) -> Any:
    """``torch.load`` of ``path`` on CPU with ``weights_only=True``; ``allow``: the exact extra globals (types,
    functions) this reader accepts, only for this call. A global outside them is an :class:`UnsafeFileError`
    ``"<what>: <path> asks to load <module.name> ..."``; other read errors propagate unchanged."""
    try:
        with torch.serialization.safe_globals(list(allow)):
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # torch wraps the unpickler's refusal in an UnpicklingError
        found = _REFUSED.search(str(error))
        if found is None:
            raise
        refused = found.group(1) or found.group(2)
        raise UnsafeFileError(f"{what}: {path} asks to load {refused}, which is not a tensor or plain data; refused "
                              "without running it (files from others are read as data only)") from None


class ImageTooLargeError(UnsafeFileError):
    """An image declaring more than :data:`MAX_IMAGE_PIXELS` pixels (a decompression bomb)."""


def _too_large(path: Path, pixels: int | str) -> ImageTooLargeError:
    return ImageTooLargeError(f"image file {path} declares {pixels} pixels, more than the {MAX_IMAGE_PIXELS:,} an "
                              "image may have (a decompression bomb, or an image to downscale first); refused")


@contextlib.contextmanager
def open_image(path: str | os.PathLike) -> Iterator[Image.Image]:
    """``PIL.Image.open(path)`` (lazy: header only) refusing more than :data:`MAX_IMAGE_PIXELS` pixels with
    :class:`ImageTooLargeError` before any pixel is decoded; PIL's own errors (missing file, not an image) propagate."""
    path = Path(path)
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        try:
            image = Image.open(path)
        except (Image.DecompressionBombError, Image.DecompressionBombWarning) as error:
            found = _PIXELS.search(str(error))
            raise _too_large(path, f"{int(found.group(1)):,}" if found else "too many") from None
    with image:
        width, height = image.size
        if width * height > MAX_IMAGE_PIXELS:
            raise _too_large(path, f"{width} x {height} = {width * height:,}")
        yield image
