"""The connection under every table mixin: opening the file, the transaction helper, helpers.

:class:`FactLogBase` holds the ``sqlite_utils.Database`` (``self.db``) and the one transaction
helper (:meth:`FactLogBase.transaction`) that every write of the fact log, and of its callers,
goes through. The per-table mixins in this package subclass it; :class:`~inferscale_core.factlog.
FactLog` combines them.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sqlite3
import stat
import time
import unicodedata
from collections.abc import Sequence
from contextlib import AbstractContextManager
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any, Self

from sqlite_utils import Database

from inferscale_core.factlog._transaction import immediate_transaction
from inferscale_core.factlog.migrations import migrate
from inferscale_core.files import create_private
from inferscale_core.types import Fact

logger = logging.getLogger(__name__)

BUSY_TIMEOUT_MS = 10_000
IN_BATCH = 500  # ids per "IN (...)" query (SQLite allows 32,766 parameters; stay far below)


def id_chunks(ids: Sequence[int]) -> list[tuple[list[int], str]]:
    """``ids`` without repeats, in chunks of :data:`IN_BATCH`, each with its ``?,?,…``
    placeholders for an ``IN (...)`` clause."""
    unique = list(dict.fromkeys(int(i) for i in ids))
    chunks = [unique[start : start + IN_BATCH] for start in range(0, len(unique), IN_BATCH)]
    return [(chunk, ",".join("?" * len(chunk))) for chunk in chunks]


FACT_COLUMNS = (
    "id, profile_id, text, refers_to, source_turn_ids, status, supersedes, created_at,"
    " valid_until, ended_by"
)
"""The ``facts`` columns :func:`fact_from_row` expects, in its order."""


class InactiveFactError(ValueError):
    """The fact is superseded or forgotten, so it can't be changed or given KV entries."""


def normalize_fact_text(text: str) -> str:
    """The form a fact's dedup hash is computed on.

    NFKC, case-folded, whitespace collapsed, trailing punctuation stripped. Persisted through
    ``text_hash``: changing this function needs a migration that recomputes the hashes.
    """
    s = " ".join(unicodedata.normalize("NFKC", text).casefold().split())
    end = len(s)
    while end and (s[end - 1].isspace() or unicodedata.category(s[end - 1]).startswith("P")):
        end -= 1
    return s[:end]


def fact_text_hash(text: str) -> str:
    """sha256 hex of :func:`normalize_fact_text`."""
    return hashlib.sha256(normalize_fact_text(text).encode("utf-8")).hexdigest()


def utc_now() -> str:
    """Our clock as stored: UTC, microseconds, ``+00:00`` (fixed width, so it sorts)."""
    return datetime.now(UTC).isoformat(timespec="microseconds")


def parse_dt(value: str | None) -> datetime | None:
    return None if value is None else datetime.fromisoformat(value)


def like_pattern(text: str) -> str:
    """A LIKE pattern matching ``text`` anywhere (``%``, ``_`` and ``\\`` taken literally)."""
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def fact_from_row(row: Sequence[Any]) -> Fact:
    """A :class:`Fact` from a row selected as :data:`FACT_COLUMNS`."""
    fid, profile_id, text, refers_to, turn_ids, status, supersedes, created_at, until, by = row
    return Fact(
        id=fid,
        profile_id=profile_id,
        text=text,
        refers_to=None if refers_to is None else date.fromisoformat(refers_to),
        source_turn_ids=json.loads(turn_ids),
        status=status,
        supersedes=supersedes,
        created_at=datetime.fromisoformat(created_at),
        valid_until=None if until is None else date.fromisoformat(until),
        ended_by=by,
    )


def _create_private_file(path: Path) -> None:
    """Create ``path`` as 0600 before SQLite opens it; tighten it (and its WAL) if looser.

    An existing file is not opened (:func:`create_private`): every ``open`` of the log, a
    memory worker's too, would otherwise drop the POSIX locks this process's live connections
    hold on it, and the next connection of another process to close (a CLI, a backup) would
    delete the WAL under them: the connection opened next here then read a new WAL through the
    old index ("disk I/O error", "file is not a database", rows of other tables).
    """
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    create_private(path)
    if os.name != "posix":  # Windows has no group/other bits to tighten
        return
    for p in (path, Path(f"{path}-wal"), Path(f"{path}-shm"), Path(f"{path}-journal")):
        try:
            mode = stat.S_IMODE(os.stat(p).st_mode)
        except FileNotFoundError:
            continue
        if mode & 0o077:
            logger.warning(
                "fact log file %s was readable by others (mode %o); changing it to 600", p, mode
            )
            os.chmod(p, 0o600)


def _enable_wal(db: Database) -> None:
    """Switch a new file to WAL (it stays so). Changing the journal mode needs the file to
    itself and does not wait on the busy timeout: when two threads open a new log at once (the
    chat's session and its reader), the second retries until the first has finished."""
    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            if db.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                db.enable_wal()
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.02)


class FactLogBase:
    """The fact log's connection, over a ``sqlite_utils.Database``.

    Constructing it turns foreign keys on and applies pending migrations.
    """

    def __init__(self, db: Database) -> None:
        self.db = db
        db.execute("PRAGMA foreign_keys = ON")
        migrate(db)

    @classmethod
    def open(cls, path: Path | str) -> Self:
        """Open (creating if needed) the fact log file at ``path``: mode 0600, WAL, migrated."""
        path = Path(path).expanduser()
        _create_private_file(path)
        db = Database(path)
        try:
            db.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            _enable_wal(db)
            db.execute("PRAGMA synchronous = NORMAL")
            db.execute("PRAGMA secure_delete = ON")
            return cls(db)
        except BaseException:
            db.close()
            raise

    def close(self) -> None:
        self.db.close()

    @property
    def path(self) -> Path | None:
        """The database file (None for an in-memory log)."""
        row = self.db.execute("PRAGMA database_list").fetchone()
        return Path(row[2]) if row is not None and row[2] else None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def transaction(self) -> AbstractContextManager[None]:
        """A write transaction: ``BEGIN IMMEDIATE``, commit, or roll back on any exception.

        Every write of the fact log runs in one. Callers use it to make several calls atomic
        (the import pipeline: "look a conversation up, then add to it" must not interleave
        with another writer): it takes the write lock at once, and the fact log's own writes
        inside it nest as savepoints. See :func:`immediate_transaction` for why IMMEDIATE.
        """
        return immediate_transaction(self.db)

    def _one(self, sql: str, params: Sequence[Any] = ()) -> Any:
        """The first column of the first row of ``sql`` (None when there is no row)."""
        row = self.db.execute(sql, params).fetchone()
        return None if row is None else row[0]

    def _active_row(self, fact_id: int) -> tuple[int, str, str | None, str]:
        """``(profile_id, text, refers_to, status)`` of an active fact.

        The guard of every write that needs a live fact (updating it, recording its KV or
        embedding). Raises ``KeyError`` if the fact does not exist and
        :class:`InactiveFactError` if it is superseded or forgotten.
        """
        row = self.db.execute(
            "SELECT profile_id, text, refers_to, status FROM facts WHERE id = ?", (fact_id,)
        ).fetchone()
        if row is None:
            raise KeyError(f"no fact {fact_id}")
        if row[3] != "active":
            raise InactiveFactError(f"fact {fact_id} is {row[3]}")
        return row
