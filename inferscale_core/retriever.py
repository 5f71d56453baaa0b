"""Question -> the facts to inject: dense and keyword search over one profile's active facts.

By default a search fuses the embedding (cosine) ranking of the profile's vector index and the
BM25 ranking of the fact log's full-text index (:meth:`FactLog.keyword_search`: the facts' text,
their dates in words and the turns they answered) by weighted reciprocal-rank fusion (RRF): each
list is taken to ``CANDIDATES * k`` facts, and rank r in a list adds ``weight / (RRF_K + r)``,
the dense list's weight 1, the keyword list's ``KEYWORD_WEIGHT``. When the question names one of
the people of the profile's conversations (a turn's speaker, not "user" or "assistant"; named as
spoken: "Will", not the "will" of "when will…"), a third list adds ``PEOPLE_WEIGHT / (RRF_K +
r)``: the fused candidates that person said, in fused order (who said a fact = the speaker of
its first source turn). A question naming someone by a relation ("my cousin Alex", "Alex from
work", "my sister": :mod:`inferscale_core.retriever_people`) adds such a list of the candidates
about that person (named so in the text, or "she"/"he" after a turn that names them), and a
candidate naming the same first name with another relation loses its BM25 share. Either
ranking alone is a ``mode``.

The constants come from the LoCoMo recall bench (``inferscale-assistant bench recall``: 1,536
questions, the ~5,500 facts the product's own extractor makes; R@10 / R@50): dense 0.549 / 0.768;
keyword 0.672 / 0.801 on the fact text alone, 0.807 / 0.911 with the search context; fused with
the textbook RRF (RRF_K=60, equal weights, 4k candidates) 0.734 / 0.906, with RRF_K=5 and the
keyword list weighted 2 0.814 / 0.929, plus the people list 0.825 / 0.934, with 2k candidates
instead of 4k 0.828 / 0.933 (and fewer facts to read). RRF_K from 1 to 10 and a keyword weight
from 1.5 to 3 all score within a point of that; the constants were chosen on the same questions
(no held-out split), so read the plateau, not the third decimal. Since issue 36 a question that
names nothing (no :func:`particulars`) weighs the keyword list ``KEYWORD_WEIGHT_PLAIN`` (0.5):
on paraphrases ("How much do I earn?") BM25 at 2 pulled hybrid below dense; ``bench fusion``
re-chose all of them on a split (LoCoMo 0-4 and the life set; 5-9 held out) and found today's
within its noise (docs/BENCHMARKS.md, "What is true now").

What is true now: a fact that stopped being true (``Fact.valid_until``, closed by the fact log
when a later fact replaced it: :mod:`inferscale_core.factlog.validity`) stays searchable, but a
question that does not ask about the past (:func:`~inferscale_core.time_query.asks_about_past`)
gets the fact that replaced it in its place, and the old one after every fact still true. A
question naming days (:func:`~inferscale_core.time_query.question_interval`) gets the facts that
held then first: those among the fused hits in their order, then the others of the interval by
cosine. A hybrid search for a question about the present also favours what was said later
(``RECENCY_WEIGHT``): most changes are never said as plainly as a pattern needs ("First week at
Zalando done"), so the log cannot close the old fact; the later of two good answers is the
likelier true one. When the question asks about a part of one's life (a *facet*: home, work,
car, diet, ...; :mod:`inferscale_core.facets`), the dense search also runs with the question's
vector moved toward that facet's prototype, a fourth list in the fusion, and the newest of its
statements of that facet goes first: "Traded the Fiat in for a Skoda" answers "What do I drive
these days?" though it shares no word with it. And each of its first hits gets just above it
the newest fact said after it that restates it (:mod:`inferscale_core.retriever_newer`: near
the hit in the index, as relevant to the question), or, when that later fact ends it ("I quit
the Thursday football"), the hit goes after the others. The time steps reorder the hits the
ranking gives (``INTERVAL_READ * k`` of them for a question naming days; successors and the
interval's facts read from the log), so a question without a time word or a closed fact costs
nothing more.

Each profile has its own vector index, so a search can only ever see that profile's facts. An
index is built on the profile's first use from the embeddings stored in the fact log
(``fact_embeddings``); facts without one are embedded then, in batches, and stored. Later facts
come in through :meth:`Retriever.add`.

A search embeds the question and searches the vectors on the process's retrieval thread
(:mod:`inferscale_core.retrieval_thread`); a hybrid one runs the keyword search on the caller's
meanwhile (torch and SQLite both release the GIL), so it takes about the longer of the two, not
their sum.

The fact log has the last word: every hit is re-read from it (one query per search) and dropped
unless it is still an active fact of the profile, so a forgotten or replaced fact never comes
back, even from a stale index (and the stale id is dropped from the index on the way).

Vectors are stored as float32 little-endian bytes, under the embedder's ``name``. A
``Retriever`` shares its ``FactLog``'s thread (one sqlite3 connection per thread).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from datetime import UTC, date, datetime
from typing import Literal, Protocol

import numpy as np
import torch

from inferscale_core.embedder import Embedder
from inferscale_core.facets import FACET_ABOVE, FACET_FLOOR, FACET_READ, Facets
from inferscale_core.factlog import FactLog, InactiveFactError
from inferscale_core.retrieval_thread import RetrievalThread
from inferscale_core.retriever_newer import (
    NEWER_ANCHORS,
    NEWER_NEIGHBOURS,
    ends_it,
    newest_restatement,
)
from inferscale_core.retriever_people import agrees, asked_about, mentions
from inferscale_core.time_query import (
    asks_about_past,
    asks_about_present,
    question_interval,
    states_past,
)
from inferscale_core.types import Fact, Hit
from inferscale_core.vector_index import VectorIndex, make_index

logger = logging.getLogger(__name__)

_WORD = re.compile(r"[^\W_]+")  # letters and digits: a name matches word for word
_SELF = frozenset({"i"})  # "I" ("I'm" too: _WORD splits it)


_YEAR = re.compile(r"\b(?:19|20)\d\d\b")


def keyword_weight(question: str) -> float:
    """BM25's weight in the fusion: :data:`KEYWORD_WEIGHT` for a question naming a name or a
    number (BM25 finds them), else :data:`KEYWORD_WEIGHT_PLAIN` (its words are
    paraphrase-prone: "How much do I earn?" vs "My new salary is 4,100"). A year is no such
    name: "Who was my boss in spring 2024?" is answered by a fact that names none, and the
    interval step reads the time (on fifteen life sets past R@5 34 -> 36 of 50). A month's name
    stays one: "What happened in September 2024?" finds the facts that say "September" (with
    months taken out too, life's month questions kept 0.84 of their top 10 in the month, not
    0.96)."""
    named = particulars(_YEAR.sub(" ", question))
    return KEYWORD_WEIGHT if named else KEYWORD_WEIGHT_PLAIN


def held_above_successors(ranked: list[tuple[Fact, float]], end: date) -> list[tuple[Fact, float]]:
    """``ranked`` (best first) with each closed fact that still held on ``end`` (the day after
    an interval a question asks about: its ``valid_until`` on or after it) just above the fact
    that replaced it (``ended_by``) when that ranked higher: the successor began when it
    ended, after the interval. "Where did I live in 2025?" gets Lisbon, closed this year by
    "We moved to Porto", though Porto shares more of the question's words."""
    out = list(ranked)
    for fact, score in ranked:
        if fact.ended_by is None or fact.valid_until is None or fact.valid_until < end:
            continue
        ids = [f.id for f, _ in out]
        if fact.ended_by in ids and ids.index(fact.ended_by) < ids.index(fact.id):
            out.pop(ids.index(fact.id))
            out.insert(ids.index(fact.ended_by), (fact, score))
    return out


