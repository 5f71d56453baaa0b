"""A consistent copy of a live SQLite database, and the checks a restore runs on one.

:func:`snapshot` uses SQLite's online backup API in one step (``pages=-1``): it reads the
source in a single read transaction, so the copy is the database as of one commit, never half
of a transaction, while the app and its memory worker keep writing (in WAL mode a reader does
not block writers). Stepwise copying would restart from the first page after every write of
another connection and, with a busy memory worker, might never finish. The copy is switched to
``journal_mode=DELETE``: one self-contained file (the fact log turns WAL back on when it opens
it). Imports nothing from the project.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path

BUSY_TIMEOUT_S = 10.0  # waits on a writer's lock (a checkpoint), like the fact log's


def snapshot(source: Path, target: Path, on_bytes: Callable[[int], None] | None = None) -> None:
    """Copy the database at ``source`` to the new file ``target`` (mode 0600, made here).

    ``on_bytes(n)`` is called about every 0.1 s with the bytes written so far (the copy runs
    on a thread of its own; its size on disk is the progress).
    """
    os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    failure: list[BaseException] = []

    def copy() -> None:
        try:
            # mode=rw: never creates a missing file (read-only would need the WAL's -shm file)
            src = sqlite3.connect(_uri(source, "rw"), uri=True, timeout=BUSY_TIMEOUT_S)
            dst = sqlite3.connect(target)
            try:
                src.backup(dst, pages=-1)
                dst.execute("PRAGMA journal_mode = DELETE")
            finally:
                dst.close()
                src.close()
        except BaseException as exc:  # reported on the caller's thread
            failure.append(exc)

    worker = threading.Thread(target=copy, name="sqlite-backup", daemon=True)
    worker.start()
    while worker.is_alive():
        worker.join(0.1)
        if on_bytes is not None:
            on_bytes(target.stat().st_size)
    if failure:
        raise failure[0]


def database_bytes(path: Path) -> int:
    """About what a snapshot of ``path`` writes: the file and its WAL."""
    wal = Path(f"{path}-wal")
    return path.stat().st_size + (wal.stat().st_size if wal.exists() else 0)


def row_counts(path: Path) -> dict[str, int]:
    """``{table: rows}`` of every ordinary table (virtual tables are counted through their
    shadow tables), by name."""
    with contextlib.closing(sqlite3.connect(_uri(path, "ro"), uri=True)) as db:
        names = [
            r[0]
            for r in db.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
                " AND sql NOT LIKE 'CREATE VIRTUAL TABLE%' ORDER BY name"
            )
        ]
        return {n: db.execute(f'SELECT count(*) FROM "{n}"').fetchone()[0] for n in names}


def integrity_problem(path: Path) -> str | None:
    """None when ``PRAGMA integrity_check`` says ok, else its first complaint."""
    try:
        with contextlib.closing(sqlite3.connect(_uri(path, "ro"), uri=True)) as db:
            rows = db.execute("PRAGMA integrity_check").fetchall()
    except sqlite3.DatabaseError as exc:
        return str(exc)
    return None if rows == [("ok",)] else str(rows[0][0])


def _uri(path: Path, mode: str) -> str:
    return f"{Path(path).absolute().as_uri()}?mode={mode}"
