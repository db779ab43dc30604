"""Files from others are read as data, never as code, and within a budget: torch files, images, YAML.

Checkpoints, weights, images and configurations reach a node from colleagues, shared buckets and a tracking
server whose tags anyone with write access can change. Unpickling a torch file can call any function, and a
small file can ask for gigabytes: a pickle calling ``bytearray(n)``, a zip record that inflates a thousandfold,
an image header (or an image inside another) declaring more pixels than the node has memory, YAML aliases
repeating a subtree exponentially. Every reader of such files in the project goes through this package
(``docs/reliability.md``, "Threat model"):

- :func:`load_torch_file` (:mod:`.torch_files`): the zip records and the pickle inspected against the file's
  size before torch builds anything, then ``torch.load(..., weights_only=True)``;
- :func:`open_image` / :func:`decode_image` (:mod:`.images`): the reader's formats only, at most
  :data:`MAX_IMAGE_PIXELS` pixels from the header and again once decoded;
- :func:`load_yaml` (:mod:`.yaml_files`): the safe loader, aliases expanded and nesting bounded first.

A refused file is an :class:`UnsafeFileError` (a ``ValueError``) whose one-line message names the file. The torch
file readers import torch on first use (PEP 562): reading images and YAML does without it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from npsemiseg.untrusted.errors import UnsafeFileError
from npsemiseg.untrusted.images import (
    IMAGE_FORMATS,
    LABEL_FORMATS,
    MAX_IMAGE_PIXELS,
    PREDICT_FORMATS,
    ImageFormatError,
    ImageTooLargeError,
    decode_image,
    load_checked,
    open_image,
)
from npsemiseg.untrusted.yaml_files import (
    MAX_YAML_DEPTH,
    MAX_YAML_NODES,
    InvalidYamlError,
    YamlBudgetError,
    check_yaml,
    load_yaml,
)

__all__ = ["IMAGE_FORMATS", "LABEL_FORMATS", "MAX_IMAGE_PIXELS", "MAX_YAML_DEPTH", "MAX_YAML_NODES",
           "PREDICT_FORMATS", "ImageFormatError", "InvalidYamlError", "ImageTooLargeError", "UnsafeFileError", "YamlBudgetError",
           "check_torch_file", "check_yaml", "decode_image", "global_name", "load_checked", "load_torch_file",
           "load_yaml", "open_image"]

if TYPE_CHECKING:
    from npsemiseg.untrusted.torch_files import check_torch_file, global_name, load_torch_file

_TORCH_FILES = ("check_torch_file", "global_name", "load_torch_file")


def __getattr__(name: str) -> Any:
    if name in _TORCH_FILES:
        return getattr(importlib.import_module("npsemiseg.untrusted.torch_files"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
