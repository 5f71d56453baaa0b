"""Hybrid retrieval: the fact log's full-text (BM25) index fused with the dense ranking.

Over real fact-log files and the real MiniLM embedder: the keyword index follows every add,
edit and forget in the same transaction, an old database upgrades with its facts indexed, no
input makes an FTS5 syntax error, fusion finds by a rare word a fact dense ranks low, a fact is
found by its date and the turns before it (until its conversation is deleted or it is
forgotten), a question naming a person prefers what that person said, and the question is
embedded on another thread while the keyword search runs.
"""

from __future__ import annotations

import random
import threading
from datetime import datetime

import pytest
from sqlite_utils import Database

from inferscale_core.embedder import SentenceTransformerEmbedder
from inferscale_core.factlog import FactLog
from inferscale_core.factlog.fulltext import fts_query, index_name
from inferscale_core.factlog.migrations import migrations
from inferscale_core.retriever import MODES, Retriever
from inferscale_core.types import Conversation, Turn
from tests.unit.test_retriever import FACTS, add_facts, pin_questions

NOW = "2025-01-02T03:04:05.000006+00:00"
NASTY = [
    "", " ", '"', '""', "'", "(", ")", "((", "a)", "AND", "OR", "NOT", "NEAR", "AND OR NOT",
    "*", "cat*", "^cat", "text:cat", "-cat", "+cat", "{text}: cat", "NEAR(cat miso, 2)",
    '"unterminated', "cat AND (", "\x00", "\\", "%_", "💥🐈", "日本語を勉強しています",
    "ÉLAN naïve café", "İstanbul", "ﬁsh ²", "x" * 5000, "what is my...?", "don't",
]  # fmt: skip


def integrity_check(log: FactLog, profile_id: int) -> None:
    """FTS5's own check of the profile's index against its active facts (raises if off)."""
    fts = index_name(profile_id)
    log.db.execute(f"INSERT INTO {fts} ({fts}) VALUES ('integrity-check')")


def keyword_ids(log: FactLog, profile_id: int, query: str) -> set[int]:
    return {fid for fid, _ in log.keyword_search(profile_id, query, 1000)}


def test_fts_query_quotes_words_and_drops_stop_words():
    assert fts_query("What is my cat's NAME?") == '"cat" OR "name"'
    assert fts_query('cat AND "miso" (NEAR) *') == '"cat" OR "miso" OR "near"'
    assert fts_query("Café  café CAFÉ") == '"café"'
    assert fts_query("the and of (") == ""
    assert fts_query(" ".join(f"w{i}" for i in range(100))).count(" OR ") == 31


def test_the_sanitizer_never_raises(log):
    p = log.profile()
    ids = add_facts(log, p, FACTS)
    rng = random.Random(23)
    pool = list("\"'()*^:+-{}[],.;!?\\%_ \t\nabcXYZ09éñ日本💥") + ["AND", "OR", "NOT", "NEAR"]
    fuzz = ["".join(rng.choice(pool) for _ in range(rng.randint(1, 40))) for _ in range(500)]
    active = set(ids.values())
    for query in [*NASTY, *fuzz]:
        for fid, score in log.keyword_search(p, query, 5):
            assert fid in active and score > 0
    assert log.keyword_search(p, "", 5) == [] and log.keyword_search(p, "cat", 0) == []


def test_the_index_follows_add_edit_forget_and_retire(log):
    p, other = log.profile(), log.profile("other")
    ids = add_facts(log, p, FACTS)
    theirs, _ = log.add_fact(other, "My cat is called Pixel")
    assert keyword_ids(log, p, "cat") == {ids["cat"]}  # never another profile's
    assert keyword_ids(log, other, "cat") == {theirs}
    assert keyword_ids(log, p, "Lisbon sister") == {ids["sister"]}
    assert keyword_ids(log, p, "trained") == {ids["marathon"]}  # porter: training ~ trained

    new = log.update_fact(ids["move"], "I moved to Denver in 2024", cause="moved again")
    assert keyword_ids(log, p, "Seattle") == set() and keyword_ids(log, p, "Denver") == {new}
    assert keyword_ids(log, p, "moved") == {new}
    log.delete_fact(ids["car"], cause="sold it")
    assert keyword_ids(log, p, "Toyota") == set()
    log.forget_fact(ids["cat"], cause="asked to")
    assert keyword_ids(log, p, "Miso cat called") == set()
    log.forget_fact(new, cause="asked to")  # forgetting a replaced fact's successor
    assert keyword_ids(log, p, "Denver moved") == set()

    # a forget rolled back with its transaction leaves the fact indexed
    with pytest.raises(RuntimeError), log.transaction():
        log.forget_fact(ids["coffee"], cause="asked to")
        assert keyword_ids(log, p, "coffee") == set()
        raise RuntimeError("the caller failed after the forget")
    assert keyword_ids(log, p, "coffee") == {ids["coffee"]}
    # the index holds exactly the active facts
    for profile in (p, other):  # each index holds exactly its profile's active facts
        fts = index_name(profile)
        indexed = {r[0] for r in log.db.execute(f"SELECT id FROM {fts}_docsize")}
        active = {f.id for f in log.active_facts(profile)}
        assert indexed == active
        log.db.execute(f"INSERT INTO {fts} ({fts}) VALUES ('integrity-check')")


