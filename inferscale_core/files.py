"""Durable file writes: the one atomic-write helper every module uses, and private files made
without a second descriptor on a live database.

A reader sees the old file or the new one, never half of either: the content goes to a
temporary file in the same folder, is flushed to disk, renamed over the target, and the folder
itself is flushed so the rename survives a crash. Imports nothing from the project.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

FILE_MODE = 0o600  # memories and settings are private
TEMP_PREFIX = ".tmp-"


def create_private(path: Path | str, mode: int = FILE_MODE) -> None:
    """Create ``path`` empty with ``mode`` unless it exists.

    An existing file is left unopened: a database SQLite has open in this process must never
    get a second descriptor, since closing that one drops every POSIX lock the process holds
    on the file, SQLite's too (another process may then take the file as unused, checkpoint
    and delete the WAL under the live connections).
    """
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, mode))


def fsync_dir(path: Path | str) -> None:
    """Flush a folder's entries (a rename or unlink in it) to disk, where the platform can."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def fsync_tree(root: Path) -> None:
    """Flush every file under ``root``, then ``root`` itself (before a marker says "done")."""
    for path in root.rglob("*"):
        if path.is_file():
            with open(path, "rb") as fh:
                os.fsync(fh.fileno())
    fsync_dir(root)


def write_atomic(
    path: Path | str,
    content: bytes | str | Callable[[str], None],
    *,
    mode: int = FILE_MODE,
    suffix: str = ".tmp",
) -> Path:
    """Replace ``path`` with ``content`` atomically and durably; returns ``path``.

    ``content`` is the bytes or text (UTF-8) to write, or a function that writes the file at
    the temporary path it is given (e.g. ``safetensors.torch.save_file``). The file gets
    ``mode``; the temporary file is removed if anything fails.
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=TEMP_PREFIX, suffix=suffix, dir=path.parent)
    try:
        if callable(content):
            os.close(fd)
            content(tmp)
        else:
            data = content.encode("utf-8") if isinstance(content, str) else content
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
    return path
