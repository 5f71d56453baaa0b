"""Facts and their life cycle: the ``facts`` table (and the ``audit`` rows each change writes).

A fact is 'active', 'superseded' (replaced by :meth:`FactsMixin.update_fact` or retired by
:meth:`FactsMixin.delete_fact`) or 'forgotten'. Active facts are deduplicated per profile by
:func:`fact_text_hash`. Every change writes its audit row in the same transaction, and drops the
fact's embeddings and (except for an update) its KV rows there too, returning their keys.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Sequence
from datetime import UTC, date, datetime
from typing import Any

from inferscale_core.factlog._base import (
    FACT_COLUMNS,
    fact_from_row,
    fact_text_hash,
    id_chunks,
    like_pattern,
    normalize_fact_text,
    utc_now,
)
from inferscale_core.factlog.audit import AuditMixin
from inferscale_core.factlog.embeddings import EmbeddingsMixin
from inferscale_core.factlog.fulltext import search_context
from inferscale_core.factlog.kv_index import KVIndexMixin
from inferscale_core.factlog.replies import ReplyDetailsMixin
from inferscale_core.factlog.validity import ValidityMixin
from inferscale_core.types import Fact

logger = logging.getLogger(__name__)


def _refers_to_text(refers_to: date | str | None) -> str | None:
    """``refers_to`` as stored: ``YYYY-MM-DD`` (a datetime keeps its date)."""
    if refers_to is None:
        return None
    if isinstance(refers_to, datetime):
        refers_to = refers_to.date()
    if isinstance(refers_to, str):
        refers_to = date.fromisoformat(refers_to)
    return refers_to.isoformat()


class FactsMixin(ValidityMixin, AuditMixin, KVIndexMixin, EmbeddingsMixin, ReplyDetailsMixin):
    # -- writing ----------------------------------------------------------------------------

    def add_fact(
        self,
        profile_id: int,
        text: str,
        refers_to: date | str | None = None,
        source_turn_ids: Iterable[int] = (),
        cause: str | None = None,
        *,
        allow_forgotten: bool = False,
        created_at: datetime | None = None,
    ) -> tuple[int, bool]:
        """Add a fact; return ``(fact_id, created)``.

        Deduplicated by normalized text within the profile: if an active fact with the same
        :func:`fact_text_hash` exists, its id is returned with ``created=False`` (and the new
        source turns are added to its provenance). If the same text was *forgotten* and
        ``allow_forgotten`` is false, nothing is added and the forgotten fact's id is returned
        with ``created=False``; pass ``allow_forgotten=True`` when the user deliberately tells
        it again. ``cause`` defaults to "extracted from turn(s) ..." or "added". The audit row
        is written in the same transaction. ``created_at`` (aware) keeps the day a fact was
        first learnt when it is moved in from elsewhere (an imported ``memory export``);
        default now.
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
        with self.transaction():
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
                        (json.dumps(merged), utc_now(), fid),
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
            now = utc_now()
            born = now
            if created_at is not None:
                if created_at.tzinfo is None:
                    raise ValueError(f"created_at must be aware, got {created_at!r}")
                born = created_at.astimezone(UTC).isoformat(timespec="microseconds")
            fid = self._insert_fact(profile_id, text, h, ref, turn_ids, None, now, born)
            self._audit(profile_id, fid, "add", cause, None, text, now)
        return fid, True

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
        with self.transaction():
            profile_id, old_text, old_ref, _ = self._active_row(fact_id)
            self._check_turns(profile_id, turn_ids)
            ref = old_ref if refers_to is None else _refers_to_text(refers_to)
            now = utc_now()
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
                merged = f"{cause} (fact {fact_id} merged into it)"
                self._audit(profile_id, other, "update", merged, old_text, new_text, now)
                return other
            new_id = self._insert_fact(profile_id, new_text, h, ref, turn_ids, fact_id, now)
            self._audit(profile_id, new_id, "update", cause, old_text, new_text, now)
        return new_id

    def delete_fact(self, fact_id: int, cause: str) -> list[str]:
        """Retire an active fact that is no longer true (status 'superseded' with no successor,
        audit 'delete'; the text is kept). Its KV and embedding rows are deleted in the same
        transaction; returns the KV keys so the caller can delete the tensors."""
        with self.transaction():
            profile_id, text, _, _ = self._active_row(fact_id)
            now = utc_now()
            self.db.execute(
                "UPDATE facts SET status = 'superseded', updated_at = ? WHERE id = ?",
                (now, fact_id),
            )
            self._audit(profile_id, fact_id, "delete", cause, text, None, now)
            self._drop_embeddings(fact_id)
            return self._drop_kv(fact_id)

    def forget_fact(self, fact_id: int, cause: str) -> list[str]:
        """Forget a fact (active or superseded): status 'forgotten', text "" (the text is kept
        only in the audit trail, see the package docstring), KV and embedding rows deleted, its
        text blanked in the stored details of the replies that used it, all in one
        transaction. Returns the removed KV keys; the caller deletes the tensors there.
        Forgetting a forgotten fact returns [] and changes nothing."""
        with self.transaction():
            row = self.db.execute(
                "SELECT profile_id, text, status FROM facts WHERE id = ?", (fact_id,)
            ).fetchone()
            if row is None:
                raise KeyError(f"no fact {fact_id}")
            profile_id, text, status = row
            self._drop_embeddings(fact_id)
            self._forget_in_replies(fact_id)
            if status == "forgotten":
                return self._drop_kv(fact_id)
            # what it closed is true again: nothing the memory still holds replaced it
            reopened = self._reopen_ended_by(
                fact_id, f"fact {fact_id}, which replaced it, was forgotten"
            )
            now = utc_now()
            self.db.execute(
                "UPDATE facts SET status = 'forgotten', text = '', search_context = '',"
                " updated_at = ? WHERE id = ?",
                (now, fact_id),
            )
            self._audit(profile_id, fact_id, "forget", cause, text, None, now)
            return sorted({*self._drop_kv(fact_id), *reopened})

    def _check_turns(self, profile_id: int, turn_ids: list[int]) -> None:
        """Raise ``ValueError`` unless every id is a turn of the profile."""
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
        created_at: str | None = None,
    ) -> int:
        context = search_context(self.db, refers_to, turn_ids)
        return self.db.execute(
            "INSERT INTO facts (profile_id, text, text_hash, refers_to, source_turn_ids, status,"
            " supersedes, created_at, updated_at, search_context)"
            " VALUES (?, ?, ?, ?, ?, 'active', ?, ?, ?, ?)",
            (
                profile_id,
                text,
                text_hash,
                refers_to,
                json.dumps(turn_ids),
                supersedes,
                created_at or now,
                now,
                context,
            ),
        ).lastrowid

    # -- reading ----------------------------------------------------------------------------

    def get_fact(self, fact_id: int) -> Fact | None:
        row = self.db.execute(
            f"SELECT {FACT_COLUMNS} FROM facts WHERE id = ?", (fact_id,)
        ).fetchone()
        return None if row is None else fact_from_row(row)

    def active_facts_in(self, profile_id: int, ids: Sequence[int]) -> dict[int, Fact]:
        """``{id: Fact}`` of those ``ids`` that are active facts of the profile (one query; a
        search re-reads its hits with it: a forgotten or replaced id is simply absent)."""
        found: dict[int, Fact] = {}
        for chunk, marks in id_chunks(ids):
            rows = self.db.execute(
                f"SELECT {FACT_COLUMNS} FROM facts WHERE id IN ({marks})"
                " AND profile_id = ? AND status = 'active'",
                (*chunk, profile_id),
            ).fetchall()
            found.update((row[0], fact_from_row(row)) for row in rows)
        return found

    def fact_texts_with_context(self, ids: Sequence[int]) -> dict[int, tuple[str, str]]:
        """``{fact id: (its text, its search context)}`` for those ``ids`` that exist (the
        context: :func:`~inferscale_core.factlog.fulltext.search_context`)."""
        found: dict[int, tuple[str, str]] = {}
        for chunk, marks in id_chunks(ids):
            rows = self.db.execute(
                f"SELECT id, text, COALESCE(search_context, '') FROM facts WHERE id IN ({marks})",
                chunk,
            ).fetchall()
            found.update((fid, (text, context)) for fid, text, context in rows)
        return found

    def fact_speakers(self, ids: Sequence[int]) -> dict[int, str]:
        """``{fact id: speaker of its first source turn}`` for those ``ids`` that have one
        (who said it; a fact added by hand, or whose conversation was deleted, has none)."""
        found: dict[int, str] = {}
        for chunk, marks in id_chunks(ids):
            rows = self.db.execute(
                "SELECT f.id, t.speaker FROM facts f"
                " JOIN turns t ON t.id = json_extract(f.source_turn_ids, '$[0]')"
                f" WHERE f.id IN ({marks})",
                chunk,
            ).fetchall()
            found.update(rows)
        return found

    def fact_said_days(self, ids: Sequence[int], profile_id: int | None = None) -> dict[int, str]:
        """``{fact id: the day it was said}``: its first source turn's day, else the day it
        refers to, else the day it was made (``YYYY-MM-DD``, so the days sort as text), for
        those ``ids`` that exist (with ``profile_id``: that are active facts of the profile).
        "The baby is due in March" was said in October."""
        only = "" if profile_id is None else " AND f.profile_id = ? AND f.status = 'active'"
        extra = () if profile_id is None else (profile_id,)
        found: dict[int, str] = {}
        for chunk, marks in id_chunks(ids):
            rows = self.db.execute(
                "SELECT f.id, COALESCE(substr(t.timestamp, 1, 10), f.refers_to,"
                " substr(f.created_at, 1, 10)) FROM facts f"
                " LEFT JOIN turns t ON t.id = json_extract(f.source_turn_ids, '$[0]')"
                f" WHERE f.id IN ({marks}){only}",
                (*chunk, *extra),
            ).fetchall()
            found.update(rows)
        return found

    def facts_created_after(self, profile_id: int, when: datetime) -> frozenset[int]:
        """The ids of the profile's active facts created after ``when`` (aware; compared in
        UTC, as ``created_at`` is stored): what a search as of ``when`` leaves out."""
        if when.tzinfo is None:
            raise ValueError(f"when must be timezone-aware, got {when!r}")
        stamp = when.astimezone(UTC).isoformat(timespec="microseconds")
        rows = self.db.execute(
            "SELECT id FROM facts WHERE profile_id = ? AND status = 'active' AND created_at > ?",
            (profile_id, stamp),
        ).fetchall()
        return frozenset(r[0] for r in rows)

    def successors(self, ids: Sequence[int]) -> dict[int, int]:
        """``{fact id: the fact that replaced it}`` for those ``ids`` some fact supersedes
        (:meth:`update_fact`; a retired fact has none)."""
        found: dict[int, int] = {}
        for chunk, marks in id_chunks(ids):
            rows = self.db.execute(
                f"SELECT supersedes, max(id) FROM facts WHERE supersedes IN ({marks})"
                " GROUP BY supersedes",
                chunk,
            ).fetchall()
            found.update(rows)
        return found

    def active_facts(self, profile_id: int) -> list[Fact]:
        rows = self.db.execute(
            f"SELECT {FACT_COLUMNS} FROM facts WHERE profile_id = ? AND status = 'active'"
            " ORDER BY id",
            (profile_id,),
        ).fetchall()
        return [fact_from_row(r) for r in rows]

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
            f"SELECT {FACT_COLUMNS} FROM facts WHERE profile_id = ?"
            f" AND status IN ({','.join('?' * len(statuses))})"
        )
        params: list[Any] = [profile_id, *statuses]
        if query.strip():
            sql += " AND text LIKE ? ESCAPE '\\'"
            params.append(like_pattern(query.strip()))
        sql += " ORDER BY id DESC LIMIT ?"
        params.append(-1 if limit is None else limit)
        return [fact_from_row(r) for r in self.db.execute(sql, params).fetchall()]

    def count_facts(self, profile_id: int) -> dict[str, int]:
        """How many facts the profile has in each status (statuses with none are left out)."""
        rows = self.db.execute(
            "SELECT status, count(*) FROM facts WHERE profile_id = ? GROUP BY status",
            (profile_id,),
        ).fetchall()
        return {r[0]: r[1] for r in rows}