def test_another_profiles_facts_never_change_a_search(log):
    """The BM25 side channel (issue 35): a user who stores two facts with two rare words and
    searches for both must see byte-identical scores and order whatever another user stores
    or forgets, or they could test whether someone else's memory holds a word."""
    me, them = log.profile("user:me"), log.profile("user:them")
    add_facts(log, me, FACTS)
    log.add_fact(me, "Doctor Zanetti moved her practice to Porto")
    log.add_fact(me, "The gate code is 4812, and the doctor parks there")
    questions = ["Zanetti 4812", "doctor code", "4812", "Zanetti", "cat coffee Lisbon"]

    def searches() -> list[str]:
        return [repr(log.keyword_search(me, q, 10)) for q in questions]

    alone = searches()
    assert all(s != "[]" for s in alone)
    theirs = [
        log.add_fact(them, text)[0]
        for text in (
            "My doctor is Dr Zanetti",
            "Zanetti said 4812 twice, Zanetti again",
            "The alarm code is 4812",
            *(f"Filler fact number {i} about a cat and coffee" for i in range(20)),
        )
    ]
    assert searches() == alone
    for fid in theirs:
        log.forget_fact(fid, cause="asked to")
    assert searches() == alone
    assert keyword_ids(log, them, "Zanetti") == set()


def test_one_profile_scores_as_the_file_wide_index_did(log):
    """A file with one profile: its own index has the statistics the old file-wide index had,
    so it scores exactly as that did (the values below are what m012's index gave)."""
    p = log.profile()
    ids = add_facts(log, p, FACTS)
    hits = log.keyword_search(p, "cat Miso coffee", 3)
    assert hits[0][0] == ids["cat"]
    assert [s for _, s in hits] == [4.454219135310325, 1.992104356803421]


def test_an_old_database_upgrades_with_its_facts_indexed(tmp_path, minilm):
    """A file written by the previous schema (m001..m010) gets its active facts indexed."""
    path = tmp_path / "memory.db"
    path.touch(mode=0o600)  # as FactLog.open made it
    old = Database(path)
    migrations.apply(old, stop_before="m011_facts_fts")
    old.execute("INSERT INTO profiles (id, name, created_at) VALUES (1, 'default', 'x')")
    rows = [
        (1, FACTS["cello"], "active"),
        (2, FACTS["allergy"], "active"),
        (3, FACTS["move"], "superseded"),
        (4, "", "forgotten"),
    ]
    for fid, text, status in rows:
        old.execute(
            "INSERT INTO facts (id, profile_id, text, text_hash, status, created_at, updated_at)"
            " VALUES (?, 1, ?, ?, ?, ?, ?)",
            (fid, text, f"h{fid}", status, NOW, NOW),
        )
    old.conn.commit()
    assert "facts_fts" not in old.table_names()
    old.close()

    with FactLog.open(path) as log:
        applied = [m.name for m in migrations.applied(log.db)]
        assert applied[10:13] == [  # after m001..m010; later ones follow
            "m011_facts_fts",
            "m012_fact_search_context",
            "m013_facts_fts_per_profile",
        ]
        assert keyword_ids(log, 1, "cello orchestra") == {1}
        assert keyword_ids(log, 1, "Seattle") == set()  # superseded: not indexed
        hits = Retriever(log, minilm).search(1, "peanuts", k=1, mode="keyword")
        assert hits[0].fact.id == 2
        log.forget_fact(2, cause="asked to")  # the triggers work on an upgraded file
        assert keyword_ids(log, 1, "peanuts allergic") == set()
        integrity_check(log, 1)


