"""What is true now: a later fact closes the one it replaces (audit, undo, forgetting), and
retrieval puts the current fact first unless the question asks about the past. Real SQLite
files and the real MiniLM."""

from __future__ import annotations

import sqlite3
from datetime import UTC, date, datetime

import pytest

from inferscale_core.factlog import FactLog
from inferscale_core.retriever import Retriever

NOW = datetime(2025, 12, 20, 12, tzinfo=UTC)
LIFE = [  # (text, the day it refers to)
    ("I live in Lisbon with my partner.", date(2022, 4, 2)),
    ("I work as a teacher at a primary school.", date(2022, 5, 10)),
    ("My dog Rex loves the beach at Cascais.", date(2022, 6, 1)),
    ("We went to a concert in Lisbon in September.", date(2023, 9, 16)),
    ("I ran my first half marathon.", date(2024, 9, 8)),
    ("We finally moved to Porto last weekend.", date(2025, 3, 8)),
    ("Rex died in March, we adopted a beagle called Mochi.", date(2025, 4, 20)),
    ("My sister visited us for a week.", date(2025, 6, 1)),
]


def tell(log: FactLog, profile: int, life=LIFE) -> dict[str, int]:
    ids = {}
    for text, when in life:
        ids[text.split()[-1].rstrip(".")] = log.add_fact(profile, text, when)[0]
    while log.read_slots(profile)[0]:
        pass
    return ids


def by_text(log: FactLog, profile: int) -> dict[str, object]:
    return {f.text: f for f in log.active_facts(profile)}


def test_a_move_closes_the_old_home_and_keeps_it_true_of_its_time(log):
    p = log.profile()
    tell(log, p)
    facts = by_text(log, p)
    lisbon, porto = facts[LIFE[0][0]], facts[LIFE[5][0]]
    assert (lisbon.valid_until, lisbon.ended_by) == (date(2025, 3, 8), porto.id)
    assert lisbon.status == "active" and porto.valid_until is None
    rex, mochi = facts[LIFE[2][0]], facts[LIFE[6][0]]
    assert (rex.valid_until, rex.ended_by) == (date(2025, 4, 20), mochi.id)
    # the unrelated facts stay open, the job too (nothing replaced it)
    assert all(facts[t].valid_until is None for t, _ in (LIFE[1], LIFE[3], LIFE[4], LIFE[7]))
    closes = [e for e in log.audit(p) if e.action == "close"]
    assert [e.fact_id for e in closes] == [lisbon.id, rex.id]
    assert "replaced by fact" in closes[0].cause and closes[0].new_text == porto.text


def test_an_old_fact_told_late_is_closed_by_the_newer_one(log):
    p = log.profile()
    porto, _ = log.add_fact(p, "We moved to Porto.", date(2025, 3, 8))
    lisbon, _ = log.add_fact(p, "I live in Lisbon.", date(2022, 1, 1))  # an import's old turn
    log.read_slots(p)
    facts = {f.id: f for f in log.active_facts(p)}
    assert facts[porto].valid_until is None
    assert (facts[lisbon].valid_until, facts[lisbon].ended_by) == (date(2025, 3, 8), porto)


def test_undo_and_forgetting_reopen(log):
    p = log.profile()
    tell(log, p)
    facts = by_text(log, p)
    lisbon, porto = facts[LIFE[0][0]], facts[LIFE[5][0]]
    log.reopen_fact(lisbon.id, "undone in the memory browser")
    assert log.get_fact(lisbon.id).valid_until is None
    assert log.audit(p, lisbon.id)[-1].action == "reopen"
    with pytest.raises(ValueError, match="not closed"):
        log.reopen_fact(lisbon.id, "again")
    rex, mochi = facts[LIFE[2][0]], facts[LIFE[6][0]]
    log.forget_fact(mochi.id, "forgotten by the user")
    assert log.get_fact(rex.id).valid_until is None  # what replaced it is gone
    assert log.get_fact(porto.id).valid_until is None


def test_a_fact_of_two_slots_has_a_successor_for_each(log):
    p = log.profile()
    siemens, _ = log.add_fact(p, "Started at Siemens as a data engineer.", date(2024, 5, 6))
    senior, _ = log.add_fact(p, "I got promoted to senior data engineer.", date(2025, 2, 7))
    log.read_slots(p)  # the role changed first: that closes the whole statement
    assert log.get_fact(siemens).ended_by == senior
    zalando, _ = log.add_fact(p, "First week at Zalando done.", date(2025, 10, 1))
    log.read_slots(p)  # the employer changes too; the closed fact stays closed by the role
    assert log.open_successors([siemens]) == {siemens: [senior, zalando]}


def test_closing_drops_the_kv_rows_so_the_line_is_encoded_again(log):
    p = log.profile()
    lisbon, _ = log.add_fact(p, "I live in Lisbon.", date(2022, 1, 1))
    log.read_slots(p)
    log.record_kv(lisbon, "fp", 0, "anchored", "fact-abc", "fp/fact-abc", 10)
    log.add_fact(p, "We moved to Porto.", date(2025, 3, 8))
    _, keys = log.read_slots(p)
    assert keys == ["fact-abc"] or keys == ["fp/fact-abc"]
    assert log.kv_keys(lisbon) == []


def test_existing_logs_migrate_and_read_their_old_facts(tmp_path):
    path = tmp_path / "memory.db"
    with FactLog.open(path) as log:
        p = log.profile()
        tell(log, p, LIFE[:1])
    # as a log written before validity: unread slots, nothing closed
    db = sqlite3.connect(path)
    db.execute("UPDATE facts SET slots_read = 0")
    db.commit()
    db.close()
    with FactLog.open(path) as log:
        log.add_fact(p, "We finally moved to Porto last weekend.", date(2025, 3, 8))
        assert len(log.facts_slots_unread(p)) == 2
        log.read_slots(p)
        assert by_text(log, p)[LIFE[0][0]].valid_until == date(2025, 3, 8)


def ranked(retriever, p, question, k=5, mode="hybrid"):
    hits = retriever.search(p, question, k, order="best_first", mode=mode, now=NOW)
    return [h.fact.text for h in hits]


@pytest.mark.parametrize("mode", ["hybrid", "dense", "keyword"])
def test_the_current_home_ranks_first_unless_the_past_is_asked(log, minilm, mode):
    p = log.profile()
    tell(log, p)
    retriever = Retriever(log, minilm)
    lisbon, porto = LIFE[0][0], LIFE[5][0]
    now = ranked(retriever, p, "Where do I live?", mode=mode)
    assert now[0] == porto
    if lisbon in now:
        assert now.index(lisbon) > now.index(porto)
    then = ranked(retriever, p, "Where did I live in 2023?", mode=mode)
    assert then[0] == lisbon
    pets = ranked(retriever, p, "What's my dog's name?", mode=mode)
    assert pets[0] == LIFE[6][0]


def test_a_named_month_gets_that_months_facts_first(log, minilm):
    p = log.profile()
    tell(log, p)
    retriever = Retriever(log, minilm)
    top = ranked(retriever, p, "What did I do in September 2024?", k=3)
    assert top[0] == LIFE[4][0]
    top = ranked(retriever, p, "What did we do in September 2023?", k=3)
    assert top[0] == LIFE[3][0]
