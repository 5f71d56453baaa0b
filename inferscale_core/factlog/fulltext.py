"""Keyword search over the active facts: one FTS5 index per profile, ranked by BM25.

Each profile has its own index, ``facts_fts_p<id>`` (:func:`create_profile_index`, made with
the profile; migration ``m013_facts_fts_per_profile`` for the profiles already there), kept by
triggers on ``facts`` that fire for that profile's rows only: a fact is in it exactly while it
is active, so adding, replacing, retiring or forgetting a fact changes the index in the same
transaction. BM25's statistics (the number of facts, their average length, how many facts hold
a word) are therefore the profile's own. With one index for the whole file (m011-m012) they
were every profile's: another profile's facts changed a search's scores *and* its order, so a
user could test whether someone else's memory held a word (issue 35). A file with one profile
scores exactly as it did then (the ``profile_id`` column is kept, weight 0, so that a fact's
length in tokens is unchanged).

Two columns are searched: the fact's ``text`` and its ``search_context`` (:func:`search_context`,
written with the fact; a third, ``profile_id``, only filters). The context is the day the fact
refers to in words ("May 8 2023", so "last May" or "in 2023" finds it) and the
:data:`CONTEXT_TURNS` turns before the turn it was extracted from (a fact is often the answer to
the question just asked: "Not really, just keep their area clean" is about turtles only in its
context). It counts :data:`CONTEXT_WEIGHT` as much as the text.
Measured on LoCoMo with the product's own facts (``bench recall``, 1,536 questions): keyword
R@10 0.672 on the text alone, 0.807 with this context (about 0.79 without the date words, 0.78
with one turn instead of two). Its price: the index holds about three times the words, and a
query at 10k facts takes ~2.6 ms of SQLite instead of ~2.1.

What the user typed is never passed to FTS5 as query syntax: :func:`fts_query` keeps only its
words, each quoted, OR-ed, without stop words, so no input can raise an FTS5 syntax error.
"""

from __future__ import annotations

import re
import sqlite3
import unicodedata
from collections.abc import Sequence
from datetime import date

from sqlite_utils import Database

from inferscale_core.factlog._base import FactLogBase

CONTEXT_TURNS = 2
"""Turns before a fact's (first) source turn that go into its search context."""
CONTEXT_WEIGHT = 0.4
"""BM25 weight of the search context against the fact's text (1.0); 0.3-0.5 score alike."""
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


_MONTHS = (
    "January", "February", "March", "April", "May", "June",
    "July", "August", "September", "October", "November", "December",
)  # fmt: skip


def date_words(refers_to: date | str | None) -> str:
    """``2023-05-08`` -> ``"May 8 2023"`` (English, whatever the locale); "" for no date."""
    if refers_to is None:
        return ""
    day = date.fromisoformat(refers_to) if isinstance(refers_to, str) else refers_to
    return f"{_MONTHS[day.month - 1]} {day.day} {day.year}"


def search_context(db: Database, refers_to: date | str | None, turn_ids: Sequence[int]) -> str:
    """A fact's ``search_context``: :func:`date_words` of its day, then the
    :data:`CONTEXT_TURNS` turns before its first source turn in that turn's conversation, as
    ``"<speaker>: <text>"`` lines, oldest first (none for a fact without source turns)."""
    lines = [date_words(refers_to)] if refers_to is not None else []
    if turn_ids:
        rows = db.execute(
            "SELECT t.speaker, t.text FROM turns t"
            " JOIN turns me ON me.id = ? AND t.conversation_id = me.conversation_id"
            " WHERE t.idx < me.idx ORDER BY t.idx DESC LIMIT ?",
            (min(turn_ids), CONTEXT_TURNS),
        ).fetchall()
        lines += [f"{speaker}: {text}" for speaker, text in reversed(rows)]
    return "\n".join(lines)


def index_name(profile_id: int) -> str:
    """The profile's FTS5 table: ``facts_fts_p7``."""
    return f"facts_fts_p{int(profile_id)}"