def particulars(text: str) -> frozenset[str]:
    """What tells one statement from a near-identical one: its numbers and its capitalized
    words that do not start a sentence ("I" aside), casefolded."""
    out = set()
    for match in _WORD.finditer(text):
        word = match.group()
        before = text[: match.start()].rstrip()
        if word[0].isdigit() or (
            word[0].isupper()
            and before
            and before[-1] not in ".!?:\"'"
            and word.lower() not in _SELF
        ):
            out.add(word.casefold())
    return frozenset(out)


def same_particulars(a: str, b: str) -> bool:
    """Whether every name and number either text has (:func:`particulars`) is a word of both
    (casefolded: "porto" and "Porto" agree)."""
    words_a = {w.casefold() for w in _WORD.findall(a)}
    words_b = {w.casefold() for w in _WORD.findall(b)}
    return (particulars(a) | particulars(b)) <= (words_a & words_b)


Order = Literal["best_last", "best_first", "chronological"]
ORDERS: tuple[str, ...] = ("best_last", "best_first", "chronological")
Mode = Literal["hybrid", "dense", "keyword"]
MODES: tuple[str, ...] = ("hybrid", "dense", "keyword")

RRF_K = 5
"""Reciprocal-rank fusion's constant (Cormack et al. 2009 use 60): rank r in a list adds
weight / (RRF_K + r). A small one trusts the head of each list: measured best on LoCoMo."""
KEYWORD_WEIGHT = 2.0
KEYWORD_WEIGHT_PLAIN = 0.5
"""The BM25 list's weight when the question names nothing (no :func:`particulars`)."""
"""The BM25 list's weight in the fusion (the dense list's is 1)."""
PEOPLE_WEIGHT = 2.0
"""The weight of the list of the named person's facts (when the question names one)."""
CANDIDATES = 2
"""Each ranking is taken to ``CANDIDATES * k`` facts before fusion (4 scores the same)."""
INTERVAL_READ = 4
"""A question naming days (:func:`~inferscale_core.time_query.question_interval`) takes this
many times ``k`` hits from the ranking before the interval's facts are put first."""
INTERVAL_SCAN = 2000
"""When fewer than ``k`` of those hits held in the interval, at most this many of its other
facts are ranked by cosine to fill up (a year of a busy memory is not read whole)."""
RECENCY_FLOOR = 0.7
"""Only dense candidates whose cosine with the question is at least this share of the best
one's are weighed by their day: recency orders the good answers; a fact that answers little
is not lifted (fused RRF scores are too flat to tell: rank 5 in both lists is 0.6 of rank 1)."""
RECENCY_WEIGHT = 2.0
"""For a question about the present (:func:`~inferscale_core.time_query.asks_about_present`),
each fused candidate's score is multiplied by ``1 + RECENCY_WEIGHT * d``, ``d`` the place in
time of the day it was said between the candidates' oldest (0.0) and newest (1.0) days (by
time, not by rank among the days: a fact a year older than the newest is not lifted just
because an older one is also a candidate): of two facts
that both answer "What's my job?", the later one is likelier still true, whether or not the
fact log knew to close the older; a new fact that answers nothing stays low."""
FACETED = True
"""A hybrid search for a question about the present that asks about a facet of one's life
(:mod:`inferscale_core.facets`) also searches with the question's vector moved toward the
facet's prototype: a fourth list in the fusion, and the newest of its statements goes first."""
FACET_WEIGHT = 1.0
"""The steered dense list's weight in the fusion (the plain dense list's is 1)."""
NOT_PEOPLE = frozenset({"user", "assistant", "system", "tool", "me", "you"})
"""Speakers that are roles, not people a question names (compared case-folded)."""


