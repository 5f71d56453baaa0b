"""The fact log: the assistant's long-term memory as one SQLite file per user.

Every conversation turn is logged; facts extracted from turns are kept with their provenance
and an audit trail; ``kv_entries`` says where the encoded KV tensors of each fact live (the
tensors themselves are stored elsewhere). Nothing crosses profiles: every method that takes a
``profile_id`` filters by it, and composite foreign keys make a turn, an audit row or a
superseding fact of one profile unable to point at a row of another.

Decisions:

* Timestamps are ISO 8601 text. Our own clock (``created_at``, ``updated_at``, ``at``) is UTC,
  ``2025-01-02T03:04:05.000006+00:00`` (fixed width, so it sorts). ``turns.timestamp`` is the
  source's ``datetime.isoformat()`` verbatim: an aware time keeps its original offset (the
  user's local day matters for dates facts refer to), a naive one stays naive (zone unknown).
  Turns are ordered by ``idx``, never by timestamp. ``facts.refers_to`` is ``YYYY-MM-DD``.
* Forgetting: a forgotten fact's ``text`` becomes "" and its ``kv_entries`` and
  ``fact_embeddings`` rows are deleted in the same transaction (the caller deletes the tensors
  at the returned locations). It is never returned by :meth:`FactLog.active_facts`,
  :meth:`FactLog.facts_without_kv` or :meth:`FactLog.embeddings`, and :meth:`FactLog.record_kv`
  and :meth:`FactLog.store_embedding` refuse it. Trade-off: the text survives in the audit trail
  (``old_text`` of the 'forget' row and ``new_text`` of the earlier 'add'/'update' rows), in
  superseded earlier versions, and in the turns it was extracted from, so the memory browser
  can show what was forgotten and why; it is not an erasure. ``text_hash`` is kept as a
  tombstone so that re-running extraction over the old turns does not bring the fact back
  (:meth:`FactLog.add_fact` returns the forgotten id with ``created=False`` unless
  ``allow_forgotten=True``). ``PRAGMA secure_delete`` is on for files, so overwritten text is
  zeroed in the database pages, though copies can linger in the WAL until a checkpoint.
* The file is created 0600 (and tightened with a warning if it was looser), WAL mode,
  ``synchronous=NORMAL`` (a committed transaction survives a process crash; only an OS crash
  or power loss may lose the last ones), foreign keys on.
* One ``FactLog`` (one sqlite3 connection) per thread; several processes may share the file.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
import unicodedata
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

from sqlite_utils import Database

from inferscale_core.migrations import migrate
from inferscale_core.types import AuditEntry, Conversation, ConversationInfo, Fact, Turn

logger = logging.getLogger(__name__)

BUSY_TIMEOUT_MS = 10_000

_FACT_COLUMNS = "id, profile_id, text, refers_to, source_turn_ids, status, supersedes, created_at"


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


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


def _parse_dt(value: str | None) -> datetime | None:
    return None if value is None else datetime.fromisoformat(value)


def _refers_to_text(refers_to: date | str | None) -> str | None:
    if refers_to is None:
        return None
    if isinstance(refers_to, datetime):
        refers_to = refers_to.date()
    if isinstance(refers_to, str):
        refers_to = date.fromisoformat(refers_to)
    return refers_to.isoformat()


def _like(text: str) -> str:
    """A LIKE pattern matching ``text`` anywhere (``%``, ``_`` and ``\\`` taken literally)."""
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def _fact_from_row(row: Sequence[Any]) -> Fact:
    fid, profile_id, text, refers_to, turn_ids, status, supersedes, created_at = row
    return Fact(
        id=fid,
        profile_id=profile_id,
        text=text,
        refers_to=None if refers_to is None else date.fromisoformat(refers_to),
        source_turn_ids=json.loads(turn_ids),
        status=status,
        supersedes=supersedes,
        created_at=datetime.fromisoformat(created_at),
    )


def _create_private_file(path: Path) -> None:
    """Create ``path`` as 0600 before SQLite opens it; tighten it (and its WAL) if looser."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    os.close(fd)
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


