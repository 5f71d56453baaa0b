"""Which KV entry encodes which fact: the ``kv_entries`` table.

A fact's text is encoded into KV tensors once per encoding: a model (its fingerprint), a window
``w`` of preceding turns and an encoder version. The tensors live in a KV store, one per model
fingerprint, under a key; this table maps ``(fact, fingerprint, w, encoder version)`` to that
key (the ``location`` column). Only active facts get rows (:meth:`KVIndexMixin.record_kv`
refuses others); the rows of a superseded fact are left for :meth:`KVIndexMixin.prune_kv`,
those of a retired or forgotten fact are deleted with it. Whoever deletes rows gets their keys
back and deletes the tensors.

KV is a cache the log can rebuild: ``kv_entries.used_at`` says when an entry was last injected
(:meth:`KVIndexMixin.note_kv_used`), and :meth:`KVIndexMixin.evict_kv` drops the least
recently used entries of a model to keep its store under a byte budget. The facts whose
encoding waits until they are retrieved are in ``kv_deferred`` (:meth:`KVIndexMixin.defer_kv`,
reason 'evicted' or 'import'); :meth:`KVIndexMixin.facts_without_kv` leaves them out, and
:meth:`KVIndexMixin.want_kv` puts them back in the queue. Crash order of an eviction: the
rows go (one transaction), then the caller deletes the files; a crash in between leaves a file
no row names, never a row without its file.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime

from inferscale_core.factlog._base import (
    FACT_COLUMNS,
    FactLogBase,
    fact_from_row,
    id_chunks,
    utc_now,
)
from inferscale_core.types import Fact


class KVIndexMixin(FactLogBase):
    def facts_without_kv(
        self,
        profile_id: int,
        model_fingerprint: str,
        w: int,
        encoder_version: str | int,
        limit: int | None = None,
    ) -> list[Fact]:
        """Active facts of the profile with no KV entry for this (model, w, encoder): the most
        recently injected first (by any entry's ``used_at``: after a model switch, or a new
        window or encoder, the facts the person uses are encoded again first), then the
        never-injected by id; deferred facts (:meth:`defer_kv`) are left out."""
        rows = self.db.execute(
            f"SELECT {FACT_COLUMNS} FROM facts f WHERE profile_id = ? AND status = 'active'"
            " AND NOT EXISTS (SELECT 1 FROM kv_deferred d WHERE d.fact_id = f.id)"
            " AND NOT EXISTS (SELECT 1 FROM kv_entries k WHERE k.fact_id = f.id"
            " AND k.model_fingerprint = ? AND k.w = ? AND k.encoder_version = ?)"
            " ORDER BY (SELECT COALESCE(MAX(u.used_at), '') FROM kv_entries u"
            " WHERE u.fact_id = f.id) DESC, id LIMIT ?",
            (
                profile_id,
                model_fingerprint,
                w,
                str(encoder_version),
                -1 if limit is None else limit,
            ),
        ).fetchall()
        return [fact_from_row(r) for r in rows]

    def kv_coverage(
        self, profile_id: int, model_fingerprint: str, w: int, encoder_version: str | int
    ) -> tuple[int, int, int]:
        """``(active, encoded, elsewhere)``: the profile's active facts, those with an entry for
        this encoding, and those without one that have an entry of another encoding (another
        model, window or encoder: what a switch leaves to encode again)."""
        here = (
            "EXISTS (SELECT 1 FROM kv_entries k WHERE k.fact_id = f.id"
            " AND k.model_fingerprint = ? AND k.w = ? AND k.encoder_version = ?)"
        )
        row = self.db.execute(
            f"SELECT count(*), coalesce(sum({here}), 0), coalesce(sum(NOT {here} AND EXISTS"
            " (SELECT 1 FROM kv_entries o WHERE o.fact_id = f.id)), 0)"
            " FROM facts f WHERE profile_id = ? AND status = 'active'",
            (*(model_fingerprint, w, str(encoder_version)) * 2, profile_id),
        ).fetchone()
        return int(row[0]), int(row[1]), int(row[2])

    def facts_encoded_for(self, profile_id: int, model_fingerprint: str) -> int:
        """How many of the profile's active facts have an entry of that model (any window)."""
        return self.db.execute(
            "SELECT count(*) FROM facts f WHERE profile_id = ? AND status = 'active' AND EXISTS"
            " (SELECT 1 FROM kv_entries k WHERE k.fact_id = f.id AND k.model_fingerprint = ?)",
            (profile_id, model_fingerprint),
        ).fetchone()[0]

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
        """Record the key (``location``) of an active fact's KV entry for this encoding,
        replacing an earlier entry for the same encoding.

        Returns the replaced entry's key if it differs (the caller deletes those tensors),
        else None. Raises :class:`InactiveFactError` if the fact was superseded or forgotten
        meanwhile: the caller must then delete what it just wrote.
        """
        with self.transaction():
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
                (*key, location, num_tokens, nbytes, utc_now()),
            )
        return old if old is not None and old != location else None

    def kv_key(
        self, fact_id: int, model_fingerprint: str, w: int, encoder_version: str | int
    ) -> str | None:
        """The key of the fact's KV entry for this (model, w, encoder), or None if not encoded."""
        return self.kv_keys_for([fact_id], model_fingerprint, w, encoder_version).get(fact_id)

    def kv_keys_for(
        self,
        fact_ids: Sequence[int],
        model_fingerprint: str,
        w: int,
        encoder_version: str | int,
    ) -> dict[int, str]:
        """:meth:`kv_key` of many facts in one query: ``{fact id: key}`` of those encoded."""
        found: dict[int, str] = {}
        for chunk, marks in id_chunks(fact_ids):
            rows = self.db.execute(
                "SELECT fact_id, location FROM kv_entries WHERE model_fingerprint = ? AND w = ?"
                f" AND encoder_version = ? AND fact_id IN ({marks})",
                (model_fingerprint, w, str(encoder_version), *chunk),
            ).fetchall()
            found.update(rows)
        return found

    def kv_keys(self, fact_id: int) -> list[str]:
        """Every KV entry key recorded for a fact (all models and encodings), sorted."""
        rows = self.db.execute(
            "SELECT location FROM kv_entries WHERE fact_id = ? ORDER BY location", (fact_id,)
        ).fetchall()
        return [r[0] for r in rows]

    def kv_keys_by_model(self, fact_id: int) -> list[tuple[str, str]]:
        """``(model_fingerprint, key)`` of every KV entry recorded for a fact, sorted.

        The fingerprint says which KV store (there is one per model) holds the tensors under
        the key. Read it before :meth:`forget_fact`, which deletes the rows and returns only
        the keys.
        """
        rows = self.db.execute(
            "SELECT model_fingerprint, location FROM kv_entries WHERE fact_id = ?"
            " ORDER BY model_fingerprint, location",
            (fact_id,),
        ).fetchall()
        return [(r[0], r[1]) for r in rows]

    def kv_locations(self) -> dict[str, list[str]]:
        """``{model fingerprint: keys}`` of every KV entry recorded, all profiles, sorted (what
        a backup copies from each model's store)."""
        found: dict[str, list[str]] = {}
        for fingerprint, location in self.db.execute(
            "SELECT DISTINCT model_fingerprint, location FROM kv_entries"
            " ORDER BY model_fingerprint, location"
        ).fetchall():
            found.setdefault(fingerprint, []).append(location)
        return found

    def kv_rows(self, model_fingerprint: str) -> tuple[int, int]:
        """``(rows, bytes recorded)`` of one model's entries, every profile and encoding."""
        rows, nbytes = self.db.execute(
            "SELECT count(*), COALESCE(SUM(nbytes), 0) FROM kv_entries WHERE model_fingerprint = ?",
            (model_fingerprint,),
        ).fetchone()
        return int(rows), int(nbytes)

    def drop_model_kv(self, model_fingerprint: str) -> list[str]:
        """Delete every row of one model's entries (another model's: ``memory prune``), in one
        transaction; returns their keys, sorted. The caller deletes the files *after* this
        returns (a crash in between leaves files no row names, never a row without its file).
        Facts are not touched; deferrals are not per model and stay."""
        with self.transaction():
            rows = self.db.execute(
                "SELECT DISTINCT location FROM kv_entries WHERE model_fingerprint = ?",
                (model_fingerprint,),
            ).fetchall()
            self.db.execute(
                "DELETE FROM kv_entries WHERE model_fingerprint = ?", (model_fingerprint,)
            )
        return sorted(r[0] for r in rows)

    def drop_kv_locations(self, locations: Sequence[str]) -> list[int]:
        """Forget the rows of entries whose tensors are gone (a damaged file the store
        deleted), so their facts count as not encoded and are encoded again; returns those
        facts' ids."""
        facts: set[int] = set()
        unique = list(dict.fromkeys(locations))
        with self.transaction():
            for start in range(0, len(unique), 500):
                chunk = unique[start : start + 500]
                marks = ",".join("?" * len(chunk))
                rows = self.db.execute(
                    f"SELECT fact_id FROM kv_entries WHERE location IN ({marks})", chunk
                ).fetchall()
                facts.update(r[0] for r in rows)
                self.db.execute(f"DELETE FROM kv_entries WHERE location IN ({marks})", chunk)
        return sorted(facts)

    def prune_kv(self, profile_id: int) -> list[str]:
        """Delete the KV rows of the profile's facts that are no longer active (superseded by
        :meth:`update_fact`); return their keys so the caller can delete the tensors."""
        inactive = "SELECT id FROM facts WHERE profile_id = ? AND status <> 'active'"
        with self.transaction():
            rows = self.db.execute(
                f"SELECT location FROM kv_entries WHERE fact_id IN ({inactive})", (profile_id,)
            ).fetchall()
            self.db.execute(f"DELETE FROM kv_entries WHERE fact_id IN ({inactive})", (profile_id,))
            self.db.execute(f"DELETE FROM kv_deferred WHERE fact_id IN ({inactive})", (profile_id,))
        return sorted({r[0] for r in rows})

    def _drop_kv(self, fact_id: int) -> list[str]:
        """Delete a fact's KV rows; return their keys, sorted (call inside a transaction)."""
        # No DELETE ... RETURNING: it needs SQLite 3.35.
        rows = self.db.execute(
            "SELECT location FROM kv_entries WHERE fact_id = ?", (fact_id,)
        ).fetchall()
        self.db.execute("DELETE FROM kv_entries WHERE fact_id = ?", (fact_id,))
        self.db.execute("DELETE FROM kv_deferred WHERE fact_id = ?", (fact_id,))
        return sorted({r[0] for r in rows})

    # ---- KV as a cache: deferred encoding, use, the byte budget ----
    def defer_kv(self, fact_ids: Sequence[int], reason: str) -> int:
        """Leave these facts' encoding until they are retrieved: ``reason`` is 'evicted' (their
        KV was dropped for the budget) or 'import' (an old imported turn). Only active facts
        are deferred; a fact deferred already keeps its first reason. Returns how many were
        deferred now."""
        if reason not in ("evicted", "import"):
            raise ValueError(f"reason must be 'evicted' or 'import', got {reason!r}")
        done = 0
        with self.transaction():
            for chunk, marks in id_chunks(fact_ids):
                done += self.db.execute(
                    "INSERT OR IGNORE INTO kv_deferred (fact_id, reason, since)"
                    f" SELECT id, ?, ? FROM facts WHERE id IN ({marks}) AND status = 'active'",
                    (reason, utc_now(), *chunk),
                ).rowcount
        return done

    def want_kv(self, fact_ids: Sequence[int]) -> dict[int, str]:
        """Put deferred facts among these back in the encoding queue; ``{fact id: reason}`` of
        those that were deferred (nothing is written when none was: the chat thread calls
        this for every reply's text facts)."""
        found: dict[int, str] = {}
        for chunk, marks in id_chunks(fact_ids):
            rows = self.db.execute(
                f"SELECT fact_id, reason FROM kv_deferred WHERE fact_id IN ({marks})", chunk
            ).fetchall()
            found.update(rows)
        if found:
            with self.transaction():
                for chunk, marks in id_chunks(list(found)):
                    self.db.execute(f"DELETE FROM kv_deferred WHERE fact_id IN ({marks})", chunk)
        return found

    def deferred_kv(self, profile_id: int) -> dict[str, int]:
        """How many of the profile's active facts are deferred, per reason."""
        rows = self.db.execute(
            "SELECT d.reason, count(*) FROM kv_deferred d JOIN facts f ON f.id = d.fact_id"
            " WHERE f.profile_id = ? AND f.status = 'active' GROUP BY d.reason",
            (profile_id,),
        ).fetchall()
        return dict(rows)

    def deferred_facts(self, profile_id: int, reason: str | None = None) -> list[int]:
        """The ids of the profile's deferred active facts (of one ``reason``, or all), sorted."""
        rows = self.db.execute(
            "SELECT d.fact_id FROM kv_deferred d JOIN facts f ON f.id = d.fact_id"
            " WHERE f.profile_id = ? AND f.status = 'active' AND (? IS NULL OR d.reason = ?)"
            " ORDER BY d.fact_id",
            (profile_id, reason, reason),
        ).fetchall()
        return [r[0] for r in rows]

    def note_kv_used(self, locations: Iterable[str], when: datetime) -> int:
        """Record that the entries under these keys were injected at ``when`` (one UPDATE per
        500 keys; the memory worker batches a reply's keys). Returns the rows updated."""
        stamp = when.astimezone(UTC).isoformat(timespec="microseconds")
        unique = list(dict.fromkeys(locations))
        done = 0
        if not unique:
            return 0
        with self.transaction():
            for start in range(0, len(unique), 500):
                chunk = unique[start : start + 500]
                marks = ",".join("?" * len(chunk))
                done += self.db.execute(
                    f"UPDATE kv_entries SET used_at = ? WHERE location IN ({marks})"
                    " AND (used_at IS NULL OR used_at < ?)",
                    (stamp, *chunk, stamp),
                ).rowcount
        return done

    def kv_bytes(self, model_fingerprint: str) -> int:
        """The bytes the rows of one model record (SUM(nbytes), every profile and encoding):
        what its store holds, as the budget counts it."""
        return int(
            self._one(
                "SELECT COALESCE(SUM(nbytes), 0) FROM kv_entries WHERE model_fingerprint = ?",
                (model_fingerprint,),
            )
        )

    def evict_kv(
        self, model_fingerprint: str, target_bytes: int, spare_since: datetime
    ) -> list[str]:
        """Drop the least recently used entries of one model until its rows record at most
        ``target_bytes``, in one transaction; entries used at or after ``spare_since`` are
        kept (a reply may be loading them). Active facts left without an entry of this model
        are deferred ('evicted'), so the worker does not encode them again until they are
        retrieved. Returns the keys no row names any more, sorted: the caller deletes those
        files *after* this returns (a crash in between leaves an unrecorded file, never a
        row without its file)."""
        spare = spare_since.astimezone(UTC).isoformat(timespec="microseconds")
        with self.transaction():
            total = self.kv_bytes(model_fingerprint)
            if total <= target_bytes:
                return []
            rows = self.db.execute(
                "SELECT rowid, fact_id, location, nbytes FROM kv_entries"
                " WHERE model_fingerprint = ? AND (used_at IS NULL OR used_at < ?)"
                " ORDER BY COALESCE(used_at, created_at), rowid",
                (model_fingerprint, spare),
            )
            dropped: list[tuple[int, int, str]] = []
            for rowid, fact_id, location, nbytes in rows:
                if total <= target_bytes:
                    break
                dropped.append((rowid, fact_id, location))
                total -= nbytes
            rows.close()
            for start in range(0, len(dropped), 500):
                chunk = [rowid for rowid, _, _ in dropped[start : start + 500]]
                marks = ",".join("?" * len(chunk))
                self.db.execute(f"DELETE FROM kv_entries WHERE rowid IN ({marks})", chunk)
            bare = self._without_kv([fact_id for _, fact_id, _ in dropped], model_fingerprint)
            self.defer_kv(bare, "evicted")
            gone = self._unnamed([location for _, _, location in dropped], model_fingerprint)
        return gone

    def _without_kv(self, fact_ids: Sequence[int], model_fingerprint: str) -> list[int]:
        """Those of ``fact_ids`` with no row of this model left."""
        kept = self._in_rows("fact_id", list(dict.fromkeys(fact_ids)), model_fingerprint)
        return [i for i in dict.fromkeys(fact_ids) if i not in kept]

    def _unnamed(self, locations: Sequence[str], model_fingerprint: str) -> list[str]:
        """Those of ``locations`` no row of this model names (two encodings of a fact can
        share a key; each model has a store of its own)."""
        unique = sorted(set(locations))
        named = self._in_rows("location", unique, model_fingerprint)
        return [location for location in unique if location not in named]

    def _in_rows(self, column: str, values: Sequence[int | str], model_fingerprint: str) -> set:
        """Those of ``values`` (distinct) that some ``kv_entries`` row of this model has in
        ``column`` ("fact_id" or "location")."""
        assert column in ("fact_id", "location")
        found: set = set()
        for start in range(0, len(values), 500):
            chunk = list(values[start : start + 500])
            marks = ",".join("?" * len(chunk))
            rows = self.db.execute(
                f"SELECT DISTINCT {column} FROM kv_entries WHERE {column} IN ({marks})"
                " AND model_fingerprint = ?",
                (*chunk, model_fingerprint),
            ).fetchall()
            found.update(r[0] for r in rows)
        return found

    def resize_kv(self, sizes: dict[str, int]) -> None:
        """Record new ``nbytes`` for entries rewritten under the same key (a conversion to
        another ``kv_store_dtype``), so the budget counts what they take now."""
        if sizes:
            with self.transaction():
                self.db.conn.executemany(
                    "UPDATE kv_entries SET nbytes = ? WHERE location = ?",
                    [(n, key) for key, n in sizes.items()],
                )
