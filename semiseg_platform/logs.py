"""Where the platform's ``logging`` output goes: progress lines and diagnostics of ``semiseg_platform.*``
(and the training loop's ``npsemiseg.training``: each cell's global batch and learning rate) as plain
lines on stdout, at a level the CLI chooses (``--quiet`` / ``--verbose``)."""

from __future__ import annotations

import logging
import sys

#: The logger of the cells' and sweeps' progress lines
PROGRESS = "semiseg_platform.progress"
_ROOT = "semiseg_platform"
#: every logger whose records the platform shows
_ROOTS = (_ROOT, "npsemiseg.training")
_MARK = "_semiseg_platform_handler"


class _StdoutHandler(logging.StreamHandler):
    """A handler writing to whatever ``sys.stdout`` is when a record is emitted (not the stream of the
    moment it was made: a captured or replaced stdout may since have been closed)."""

    def __init__(self) -> None:
        super().__init__(sys.stdout)

    @property
    def stream(self):  # type: ignore[override]
        return sys.stdout

    @stream.setter
    def stream(self, value) -> None:
        pass


def configure_logging(level: int = logging.INFO) -> None:
    """``semiseg_platform``'s records at ``level`` and above as plain lines on stdout (replacing an
    earlier call's handler); they do not propagate to the root logger."""
    handler = _StdoutHandler()
    handler.setFormatter(logging.Formatter("%(message)s"))
    setattr(handler, _MARK, True)
    for name in _ROOTS:
        ours = logging.getLogger(name)
        for old in [h for h in ours.handlers if getattr(h, _MARK, False)]:
            ours.removeHandler(old)
        ours.addHandler(handler)
        ours.setLevel(level)
        ours.propagate = False


def ensure_visible() -> None:
    """Show the progress lines in a process where nothing configured logging (a Ray worker)."""
    if not logging.getLogger(_ROOT).hasHandlers():
        configure_logging(logging.INFO)
