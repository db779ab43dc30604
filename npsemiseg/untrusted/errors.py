"""The one error every reader of files from others raises when it refuses a file."""

from __future__ import annotations


class UnsafeFileError(ValueError):
    """A file refused unread: it would need code run, or more memory or time than its size allows, to be read.
    Its message is one line naming the file and what it asked for."""
