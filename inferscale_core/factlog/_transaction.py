"""The one write-transaction helper of the fact log (for :mod:`._base` and :mod:`.migrations`)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlite_utils import Database


@contextmanager
def immediate_transaction(db: Database) -> Iterator[None]:
    """A write transaction: ``BEGIN IMMEDIATE``, commit, or roll back on any exception.

    IMMEDIATE rather than sqlite-utils' ``atomic()`` (a deferred ``BEGIN``): our writes read
    first, and in WAL mode a deferred transaction whose snapshot went stale fails with "database
    is locked" at its first write instead of waiting for the busy timeout. Inside an open
    transaction it nests as a savepoint: an exception rolls back to it, and rolls back the
    whole transaction if it propagates out of the outer block too.
    """
    if db.conn.in_transaction:
        with db.atomic():
            yield
        return
    db.execute("BEGIN IMMEDIATE")
    try:
        yield
        db.execute("COMMIT")
    except BaseException:
        db.rollback()
        raise
