"""The memory worker's extraction: what it searches and embeds per turn (a real fact log, the
real retriever and MiniLM; the worker's extraction step run in the test's thread)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from inferscale_core.extractor import DeterministicExtractor, FactOp
from inferscale_core.memory_worker import MemoryWorker
from inferscale_core.retriever import Retriever
from inferscale_core.types import Conversation, Fact, Turn
from tests.support.counting_embedder import CountingEmbedder

TURNS = (
    "Ines moved to Lisbon last spring.",
    "My sister Ines moved to Porto for a new job.",
    "Our cat Miso is grey and sleeps all day.",
    "Jun teaches maths at a school in Osaka.",
)


class RecordingExtractor:
    """The deterministic extractor's facts, with the ``similar`` facts each turn was given."""

    name = "recording"

    def __init__(self, reads_similar: bool) -> None:
        self.reads_similar = reads_similar
        self.given: list[list[str]] = []
        self._inner = DeterministicExtractor()

    def extract(self, turn: Turn, similar: Sequence[Fact] = ()) -> list[FactOp]:
        self.given.append([f.text for f in similar])
        return self._inner.extract(turn, similar)


def _extract_all(log, extractor, embedder) -> tuple[int, Retriever]:
    profile = log.profile("user")
    log.add_conversation(profile, Conversation("chat", [Turn("user", t) for t in TURNS]))
    worker = MemoryWorker(lambda: log, profile, None, None, extractor)  # no encoding here
    worker._retriever = retriever = Retriever(log, embedder)
    while worker._extract_batch(log):
        pass
    return profile, retriever


def test_an_extractor_that_reads_similar_facts_gets_the_turns_hits(log, minilm):
    extractor = RecordingExtractor(reads_similar=True)
    profile, _ = _extract_all(log, extractor, minilm)
    assert extractor.given[0] == []  # nothing in memory yet
    assert "Ines moved to Lisbon last spring." in extractor.given[1]
    assert len(log.active_facts(profile)) == len(TURNS)


def test_the_deterministic_extractor_is_not_searched_for_and_each_fact_embedded_once(log, minilm):
    """Its facts are the turn's own sentences, so the worker skips the hybrid search of each
    turn (half of a turn's extraction time), and a fact's vector is the one the near-duplicate
    check just computed: one embedding a fact, the same vector as embedding it alone."""
    assert DeterministicExtractor.reads_similar is False
    extractor = RecordingExtractor(reads_similar=False)
    embedder = CountingEmbedder(minilm)
    profile, retriever = _extract_all(log, extractor, embedder)
    facts = log.active_facts(profile)
    assert extractor.given == [[]] * len(TURNS)
    assert len(facts) == len(TURNS)
    assert sorted(embedder.texts) == sorted(f.text for f in facts)  # once each
    ids, vectors = retriever._stored_vectors(profile, [f.id for f in facts])
    by_id = {f.id: f.text for f in facts}
    for fid, vector in zip(ids, vectors, strict=True):
        # the same vector up to float noise: a text embedded in a batch is padded to the
        # batch's longest, and the matmuls' blocking then differs by ~1e-8 on some CPUs
        torch.testing.assert_close(vector, minilm.embed([by_id[fid]])[0], rtol=0, atol=1e-6)


def test_a_near_duplicate_in_the_same_batch_is_still_merged(log, minilm):
    """Without the per-turn search, each turn's near-duplicate check still sees the facts the
    turns before it in the same batch added: the same statement said twice is one fact."""
    profile = log.profile("user")
    turns = [
        Turn("user", "Our cat Miso is grey and sleeps all day."),
        Turn("user", "Our cat Miso is grey and sleeps all day long."),
    ]
    log.add_conversation(profile, Conversation("chat", turns))
    worker = MemoryWorker(lambda: log, profile, None, None, DeterministicExtractor())
    worker._retriever = Retriever(log, minilm)
    while worker._extract_batch(log):
        pass
    assert [f.text for f in log.active_facts(profile)] == [turns[0].text]