class IndexFactory(Protocol):
    """Makes an empty index; :func:`inferscale_core.vector_index.make_index` is one."""

    def __call__(self, dim: int, device: str, size_hint: int) -> VectorIndex: ...


class Retriever:
    """Top-k active facts of a profile for a question.

    Args:
        factlog: the fact log (its thread is the retriever's thread).
        embedder: embeds facts and questions; its ``name`` keys the stored vectors.
        index_factory: ``(dim, device, size_hint) -> VectorIndex``, called once per profile.
        device: where the indexes live ("cpu" or "cuda").
        batch_size: facts embedded per call when building an index.
        thread: where the question's embedding and the vector search run (the runtime's one;
            None: a thread of this retriever's own).
    """

    def __init__(
        self,
        factlog: FactLog,
        embedder: Embedder,
        index_factory: IndexFactory = make_index,
        device: str = "cpu",
        batch_size: int = 256,
        thread: RetrievalThread | None = None,
    ) -> None:
        self.log = factlog
        self.thread = thread or RetrievalThread()
        self.embedder = embedder
        self.index_factory = index_factory
        self.device = device
        self.batch_size = batch_size
        self._indexes: dict[int, VectorIndex] = {}  # profile id -> its index
        # profile id -> (the largest turn id read, {case-folded name: name as spoken})
        self._people: dict[int, tuple[int, dict[str, str]]] = {}
        # the last question embedded and its vector [1, dim]: an interval's fill reuses it
        self._last_query: tuple[str, torch.Tensor | None] = ("", None)
        self.facets = Facets(embedder)  # a present question's facet widens its dense search
        # the facet the last faceted question asked about and the steered query's nearest
        self._last_facet: tuple[str, list[tuple[int, float]]] | None = None

    # -- writes -----------------------------------------------------------------------------

    def add(self, fact: Fact) -> bool:
        """Embed, store and index one fact; False if it is no longer active (then nothing is
        stored). Call it after :meth:`FactLog.add_fact` / :meth:`FactLog.update_fact`."""
        return self.add_many([fact]) == 1

    def add_many(self, facts: Sequence[Fact]) -> int:
        """:meth:`add` for many facts, embedded in batches; returns how many were added."""
        added = 0
        for start in range(0, len(facts), self.batch_size):
            batch = [f for f in facts[start : start + self.batch_size] if f.status == "active"]
            if not batch:
                continue
            last = self._last_query  # the worker's near-duplicate check just embedded it
            if len(batch) == 1 and last[1] is not None and last[0] == batch[0].text:
                vectors = last[1]  # [1, dim]
            else:
                vectors = self.embedder.embed([f.text for f in batch])  # [b, dim]
            added += self._store(batch, vectors)
        return added

    def remove(self, fact_id: int) -> None:
        """Drop a fact from the indexes (after forgetting, replacing or retiring it in the log,
        which deletes its stored embedding). Searches would skip it anyway; this frees the slot."""
        for index in self._indexes.values():
            index.remove([fact_id])

    def sync(self, profile_id: int) -> None:
        """Rebuild the profile's index from the log now (after facts were added or changed by
        another ``FactLog``/thread); embeds only the facts that have no stored vector."""
        self._indexes.pop(profile_id, None)
        self._index(profile_id)

    # -- reads ------------------------------------------------------------------------------

    def search(
        self,
        profile_id: int,
        question: str,
        k: int = 8,
        order: Order = "best_last",
        mode: Mode = "hybrid",
        as_of: datetime | None = None,
        now: datetime | None = None,
    ) -> list[Hit]:
        """The ``k`` active facts of the profile that best answer ``question``.

        ``order`` is the order to inject them in: "best_last" (the default: the best hit last,
        nearest the question), "best_first", or "chronological" (facts without a date first,
        then by ``refers_to``, then by id). ``Hit.rank`` is 1 for the best hit in every order.

        ``mode`` is the ranking: "hybrid" (the default: dense, BM25 and the named person's
        facts fused by weighted RRF, see the module docstring; ``Hit.score`` is the fused score
        over its maximum, so 1.0 = first in every list), "dense" (``Hit.score`` = cosine
        similarity) or "keyword" (BM25, made positive).

        ``as_of`` (aware) keeps to the facts created at or before it: the memory as it stood
        then, as far as today's active facts tell (one replaced or forgotten since is not
        searched). The later facts are taken out of each ranking before fusion, which reads
        that many more candidates, so they cost no hit and the ranks are those among the rest.

        Time (module docstring, "What is true now"): a question naming days ("in September
        2024", "last March", "in 2023") gets the facts that held then first; one that does not
        ask about the past gets, for a fact that stopped being true, the fact that replaced it
        in its place and the old one after every fact still true. ``now`` (aware; default the
        clock, or ``as_of``) is the day the question's words are read against.
        """
        if order not in ORDERS:
            raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if k <= 0:
            return []
        later = frozenset() if as_of is None else self.log.facts_created_after(profile_id, as_of)
        today = (now or as_of or datetime.now(UTC)).date()
        interval = question_interval(question, today)
        # a question naming days reads INTERVAL_READ times deeper: the interval's facts
        # among them go first, in the ranking's order
        n = k * INTERVAL_READ if interval is not None else k
        if mode == "keyword":
            found = self.log.keyword_search(profile_id, question, n + len(later))
            hits = self._hits(profile_id, _without(found, later, n), n)
        elif mode == "dense":
            hits = self._search(profile_id, question, n, later)
        else:
            present = asks_about_present(question, today)
            hits = self._hybrid(profile_id, question, n, later, present and RECENCY_WEIGHT > 0)
        hits = self._in_time(profile_id, question, hits, k, today, interval, later)
        if mode == "hybrid" and present and NEWER_ANCHORS > 0:
            hits = self._newer_first(profile_id, question, hits, k, later)
        if mode == "hybrid" and present:  # "My old job was ...": after what holds now
            hits = _past_last(hits)
        if order == "best_last":
            hits.reverse()
        elif order == "chronological":
            hits.sort(key=_chronological)
        return hits

    def similar(self, profile_id: int, text: str, threshold: float = 0.92) -> Hit | None:
        """The profile's active fact most similar to ``text`` if its cosine similarity is at
        least ``threshold`` and they name the same people, places and numbers
        (:func:`same_particulars`), else None (for merging near-duplicates at extraction:
        "My cousin Ana lives in Porto" and "My cousin Bea lives in Porto" are two facts)."""
        hits = self._search(profile_id, text, 1)
        if hits and hits[0].score >= threshold and same_particulars(text, hits[0].fact.text):
            return hits[0]
        return None

    # -- helpers ----------------------------------------------------------------------------

    def _search(
        self, profile_id: int, text: str, k: int, skip: frozenset[int] = frozenset()
    ) -> list[Hit]:
        """Dense, best first (the torch work on the retrieval thread), without the ids in
        ``skip``. Hits the log no longer backs are dropped (and removed from the index), and the
        search repeated until k good ones are found or the index is exhausted."""
        index = self._index(profile_id)
        n = k + len(skip)
        query, found = self.thread.submit(self._embed_and_search, index, text, n).result()
        while True:
            found = _without(found, skip, k)
            facts = self._active_facts(profile_id, [fid for fid, _ in found])
            stale = [fid for fid, _ in found if fid not in facts]
            if not self._dropped(index, profile_id, stale):
                break
            found = self.thread.submit(index.search, query, n).result()[0]
        hits = [(facts[fid], score) for fid, score in found if fid in facts]
        return [Hit(fact, score, rank) for rank, (fact, score) in enumerate(hits, start=1)]

    @staticmethod
    def _dropped(index: VectorIndex, profile_id: int, stale: list[int]) -> bool:
        """Remove ``stale`` ids (no longer active facts) from the index; True when there
        were some and they are gone (search again), False otherwise (never loop on an index
        that keeps them)."""
        if not stale:
            return False
        logger.info("dropping %d stale ids from profile %d's index", len(stale), profile_id)
        index.remove(stale)
        return not any(fid in index for fid in stale)

    def _hybrid(
        self,
        profile_id: int,
        question: str,
        k: int,
        skip: frozenset[int] = frozenset(),
        present: bool = False,
    ) -> list[Hit]:
        """Best first: the fusion of the module docstring (ties: the better dense rank, then
        the lower id), over rankings without the ids in ``skip``. Only the fused head is re-read
        from the log, ``k`` ids at a time until ``k`` active facts are found; a stale dense id
        read there is dropped from the index and the search repeated."""
        n = CANDIDATES * k
        index = self._index(profile_id)
        # The question's embedding and the vector search run on the retrieval thread while
        # SQLite searches here: both let go of the GIL, so on two cores the search takes about
        # the longer of the two (docs/BENCHMARKS.md, "Retrieval latency").
        dense_side = self.thread.submit(
            self._embed_and_search, index, question, n + len(skip), present and FACETED
        )
        keyword = self.log.keyword_search(profile_id, question, n + len(skip))  # [(id, bm25)]
        keyword = _without(keyword, skip, n)
        person = self._named_person(profile_id, question)
        said: dict[int, str | None] = {}  # fact id -> its speaker, of the ids looked up
        if person is not None:  # the keyword candidates' speakers, while the thread works
            self._read_speakers(said, [fid for fid, _ in keyword])
        query, dense = dense_side.result()  # [1, dim], [(fact id, cosine)] best first
        facet, steered = self._last_facet or (None, [])  # steered: [(fact id, cosine)]
        dense = _without(dense, skip, n)
        steered = _without(steered, skip, n)
        weight = keyword_weight(question)
        top = (1 + weight) / (RRF_K + 1)  # the score of a fact first in every list
        if person is not None:
            top += PEOPLE_WEIGHT / (RRF_K + 1)
        asked = asked_about(question)  # "my cousin Alex", "Alex from work", "my sister"
        if asked:
            top += PEOPLE_WEIGHT / (RRF_K + 1)
        if facet is not None:
            top += FACET_WEIGHT / (RRF_K + 1)
        if present:
            top *= 1 + RECENCY_WEIGHT
        while True:
            fused: dict[int, float] = {}
            for rank, (fid, _) in enumerate(dense, start=1):
                fused[fid] = 1 / (RRF_K + rank)
            for rank, (fid, _) in enumerate(keyword, start=1):
                fused[fid] = fused.get(fid, 0.0) + weight / (RRF_K + rank)
            for rank, (fid, _) in enumerate(steered, start=1):  # the facet's statements
                fused[fid] = fused.get(fid, 0.0) + FACET_WEIGHT / (RRF_K + rank)
            dense_rank = {fid: rank for rank, (fid, _) in enumerate(dense, start=1)}

            def order(fid: int) -> tuple[float, int, int]:
                return (-fused[fid], dense_rank.get(fid, n + 1), fid)  # noqa: B023

            ranked = sorted(fused, key=order)
            if asked:  # the person the question names by a relation, not another of the name
                read = self.log.fact_texts_with_context(ranked)
                about = {fid: agrees(asked, *read[fid]) for fid in ranked if fid in read}
                for rank, (fid, _) in enumerate(keyword, start=1):
                    if about.get(fid) is False:  # BM25 matched the name only
                        fused[fid] -= weight / (RRF_K + rank)
                theirs = [fid for fid in ranked if about.get(fid)]
                for rank, fid in enumerate(theirs, start=1):
                    fused[fid] += PEOPLE_WEIGHT / (RRF_K + rank)
                ranked.sort(key=order)
            if person is not None:
                self._read_speakers(said, ranked)
                theirs = [fid for fid in ranked if (said[fid] or "").casefold() == person]
                for rank, fid in enumerate(theirs, start=1):
                    fused[fid] += PEOPLE_WEIGHT / (RRF_K + rank)
                ranked.sort(key=order)
            if present:  # later answers first: a later one is likelier true now
                cosine = dict(dense)  # fact id -> cosine with the question
                best = max(cosine.values(), default=0.0)
                good = [fid for fid in ranked if cosine.get(fid, -1.0) >= RECENCY_FLOOR * best]
                said = self.log.fact_said_days(good)
                step = _recency(set(said.values()))  # the newest day 1.0, the oldest 0.0
                for fid in good:
                    fused[fid] *= 1 + RECENCY_WEIGHT * step.get(said.get(fid, ""), 0.0)
                ranked.sort(key=order)
                if facet is not None:  # the newest statement of the question's facet first
                    self._newest_of_facet_first(profile_id, facet, ranked, fused, steered, skip)
            facts, gone = self._first_active(profile_id, ranked, k)
            if not self._dropped(index, profile_id, [fid for fid in gone if fid in dense_rank]):
                break
            found = self.thread.submit(index.search, query, n + len(skip)).result()[0]
            dense = _without(found, skip, n)
        return [Hit(fact, fused[fact.id] / top, rank) for rank, fact in enumerate(facts, start=1)]

    def _newest_of_facet_first(
        self,
        profile_id: int,
        facet: str,
        ranked: list[int],
        fused: dict[int, float],
        steered: list[tuple[int, float]],
        skip: frozenset[int],
    ) -> None:
        """Move to the front of ``ranked`` (with the first's fused score) the newest of the
        first ``FACET_READ`` ``steered`` candidates (``[(fact id, cosine)]`` best first) at
        least ``FACET_FLOOR`` times the best cosine near the steered query that are about
        ``facet`` (:meth:`Facets.about`, their stored vectors read from the log); below the
        first hits, though, when they were said after it: a turn telling three things at once
        ("Marie's new school is miles away, so we bought a car") is often about other facets
        only, and the step would put an older statement of the facet above the change."""
        best = steered[0][1] if steered else 0.0
        near = [fid for fid, c in steered[:FACET_READ] if c >= FACET_FLOOR * best]
        ids, vectors = self._stored_vectors(profile_id, near)  # [n], [n, dim]
        about = self.facets.about(vectors)
        ofs = [fid for fid, names in zip(ids, about, strict=True) if facet in names]
        # what replaced one of them states the facet too, in whatever words ("Handed in my
        # notice: I start as a planning officer at the council" closed "I'm a technician")
        for new in self.log.open_successors(ofs).values():
            ofs += [fid for fid in new if fid not in ofs and fid not in skip]
        said = self.log.fact_said_days(ofs + ranked[:FACET_ABOVE], profile_id)  # one read
        newest = max(((said[fid], fid) for fid in ofs if fid in said), default=None)
        if newest is None or ranked[0] == newest[1]:
            return
        day, fid = newest
        at = 0  # after the first hits said later than it
        while at < min(FACET_ABOVE, len(ranked)) and said.get(ranked[at], "") > day:
            at += 1
        if fid in fused:  # a successor may not be a candidate
            ranked.remove(fid)
        fused[fid] = fused[ranked[at]] if at < len(ranked) else min(fused.values())
        ranked.insert(at, fid)

    def _in_time(
        self,
        profile_id: int,
        question: str,
        hits: list[Hit],
        k: int,
        today: date,
        interval: tuple[date, date] | None,
        skip: frozenset[int],
    ) -> list[Hit]:
        """``hits`` (best first) reordered for time: the interval's facts first, then, unless
        the question looks at the past, each closed fact's open successor in its place and
        the closed facts after the open ones; when it does, a closed fact that still held
        when the interval ended goes above the fact that replaced it
        (:func:`held_above_successors`); cut to ``k``, ranks renumbered 1..k."""
        ranked = [(h.fact, h.score) for h in hits]
        if interval is not None:
            ranked = self._interval_first(profile_id, question, ranked, k, interval, skip)
        if not asks_about_past(question, today):
            ranked = self._current_first(profile_id, ranked, skip)
        elif interval is not None:
            ranked = held_above_successors(ranked, interval[1])
        if [f.id for f, _ in ranked[:k]] == [h.fact.id for h in hits]:
            return hits  # (then len(hits) <= k)
        return [Hit(f, score, rank) for rank, (f, score) in enumerate(ranked[:k], start=1)]

    def _newer_first(
        self, profile_id: int, question: str, hits: list[Hit], k: int, skip: frozenset[int]
    ) -> list[Hit]:
        """For a question about the present: each of the first ``NEWER_ANCHORS`` open hits
        gets, just above it, the newest fact said after it that restates the same thing
        (:func:`~inferscale_core.retriever_newer.newest_restatement`), read from the index; a
        later fact naming the anchor's person by another relation is about someone else."""
        anchors = [h.fact.id for h in hits[:NEWER_ANCHORS] if h.fact.valid_until is None]
        if not anchors:
            return hits
        stored, vectors = self._stored_vectors(profile_id, anchors)  # [a], [a, dim]
        if not stored:
            return hits
        index = self._index(profile_id)
        found = self.thread.submit(index.search, vectors, NEWER_NEIGHBOURS).result()
        near = {
            fid: [(other, c) for other, c in pairs if other != fid and other not in skip]
            for fid, pairs in zip(stored, found, strict=True)
        }
        ids = sorted({fid for pairs in near.values() for fid, _ in pairs} | set(near))
        said = self.log.fact_said_days(ids, profile_id)
        asked = dict(self._dense_among(profile_id, question, ids))
        facts = self._active_facts(profile_id, ids)
        for fid, pairs in near.items():  # "Alex from work ..." restates nothing of "my cousin Alex"
            who = mentions(facts[fid].text) if fid in facts else frozenset()
            if who:
                near[fid] = [
                    (o, c)
                    for o, c in pairs
                    if o in facts and agrees(who, facts[o].text, "") is not False
                ]
        endings = frozenset(fid for fid, fact in facts.items() if ends_it(fact.text))
        chosen = {
            fid: new
            for fid, pairs in near.items()
            if (new := newest_restatement(fid, pairs, said, asked, endings)) is not None
        }
        if not chosen:
            return hits
        ranked: list[tuple[Fact, float]] = []
        ended: list[tuple[Fact, float]] = []  # anchors a newer statement ended: after the rest
        placed: set[int] = set()
        for hit in hits:
            new = chosen.get(hit.fact.id)
            fact = facts.get(new) if new is not None else None
            if fact is not None and fact.valid_until is None:
                if new not in placed:
                    ranked.append((fact, hit.score))
                    placed.add(fact.id)
                if new in endings and hit.fact.id not in placed:
                    ended.append((hit.fact, hit.score))
                    placed.add(hit.fact.id)
            if hit.fact.id not in placed:
                ranked.append((hit.fact, hit.score))
                placed.add(hit.fact.id)
        ranked += ended
        return [Hit(f, score, rank) for rank, (f, score) in enumerate(ranked[:k], start=1)]

    def _interval_first(
        self,
        profile_id: int,
        question: str,
        ranked: list[tuple[Fact, float]],
        k: int,
        interval: tuple[date, date],
        skip: frozenset[int],
    ) -> list[tuple[Fact, float]]:
        """The facts that held in ``interval`` (:meth:`FactLog.facts_valid_in`) first: those
        among the hits in their order, then the others by cosine with the question; then the
        rest of the hits."""
        held = self.log.facts_valid_in(profile_id, *interval, among=[f.id for f, _ in ranked])
        first = [(f, s) for f, s in ranked if f.id in held]
        if len(first) < k:  # the interval's other facts (at most INTERVAL_SCAN), by cosine
            more = self.log.facts_valid_in(profile_id, *interval, limit=INTERVAL_SCAN)
            rest = [fid for fid in more if fid not in held and fid not in skip]
            best = self._dense_among(profile_id, question, rest)[: k - len(first)]
            found = self._active_facts(profile_id, [fid for fid, _ in best])
            first += [(found[fid], cosine) for fid, cosine in best if fid in found]
        ids = {f.id for f, _ in first}
        return first + [(f, s) for f, s in ranked if f.id not in ids]

    def _current_first(
        self, profile_id: int, ranked: list[tuple[Fact, float]], skip: frozenset[int]
    ) -> list[tuple[Fact, float]]:
        """Each closed fact's open successors (:meth:`FactLog.open_successors`: what closed
        it, and what holds each of its slots now) take its place unless ranked above it
        already; the closed facts go after the open ones."""
        closed = [f.id for f, _ in ranked if f.valid_until is not None]
        if not closed:
            return ranked
        successors = {
            old: [fid for fid in new if fid not in skip]
            for old, new in self.log.open_successors(closed).items()
        }
        have = {f.id: f for f, _ in ranked}
        wanted = [fid for new in successors.values() for fid in new if fid not in have]
        extra = self._active_facts(profile_id, wanted) if wanted else {}
        current: list[tuple[Fact, float]] = []
        placed: set[int] = set()
        for fact, score in ranked:
            if fact.valid_until is None:
                if fact.id not in placed:
                    current.append((fact, score))
                    placed.add(fact.id)
                continue
            for new in successors.get(fact.id, []):
                found = extra.get(new) or have.get(new)
                if new not in placed and found is not None and found.valid_until is None:
                    current.append((found, score))
                    placed.add(new)
        return current + [(f, s) for f, s in ranked if f.valid_until is not None]

    def _dense_among(
        self, profile_id: int, question: str, ids: list[int]
    ) -> list[tuple[int, float]]:
        """``[(fact id, cosine)]`` of those ``ids`` with a stored vector, best first."""
        stored, vectors = self._stored_vectors(profile_id, ids)  # [n], [n, dim]
        if not stored:
            return []
        asked, query = self._last_query
        if asked != question:  # a keyword-mode search embedded nothing
            query = self.embedder.embed([question])  # [1, dim]
        cosine = (vectors @ query[0].to(vectors.dtype).cpu()).tolist()  # [n]
        return sorted(zip(stored, cosine, strict=True), key=lambda p: -p[1])

    def _stored_vectors(self, profile_id: int, ids: list[int]) -> tuple[list[int], torch.Tensor]:
        """Those ``ids`` with a stored vector of this embedder, and the vectors ``[n, dim]``
        (float32; ``[0, dim]`` when none): the profile's index rows (its copy of the stored
        vectors, read in ~10 us instead of ~0.2 ms from the log), the log for ids it lacks
        (facts added elsewhere and not synced yet). An id the index still holds after its
        fact was deleted elsewhere comes back too: the callers date their ids with
        :meth:`FactLog.fact_said_days` of the profile, which leaves it out."""
        dim = self.embedder.dim
        found, rows = self._index(profile_id).vectors(ids)  # [n], [n, dim]
        if len(found) == len(ids):
            return found, rows
        have = set(found)
        stored = self.log.embeddings_of(
            profile_id, self.embedder.name, [fid for fid in ids if fid not in have]
        )
        stored = [(fid, blob) for fid, blob in stored if len(blob) == 4 * dim]
        if not stored:
            return found, rows
        vectors = dict(zip(found, rows, strict=True))
        decoded = _decode([blob for _, blob in stored], dim)  # [m, dim]
        vectors.update(zip([fid for fid, _ in stored], decoded, strict=True))
        order = [fid for fid in ids if fid in vectors]
        return order, torch.stack([vectors[fid] for fid in order])

    def _read_speakers(self, said: dict[int, str | None], ids: list[int]) -> None:
        """Add to ``said`` the speakers of the ``ids`` it lacks, read from the log (None: a
        fact nobody said, :meth:`FactLog.fact_speakers`)."""
        todo = [fid for fid in ids if fid not in said]
        if todo:
            found = self.log.fact_speakers(todo)
            said.update((fid, found.get(fid)) for fid in todo)

    def _embed_and_search(
        self, index: VectorIndex, question: str, n: int, faceted: bool = False
    ) -> tuple[torch.Tensor, list[tuple[int, float]]]:
        """The question's vector ``[1, dim]`` and its ``n`` nearest ``[(fact id, cosine)]``
        (run on the retrieval thread). ``faceted``: when the question asks about a facet
        (:meth:`Facets.steer`), the query moved toward its prototype is searched too, in the
        same call; ``_last_facet`` is then ``(facet, its n nearest)``, else None."""
        query = self.embedder.embed([question])  # [1, dim]
        self._last_query = (question, query)  # read by _dense_among after .result()
        self._last_facet = None
        if faceted and (found := self.facets.of(query)) is not None:
            steered = self.facets.steer(query, found[0])  # [1, dim]
            plain, moved = index.search(torch.cat([query, steered]), n)
            self._last_facet = (found[0], moved)
            return query, plain
        return query, index.search(query, n)[0]

    def _first_active(
        self, profile_id: int, ranked: list[int], k: int
    ) -> tuple[list[Fact], list[int]]:
        """The first ``k`` of ``ranked`` that are active facts of the profile, read from the
        log ``k`` ids at a time (k=50 of ~175 candidates: 0.5 ms instead of 1.4), and the ids
        read that are not."""
        kept: list[Fact] = []
        gone: list[int] = []
        for start in range(0, len(ranked), k):
            chunk = ranked[start : start + k]
            facts = self._active_facts(profile_id, chunk)
            for fid in chunk:
                if fid not in facts:
                    gone.append(fid)
                elif len(kept) < k:
                    kept.append(facts[fid])
            if len(kept) == k:
                break
        return kept, gone

    def _named_person(self, profile_id: int, question: str) -> str | None:
        """The one person of the profile's turns the question names, case-folded; None when it
        names none or several. A name matches word for word as it is spoken ("Will", not the
        "will" of "when will…"), or in any case when the question has no capitals at all. The
        names are read once, then only from newer turns (a deleted conversation's speaker
        lingers, harmlessly: no active fact is theirs)."""
        last, names = self._people.get(profile_id, (0, {}))
        new = self.log.speakers(profile_id, after_id=last)
        if new:
            names = dict(names)
            for speaker in new:
                if _WORD.search(speaker) and speaker.casefold() not in NOT_PEOPLE:
                    names[speaker.casefold()] = speaker
            self._people[profile_id] = (max(last, *new.values()), names)
        if not names:
            return None
        lower = question == question.casefold()
        words = f" {' '.join(_WORD.findall(question))} "
        named = [
            key
            for key, spoken in names.items()
            if f" {' '.join(_WORD.findall(key if lower else spoken))} " in words
        ]
        return named[0] if len(named) == 1 else None

    def _hits(self, profile_id: int, ranked: list[tuple[int, float]], k: int) -> list[Hit]:
        """``(fact id, score)`` best first -> the first ``k`` still active in the log, as hits."""
        facts = self._active_facts(profile_id, [fid for fid, _ in ranked])
        kept = [(facts[fid], score) for fid, score in ranked if fid in facts][:k]
        return [Hit(fact, score, rank) for rank, (fact, score) in enumerate(kept, start=1)]

    def _active_facts(self, profile_id: int, ids: list[int]) -> dict[int, Fact]:
        """``{id: Fact}`` of the ids that are active facts of the profile, read from the log."""
        return self.log.active_facts_in(profile_id, ids)

    def _index(self, profile_id: int) -> VectorIndex:
        """The profile's index, built on first use from the stored embeddings."""
        index = self._indexes.get(profile_id)
        if index is not None:
            return index
        dim = self.embedder.dim
        stored = [
            (fid, blob)
            for fid, blob in self.log.embeddings(profile_id, self.embedder.name)
            if len(blob) == 4 * dim  # else written by another dim: embed again
        ]
        have = {fid for fid, _ in stored}
        missing = [f for f in self.log.active_facts(profile_id) if f.id not in have]
        index = self.index_factory(dim, self.device, len(stored) + len(missing))
        if stored:
            index.add([fid for fid, _ in stored], _decode([blob for _, blob in stored], dim))
        self._indexes[profile_id] = index
        if missing:
            logger.info("embedding %d facts of profile %d", len(missing), profile_id)
            self.add_many(missing)
        return index

    def _store(self, facts: list[Fact], vectors: torch.Tensor) -> int:
        """Store each fact's vector in the log, then index the ones stored (skipping facts
        that were forgotten or replaced meanwhile: the log refuses them)."""
        kept = []
        for i, fact in enumerate(facts):
            try:
                self.log.store_embedding(
                    fact.id, self.embedder.name, _encode(vectors[i]), vectors.shape[1]
                )
            except (InactiveFactError, KeyError):
                logger.info("fact %d is gone; not indexing it", fact.id)
                continue
            kept.append(i)
        by_profile: dict[int, list[int]] = {}
        for i in kept:
            by_profile.setdefault(facts[i].profile_id, []).append(i)
        for profile_id, rows in by_profile.items():
            index = self._indexes.get(profile_id)
            if index is not None:  # else built from the log, with these, on first use
                index.add([facts[i].id for i in rows], vectors[rows])
        return len(kept)


