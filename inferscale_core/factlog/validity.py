"""Validity in time: which facts stopped being true, when, and what said so.

A fact is valid from the day it refers to (``refers_to``; else the day it was made) until
``valid_until`` (None: true now). :meth:`ValidityMixin.close_replaced` reads a new fact's slots
(:mod:`inferscale_core.slots`: "I live in Lisbon" sets ``self|residence = lisbon``) into
``fact_slots`` and closes the facts it replaces: an open fact of the same holder and attribute
with another value, dated no later, ends the day the new one begins (``valid_until``,
``ended_by``), and an ending ("Rex died") closes the open fact with its value. A fact dated
*before* an open one of its slot (an old turn imported late) is closed by that one instead.
Both stay active: "I lived in Lisbon" is still true of 2023, and a question about then
retrieves it (:mod:`inferscale_core.retriever`).

Every close writes an audit row ('close', the cause names the fact that replaced it) in the
same transaction; :meth:`ValidityMixin.reopen_fact` undoes one ('reopen'), and forgetting the
fact that closed others reopens them. A closed or reopened fact's KV rows are dropped with it:
its line in a prompt now says until when it held (``- 2023-05-01 I live in Lisbon (until
2025-03)``), so its KV is encoded again; the caller deletes the tensors under the returned
keys.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import date

from inferscale_core.factlog._base import id_chunks, utc_now
from inferscale_core.factlog.audit import AuditMixin
from inferscale_core.factlog.kv_index import KVIndexMixin
from inferscale_core.slots import ANY, Slot, slots


class ValidityMixin(AuditMixin, KVIndexMixin):
    def close_replaced(self, fact_id: int, cause: str | None = None) -> list[str]:
        """Read an active fact's slots and close what it replaces (module docstring). Returns
        the KV keys dropped (of every fact closed); [] when it replaces nothing. A fact read
        already, or no longer active, changes nothing."""
        with self.transaction():
            row = self.db.execute(
                "SELECT profile_id, text, refers_to, created_at, status, slots_read"
                " FROM facts WHERE id = ?",
                (fact_id,),
            ).fetchone()
            if row is None:
                raise KeyError(f"no fact {fact_id}")
            profile_id, text, refers_to, created_at, status, read = row
            if status != "active" or read:
                return []
            self.db.execute("UPDATE facts SET slots_read = 1 WHERE id = ?", (fact_id,))
            begins = refers_to or created_at[:10]
            keys: list[str] = []
            for slot in slots(text):
                self.db.execute(
                    "INSERT OR IGNORE INTO fact_slots (fact_id, profile_id, key, value, ends)"
                    " VALUES (?, ?, ?, ?, ?)",
                    (fact_id, profile_id, slot.key, slot.value, int(slot.ends)),
                )
                for other, other_begins, value in self._open_in_slot(profile_id, slot, fact_id):
                    if slot.ends:
                        if slot.same_value(value) and other_begins <= begins:
                            keys += self._close(profile_id, other, fact_id, begins, slot, cause)
                    elif slot.same_value(value):
                        continue  # told again: the older statement still holds
                    elif other_begins <= begins:
                        keys += self._close(profile_id, other, fact_id, begins, slot, cause)
                    elif self._is_open(fact_id):  # a newer fact replaced this one already
                        keys += self._close(profile_id, fact_id, other, other_begins, slot, cause)
            return sorted(set(keys))

    def reopen_fact(self, fact_id: int, cause: str) -> list[str]:
        """Undo a close: the fact is true now again (audit 'reopen'). Returns the KV keys
        dropped (its line changes). Raises ``KeyError`` for no such fact and ``ValueError``
        for a fact that is not closed."""
        with self.transaction():
            profile_id, text, _, _ = self._active_row(fact_id)
            if self._is_open(fact_id):
                raise ValueError(f"fact {fact_id} is not closed: it is true now already")
            return self._reopen(profile_id, fact_id, text, cause)

    def read_slots(self, profile_id: int, limit: int = 200) -> tuple[int, list[str]]:
        """:meth:`close_replaced` for up to ``limit`` of the profile's facts not read yet,
        oldest day first (so a chain of moves closes in order). Returns ``(facts read, the
        KV keys dropped)``: the memory worker runs it after extraction, before encoding."""
        ids = self.facts_slots_unread(profile_id, limit)
        keys: list[str] = []
        for fact_id in ids:
            keys += self.close_replaced(fact_id)
        return len(ids), keys

    def facts_slots_unread(self, profile_id: int, limit: int = 200) -> list[int]:
        """Active facts of the profile whose slots were never read (new ones, and those made
        before validity existed), oldest day first: what :meth:`close_replaced` has to read."""
        rows = self.db.execute(
            "SELECT id FROM facts WHERE profile_id = ? AND status = 'active' AND slots_read = 0"
            " ORDER BY COALESCE(refers_to, substr(created_at, 1, 10)), id LIMIT ?",
            (profile_id, limit),
        ).fetchall()
        return [r[0] for r in rows]

    def facts_valid_in(
        self,
        profile_id: int,
        start: date,
        end: date,
        among: Sequence[int] | None = None,
        limit: int | None = None,
    ) -> frozenset[int]:
        """The profile's active facts that held in ``[start, end)``: dated inside it, said
        inside it (its first source turn's day: "what did she show me on 13 October?" asks
        about that day's conversation, whose facts may refer to the day before), or a closed
        state (a replaced fact with a slot) that began before its end and ended after its
        start. An open state is not counted: it holds in every interval since it began, and
        would crowd out what happened then. Only those of ``among`` when given (a search's
        hits); without ``among``, the day said is not read (every fact's first turn would be:
        10 ms at 10k facts) and at most ``limit`` are returned."""
        lo, hi = start.isoformat(), end.isoformat()
        sql = (
            "SELECT f.id FROM facts f LEFT JOIN turns t"
            " ON t.id = json_extract(f.source_turn_ids, '$[0]')"
            " WHERE f.profile_id = ? AND f.status = 'active'"
            " AND ((f.refers_to >= ? AND f.refers_to < ?)"
            " OR (substr(t.timestamp, 1, 10) >= ? AND substr(t.timestamp, 1, 10) < ?)){among}"
            " UNION SELECT f.id FROM facts f JOIN fact_slots s ON s.fact_id = f.id AND s.ends = 0"
            " WHERE f.profile_id = ? AND f.status = 'active'"
            " AND COALESCE(f.refers_to, substr(f.created_at, 1, 10)) < ?"
            " AND f.valid_until > ?{among_f}"
        )
        params: tuple = (profile_id, lo, hi, lo, hi, profile_id, hi, lo)
        tail = "" if limit is None else f" LIMIT {int(limit)}"
        if among is None:  # by the indexes: the dated facts, the closed states (few)
            rows = self.db.execute(
                "SELECT id FROM facts WHERE profile_id = ? AND refers_to >= ? AND refers_to < ?"
                " AND status = 'active'"
                " UNION SELECT f.id FROM facts f JOIN fact_slots s ON s.fact_id = f.id"
                " AND s.ends = 0 WHERE s.profile_id = ? AND f.status = 'active'"
                " AND COALESCE(f.refers_to, substr(f.created_at, 1, 10)) < ?"
                f" AND f.valid_until > ?{tail}",
                (profile_id, lo, hi, profile_id, hi, lo),
            ).fetchall()
            return frozenset(r[0] for r in rows)
        found: set[int] = set()
        for chunk, marks in id_chunks(among):
            query = sql.format(among=f" AND f.id IN ({marks})", among_f=f" AND f.id IN ({marks})")
            args = (*params[:5], *chunk, *params[5:], *chunk)
            found.update(r[0] for r in self.db.execute(query + tail, args).fetchall())
        return frozenset(found)

    def open_successors(self, ids: Sequence[int]) -> dict[int, list[int]]:
        """``{closed fact id: the open facts that replaced it}`` for those ``ids`` that are
        closed by an active fact: first the end of its chain of closes (Lisbon -> Porto ->
        Berlin gives Lisbon -> Berlin; an ending such as "Rex died" counts too), then, for each
        slot it set, the open fact that holds that slot now (:meth:`slot_holders`). A fact of
        two slots is closed by whichever changed first ("Started at Siemens as a data
        engineer", closed by a promotion), yet its other slot changes later ("First week at
        Zalando"): both successors stand in for it."""
        found: dict[int, list[int]] = {}
        for start, by in self._ended_by(ids).items():
            seen = {start, by}
            while (later := self._ended_by([by]).get(by)) is not None and later not in seen:
                seen.add(later)
                by = later
            found[start] = [by]
        for start, holders in self.slot_holders(list(found)).items():
            found[start] += [fid for fid in holders if fid not in found[start]]
        return found

    def slot_holders(self, ids: Sequence[int]) -> dict[int, list[int]]:
        """``{fact id: the open, active facts that set one of its slots now}`` (another value
        or the same; the latest said first, one per slot), for those ``ids`` that set a slot
        and have such a holder."""
        found: dict[int, list[int]] = {}
        for chunk, marks in id_chunks(ids):
            rows = self.db.execute(
                "SELECT s.fact_id, s.key, f.id FROM fact_slots s"
                " JOIN fact_slots o ON o.profile_id = s.profile_id AND o.key = s.key"
                " AND o.ends = 0 AND o.fact_id <> s.fact_id"
                " JOIN facts f ON f.id = o.fact_id AND f.status = 'active'"
                " AND f.valid_until IS NULL"
                f" WHERE s.fact_id IN ({marks}) AND s.ends = 0"
                " ORDER BY s.fact_id, s.key, COALESCE(f.refers_to, substr(f.created_at, 1, 10))"
                " DESC, f.id DESC",
                chunk,
            ).fetchall()
            keys: set[tuple[int, str]] = set()
            for fact_id, key, holder in rows:
                if (fact_id, key) not in keys:
                    keys.add((fact_id, key))
                    if holder not in found.setdefault(fact_id, []):
                        found[fact_id].append(holder)
        return found

    # -- helpers ------------------------------------------------------------------------------

    def _ended_by(self, ids: Sequence[int]) -> dict[int, int]:
        found: dict[int, int] = {}
        for chunk, marks in id_chunks(ids):
            rows = self.db.execute(
                f"SELECT f.id, f.ended_by FROM facts f JOIN facts b ON b.id = f.ended_by"
                f" WHERE f.id IN ({marks}) AND b.status = 'active'",
                chunk,
            ).fetchall()
            found.update(rows)
        return found

    def _open_in_slot(
        self, profile_id: int, slot: Slot, fact_id: int
    ) -> list[tuple[int, str, str]]:
        """``[(fact id, the day it begins, its value)]``: the profile's open, active facts that
        set ``slot``'s attribute for its holder (any attribute for an ending of ANY)."""
        holder, attribute = slot.key.split("|", 1)
        match = "s.key LIKE ? ESCAPE '\\'" if attribute == ANY else "s.key = ?"
        key = holder.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "|%"
        return self.db.execute(
            "SELECT f.id, COALESCE(f.refers_to, substr(f.created_at, 1, 10)), s.value"
            " FROM fact_slots s JOIN facts f ON f.id = s.fact_id"
            f" WHERE s.profile_id = ? AND {match} AND s.ends = 0 AND f.id <> ?"
            " AND f.status = 'active' AND f.valid_until IS NULL ORDER BY f.id",
            (profile_id, key if attribute == ANY else slot.key, fact_id),
        ).fetchall()

    def _is_open(self, fact_id: int) -> bool:
        return self._one("SELECT valid_until IS NULL FROM facts WHERE id = ?", (fact_id,)) == 1

    def _close(
        self,
        profile_id: int,
        fact_id: int,
        by: int,
        until: str,
        slot: Slot,
        cause: str | None,
    ) -> list[str]:
        """Close one fact (inside the transaction): its end, the audit row, its KV rows."""
        now = utc_now()
        self.db.execute(
            "UPDATE facts SET valid_until = ?, ended_by = ?, updated_at = ? WHERE id = ?",
            (until, by, now, fact_id),
        )
        text = self._one("SELECT text FROM facts WHERE id = ?", (fact_id,))
        newer = self._one("SELECT text FROM facts WHERE id = ?", (by,))
        what = slot.attribute if slot.attribute != ANY else "it"
        why = cause or f"replaced by fact {by} ({what}: {slot.value}), true until {until}"
        self._audit(profile_id, fact_id, "close", why, text, newer, now)
        return self._drop_kv(fact_id)

    def _reopen(self, profile_id: int, fact_id: int, text: str, cause: str) -> list[str]:
        now = utc_now()
        self.db.execute(
            "UPDATE facts SET valid_until = NULL, ended_by = NULL, updated_at = ? WHERE id = ?",
            (now, fact_id),
        )
        self._audit(profile_id, fact_id, "reopen", cause, None, text, now)
        return self._drop_kv(fact_id)

    def _reopen_ended_by(self, fact_id: int, cause: str) -> list[str]:
        """Reopen the active facts ``fact_id`` closed (it is being forgotten)."""
        keys: list[str] = []
        rows = self.db.execute(
            "SELECT id, profile_id, text FROM facts WHERE ended_by = ? AND status = 'active'",
            (fact_id,),
        ).fetchall()
        for other, profile_id, text in rows:
            keys += self._reopen(profile_id, other, text, cause)
        return keys
