"""What each assistant turn used, stored in the fact log (real SQLite files): it round-trips,
an existing database upgrades to it, it goes with its conversation, and a forgotten fact's text
does not survive in it."""

from __future__ import annotations

import sqlite3
from datetime import date

import pytest
from sqlite_utils import Database

from inferscale_core.factlog import FactLog
from inferscale_core.factlog.migrations import migrations
from inferscale_core.types import (
    Conversation,
    GenerationResult,
    ReplyDetails,
    ReplyMemory,
    Turn,
)

CAT = "I adopted a grey cat named Miso."
SISTER = "My sister Ana moved to Lisbon."


def chat(log: FactLog, pid: int) -> tuple[int, list[int]]:
    """A conversation of two exchanges; returns its id and its turn ids."""
    turns = [
        Turn("user", "What is my cat called?"),
        Turn("assistant", "Miso."),
        Turn("user", "And my sister?"),
        Turn("assistant", "Ana, in Lisbon."),
    ]
    cid, _ = log.add_conversation(pid, Conversation("pets", turns, "chat"))
    return cid, [tid for tid, _ in log.conversation_turns(cid)]


def details(cat: int, sister: int) -> ReplyDetails:
    return ReplyDetails(
        mode="inject",
        k=5,
        memories=(
            ReplyMemory(cat, CAT, "2023-05-08", 0.83, "injected", "host"),
            ReplyMemory(sister, SISTER, None, 0.22, "text"),
        ),
        notes=("left out to fit the context: 2 memories",),
        ttft_s=0.041,
        prompt_tokens=212,
        injected_tokens=124,
        computed_tokens=61,
        prefix_cached_tokens=27,
    )


def facts(log: FactLog, pid: int) -> tuple[int, int]:
    cat, _ = log.add_fact(pid, CAT, refers_to=date(2023, 5, 8))
    sister, _ = log.add_fact(pid, SISTER)
    return cat, sister


def rows(log: FactLog, table: str) -> int:
    return log.db.execute(f"SELECT count(*) FROM {table}").fetchone()[0]


def test_details_round_trip_and_are_replaced(log):
    pid = log.profile()
    _, (_, first, _, second) = chat(log, pid)
    cat, sister = facts(log, pid)
    stored = details(cat, sister)
    log.save_reply_details(first, stored)
    nothing = ReplyDetails("prompt", 3)  # the engine returned nothing: no figures
    log.save_reply_details(second, nothing)

    found = log.reply_details([first, second, second + 100])
    assert found == {first: stored, second: nothing}
    assert found[second].prompt_tokens is None and found[second].memories == ()
    assert log.reply_details([]) == {}
    # many ids at once (more than one query's worth)
    assert log.reply_details(range(1, 2000)).keys() == {first, second}

    again = ReplyDetails("prompt", 2, (ReplyMemory(sister, SISTER, None, 0.5, "text"),))
    log.save_reply_details(first, again)
    assert log.reply_details([first]) == {first: again}
    assert rows(log, "reply_memories") == 1


def test_details_of_a_generation_result():
    result = GenerationResult(
        "r",
        prompt_tokens=200,
        ttft_s=0.05,
        cached_tokens=150,
        prefix_cached_tokens=30,
        injected_tokens=120,
        refused=None,
    )
    memory = ReplyMemory(1, CAT, None, 0.9, "injected", "device")
    got = ReplyDetails.of(result, "inject", 4, [memory], ["a note"])
    assert got == ReplyDetails("inject", 4, (memory,), ("a note",), 0.05, 200, 120, 50, 30, None)
    assert ReplyDetails.of(None, "prompt", 4, []) == ReplyDetails("prompt", 4)


def test_saving_checks_the_turn_and_the_facts_profile(log):
    pid, other = log.profile(), log.profile("work")
    _, (_, first, *_) = chat(log, pid)
    cat, sister = facts(log, pid)
    theirs, _ = log.add_fact(other, "I work at the harbour.")
    with pytest.raises(KeyError, match="no turn"):
        log.save_reply_details(first + 100, details(cat, sister))
    with pytest.raises(sqlite3.IntegrityError):  # a fact of another profile
        log.save_reply_details(first, details(cat, theirs))
    with pytest.raises(sqlite3.IntegrityError):  # a fact that does not exist
        log.save_reply_details(first, details(cat, theirs + 100))
    assert rows(log, "reply_details") == rows(log, "reply_memories") == 0  # all or nothing


