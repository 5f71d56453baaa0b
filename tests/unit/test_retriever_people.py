"""People named by relation: "my cousin Alex" and "Alex from work" are two people.

The reading of names and relations (:mod:`inferscale_core.retriever_people`) on plain
strings, then the real retriever over a real fact log and the real MiniLM: a question that
says which Alex gets that Alex's facts first, including one that says only "she" right after
a turn naming her, and "my sister" with no name finds the sister's."""

from __future__ import annotations

from datetime import datetime

import pytest

from inferscale_core import retriever as retriever_module
from inferscale_core.factlog import FactLog
from inferscale_core.retriever import Retriever
from inferscale_core.retriever_people import Mention, agrees, asked_about, mentions, names_in
from inferscale_core.types import Conversation, Turn


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("What does my cousin Alex do for work?", {("alex", "cousin")}),
        ("Which club does Alex from work support?", {("alex", "from work")}),
        ("I met Tiago from the gym for coffee.", {("tiago", "from gym")}),
        ("Jan, my neighbour, fixed the bike.", {("jan", "neighbour")}),
        ("My older sister Inês lives in London.", {("inês", "older sister")}),
        ("My cousin Alex and Alex from work met.", {("alex", "cousin"), ("alex", "from work")}),
        ("How do I know Tiago?", set()),  # a name without a relation
        ("My flat is small.", set()),  # no name after the relation
    ],
)
def test_mentions_read_a_name_and_its_relation(text, expected):
    assert {(m.name, m.relation) for m in mentions(text)} == expected


def test_a_question_may_name_the_relation_alone():
    assert asked_about("What does my sister do for a living?") == {Mention("", "sister")}
    assert asked_about("Who is my boss?") == {Mention("", "boss")}
    assert asked_about("Where does my cousin Alex live?") == {Mention("alex", "cousin")}
    assert asked_about("Where do I live?") == frozenset()


def test_agrees_tells_the_person_apart():
    cousin = asked_about("What does my cousin Alex do?")
    assert agrees(cousin, "My cousin Alex had a baby.", "") is True
    assert agrees(cousin, "Alex from work texted me.", "") is False
    # a fact that names nobody takes the person its context names, through a pronoun
    assert agrees(cousin, "She's a nurse.", "user: My cousin Alex stayed with us.") is True
    assert agrees(cousin, "He supports Benfica.", "user: Alex from work is funny.") is False
    assert agrees(cousin, "The weather is nice.", "user: My cousin Alex stayed.") is None
    sister = asked_about("What does my sister do?")
    assert agrees(sister, "She's an architect.", "user: I'm off to see my sister Inês.") is True
    assert agrees(sister, "My brother Rui cooks.", "") is None


def test_two_places_do_not_tell_a_person_apart():
    """A place does not tell: "Cian from the Bishopstown clinic" may be "Cian from work"
    (life-dev10), so neither says it is someone else; "my brother Cian" does."""
    clinic = asked_about("Where did Cian from the Bishopstown clinic go when he left?")
    assert clinic == {Mention("cian", "from bishopstown")}
    assert agrees(clinic, "Cian from work is leaving us for a practice in Dublin.", "") is None
    assert agrees(clinic, "My brother Cian is emigrating to Canada.", "") is False
    assert agrees(clinic, "Cian from Bishopstown rang.", "") is True


def test_a_possessive_names_the_person():
    """ "my brother Cian's going-away do" names Cian (it read as "cian's", no one asked)."""
    assert mentions("On the 26th it's my brother Cian's going-away do.") == {
        Mention("cian", "brother")
    }
    assert names_in("Cian’s flat and O'Brien's van") == {"cian", "o'brien"}
    cousin = asked_about("What does my cousin Alex do?")
    assert agrees(cousin, "Alex from work's farewell was lovely.", "") is False


def chat(log: FactLog, p: int, title: str, texts: list[str], day: str) -> list[int]:
    when = datetime.fromisoformat(f"{day}T10:00:00+00:00")
    conv = Conversation(title, [Turn("user", t, when) for t in texts], "chat", title)
    conv_id, _ = log.add_conversation(p, conv)
    return [turn_id for turn_id, _ in log.conversation_turns(conv_id)]


def test_the_question_says_which_alex(log, minilm, monkeypatch):
    p = log.profile()
    facts: dict[str, int] = {}
    sessions = [
        ("a", ["My cousin Alex stayed with us, she came up from Coimbra.",
               "She's a nurse at the hospital there and works night shifts."], "2024-06-03"),
        ("b", ["Alex from work is obsessed with board games.",
               "Alex from work and I finished the migration on Friday.",
               "Alex from work moved to the Lisbon office.",
               "Alex from work says work is busy, he's a backend developer."], "2024-07-01"),
        ("c", ["My cousin Alex had her baby, a boy called Leo."], "2025-02-10"),
        ("d", ["The weather at work was awful all week."], "2025-03-01"),
    ]  # fmt: skip
    for title, texts, day in sessions:
        for turn, text in zip(chat(log, p, title, texts, day), texts, strict=True):
            facts[text] = log.add_fact(p, text, None, [turn])[0]
    retriever = Retriever(log, minilm)
    nurse = facts["She's a nurse at the hospital there and works night shifts."]
    work = {fid for text, fid in facts.items() if text.startswith("Alex from work")}

    def top(question: str, k: int = 3) -> list[int]:
        return [h.fact.id for h in retriever.search(p, question, k, "best_first")]

    cousin = top("What does my cousin Alex do for work?")
    assert nurse in cousin and not work & set(cousin), cousin
    colleague = top("What does Alex from work do?")
    assert set(colleague) <= work, colleague
    # the relation is what does it: read as a bare name, "Alex" and "work" bring the colleague
    monkeypatch.setattr(retriever_module, "asked_about", lambda question: frozenset())
    assert work & set(top("What does my cousin Alex do for work?", 5))
