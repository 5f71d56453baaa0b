"""Keyword search over the active facts: the ``facts_fts`` FTS5 index, ranked by BM25.

The index is kept by triggers on ``facts`` (migration ``m011_facts_fts``): a fact is in it
exactly while it is active, so adding, replacing, retiring or forgetting a fact changes the
index in the same transaction. A search is per profile (joined through ``facts``); BM25's term
statistics are the whole file's, so another profile's facts can shift scores, never results.

What the user typed is never passed to FTS5 as query syntax: :func:`fts_query` keeps only its
words, each quoted, OR-ed, without stop words, so no input can raise an FTS5 syntax error.
"""

from __future__ import annotations

import re
import unicodedata

from inferscale_core.factlog._base import FactLogBase

MAX_QUERY_TERMS = 32
"""Words kept from a query (the first ones, after stop words): bounds the cost of a search."""

_WORD = re.compile(r"[^\W_]+")  # letters and digits: what FTS5's unicode61 keeps in a token

_STOP_WORDS = """
    a about above after again against all am an and any are as at be because been before being
    below between both but by can could did do does doing down during each few for from further
    had has have having he her here hers herself him himself his how i if in into is it its
    itself just me more most my myself no nor not now of off on once only or other our ours
    ourselves out over own same she should so some such than that the their theirs them
    themselves then there these they this those through to too under until up very was we were
    what when where which while who whom why will with would you your yours yourself yourselves
    s t d ll m re ve don didn doesn isn wasn aren weren won
"""
STOP_WORDS = frozenset(_STOP_WORDS.split())
"""English function words (and contraction tails), dropped from queries: BM25 would weigh
them little anyway, and an OR over them matches nearly every fact."""


def fts_query(text: str) -> str:
    """``text`` as a safe FTS5 query: its words (NFKC, case-folded), stop words dropped, each
    in double quotes, OR-ed; "" when no word is left. Quoted words are plain strings to FTS5,
    so operators (AND, NEAR, ``*``, ``^``, ``:``) and stray quotes or brackets are just text."""
    words: list[str] = []
    for word in _WORD.findall(unicodedata.normalize("NFKC", text).casefold()):
        if word not in STOP_WORDS and word not in words:
            words.append(word)
            if len(words) == MAX_QUERY_TERMS:
                break
    return " OR ".join(f'"{w}"' for w in words)


class FullTextMixin(FactLogBase):
    def keyword_search(self, profile_id: int, query: str, k: int) -> list[tuple[int, float]]:
        """The ``k`` active facts of the profile that best match ``query``'s words, by BM25.

        Args:
            profile_id: whose facts.
            query: anything the user typed (see :func:`fts_query`; no words -> no hits).
            k: how many at most.

        Returns:
            ``(fact_id, score)`` best first; ``score`` is BM25 made positive (higher = better).
        """
        match = fts_query(query)
        if k <= 0 or not match:
            return []
        rows = self.db.execute(
            "SELECT f.id, -bm25(facts_fts) AS score FROM facts_fts"
            " JOIN facts f ON f.id = facts_fts.rowid"
            " WHERE facts_fts MATCH ? AND f.profile_id = ? AND f.status = 'active'"
            " ORDER BY score DESC, f.id LIMIT ?",
            (match, profile_id, k),
        ).fetchall()
        return [(r[0], r[1]) for r in rows]