def test_deleting_a_conversation_deletes_its_details(log):
    pid = log.profile()
    cid, (_, first, _, second) = chat(log, pid)
    keep, (_, kept, *_) = chat(log, pid)
    cat, sister = facts(log, pid)
    for turn in (first, second, kept):
        log.save_reply_details(turn, details(cat, sister))
    log.delete_conversation(cid)
    assert log.reply_details([first, second, kept]).keys() == {kept}
    assert rows(log, "reply_details") == 1 and rows(log, "reply_memories") == 2


def test_forgetting_a_fact_blanks_it_in_every_stored_reply(log):
    pid = log.profile()
    _, (_, first, _, second) = chat(log, pid)
    cat, sister = facts(log, pid)
    log.save_reply_details(first, details(cat, sister))
    log.save_reply_details(second, details(cat, sister))

    log.forget_fact(cat, "forgotten by the user")
    for got in log.reply_details([first, second]).values():
        gone, kept = got.memories
        assert (gone.fact_id, gone.text, gone.forgotten) == (cat, "", True)
        assert (gone.score, gone.how, gone.tier) == (0.83, "injected", "host")
        assert kept == ReplyMemory(sister, SISTER, None, 0.22, "text")
    assert log.db.execute(
        "SELECT count(*) FROM reply_memories WHERE text LIKE '%Miso%'"
    ).fetchone() == (0,)

    # a reply saved after the forget (asked while it happened) does not bring the text back
    log.save_reply_details(first, details(cat, sister))
    assert log.reply_details([first])[first].memories[0].text == ""
    log.forget_fact(cat, "again")  # a no-op, and still blank
    assert log.reply_details([first])[first].memories[0].forgotten


def test_forgetting_rolls_back_with_its_transaction(log):
    pid = log.profile()
    _, (_, first, *_) = chat(log, pid)
    cat, sister = facts(log, pid)
    log.save_reply_details(first, details(cat, sister))
    with pytest.raises(RuntimeError), log.transaction():
        log.forget_fact(cat, "changed my mind")
        raise RuntimeError("the caller failed after the forget")
    assert log.reply_details([first])[first].memories[0].text == CAT
    assert log.get_fact(cat).status == "active"


def test_an_existing_database_upgrades_and_keeps_its_data(tmp_path):
    """A file written by the previous schema (m001..m009) gains the tables on open."""
    path = tmp_path / "memory.db"
    path.touch(mode=0o600)  # as FactLog.open made it
    old = Database(path)
    migrations.apply(old, stop_before="m010_reply_details")
    old.execute("INSERT INTO profiles (id, name, created_at) VALUES (1, 'default', 'x')")
    old.execute(
        "INSERT INTO conversations (id, profile_id, title, source, created_at)"
        " VALUES (7, 1, 'old chat', 'chat', 'x')"
    )
    for idx, (speaker, text) in enumerate([("user", "Hi"), ("assistant", "Hello!")]):
        old.execute(
            "INSERT INTO turns (conversation_id, profile_id, idx, speaker, text, source)"
            " VALUES (7, 1, ?, ?, ?, 'chat')",
            (idx, speaker, text),
        )
    old.conn.commit()
    assert "reply_details" not in old.table_names()
    old.close()

    with FactLog.open(path) as log:
        assert "m010_reply_details" in [m.name for m in migrations.applied(log.db)]
        assert migrations.pending(log.db) == []
        turns = log.conversation_turns(7)
        assert [t.text for _, t in turns] == ["Hi", "Hello!"]
        assert log.reply_details(tid for tid, _ in turns) == {}  # old replies have none
        cat, sister = facts(log, 1)
        log.save_reply_details(turns[1][0], details(cat, sister))
        log.delete_conversation(7)  # the cascade works on an upgraded file too
        assert rows(log, "reply_details") == rows(log, "reply_memories") == 0
