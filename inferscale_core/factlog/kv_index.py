"""Which KV entry encodes which fact: the ``kv_entries`` table.

A fact's text is encoded into KV tensors once per encoding: a model (its fingerprint), a window
``w`` of preceding turns and an encoder version. The tensors live in a KV store, one per model
fingerprint, under a key; this table maps ``(fact, fingerprint, w, encoder version)`` to that
key (the ``location`` column). Only active facts get rows (:meth:`KVIndexMixin.record_kv`
refuses others); the rows of a superseded fact are left for :meth:`KVIndexMixin.prune_kv`,
those of a retired or forgotten fact are deleted with it. Whoever deletes rows gets their keys
back and deletes the tensors.
"""

from __future__ import annotations

from collections.abc import Sequence

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
        """Active facts of the profile with no KV entry for this (model, w, encoder), by id."""
        rows = self.db.execute(
            f"SELECT {FACT_COLUMNS} FROM facts f WHERE profile_id = ? AND status = 'active'"
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
        return [fact_from_row(r) for r in rows]

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
        return sorted({r[0] for r in rows})

    def _drop_kv(self, fact_id: int) -> list[str]:
        """Delete a fact's KV rows; return their keys, sorted (call inside a transaction)."""
        # No DELETE ... RETURNING: it needs SQLite 3.35.
        rows = self.db.execute(
            "SELECT location FROM kv_entries WHERE fact_id = ?", (fact_id,)
        ).fetchall()
        self.db.execute("DELETE FROM kv_entries WHERE fact_id = ?", (fact_id,))
        return sorted({r[0] for r in rows})