def test_forgotten_and_edited_facts_never_come_back(log, minilm):
    p = log.profile()
    ids = add_facts(log, p, FACTS)
    pin, _ = log.add_fact(p, "My bank card PIN is 4821")
    retriever = Retriever(log, minilm)
    questions = pin_questions()[:100] + ["4821", "PIN 4821", "bank card PIN"]
    assert all(pin in {h.fact.id for h in retriever.search(p, q, 3)} for q in questions[-3:])
    log.forget_fact(pin, cause="user forgot it")  # the dense index is stale now
    for question in questions:
        assert pin not in keyword_ids(log, p, question)
        for mode in MODES:
            assert pin not in {h.fact.id for h in retriever.search(p, question, 5, mode=mode)}

    new = log.update_fact(ids["cello"], "I play the viola in a string quartet", cause="switched")
    retriever.add(log.get_fact(new))  # the old one stays in the dense index: stale
    for question in [f"{q} cello orchestra" for q in pin_questions()[:100]]:
        for mode in MODES:
            got = {h.fact.id for h in retriever.search(p, question, 5, mode=mode)}
            assert ids["cello"] not in got
    assert retriever.search(p, "viola", k=1, mode="keyword")[0].fact.id == new


FILLER = [
    f"{who} {what}"
    for who in ("My neighbour", "My colleague", "My cousin", "My friend", "My landlord")
    for what in (
        "fixed the boiler in our flat",
        "helped me repair the heating",
        "recommended a plumber for the leaking pipe",
        "came by to look at the broken radiator",
        "lent me tools to fix the sink",
        "said the water heater needs a new part",
    )
]


def test_hybrid_finds_a_rare_word_that_dense_ranks_low(log, minilm):
    p = log.profile()
    add_facts(log, p, FACTS)
    for text in FILLER:
        log.add_fact(p, text)
    target, _ = log.add_fact(p, "Quinlivan owes me 40 euros since the party")
    retriever = Retriever(log, minilm)
    question = "Did Quinlivan help with the boiler?"
    dense = [h.fact.id for h in retriever.search(p, question, 100, "best_first", "dense")]
    assert dense.index(target) + 1 > 3, "dense should rank it low for this test to mean anything"
    hybrid = retriever.search(p, question, 3, "best_first", "hybrid")
    assert target in [h.fact.id for h in hybrid]
    assert [h.rank for h in hybrid] == [1, 2, 3]
    assert all(0 < h.score <= 1 for h in hybrid)
    assert [h.score for h in hybrid] == sorted((h.score for h in hybrid), reverse=True)
    # every order keeps rank 1 = best
    last = retriever.search(p, question, 3, mode="hybrid")
    assert [h.fact.id for h in last] == [h.fact.id for h in reversed(hybrid)]
    with pytest.raises(ValueError, match="mode"):
        retriever.search(p, question, 5, mode="bm25")


class _Threads:
    """The real embedder, noting the thread each call runs on (or raising, when told to)."""

    def __init__(self, inner: SentenceTransformerEmbedder) -> None:
        self.inner, self.threads, self.fail = inner, [], False
        self.name, self.dim = inner.name, inner.dim

    def embed(self, texts):
        self.threads.append(threading.current_thread().name)
        if self.fail:
            raise RuntimeError("embedder broke")
        return self.inner.embed(texts)


def test_the_question_is_embedded_beside_the_keyword_search(log, minilm):
    p = log.profile()
    add_facts(log, p, FACTS)
    watched = _Threads(minilm)
    retriever = Retriever(log, watched)
    retriever.sync(p)  # the index is built (the facts embedded here) before the search
    watched.threads.clear()
    question = "Which city did my sister move to?"
    hybrid = retriever.search(p, question, 5, "best_first")
    assert len(watched.threads) == 1 and watched.threads[0].startswith("inferscale-retrieval")
    assert hybrid == Retriever(log, minilm).search(p, question, 5, "best_first")
    dense = retriever.search(p, question, 5, mode="dense")  # a dense search's too
    assert len(dense) == 5 and watched.threads[-1].startswith("inferscale-retrieval")
    watched.fail = True  # an embedder's error reaches the caller
    with pytest.raises(RuntimeError, match="embedder broke"):
        retriever.search(p, question, 5)


def chat(log: FactLog, p: int, title: str, turns: list[tuple[str, str]], day: str) -> list[int]:
    """Store a conversation of ``(speaker, text)`` turns said on ``day``; its turn ids."""
    when = datetime.fromisoformat(f"{day}T10:00:00")
    conv = Conversation(title, [Turn(who, text, when) for who, text in turns], "chat", title)
    conv_id, _ = log.add_conversation(p, conv)
    return [turn_id for turn_id, _ in log.conversation_turns(conv_id)]


def context_of(log: FactLog, fact_id: int) -> str:
    return log.db.execute("SELECT search_context FROM facts WHERE id = ?", (fact_id,)).fetchone()[0]