class FactLog:
    """The fact log over a ``sqlite_utils.Database`` (``FactLog(Database(memory=True))`` in tests).

    Opening applies pending migrations. Methods returning rows return plain dataclasses.
    """

    def __init__(self, db: Database) -> None:
        self.db = db
        db.execute("PRAGMA foreign_keys = ON")
        migrate(db)

    @classmethod
    def open(cls, path: Path | str) -> FactLog:
        """Open (creating if needed) the fact log file at ``path``: mode 0600, WAL, migrated."""
        path = Path(path).expanduser()
        _create_private_file(path)
        db = Database(path)
        try:
            db.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            db.enable_wal()
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

    def __enter__(self) -> FactLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _write(self) -> Iterator[None]:
        """A write transaction: ``BEGIN IMMEDIATE``, commit, or roll back on any exception.

        IMMEDIATE rather than sqlite-utils' ``atomic()`` (a deferred ``BEGIN``): our writes read
        first, and in WAL mode a deferred transaction whose snapshot went stale fails with
        "database is locked" at its first write instead of waiting for the busy timeout.
        Inside an open transaction it nests as a savepoint.
        """
        if self.db.conn.in_transaction:
            with self.db.atomic():
                yield
            return
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield
            self.db.execute("COMMIT")
        except BaseException:
            self.db.rollback()
            raise

    def _one(self, sql: str, params: Sequence[Any] = ()) -> Any:
        row = self.db.execute(sql, params).fetchone()
        return None if row is None else row[0]

    # -- profiles ---------------------------------------------------------------------------

    def profile(self, name: str = "default") -> int:
        """The id of the profile called ``name``, created if it does not exist."""
        if not name:
            raise ValueError("profile name must not be empty")
        with self._write():
            self.db.execute(
                "INSERT INTO profiles (name, created_at) VALUES (?, ?)"
                " ON CONFLICT (name) DO NOTHING",
                (name, _now()),
            )
            return self._one("SELECT id FROM profiles WHERE name = ?", (name,))

    # -- conversations and turns ------------------------------------------------------------

    def add_conversation(self, profile_id: int, conv: Conversation) -> tuple[int, int]:
        """Store ``conv`` under the profile; return ``(conversation_id, number of new turns)``.

        All or nothing: the conversation and its new turns are one transaction. Idempotent
        when ``conv.source_id`` is set: the same ``(source, source_id)`` maps to the same
        conversation, and only turns with an index beyond those stored are added (a grown
        export imports what is new; stored turns are never changed or duplicated). Without a
        ``source_id`` every call creates a new conversation. A re-import updates the title.
        """
        with self._write():
            conv_id = None
            if conv.source_id is not None:
                conv_id = self._one(
                    "SELECT id FROM conversations"
                    " WHERE profile_id = ? AND source = ? AND source_id = ?",
                    (profile_id, conv.source, conv.source_id),
                )
            if conv_id is None:
                cur = self.db.execute(
                    "INSERT INTO conversations (profile_id, title, source, source_id, created_at)"
                    " VALUES (?, ?, ?, ?, ?)",
                    (profile_id, conv.title, conv.source, conv.source_id, _now()),
                )
                conv_id = cur.lastrowid
                stored = 0
            else:
                self.db.execute(
                    "UPDATE conversations SET title = ? WHERE id = ? AND title <> ?",
                    (conv.title, conv_id, conv.title),
                )
                stored = self._one(
                    "SELECT coalesce(max(idx) + 1, 0) FROM turns WHERE conversation_id = ?",
                    (conv_id,),
                )
                if stored > len(conv.turns):
                    logger.info(
                        "conversation %s/%s has %d stored turns but the import has %d;"
                        " keeping the stored ones",
                        conv.source,
                        conv.source_id,
                        stored,
                        len(conv.turns),
                    )
            new = conv.turns[stored:]
            self._insert_turns(conv_id, profile_id, conv.source, stored, new)
        return conv_id, len(new)

    def _insert_turns(
        self, conv_id: int, profile_id: int, source: str, first_idx: int, turns: Iterable[Turn]
    ) -> int | None:
        last = None
        for i, t in enumerate(turns, start=first_idx):
            last = self.db.execute(
                "INSERT INTO turns (conversation_id, profile_id, idx, speaker, text, timestamp,"
                " source, source_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    conv_id,
                    profile_id,
                    i,
                    t.speaker,
                    t.text,
                    None if t.timestamp is None else t.timestamp.isoformat(),
                    source,
                    t.source_id,
                ),
            ).lastrowid
        return last

    def append_turn(self, conversation_id: int, turn: Turn) -> int:
        """Append ``turn`` at the end of the conversation; return its turn id."""
        with self._write():
            row = self.db.execute(
                "SELECT profile_id, source FROM conversations WHERE id = ?", (conversation_id,)
            ).fetchone()
            if row is None:
                raise ValueError(f"no conversation {conversation_id}")
            profile_id, source = row
            nxt = self._one(
                "SELECT coalesce(max(idx) + 1, 0) FROM turns WHERE conversation_id = ?",
                (conversation_id,),
            )
            turn_id = self._insert_turns(conversation_id, profile_id, source, nxt, [turn])
        assert turn_id is not None
        return turn_id

    def turns(
        self, profile_id: int, after_id: int = 0, limit: int | None = None
    ) -> list[tuple[int, Turn]]:
        """The profile's turns with id > ``after_id``, as ``(turn_id, Turn)`` in id order.

        For the extractor: remember the last turn id processed and ask for what came after.
        """
        rows = self.db.execute(
            "SELECT id, speaker, text, timestamp, source_id FROM turns"
            " WHERE profile_id = ? AND id > ? ORDER BY id LIMIT ?",
            (profile_id, after_id, -1 if limit is None else limit),
        ).fetchall()
        return [(r[0], Turn(r[1], r[2], _parse_dt(r[3]), r[4])) for r in rows]

    def turns_before(self, turn_id: int, w: int) -> list[Turn]:
        """The (at most) ``w`` turns before ``turn_id`` in its conversation, oldest first."""
        if w < 0:
            raise ValueError(f"w must be >= 0, got {w}")
        rows = self.db.execute(
            "SELECT t.speaker, t.text, t.timestamp, t.source_id FROM turns t"
            " JOIN turns me ON me.id = ? AND t.conversation_id = me.conversation_id"
            " WHERE t.idx < me.idx ORDER BY t.idx DESC LIMIT ?",
            (turn_id, w),
        ).fetchall()
        return [Turn(r[0], r[1], _parse_dt(r[2]), r[3]) for r in reversed(rows)]

    def conversations(
        self, profile_id: int, query: str = "", limit: int | None = None
    ) -> list[ConversationInfo]:
        """The profile's conversations, most recently active first (new, empty ones on top).

        ``query`` keeps those whose title or any turn contains it (case-insensitive for ASCII).
        """
        sql = (
            "SELECT c.id, c.title, c.source, c.created_at, count(t.id), max(t.id)"
            " FROM conversations c LEFT JOIN turns t ON t.conversation_id = c.id"
            " WHERE c.profile_id = ?"
        )
        params: list[Any] = [profile_id]
        if query.strip():
            pattern = _like(query.strip())
            sql += (
                " AND (c.title LIKE ? ESCAPE '\\' OR EXISTS (SELECT 1 FROM turns m"
                " WHERE m.conversation_id = c.id AND m.text LIKE ? ESCAPE '\\'))"
            )
            params += [pattern, pattern]
        # A conversation without turns yet was just started: it goes first.
        sql += " GROUP BY c.id ORDER BY count(t.id) = 0 DESC, max(t.id) DESC, c.id DESC LIMIT ?"
        params.append(-1 if limit is None else limit)
        return [
            ConversationInfo(r[0], r[1], r[2], datetime.fromisoformat(r[3]), r[4], r[5])
            for r in self.db.execute(sql, params).fetchall()
        ]

    def conversation_turns(self, conversation_id: int) -> list[tuple[int, Turn]]:
        """The turns of a conversation as ``(turn_id, Turn)``, in order."""
        rows = self.db.execute(
            "SELECT id, speaker, text, timestamp, source_id FROM turns"
            " WHERE conversation_id = ? ORDER BY idx",
            (conversation_id,),
        ).fetchall()
        return [(r[0], Turn(r[1], r[2], _parse_dt(r[3]), r[4])) for r in rows]

    def get_turns(self, turn_ids: Iterable[int]) -> list[tuple[int, Turn]]:
        """The turns with these ids (e.g. a fact's ``source_turn_ids``), by id."""
        ids = sorted({int(t) for t in turn_ids})
        if not ids:
            return []
        rows = self.db.execute(
            "SELECT id, speaker, text, timestamp, source_id FROM turns"
            f" WHERE id IN ({','.join('?' * len(ids))}) ORDER BY id",
            ids,
        ).fetchall()
        return [(r[0], Turn(r[1], r[2], _parse_dt(r[3]), r[4])) for r in rows]

    def rename_conversation(self, conversation_id: int, title: str) -> None:
        """Give a conversation a new title (``KeyError`` if it does not exist)."""
        title = " ".join(title.split())
        if not title:
            raise ValueError("a conversation title must not be empty")
        with self._write():
            cur = self.db.execute(
                "UPDATE conversations SET title = ? WHERE id = ?", (title, conversation_id)
            )
            if cur.rowcount == 0:
                raise KeyError(f"no conversation {conversation_id}")

    def delete_conversation(self, conversation_id: int) -> int:
        """Delete a conversation and its turns in one transaction; return how many turns went.

        The facts extracted from it stay in the memory (forget them in the memory browser);
        their ``source_turn_ids`` then name turns that no longer exist. A deleted imported
        conversation comes back only if its export is imported again under a new file hash.
        """
        with self._write():
            if self._one("SELECT 1 FROM conversations WHERE id = ?", (conversation_id,)) is None:
                raise KeyError(f"no conversation {conversation_id}")
            turns = self.db.execute(
                "DELETE FROM turns WHERE conversation_id = ?", (conversation_id,)
            ).rowcount
            self.db.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,))
        return turns

    # -- facts ------------------------------------------------------------------------------

    def _audit(
        self,
        profile_id: int,
        fact_id: int,
        action: str,
        cause: str,
        old_text: str | None,
        new_text: str | None,
        at: str,
    ) -> None:
        self.db.execute(
            "INSERT INTO audit (profile_id, fact_id, action, cause, old_text, new_text, at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            (profile_id, fact_id, action, cause, old_text, new_text, at),
        )

    def _check_turns(self, profile_id: int, turn_ids: list[int]) -> None:
        if not turn_ids:
            return
        found = self._one(
            f"SELECT count(*) FROM turns WHERE profile_id = ?"
            f" AND id IN ({','.join('?' * len(turn_ids))})",
            (profile_id, *turn_ids),
        )
        if found != len(turn_ids):
            raise ValueError(f"source turns {turn_ids} are not all turns of profile {profile_id}")

    def _insert_fact(
        self,
        profile_id: int,
        text: str,
        text_hash: str,
        refers_to: str | None,
        turn_ids: list[int],
        supersedes: int | None,
        now: str,
    ) -> int:
        return self.db.execute(
            "INSERT INTO facts (profile_id, text, text_hash, refers_to, source_turn_ids, status,"
            " supersedes, created_at, updated_at) VALUES (?, ?, ?, ?, ?, 'active', ?, ?, ?)",
            (profile_id, text, text_hash, refers_to, json.dumps(turn_ids), supersedes, now, now),
        ).lastrowid

    def add_fact(
        self,
        profile_id: int,
        text: str,
        refers_to: date | str | None = None,
        source_turn_ids: Iterable[int] = (),
        cause: str | None = None,
        *,
        allow_forgotten: bool = False,
    ) -> tuple[int, bool]:
        """Add a fact; return ``(fact_id, created)``.

        Deduplicated by normalized text within the profile: if an active fact with the same
        :func:`fact_text_hash` exists, its id is returned with ``created=False`` (and the new
        source turns are added to its provenance). If the same text was *forgotten* and
        ``allow_forgotten`` is false, nothing is added and the forgotten fact's id is returned
        with ``created=False``; pass ``allow_forgotten=True`` when the user deliberately tells
        it again. ``cause`` defaults to "extracted from turn(s) ..." or "added". The audit row
        is written in the same transaction.
        """
        text = text.strip()
        if not normalize_fact_text(text):
            raise ValueError(f"empty fact text: {text!r}")
        h = fact_text_hash(text)
        turn_ids = sorted({int(t) for t in source_turn_ids})
        ref = _refers_to_text(refers_to)
        if cause is None:
            if turn_ids:
                label = "turn" if len(turn_ids) == 1 else "turns"
                cause = f"extracted from {label} {', '.join(map(str, turn_ids))}"
            else:
                cause = "added"
        with self._write():
            self._check_turns(profile_id, turn_ids)
            row = self.db.execute(
                "SELECT id, source_turn_ids FROM facts"
                " WHERE profile_id = ? AND text_hash = ? AND status = 'active'",
                (profile_id, h),
            ).fetchone()
            if row is not None:
                fid, stored = row
                merged = sorted(set(json.loads(stored)) | set(turn_ids))
                if merged != json.loads(stored):
                    self.db.execute(
                        "UPDATE facts SET source_turn_ids = ?, updated_at = ? WHERE id = ?",
                        (json.dumps(merged), _now(), fid),
                    )
                return fid, False
            if not allow_forgotten:
                gone = self._one(
                    "SELECT id FROM facts WHERE profile_id = ? AND text_hash = ?"
                    " AND status = 'forgotten' ORDER BY id DESC LIMIT 1",
                    (profile_id, h),
                )
                if gone is not None:
                    logger.debug("not re-adding forgotten fact %d", gone)
                    return gone, False
            now = _now()
            fid = self._insert_fact(profile_id, text, h, ref, turn_ids, None, now)
            self._audit(profile_id, fid, "add", cause, None, text, now)
        return fid, True

    def _active_row(self, fact_id: int) -> tuple[int, str, str | None, str]:
        row = self.db.execute(
            "SELECT profile_id, text, refers_to, status FROM facts WHERE id = ?", (fact_id,)
        ).fetchone()
        if row is None:
            raise KeyError(f"no fact {fact_id}")
        if row[3] != "active":
            raise InactiveFactError(f"fact {fact_id} is {row[3]}")
        return row

    def update_fact(
        self,
        fact_id: int,
        new_text: str,
        cause: str,
        refers_to: date | str | None = None,
        source_turn_ids: Iterable[int] = (),
    ) -> int:
        """Replace an active fact: the old one becomes 'superseded' and a new active fact with
        ``supersedes=fact_id`` is inserted (audit 'update' on the new id). Returns the new id.

        ``refers_to`` defaults to the old fact's. If the new text equals (normalized) another
        active fact of the profile, the old fact is superseded and that fact's id is returned
        (merge; the audit row says so). The old fact's embeddings are deleted in the same
        transaction (its KV rows are left to :meth:`prune_kv`). Raises
        :class:`InactiveFactError` if the fact is not active and ``KeyError`` if it does not
        exist.
        """
        new_text = new_text.strip()
        if not normalize_fact_text(new_text):
            raise ValueError(f"empty fact text: {new_text!r}")
        h = fact_text_hash(new_text)
        turn_ids = sorted({int(t) for t in source_turn_ids})
        with self._write():
            profile_id, old_text, old_ref, _ = self._active_row(fact_id)
            self._check_turns(profile_id, turn_ids)
            ref = old_ref if refers_to is None else _refers_to_text(refers_to)
            now = _now()
            self.db.execute(
                "UPDATE facts SET status = 'superseded', updated_at = ? WHERE id = ?",
                (now, fact_id),
            )
            self._drop_embeddings(fact_id)
            other = self._one(
                "SELECT id FROM facts WHERE profile_id = ? AND text_hash = ? AND status = 'active'",
                (profile_id, h),
            )
            if other is not None:
                self._audit(
                    profile_id,
                    other,
                    "update",
                    f"{cause} (fact {fact_id} merged into it)",
                    old_text,
                    new_text,
                    now,
                )
                return other
            new_id = self._insert_fact(profile_id, new_text, h, ref, turn_ids, fact_id, now)
            self._audit(profile_id, new_id, "update", cause, old_text, new_text, now)
        return new_id

    def _drop_kv(self, fact_id: int) -> list[str]:
        # Call inside a transaction. (No DELETE ... RETURNING: it needs SQLite 3.35.)
        rows = self.db.execute(
            "SELECT location FROM kv_entries WHERE fact_id = ?", (fact_id,)
        ).fetchall()
        self.db.execute("DELETE FROM kv_entries WHERE fact_id = ?", (fact_id,))
        return sorted({r[0] for r in rows})

    def _drop_embeddings(self, fact_id: int) -> None:
        # Call inside a transaction.
        self.db.execute("DELETE FROM fact_embeddings WHERE fact_id = ?", (fact_id,))

    def delete_fact(self, fact_id: int, cause: str) -> list[str]:
        """Retire an active fact that is no longer true (status 'superseded' with no successor,
        audit 'delete'; the text is kept). Its KV and embedding rows are deleted in the same
        transaction; returns the KV locations so the caller can delete the tensors."""
        with self._write():
            profile_id, text, _, _ = self._active_row(fact_id)
            now = _now()
            self.db.execute(
                "UPDATE facts SET status = 'superseded', updated_at = ? WHERE id = ?",
                (now, fact_id),
            )
            self._audit(profile_id, fact_id, "delete", cause, text, None, now)
            self._drop_embeddings(fact_id)
            return self._drop_kv(fact_id)

    def forget_fact(self, fact_id: int, cause: str) -> list[str]:
        """Forget a fact (active or superseded): status 'forgotten', text "" (the text is kept
        only in the audit trail, see the module docstring), KV and embedding rows deleted, all
        in one transaction. Returns the removed KV locations; the caller deletes the tensors there.
        Forgetting a forgotten fact returns [] and changes nothing."""
        with self._write():
            row = self.db.execute(
                "SELECT profile_id, text, status FROM facts WHERE id = ?", (fact_id,)
            ).fetchone()
            if row is None:
                raise KeyError(f"no fact {fact_id}")
            profile_id, text, status = row
            self._drop_embeddings(fact_id)
            if status == "forgotten":
                return self._drop_kv(fact_id)
            now = _now()
            self.db.execute(
                "UPDATE facts SET status = 'forgotten', text = '', updated_at = ? WHERE id = ?",
                (now, fact_id),
            )
            self._audit(profile_id, fact_id, "forget", cause, text, None, now)
            return self._drop_kv(fact_id)

    def get_fact(self, fact_id: int) -> Fact | None:
        row = self.db.execute(
            f"SELECT {_FACT_COLUMNS} FROM facts WHERE id = ?", (fact_id,)
        ).fetchone()
        return None if row is None else _fact_from_row(row)

    def active_facts(self, profile_id: int) -> list[Fact]:
        rows = self.db.execute(
            f"SELECT {_FACT_COLUMNS} FROM facts WHERE profile_id = ? AND status = 'active'"
            " ORDER BY id",
            (profile_id,),
        ).fetchall()
        return [_fact_from_row(r) for r in rows]

    def search_facts(
        self,
        profile_id: int,
        query: str = "",
        statuses: Sequence[str] = ("active",),
        limit: int | None = 500,
    ) -> list[Fact]:
        """The profile's facts whose text contains ``query`` (all when empty), newest first.

        ``statuses`` picks which: "active", "superseded", "forgotten" (a forgotten fact's text
        is "", so only an empty query finds it).
        """
        if not statuses:
            return []
        sql = (
            f"SELECT {_FACT_COLUMNS} FROM facts WHERE profile_id = ?"
            f" AND status IN ({','.join('?' * len(statuses))})"
        )
        params: list[Any] = [profile_id, *statuses]
        if query.strip():
            sql += " AND text LIKE ? ESCAPE '\\'"
            params.append(_like(query.strip()))
        sql += " ORDER BY id DESC LIMIT ?"
        params.append(-1 if limit is None else limit)
        return [_fact_from_row(r) for r in self.db.execute(sql, params).fetchall()]

    def count_facts(self, profile_id: int) -> dict[str, int]:
        """How many facts the profile has in each status (statuses with none are left out)."""
        rows = self.db.execute(
            "SELECT status, count(*) FROM facts WHERE profile_id = ? GROUP BY status",
            (profile_id,),
        ).fetchall()
        return {r[0]: r[1] for r in rows}

    # -- KV entries -------------------------------------------------------------------------

    def facts_without_kv(
        self,
        profile_id: int,
        model_fingerprint: str,
        w: int,
        encoder_version: str | int,
        limit: int | None = None,
    ) -> list[Fact]:
        """Active facts of the profile with no KV entry for this (model, w, encoder), by id."""
        rows = self.db.execute(
            f"SELECT {_FACT_COLUMNS} FROM facts f WHERE profile_id = ? AND status = 'active'"
            " AND NOT EXISTS (SELECT 1 FROM kv_entries k WHERE k.fact_id = f.id"
            " AND k.model_fingerprint = ? AND k.w = ? AND k.encoder_version = ?)"
            " ORDER BY id LIMIT ?",
            (
                profile_id,
                model_fingerprint,
                w,
                str(encoder_version),
                -1 if limit is None else limit,
            ),
        ).fetchall()
        return [_fact_from_row(r) for r in rows]

    def record_kv(
        self,
        fact_id: int,
        model_fingerprint: str,
        w: int,
        encoder_version: str | int,
        location: str,
        num_tokens: int,
        nbytes: int,
    ) -> str | None:
        """Record where the KV tensors of an active fact are (replacing an earlier entry with
        the same key). Returns the replaced entry's location if it differs (the caller deletes
        those tensors), else None. Raises :class:`InactiveFactError` if the fact was
        superseded or forgotten meanwhile: the caller must then delete what it just wrote."""
        with self._write():
            self._active_row(fact_id)
            key = (fact_id, model_fingerprint, w, str(encoder_version))
            old = self._one(
                "SELECT location FROM kv_entries WHERE fact_id = ? AND model_fingerprint = ?"
                " AND w = ? AND encoder_version = ?",
                key,
            )
            self.db.execute(
                "INSERT INTO kv_entries (fact_id, model_fingerprint, w, encoder_version, location,"
                " num_tokens, nbytes, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (fact_id, model_fingerprint, w, encoder_version) DO UPDATE SET"
                " location = excluded.location, num_tokens = excluded.num_tokens,"
                " nbytes = excluded.nbytes, created_at = excluded.created_at",
                (*key, location, num_tokens, nbytes, _now()),
            )
        return old if old is not None and old != location else None

    def prune_kv(self, profile_id: int) -> list[str]:
        """Delete the KV rows of the profile's facts that are no longer active (superseded by
        :meth:`update_fact`); return their locations so the caller can delete the tensors."""
        inactive = "SELECT id FROM facts WHERE profile_id = ? AND status <> 'active'"
        with self._write():
            rows = self.db.execute(
                f"SELECT location FROM kv_entries WHERE fact_id IN ({inactive})", (profile_id,)
            ).fetchall()
            self.db.execute(f"DELETE FROM kv_entries WHERE fact_id IN ({inactive})", (profile_id,))
        return sorted({r[0] for r in rows})

    def kv_entries(self, fact_id: int) -> list[tuple[str, str]]:
        """``(model_fingerprint, location)`` of every stored KV entry of a fact.

        Read it before :meth:`forget_fact` when the caller must know which store (one per
        model fingerprint) holds the tensors at the returned locations.
        """
        rows = self.db.execute(
            "SELECT model_fingerprint, location FROM kv_entries WHERE fact_id = ?"
            " ORDER BY model_fingerprint, location",
            (fact_id,),
        ).fetchall()
        return [(r[0], r[1]) for r in rows]

    def count_embeddings(self, profile_id: int) -> dict[str, int]:
        """How many of the profile's active facts have an embedding, per embedding model."""
        rows = self.db.execute(
            "SELECT e.model, count(*) FROM fact_embeddings e JOIN facts f ON f.id = e.fact_id"
            " WHERE f.profile_id = ? AND f.status = 'active' GROUP BY e.model",
            (profile_id,),
        ).fetchall()
        return {r[0]: r[1] for r in rows}

    # -- embeddings -------------------------------------------------------------------------

    def store_embedding(self, fact_id: int, model: str, vector: bytes, dim: int) -> None:
        """Store the embedding of an active fact under ``model`` (replacing an earlier one).

        ``vector`` is opaque here (the retriever writes ``dim`` float32 values). Raises
        :class:`InactiveFactError` if the fact was superseded or forgotten meanwhile (so an
        embedding computed before a forget can't bring the fact's text back in vector form),
        and ``KeyError`` if it does not exist.
        """
        if dim <= 0 or not vector:
            raise ValueError(f"empty embedding (dim={dim}, {len(vector)} bytes)")
        with self._write():
            self._active_row(fact_id)
            self.db.execute(
                "INSERT INTO fact_embeddings (fact_id, model, dim, vector) VALUES (?, ?, ?, ?)"
                " ON CONFLICT (fact_id, model) DO UPDATE SET"
                " dim = excluded.dim, vector = excluded.vector",
                (fact_id, model, dim, bytes(vector)),
            )

    def embeddings(self, profile_id: int, model: str) -> list[tuple[int, bytes]]:
        """``(fact_id, vector)`` of the profile's active facts embedded with ``model``, by id."""
        rows = self.db.execute(
            "SELECT e.fact_id, e.vector FROM fact_embeddings e JOIN facts f ON f.id = e.fact_id"
            " WHERE f.profile_id = ? AND f.status = 'active' AND e.model = ? ORDER BY e.fact_id",
            (profile_id, model),
        ).fetchall()
        return [(r[0], r[1]) for r in rows]

    # -- audit ------------------------------------------------------------------------------

    def extraction_cursor(self, profile_id: int) -> int:
        """The last turn id whose facts were extracted (0: none yet)."""
        value = self._one(
            "SELECT last_turn_id FROM extraction_cursor WHERE profile_id = ?", (profile_id,)
        )
        return int(value or 0)

    def set_extraction_cursor(self, profile_id: int, turn_id: int) -> None:
        with self._write():
            self.db.execute(
                "INSERT INTO extraction_cursor (profile_id, last_turn_id) VALUES (?, ?)"
                " ON CONFLICT (profile_id) DO UPDATE SET last_turn_id = excluded.last_turn_id",
                (profile_id, turn_id),
            )

    def kv_location(
        self, fact_id: int, model_fingerprint: str, w: int, encoder_version: str | int
    ) -> str | None:
        """Where the fact's KV for this (model, w, encoder) is, or None if not encoded yet."""
        return self._one(
            "SELECT location FROM kv_entries WHERE fact_id = ? AND model_fingerprint = ?"
            " AND w = ? AND encoder_version = ?",
            (fact_id, model_fingerprint, w, str(encoder_version)),
        )

    def kv_locations(self, fact_id: int) -> list[str]:
        """Every stored KV location of a fact (all models and encodings)."""
        rows = self.db.execute(
            "SELECT location FROM kv_entries WHERE fact_id = ? ORDER BY location", (fact_id,)
        ).fetchall()
        return [r[0] for r in rows]

    def audit(self, profile_id: int, fact_id: int | None = None) -> list[AuditEntry]:
        """The profile's audit trail (optionally of one fact), oldest first."""
        sql = (
            "SELECT id, profile_id, fact_id, action, cause, old_text, new_text, at FROM audit"
            " WHERE profile_id = ?"
        )
        params: list[Any] = [profile_id]
        if fact_id is not None:
            sql += " AND fact_id = ?"
            params.append(fact_id)
        rows = self.db.execute(sql + " ORDER BY id", params).fetchall()
        return [
            AuditEntry(r[0], r[1], r[2], r[3], r[4], r[5], r[6], datetime.fromisoformat(r[7]))
            for r in rows
        ]
