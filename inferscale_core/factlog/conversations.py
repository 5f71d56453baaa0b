"""Profiles, conversations and turns: the ``profiles``, ``conversations`` and ``turns`` tables.

A conversation belongs to one profile; its turns are numbered by ``idx`` from 0 and are ordered
by it, never by timestamp. ``turns.timestamp`` is the source's ``datetime.isoformat()`` verbatim
(an aware time keeps its offset, a naive one stays naive).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from inferscale_core.context_window import first_context_turn
from inferscale_core.factlog._base import FactLogBase, like_pattern, parse_dt, utc_now
from inferscale_core.factlog.fulltext import create_profile_index, search_context
from inferscale_core.types import Conversation, ConversationInfo, Turn

logger = logging.getLogger(__name__)

_TURN_COLUMNS = "id, speaker, text, timestamp, source_id"


def _turn_from_row(row: Sequence[Any]) -> tuple[int, Turn]:
    """``(turn_id, Turn)`` from a row selected as ``_TURN_COLUMNS``."""
    tid, speaker, text, timestamp, source_id = row
    return tid, Turn(speaker, text, parse_dt(timestamp), source_id)


def _stored_form(turn: Turn) -> tuple[str, str, str | None]:
    """``(speaker, text, timestamp)`` of a turn as the ``turns`` table stores them."""
    return turn.speaker, turn.text, None if turn.timestamp is None else turn.timestamp.isoformat()


class ConversationsMixin(FactLogBase):
    # -- profiles ---------------------------------------------------------------------------

    def profile(self, name: str = "default") -> int:
        """The id of the profile called ``name``, created if it does not exist."""
        if not name:
            raise ValueError("profile name must not be empty")
        with self.transaction():
            self.db.execute(
                "INSERT INTO profiles (name, created_at) VALUES (?, ?)"
                " ON CONFLICT (name) DO NOTHING",
                (name, utc_now()),
            )
            profile_id = self._one("SELECT id FROM profiles WHERE name = ?", (name,))
            create_profile_index(self.db, profile_id)  # its own keyword index (fulltext.py)
            return profile_id

    def profiles(self) -> dict[str, int]:
        """``{name: id}`` of every profile, by name."""
        rows = self.db.execute("SELECT name, id FROM profiles ORDER BY name").fetchall()
        return {name: pid for name, pid in rows}

    # -- writing conversations and turns ----------------------------------------------------

    def add_conversation(self, profile_id: int, conv: Conversation) -> tuple[int, int]:
        """Store ``conv`` under the profile; return ``(conversation_id, number of new turns)``.

        All or nothing: the conversation and its new turns are one transaction. Idempotent
        when ``conv.source_id`` is set: the same ``(source, source_id)`` maps to the same
        conversation, and only turns with an index beyond those stored are added (a grown
        export imports what is new; stored turns are never changed or duplicated). Without a
        ``source_id`` every call creates a new conversation. A re-import updates the title.
        """
        with self.transaction():
            conv_id = None
            if conv.source_id is not None:
                conv_id = self.conversation_by_source(profile_id, conv.source, conv.source_id)
            if conv_id is None:
                cur = self.db.execute(
                    "INSERT INTO conversations (profile_id, title, source, source_id, created_at)"
                    " VALUES (?, ?, ?, ?, ?)",
                    (profile_id, conv.title, conv.source, conv.source_id, utc_now()),
                )
                conv_id = cur.lastrowid
                stored = 0
            else:
                self.db.execute(
                    "UPDATE conversations SET title = ? WHERE id = ? AND title <> ?",
                    (conv.title, conv_id, conv.title),
                )
                stored = self._next_idx(conv_id)
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

    def _next_idx(self, conversation_id: int) -> int:
        return self._one(
            "SELECT coalesce(max(idx) + 1, 0) FROM turns WHERE conversation_id = ?",
            (conversation_id,),
        )

    def _insert_turns(
        self, conv_id: int, profile_id: int, source: str, first_idx: int, turns: Iterable[Turn]
    ) -> int | None:
        """Insert ``turns`` numbered from ``first_idx``; return the last one's id (call inside
        a transaction)."""
        last = None
        for i, t in enumerate(turns, start=first_idx):
            last = self.db.execute(
                "INSERT INTO turns (conversation_id, profile_id, idx, speaker, text, timestamp,"
                " source, source_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (conv_id, profile_id, i, *_stored_form(t), source, t.source_id),
            ).lastrowid
        return last

    def append_turn(self, conversation_id: int, turn: Turn) -> int:
        """Append ``turn`` at the end of the conversation; return its turn id."""
        with self.transaction():
            row = self.db.execute(
                "SELECT profile_id, source FROM conversations WHERE id = ?", (conversation_id,)
            ).fetchone()
            if row is None:
                raise ValueError(f"no conversation {conversation_id}")
            profile_id, source = row
            nxt = self._next_idx(conversation_id)
            turn_id = self._insert_turns(conversation_id, profile_id, source, nxt, [turn])
        assert turn_id is not None
        return turn_id

    def rename_conversation(self, conversation_id: int, title: str) -> None:
        """Give a conversation a new title (``KeyError`` if it does not exist)."""
        title = " ".join(title.split())
        if not title:
            raise ValueError("a conversation title must not be empty")
        with self.transaction():
            cur = self.db.execute(
                "UPDATE conversations SET title = ? WHERE id = ?", (title, conversation_id)
            )
            if cur.rowcount == 0:
                raise KeyError(f"no conversation {conversation_id}")

    def delete_conversation(self, conversation_id: int) -> int:
        """Delete a conversation and its turns in one transaction; return how many turns went.

        The facts extracted from it stay in the memory (forget them in the memory browser);
        their ``source_turn_ids`` then name turns that no longer exist, and the turns it held
        leave their keyword search context (:func:`~inferscale_core.factlog.fulltext.
        search_context`: only the date words stay). A deleted imported conversation comes back
        only if its export is imported again under a new file hash.
        """
        with self.transaction():
            if self._one("SELECT 1 FROM conversations WHERE id = ?", (conversation_id,)) is None:
                raise KeyError(f"no conversation {conversation_id}")
            quoting = self.db.execute(
                "SELECT id, refers_to FROM facts"
                " WHERE profile_id = (SELECT profile_id FROM conversations WHERE id = ?)"
                " AND search_context <> '' AND json_extract(source_turn_ids, '$[0]') IN"
                " (SELECT id FROM turns WHERE conversation_id = ?)",
                (conversation_id, conversation_id),
            ).fetchall()
            turns = self.db.execute(
                "DELETE FROM turns WHERE conversation_id = ?", (conversation_id,)
            ).rowcount
            self.db.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,))
            for fact_id, refers_to in quoting:  # the index follows (trigger)
                self.db.execute(
                    "UPDATE facts SET search_context = ? WHERE id = ?",
                    (search_context(self.db, refers_to, ()), fact_id),
                )
        return turns

    # -- reading conversations --------------------------------------------------------------

    def conversation_by_source(self, profile_id: int, source: str, source_id: str) -> int | None:
        """The id of the profile's conversation stored under ``(source, source_id)``, if any."""
        return self._one(
            "SELECT id FROM conversations WHERE profile_id = ? AND source = ? AND source_id = ?",
            (profile_id, source, source_id),
        )

    def conversation_agrees(self, conversation_id: int, turns: Sequence[Turn]) -> bool:
        """Whether the stored turns of the conversation equal ``turns`` on every index both have.

        Turns compare by speaker, text and timestamp (``source_id`` is ignored). True when
        either side is a prefix of the other, including an empty or unknown conversation.
        Reads the stored turns only as far as the first difference.
        """
        stored = self.db.execute(
            "SELECT speaker, text, timestamp FROM turns WHERE conversation_id = ? ORDER BY idx",
            (conversation_id,),
        )
        return all(
            tuple(row) == _stored_form(turn) for row, turn in zip(stored, turns, strict=False)
        )

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
            pattern = like_pattern(query.strip())
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

    # -- reading turns ----------------------------------------------------------------------

    def turns(
        self, profile_id: int, after_id: int = 0, limit: int | None = None
    ) -> list[tuple[int, Turn]]:
        """The profile's turns with id > ``after_id``, as ``(turn_id, Turn)`` in id order.

        For the extractor: remember the last turn id processed and ask for what came after.
        """
        rows = self.db.execute(
            f"SELECT {_TURN_COLUMNS} FROM turns WHERE profile_id = ? AND id > ?"
            " ORDER BY id LIMIT ?",
            (profile_id, after_id, -1 if limit is None else limit),
        ).fetchall()
        return [_turn_from_row(r) for r in rows]

    def turns_before(self, turn_id: int, w: int) -> list[Turn]:
        """The (at most) ``w`` turns before ``turn_id`` in its conversation, oldest first."""
        if w < 0:
            raise ValueError(f"w must be >= 0, got {w}")
        rows = self.db.execute(
            "SELECT t.id, t.speaker, t.text, t.timestamp, t.source_id FROM turns t"
            " JOIN turns me ON me.id = ? AND t.conversation_id = me.conversation_id"
            " WHERE t.idx < me.idx ORDER BY t.idx DESC LIMIT ?",
            (turn_id, w),
        ).fetchall()
        return [_turn_from_row(r)[1] for r in reversed(rows)]

    def context_turns(self, turn_id: int, w: int, window: str) -> list[Turn]:
        """The turns a fact of ``turn_id`` is encoded after, oldest first, never from another
        conversation (:mod:`~inferscale_core.context_window`)."""
        row = self.db.execute("SELECT idx FROM turns WHERE id = ?", (turn_id,)).fetchone()
        if row is None:
            return []
        return self.turns_before(turn_id, row[0] - first_context_turn(row[0], w, window))

    def conversation_turns(self, conversation_id: int) -> list[tuple[int, Turn]]:
        """The turns of a conversation as ``(turn_id, Turn)``, in order."""
        rows = self.db.execute(
            f"SELECT {_TURN_COLUMNS} FROM turns WHERE conversation_id = ? ORDER BY idx",
            (conversation_id,),
        ).fetchall()
        return [_turn_from_row(r) for r in rows]

    def recent_turns(self, conversation_id: int, n: int) -> list[Turn]:
        """The (at most) ``n`` last turns of a conversation, oldest first."""
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        rows = self.db.execute(
            f"SELECT {_TURN_COLUMNS} FROM turns WHERE conversation_id = ?"
            " ORDER BY idx DESC LIMIT ?",
            (conversation_id, n),
        ).fetchall()
        return [_turn_from_row(r)[1] for r in reversed(rows)]

    def speakers(self, profile_id: int, after_id: int = 0) -> dict[str, int]:
        """``{speaker: their last turn id}`` over the profile's turns with id > ``after_id``
        (the people a question may name; pass the largest id seen to read only what is new)."""
        rows = self.db.execute(
            "SELECT speaker, max(id) FROM turns WHERE profile_id = ? AND id > ? GROUP BY speaker",
            (profile_id, after_id),
        ).fetchall()
        return {speaker: last for speaker, last in rows}

    def get_turns(self, turn_ids: Iterable[int]) -> list[tuple[int, Turn]]:
        """The turns with these ids (e.g. a fact's ``source_turn_ids``), by id."""
        ids = sorted({int(t) for t in turn_ids})
        if not ids:
            return []
        rows = self.db.execute(
            f"SELECT {_TURN_COLUMNS} FROM turns"
            f" WHERE id IN ({','.join('?' * len(ids))}) ORDER BY id",
            ids,
        ).fetchall()
        return [_turn_from_row(r) for r in rows]

    def turn_sources(self, turn_ids: Iterable[int]) -> dict[int, tuple[int, str, Turn]]:
        """``{turn id: (its conversation's id, that conversation's title, the turn)}`` for the
        ids that are turns (where a fact came from)."""
        ids = sorted({int(t) for t in turn_ids})
        if not ids:
            return {}
        rows = self.db.execute(
            "SELECT c.id, c.title, t.id, t.speaker, t.text, t.timestamp, t.source_id"
            " FROM turns t JOIN conversations c ON c.id = t.conversation_id"
            f" WHERE t.id IN ({','.join('?' * len(ids))})",
            ids,
        ).fetchall()
        found: dict[int, tuple[int, str, Turn]] = {}
        for cid, title, *turn in rows:
            tid, parsed = _turn_from_row(turn)
            found[tid] = (cid, title, parsed)
        return found

    def turn_recency(
        self, turn_ids: Iterable[int]
    ) -> dict[int, tuple[str, datetime | None, datetime | None]]:
        """``{turn id: (its conversation's source, its timestamp, the timestamp of the last
        turn of its conversation that has one)}``: how old a turn was when its conversation
        ended (the memory worker defers the facts of old imported turns)."""
        ids = sorted({int(t) for t in turn_ids})
        if not ids:
            return {}
        rows = self.db.execute(
            "SELECT t.id, c.source, t.timestamp, (SELECT e.timestamp FROM turns e"
            " WHERE e.conversation_id = t.conversation_id AND e.timestamp IS NOT NULL"
            " ORDER BY e.idx DESC LIMIT 1)"
            " FROM turns t JOIN conversations c ON c.id = t.conversation_id"
            f" WHERE t.id IN ({','.join('?' * len(ids))})",
            ids,
        ).fetchall()
        return {tid: (source, parse_dt(ts), parse_dt(last)) for tid, source, ts, last in rows}