def test_a_fact_is_found_by_its_date_and_the_turns_before_it(log):
    p = log.profile()
    turns = chat(
        log,
        p,
        "turtles",
        [
            ("Ben", "Morning!"),
            ("Ben", "Is it hard to look after turtles?"),
            ("Rosa", "Not really, just keep their area clean and feed them properly."),
        ],
        "2023-05-08",
    )
    answer, _ = log.add_fact(
        p, "Rosa: Not really, just keep their area clean", "2023-05-08", turns[2:]
    )
    other, _ = log.add_fact(p, "I keep my desk clean", "2022-11-30")
    assert context_of(log, answer) == (
        "May 8 2023\nBen: Morning!\nBen: Is it hard to look after turtles?"
    )
    assert context_of(log, other) == "November 30 2022"
    assert keyword_ids(log, p, "turtles") == {answer}  # only in the turn before it
    assert keyword_ids(log, p, "What happened in May 2023?") == {answer}
    assert keyword_ids(log, p, "November") == {other}
    # the text weighs more than the context: "clean" in both texts ranks them by text
    assert [fid for fid, _ in log.keyword_search(p, "turtles clean", 2)][0] == answer

    # deleting the conversation takes its turns out of the index; the date stays
    log.delete_conversation(log.conversations(p)[0].id)
    assert context_of(log, answer) == "May 8 2023"
    assert keyword_ids(log, p, "turtles") == set()
    assert keyword_ids(log, p, "May 2023") == {answer}
    # forgetting blanks the context with the text
    log.forget_fact(answer, cause="asked to")
    assert context_of(log, answer) == "" and keyword_ids(log, p, "May") == set()
    integrity_check(log, p)


def test_an_m011_database_gets_the_search_context_of_its_facts(tmp_path):
    path = tmp_path / "memory.db"
    path.touch(mode=0o600)
    old = Database(path)
    migrations.apply(old, stop_before="m012_fact_search_context")
    old.execute("INSERT INTO profiles (id, name, created_at) VALUES (1, 'default', 'x')")
    old.execute(
        "INSERT INTO conversations (id, profile_id, source, created_at) VALUES (1, 1, 'chat', 'x')"
    )
    for tid, (who, text) in enumerate([("Ben", "Do you still paint?"), ("Rosa", "Every day")]):
        old.execute(
            "INSERT INTO turns (id, conversation_id, profile_id, idx, speaker, text, source)"
            " VALUES (?, 1, 1, ?, ?, ?, 'chat')",
            (tid + 1, tid, who, text),
        )
    old.execute(
        "INSERT INTO facts (id, profile_id, text, text_hash, refers_to, source_turn_ids, status,"
        " created_at, updated_at) VALUES (1, 1, 'Rosa: Every day', 'h', '2024-02-29', '[2]',"
        " 'active', ?, ?)",
        (NOW, NOW),
    )
    old.conn.commit()
    old.close()
    with FactLog.open(path) as log:
        assert context_of(log, 1) == "February 29 2024\nBen: Do you still paint?"
        assert keyword_ids(log, 1, "painting") == {1}  # porter: paint ~ painting
        assert keyword_ids(log, 1, "February") == {1}
        integrity_check(log, 1)


def test_a_question_naming_a_person_prefers_what_that_person_said(log, minilm):
    p = log.profile()
    said = {}
    for who, dish in (("Anna", "risotto"), ("Ben", "a curry"), ("Carla", "pancakes")):
        (turn,) = chat(log, p, who, [(who, f"I love cooking {dish} on Sundays.")], "2024-03-03")
        # the fact's text does not name its speaker (as an LLM extractor may write it)
        said[who], _ = log.add_fact(p, f"Loves cooking {dish} on Sundays", None, [turn])
    log.add_fact(p, "Anna and Ben and Carla cook together at Easter")
    (turn,) = chat(log, p, "Will", [("Will", "I love cooking noodles on Sundays.")], "2024-03-03")
    wills, _ = log.add_fact(p, "Loves cooking noodles on Sundays", None, [turn])
    retriever = Retriever(log, minilm)
    # "will" is a word here, not Will: the question names Carla alone
    best = retriever.search(p, "What will Carla cook on Sundays?", 3, "best_first")[0]
    assert best.fact.id == said["Carla"], best.fact.text
    for who in said:
        asked = f"What does {who} like to cook on Sundays?"
        for question in (asked, asked.lower()):  # as spoken, or typed all in lower case
            best = retriever.search(p, question, 3, "best_first")[0]
            assert best.fact.id == said[who], (question, best.fact.text)
    said["Will"] = wills
    assert log.fact_speakers(list(said.values())) == {fid: who for who, fid in said.items()}
    assert log.speakers(p) == {
        who: log.get_fact(fid).source_turn_ids[0] for who, fid in said.items()
    }
    last = max(log.speakers(p).values())
    assert log.speakers(p, after_id=last) == {}
