"""Retrieval vectors of facts: the ``fact_embeddings`` table.

One vector per (fact, embedding model). Only active facts have rows: superseding, retiring or
forgetting a fact deletes them in the same transaction, and :meth:`EmbeddingsMixin.
store_embedding` refuses an inactive fact, so a forgotten fact's text can't survive in vector
form.
"""

from __future__ import annotations

from collections.abc import Sequence

from inferscale_core.factlog._base import FactLogBase, id_chunks


class EmbeddingsMixin(FactLogBase):
    def store_embedding(self, fact_id: int, model: str, vector: bytes, dim: int) -> None:
        """Store the embedding of an active fact under ``model`` (replacing an earlier one).

        ``vector`` is opaque here (the retriever writes ``dim`` float32 values). Raises
        :class:`InactiveFactError` if the fact was superseded or forgotten meanwhile (so an
        embedding computed before a forget can't bring the fact's text back in vector form),
        and ``KeyError`` if it does not exist.
        """
        if dim <= 0 or not vector:
            raise ValueError(f"empty embedding (dim={dim}, {len(vector)} bytes)")
        with self.transaction():
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

    def embeddings_of(
        self, profile_id: int, model: str, ids: Sequence[int]
    ) -> list[tuple[int, bytes]]:
        """:meth:`embeddings` of those ``ids`` only (the facts a question's interval holds)."""
        found: list[tuple[int, bytes]] = []
        for chunk, marks in id_chunks(ids):
            found += self.db.execute(
                "SELECT e.fact_id, e.vector FROM fact_embeddings e JOIN facts f ON f.id = e.fact_id"
                f" WHERE e.fact_id IN ({marks}) AND f.profile_id = ? AND f.status = 'active'"
                " AND e.model = ?",
                (*chunk, profile_id, model),
            ).fetchall()
        return found

    def count_embeddings(self, profile_id: int) -> dict[str, int]:
        """How many of the profile's active facts have an embedding, per embedding model."""
        rows = self.db.execute(
            "SELECT e.model, count(*) FROM fact_embeddings e JOIN facts f ON f.id = e.fact_id"
            " WHERE f.profile_id = ? AND f.status = 'active' GROUP BY e.model",
            (profile_id,),
        ).fetchall()
        return {r[0]: r[1] for r in rows}

    def _drop_embeddings(self, fact_id: int) -> None:
        """Delete every embedding of a fact (call inside a transaction)."""
        self.db.execute("DELETE FROM fact_embeddings WHERE fact_id = ?", (fact_id,))