def _without(
    ranked: list[tuple[int, float]], skip: frozenset[int], n: int
) -> list[tuple[int, float]]:
    """The first ``n`` of ``(fact id, score)`` best first whose id is not in ``skip``."""
    if not skip:
        return ranked[:n]
    return [pair for pair in ranked if pair[0] not in skip][:n]


def _past_last(hits: list[Hit]) -> list[Hit]:
    """``hits`` with those whose own words place them before now (:func:`states_past`) after
    the others, each group in its order, ranked anew."""
    ordered = sorted(hits, key=lambda h: states_past(h.fact.text))  # stable: order kept
    return [Hit(h.fact, h.score, rank) for rank, h in enumerate(ordered, start=1)]


def _recency(days: set[str]) -> dict[str, float]:
    """Each day (YYYY-MM-DD) placed in time between the oldest (0.0) and the newest (1.0) of
    ``days``; a single day is 0.0."""
    if not days:
        return {}
    ordinal = {d: date.fromisoformat(d).toordinal() for d in days}
    first, last = min(ordinal.values()), max(ordinal.values())
    span = max(1, last - first)
    return {d: (o - first) / span for d, o in ordinal.items()}


def _chronological(hit: Hit) -> tuple[bool, date, int]:
    when = hit.fact.refers_to
    return (when is not None, when or date.min, hit.fact.id)


def _encode(vector: torch.Tensor) -> bytes:
    """``[dim]`` -> float32 little-endian bytes."""
    return vector.detach().cpu().numpy().astype("<f4", copy=False).tobytes()


def _decode(blobs: Sequence[bytes], dim: int) -> torch.Tensor:
    """float32 little-endian blobs of ``dim`` values -> ``[len(blobs), dim]`` float32."""
    flat = np.frombuffer(b"".join(blobs), dtype="<f4").astype(np.float32)  # [n * dim]
    return torch.from_numpy(flat.reshape(len(blobs), dim))