def create_profile_index(db: Database, profile_id: int) -> None:
    """The profile's keyword index and the triggers that keep it; a no-op when it exists.

    An external-content FTS5 table over a view of the profile's active facts (``rebuild`` and
    ``integrity-check`` read exactly them; rowid = fact id), and three triggers on ``facts``
    that fire for the profile's rows only: index a fact when it becomes active, unindex it
    when it stops being one (superseded, retired, forgotten, deleted), inside the statement
    that changes it. A 'delete' must be given exactly the indexed values, which ``old.*`` are;
    a fact's profile never changes. The tokenizer is part of the index: changing it needs a
    migration that rebuilds every profile's. Stemming (porter) is English.
    """
    p = int(profile_id)
    fts, cols = index_name(p), "text, search_context, profile_id"
    for sql in (
        f"CREATE VIEW IF NOT EXISTS facts_active_p{p} AS SELECT id, {cols} FROM facts"
        f" WHERE profile_id = {p} AND status = 'active'",
        f"CREATE VIRTUAL TABLE IF NOT EXISTS {fts} USING fts5({cols},"
        f" content = 'facts_active_p{p}', content_rowid = 'id',"
        " tokenize = 'porter unicode61 remove_diacritics 2')",
        f"CREATE TRIGGER IF NOT EXISTS {fts}_insert AFTER INSERT ON facts"
        f" WHEN new.profile_id = {p} AND new.status = 'active' BEGIN"
        f" INSERT INTO {fts} (rowid, {cols})"
        " VALUES (new.id, new.text, new.search_context, new.profile_id); END",
        f"CREATE TRIGGER IF NOT EXISTS {fts}_update"
        f" AFTER UPDATE OF status, text, search_context ON facts WHEN new.profile_id = {p} BEGIN"
        f" INSERT INTO {fts} ({fts}, rowid, {cols})"
        "  SELECT 'delete', old.id, old.text, old.search_context, old.profile_id"
        "  WHERE old.status = 'active';"
        f" INSERT INTO {fts} (rowid, {cols})"
        "  SELECT new.id, new.text, new.search_context, new.profile_id"
        "  WHERE new.status = 'active'; END",
        f"CREATE TRIGGER IF NOT EXISTS {fts}_delete AFTER DELETE ON facts"
        f" WHEN old.profile_id = {p} AND old.status = 'active' BEGIN"
        f" INSERT INTO {fts} ({fts}, rowid, {cols})"
        " VALUES ('delete', old.id, old.text, old.search_context, old.profile_id); END",
    ):
        db.execute(sql)


class FullTextMixin(FactLogBase):
    def keyword_search(self, profile_id: int, query: str, k: int) -> list[tuple[int, float]]:
        """The ``k`` active facts of the profile that best match ``query``'s words, by BM25
        over their text and (weighted :data:`CONTEXT_WEIGHT`) their search context.

        Args:
            profile_id: whose facts.
            query: anything the user typed (see :func:`fts_query`; no words -> no hits).
            k: how many at most.

        Returns:
            ``(fact_id, score)`` best first; ``score`` is BM25 made positive (higher = better).
        """
        words = fts_query(query)
        if k <= 0 or not words:
            return []
        # one FTS5 query on the profile's own index (only its active facts are in it, the
        # triggers): the words in the text and context only, the profile_id column weight 0
        fts = index_name(profile_id)
        try:
            rows = self.db.execute(
                f"SELECT rowid, -bm25({fts}, 1.0, ?, 0.0) AS score FROM {fts}"
                f" WHERE {fts} MATCH ? ORDER BY score DESC, rowid LIMIT ?",
                (CONTEXT_WEIGHT, f"{{text search_context}} : ({words})", k),
            ).fetchall()
        except sqlite3.OperationalError as e:
            if str(e).startswith("no such table"):
                return []  # no such profile
            raise
        return [(r[0], r[1]) for r in rows]
