"""The newer of two statements of the same thing ranks first for a question about now.

:func:`newest_restatement` on plain numbers, then the real retriever over a real fact log and
the real MiniLM, with changes said in words no slot pattern reads ("I ran 48:30 at a 10k on
Sunday", "I quit the Thursday football"): the later statement goes first for a question about
the present, and only then (the same question about the past, or the step turned off, keeps
the old order)."""

from __future__ import annotations

from datetime import UTC, date, datetime

import pytest

from inferscale_core import retriever as retriever_module
from inferscale_core.retriever import Retriever
from inferscale_core.retriever_newer import ends_it, newest_restatement

SAID = {1: "2024-01-05", 2: "2024-06-01", 3: "2025-02-01", 4: "2023-01-01"}


def test_the_newest_similar_relevant_later_fact_is_chosen():
    asked = {1: 0.5, 2: 0.45, 3: 0.4, 4: 0.6}
    near = [(2, 0.7), (3, 0.55), (4, 0.9)]
    assert newest_restatement(1, near, SAID, asked) == 3  # 4 is older than the anchor
    assert newest_restatement(1, [(2, 0.7), (3, 0.3)], SAID, asked) == 2  # 3 is not similar
    assert newest_restatement(1, near, SAID, {**asked, 3: 0.2}) == 2  # 3 answers too little
    assert newest_restatement(1, [(4, 0.9)], SAID, asked) is None
    assert newest_restatement(9, near, SAID, asked) is None  # an anchor of unknown day


def test_an_ending_needs_less_relevance_but_some():
    asked = {1: 0.5, 3: 0.2}  # 0.4 of the anchor's: too little to restate it, enough to end it
    assert newest_restatement(1, [(3, 0.6)], SAID, asked) is None
    assert newest_restatement(1, [(3, 0.6)], SAID, asked, frozenset({3})) == 3
    # an ending about something the question does not ask of ends nothing it asks of
    off_topic = {1: 0.5, 3: 0.05}
    assert newest_restatement(1, [(3, 0.6)], SAID, off_topic, frozenset({3})) is None


def test_an_ending_needs_less_similarity():
    """An ending restates its anchor from a lower cosine: "She took me off the cetirizine and
    put me on fexofenadine" is 0.44 from "the cetirizine is doing nothing"; a plain statement
    that far does not restate it."""
    asked = {1: 0.5, 3: 0.45}
    assert newest_restatement(1, [(3, 0.44)], SAID, asked) is None
    assert newest_restatement(1, [(3, 0.44)], SAID, asked, frozenset({3})) == 3
    assert newest_restatement(1, [(3, 0.35)], SAID, asked, frozenset({3})) is None


@pytest.mark.parametrize(
    ("text", "ends"),
    [
        ("I quit the Thursday football.", True),
        ("Finished Middlemarch at last.", True),
        ("We sold the van to a neighbour.", True),
        ("I don't sing in the choir any more.", True),
        # a switch ends the old value too
        ("The GP has taken me off the amlodipine and put me on ramipril.", True),
        ("Swapped the gym for running along the river.", True),
        ("Gaelic has fallen by the wayside, I'm afraid.", True),
        ("Carmen and I have called it a day.", True),
        ("I play football on Thursdays.", False),
        ("Started reading Middlemarch.", False),
        ("The plane took off an hour late.", False),
    ],
)
def test_ends_it(text, ends):
    assert ends_it(text) is ends


NOW = datetime(2025, 12, 20, 12, tzinfo=UTC)
LIFE = [
    ("My best 10k is 55 minutes, I'd love to get under 50.", date(2024, 2, 6)),
    ("On Thursdays I play five-a-side football with old colleagues.", date(2024, 1, 23)),
    ("I go to the climbing wall near the station on Tuesdays.", date(2024, 10, 14)),
    ("Ran the Leeds 10k yesterday in 52:10, a new personal best!", date(2024, 10, 13)),
    ("I quit the Thursday football, I didn't know anyone any more.", date(2024, 10, 17)),
    ("I ran 48:30 at a 10k in the park on Sunday, a new best!", date(2025, 11, 23)),
    ("My sister came to visit for the weekend.", date(2025, 6, 1)),
    ("We had pizza at the new place on the corner.", date(2025, 7, 1)),
]


def ranked(retriever, p, question):
    hits = retriever.search(p, question, 5, order="best_first", now=NOW)
    return [h.fact.text for h in hits]


def test_the_later_statement_goes_first_for_a_question_about_now(log, minilm, monkeypatch):
    monkeypatch.setattr(retriever_module, "FACETED", False)  # this step alone (test_facets.py)
    p = log.profile()
    for text, when in LIFE:
        log.add_fact(p, text, when)
    retriever = Retriever(log, minilm)
    newest_10k, football, quit_ = LIFE[5][0], LIFE[1][0], LIFE[4][0]
    best = ranked(retriever, p, "What's my fastest time over 10 kilometres?")
    assert best[0] == newest_10k, best
    sport = ranked(retriever, p, "What sport do I do every week?")
    assert sport.index(quit_) < sport.index(football), sport  # the ending goes above
    assert sport[-1] == football or football not in sport[:3], sport  # and it after the rest
    past_question = "What was my best 10k time before the Leeds race?"
    past = ranked(retriever, p, past_question)
    # the step is what does it: without it the older statements lead
    monkeypatch.setattr(retriever_module, "NEWER_ANCHORS", 0)
    assert ranked(retriever, p, "What's my fastest time over 10 kilometres?")[0] != newest_10k
    assert ranked(retriever, p, "What sport do I do every week?").index(football) < sport.index(
        football
    )
    # and a question about the past is left as the ranking has it
    assert ranked(retriever, p, past_question) == past


def test_a_fact_that_tells_of_the_past_goes_after_what_holds_now(log, minilm, monkeypatch):
    """Said the same day, "My old job was at the post office in Lisbon" is nearer "Where do I
    live now?" for MiniLM than the move to Porto; its own words place it before now."""
    p = log.profile()
    moved = "I moved from Lisbon to Porto last month for a new job at a bakery."
    old_job = "My old job was at the post office in Lisbon."
    for text in (moved, old_job):
        log.add_fact(p, text, date(2026, 12, 6))
    retriever = Retriever(log, minilm)
    now = datetime(2026, 12, 6, 12, tzinfo=UTC)

    def first(question: str) -> str:
        return retriever.search(p, question, 2, order="best_first", now=now)[0].fact.text

    assert first("Where do I live now?") == moved
    assert first("Where did I use to work?") == old_job  # the past asked: left as ranked
    monkeypatch.setattr(retriever_module, "states_past", lambda text: False)
    assert first("Where do I live now?") == old_job  # what the step changes
