"""The fact log: schema, file safety, idempotent/atomic imports, facts, isolation, crashes.

Run as a script (``python tests/unit/test_factlog.py child DB``) it is the child process of the
crash test.
"""

from __future__ import annotations

import logging
import os
import signal
import sqlite3
import stat
import subprocess
import sys
import threading
import time
from datetime import UTC, date, datetime, timedelta, timezone
from pathlib import Path

import pytest
from sqlite_utils import Database

from inferscale_core.factlog import FactLog, InactiveFactError, fact_text_hash, normalize_fact_text
from inferscale_core.factlog.migrations import migrate, migrations
from inferscale_core.types import Conversation, Turn
from tests.support import REPO

EXPECTED_COLUMNS = {
    "profiles": {"id": int, "name": str, "created_at": str},
    "conversations": {
        "id": int,
        "profile_id": int,
        "title": str,
        "source": str,
        "source_id": str,
        "created_at": str,
    },
    "turns": {
        "id": int,
        "conversation_id": int,
        "profile_id": int,
        "idx": int,
        "speaker": str,
        "text": str,
        "timestamp": str,
        "source": str,
        "source_id": str,
    },
    "facts": {
        "id": int,
        "profile_id": int,
        "text": str,
        "text_hash": str,
        "refers_to": str,
        "source_turn_ids": str,
        "status": str,
        "supersedes": int,
        "created_at": str,
        "updated_at": str,
        "search_context": str,
        "valid_until": str,
        "ended_by": int,
        "slots_read": int,
    },
    "audit": {
        "id": int,
        "profile_id": int,
        "fact_id": int,
        "action": str,
        "cause": str,
        "old_text": str,
        "new_text": str,
        "at": str,
    },
    "kv_entries": {
        "fact_id": int,
        "model_fingerprint": str,
        "w": int,
        "encoder_version": str,
        "location": str,
        "num_tokens": int,
        "nbytes": int,
        "created_at": str,
        "used_at": str,
    },
    "kv_deferred": {"fact_id": int, "reason": str, "since": str},
    "fact_embeddings": {"fact_id": int, "model": str, "dim": int, "vector": bytes},
    "fact_slots": {"fact_id": int, "profile_id": int, "key": str, "value": str, "ends": int},
    "imports": {
        "id": int,
        "profile_id": int,
        "path": str,
        "sha256": str,
        "format": str,
        "status": str,
        "reason": str,
        "conversations": int,
        "turns_added": int,
        "at": str,
    },
    "extraction_cursor": {"profile_id": int, "last_turn_id": int},
    "reply_details": {
        "turn_id": int,
        "profile_id": int,
        "mode": str,
        "k": int,
        "ttft_s": float,
        "prompt_tokens": int,
        "injected_tokens": int,
        "computed_tokens": int,
        "prefix_cached_tokens": int,
        "refused": str,
        "notes": str,
    },
    "reply_memories": {
        "turn_id": int,
        "pos": int,
        "profile_id": int,
        "fact_id": int,
        "text": str,
        "refers_to": str,
        "score": float,
        "how": str,
        "tier": str,
        "forgotten": int,
    },
}


def conv(source_id: str | None, n: int, *, title: str = "t", source: str = "jsonl", start=0):
    return Conversation(
        title=title,
        turns=[Turn("user" if i % 2 == 0 else "assistant", f"turn {i}") for i in range(start, n)],
        source=source,
        source_id=source_id,
    )


def schema(db: Database) -> list[tuple]:
    return db.execute("SELECT type, name, sql FROM sqlite_master ORDER BY name").fetchall()


def count(log: FactLog, sql: str, params=()) -> int:
    return log.db.execute(sql, params).fetchone()[0]


# -- schema ----------------------------------------------------------------------------------


def test_migrations_create_the_schema_and_reapply_as_a_no_op():
    db = Database(memory=True)
    migrate(db)
    assert [m.name for m in migrations.applied(db)] == [
        "m001_profiles",
        "m002_conversations",
        "m003_turns",
        "m004_facts",
        "m005_audit",
        "m006_kv_entries",
        "m007_fact_embeddings",
        "m008_imports",
        "m009_extraction_cursor",
        "m010_reply_details",
        "m011_facts_fts",
        "m012_fact_search_context",
        "m013_facts_fts_per_profile",
        "m014_kv_deferred",
        "m015_validity",
        "m016_facts_by_day",
    ]
    assert db["kv_entries"].pks == ["fact_id", "model_fingerprint", "w", "encoder_version"]
    assert db["fact_embeddings"].pks == ["fact_id", "model"]
    partial = db.execute(
        "SELECT sql FROM sqlite_master WHERE name = 'idx_facts_active_hash'"
    ).fetchone()[0]
    assert "UNIQUE" in partial and "WHERE status = 'active'" in partial

    before, applied = schema(db), migrations.applied(db)
    migrate(db)
    FactLog(db)  # opening an up-to-date database migrates nothing either
    assert schema(db) == before
    assert migrations.applied(db) == applied
    assert migrations.pending(db) == []


def test_every_table_has_the_expected_columns():
    db = Database(memory=True)
    migrate(db)
    assert set(db.table_names()) == {*EXPECTED_COLUMNS, "_sqlite_migrations"}
    FactLog(db).profile()  # a profile brings its keyword index (fulltext.py)
    fts = {f"facts_fts_p1{part}" for part in ("", "_data", "_idx", "_docsize", "_config")}
    assert set(db.table_names()) == {*EXPECTED_COLUMNS, "_sqlite_migrations", *fts}
    assert db.view_names() == ["facts_active_p1"]
    for table, columns in EXPECTED_COLUMNS.items():
        assert db[table].columns_dict == columns, table


def test_open_creates_a_private_wal_file(tmp_path, monkeypatch):
    old = os.umask(0)  # the 0600 must come from FactLog.open, not from the umask
    try:
        path = tmp_path / "sub" / "memory.db"
        with FactLog.open(path) as log:
            log.profile()
            assert log.db.journal_mode == "wal"
            assert log.db.execute("PRAGMA foreign_keys").fetchone()[0] == 1
            assert log.db.execute("PRAGMA busy_timeout").fetchone()[0] >= 1000
            assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
            assert stat.S_IMODE(os.stat(f"{path}-wal").st_mode) == 0o600
    finally:
        os.umask(old)
    with FactLog.open(path) as log:  # reopening keeps the data
        assert log.profile() == 1


def test_open_tightens_a_looser_existing_file(tmp_path, caplog):
    path = tmp_path / "memory.db"
    FactLog.open(path).close()
    os.chmod(path, 0o644)
    with caplog.at_level(logging.WARNING, logger="inferscale_core.factlog"):
        FactLog.open(path).close()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert "readable by others" in caplog.text


def test_opening_it_again_keeps_the_locks_other_processes_see(tmp_path):
    """Closing any descriptor of a file drops every POSIX lock the process holds on it. If a
    second open here did that to the first connection's locks, another process's connection
    would close as if it were the last one, checkpoint and delete the WAL under the first, and
    the next connection opened here would read a new WAL through the old index ("disk I/O
    error", "file is not a database", rows of other tables: the server's memory workers at
    their first read, after the serve tests read the file)."""
    path = tmp_path / "memory.db"
    first = FactLog.open(path)
    p = first.profile()
    first.add_fact(p, "My friend Ana lives in Lisbon.")
    second = FactLog.open(path)  # as a memory worker opens its own
    reader = "import sqlite3, sys; sqlite3.connect(sys.argv[1]).execute('SELECT 1 FROM facts')"
    subprocess.run([sys.executable, "-c", reader, str(path)], check=True, timeout=60)
    assert Path(f"{path}-wal").exists()
    first.add_fact(p, "My friend Bo lives in Oslo.")
    with FactLog.open(path) as third:
        assert [f.text for f in third.active_facts(p)] == [
            "My friend Ana lives in Lisbon.",
            "My friend Bo lives in Oslo.",
        ]
    second.close()
    first.close()


# -- conversations and turns -----------------------------------------------------------------


def test_add_conversation_is_idempotent_and_imports_only_new_turns(log):
    p = log.profile()
    cid, n = log.add_conversation(p, conv("a", 3))
    assert n == 3
    assert log.add_conversation(p, conv("a", 3)) == (cid, 0)
    assert log.add_conversation(p, conv("a", 5, title="renamed")) == (cid, 2)
    assert log.db.execute("SELECT title FROM conversations").fetchall() == [("renamed",)]
    assert log.add_conversation(p, conv("a", 4)) == (cid, 0)  # a shorter export adds nothing
    rows = log.db.execute(
        "SELECT idx, text FROM turns WHERE conversation_id = ? ORDER BY idx", (cid,)
    ).fetchall()
    assert rows == [(i, f"turn {i}") for i in range(5)]

    # another source with the same source_id is another conversation
    other, n = log.add_conversation(p, conv("a", 2, source="chatgpt"))
    assert other != cid and n == 2
    # without a source_id every add is a new conversation
    ids = {log.add_conversation(p, conv(None, 1))[0] for _ in range(3)}
    assert len(ids) == 3
    assert count(log, "SELECT count(*) FROM turns") == 5 + 2 + 3


@pytest.mark.parametrize("failure", ["not_null", "exception"])
def test_add_conversation_is_all_or_nothing(log, monkeypatch, failure):
    p = log.profile()
    cid, _ = log.add_conversation(p, conv("old", 2))
    new = conv("new", 6)
    grown = conv("old", 6)
    if failure == "not_null":
        new.turns[3].text = None  # type: ignore[assignment]
        grown.turns[4].text = None  # type: ignore[assignment]
        expected = sqlite3.IntegrityError
    else:
        real_execute = log.db.execute
        calls = {"n": 0}

        def flaky_execute(sql, params=None):
            if sql.startswith("INSERT INTO turns"):
                calls["n"] += 1
                if calls["n"] % 3 == 0:
                    raise RuntimeError("disk on fire")
            return real_execute(sql, params)

        monkeypatch.setattr(log.db, "execute", flaky_execute)
        expected = RuntimeError
    with pytest.raises(expected):
        log.add_conversation(p, new)
    with pytest.raises(expected):
        log.add_conversation(p, grown)
    monkeypatch.undo()
    assert log.db.execute("SELECT id, source_id FROM conversations").fetchall() == [(cid, "old")]
    assert count(log, "SELECT count(*) FROM turns") == 2
    assert not log.db.conn.in_transaction
    # and the log is still usable afterwards
    assert log.add_conversation(p, conv("old", 6))[1] == 4


def test_timestamps_round_trip(log):
    p = log.profile()
    aware = datetime(2024, 3, 1, 23, 30, tzinfo=timezone(timedelta(hours=-5)))
    naive = datetime(2024, 3, 2, 8, 0, 0, 123456)
    c = Conversation("t", [Turn("u", "a", aware, "x1"), Turn("u", "b", naive), Turn("u", "c")])
    cid, _ = log.add_conversation(p, c)
    stored = [t for _, t in log.turns(p)]
    assert [t.timestamp for t in stored] == [aware, naive, None]
    assert stored[0].source_id == "x1"
    assert log.db.execute("SELECT timestamp FROM turns WHERE idx = 0").fetchone()[0] == (
        "2024-03-01T23:30:00-05:00"
    )


def test_append_turn_and_turns_before(log):
    p = log.profile()
    cid, _ = log.add_conversation(p, conv("a", 3))
    other, _ = log.add_conversation(p, conv("b", 3))
    tid = log.append_turn(cid, Turn("user", "turn 3"))
    assert count(log, "SELECT idx FROM turns WHERE id = ?", (tid,)) == 3
    assert [t.text for t in log.turns_before(tid, 2)] == ["turn 1", "turn 2"]
    assert [t.text for t in log.turns_before(tid, 10)] == ["turn 0", "turn 1", "turn 2"]
    assert log.turns_before(tid, 0) == []
    first = count(log, "SELECT id FROM turns WHERE conversation_id = ? AND idx = 0", (other,))
    assert log.turns_before(first, 5) == []  # never reaches into another conversation
    with pytest.raises(ValueError):
        log.append_turn(9999, Turn("user", "x"))
    # the extractor's cursor: turns after a given id
    ids = [i for i, _ in log.turns(p)]
    assert ids == sorted(ids) and len(ids) == 7
    assert [i for i, _ in log.turns(p, after_id=ids[4])] == ids[5:]
    assert len(log.turns(p, limit=2)) == 2


def test_context_turns_follow_the_window(log):
    p = log.profile()
    cid, _ = log.add_conversation(p, conv("a", 9))
    ids = [tid for tid, _ in log.conversation_turns(cid)]

    def texts(i, w, window):
        return [t.text for t in log.context_turns(ids[i], w, window)]

    assert texts(7, 3, "sliding") == ["turn 4", "turn 5", "turn 6"]
    assert texts(7, 3, "anchored") == ["turn 3", "turn 4", "turn 5", "turn 6"]  # anchor 3
    assert texts(5, 3, "anchored") == ["turn 0", "turn 1", "turn 2", "turn 3", "turn 4"]
    assert texts(2, 3, "anchored") == texts(2, 3, "sliding") == ["turn 0", "turn 1"]
    assert texts(7, 0, "anchored") == texts(7, 0, "sliding") == []
    assert log.context_turns(987654, 3, "anchored") == []  # no such turn: no context
    with pytest.raises(ValueError, match="window must be one of anchored, sliding"):
        log.context_turns(ids[7], 3, "rolling")


# -- facts -----------------------------------------------------------------------------------


def test_normalization():
    assert normalize_fact_text("  I live in   PARIS.  ") == "i live in paris"
    assert normalize_fact_text("I live in Paris!?…") == "i live in paris"
    assert fact_text_hash("I live in Paris") == fact_text_hash("i live\nin paris.")
    assert fact_text_hash("I live in Paris") != fact_text_hash("I live in Lyon")


def test_add_fact_dedups_within_a_profile(log):
    p = log.profile()
    cid, _ = log.add_conversation(p, conv("a", 3))
    t0, t1 = (r[0] for r in log.db.execute("SELECT id FROM turns ORDER BY id LIMIT 2"))
    fid, created = log.add_fact(p, "I live in Paris.", date(2024, 5, 1), [t0])
    assert created
    assert log.add_fact(p, "i  live in paris", source_turn_ids=[t1]) == (fid, False)
    fact = log.get_fact(fid)
    assert fact.text == "I live in Paris."
    assert fact.refers_to == date(2024, 5, 1)
    assert fact.source_turn_ids == [t0, t1]  # provenance of the duplicate is kept
    assert fact.status == "active" and fact.supersedes is None
    assert isinstance(fact.created_at, datetime)
    (entry,) = log.audit(p)
    assert (entry.fact_id, entry.action, entry.new_text) == (fid, "add", "I live in Paris.")
    assert entry.cause == f"extracted from turn {t0}"
    with pytest.raises(ValueError):
        log.add_fact(p, " ... ")
    with pytest.raises(ValueError):
        log.add_fact(p, "unknown turn", source_turn_ids=[12345])
    assert log.get_fact(9999) is None


def test_update_fact_supersedes(log):
    p = log.profile()
    f1, _ = log.add_fact(p, "I live in Lyon", refers_to="2020-01-01", cause="chat")
    f2 = log.update_fact(f1, "I live in Paris", cause="user moved")
    f3 = log.update_fact(f2, "I live in Paris, 11th arrondissement", cause="more precise")
    assert [f.id for f in log.active_facts(p)] == [f3]
    assert log.get_fact(f1).status == log.get_fact(f2).status == "superseded"
    assert log.get_fact(f3).supersedes == f2 and log.get_fact(f2).supersedes == f1
    assert log.get_fact(f3).refers_to == date(2020, 1, 1)  # kept unless given
    entries = log.audit(p, fact_id=f3)
    assert [(e.action, e.old_text, e.new_text, e.cause) for e in entries] == [
        ("update", "I live in Paris", "I live in Paris, 11th arrondissement", "more precise")
    ]
    assert [e.action for e in log.audit(p)] == ["add", "update", "update"]
    with pytest.raises(InactiveFactError):
        log.update_fact(f1, "I live in Rome", cause="stale")
    with pytest.raises(KeyError):
        log.update_fact(9999, "x", cause="x")

    # a case-only fix supersedes in place of the old one
    f4 = log.update_fact(f3, "i live in paris, 11th arrondissement", cause="case")
    assert f4 != f3 and log.get_fact(f4).supersedes == f3
    # updating into the text of another active fact merges into it
    g, _ = log.add_fact(p, "I have a cat")
    h, _ = log.add_fact(p, "I have a kitten")
    assert log.update_fact(h, "I have a cat.", cause="same thing") == g
    assert {f.id for f in log.active_facts(p)} == {f4, g}


def test_forget_removes_kv_and_keeps_an_audit_row(log):
    p = log.profile()
    fid, _ = log.add_fact(p, "My PIN is 1234")
    keep, _ = log.add_fact(p, "I like tea")
    log.record_kv(fid, "fp", 0, "v1", "/kv/a.safetensors", 7, 700)
    log.record_kv(fid, "fp", 2, "v1", "/kv/b.safetensors", 9, 900)
    log.record_kv(keep, "fp", 0, "v1", "/kv/c.safetensors", 5, 500)

    removed = log.forget_fact(fid, cause="user forgot it in the memory browser")
    assert removed == ["/kv/a.safetensors", "/kv/b.safetensors"]
    assert count(log, "SELECT count(*) FROM kv_entries WHERE fact_id = ?", (fid,)) == 0
    assert count(log, "SELECT count(*) FROM kv_entries") == 1
    fact = log.get_fact(fid)
    assert fact.status == "forgotten" and fact.text == ""
    assert [f.id for f in log.active_facts(p)] == [keep]
    assert log.facts_without_kv(p, "fp", 2, "v1", 10) == [log.get_fact(keep)]
    assert count(log, "SELECT count(*) FROM facts WHERE text LIKE '%1234%'") == 0
    last = log.audit(p, fact_id=fid)[-1]
    assert (last.action, last.old_text, last.new_text) == ("forget", "My PIN is 1234", None)
    assert last.cause == "user forgot it in the memory browser"

    # an encoder that raced with the forget may not bring the KV back
    with pytest.raises(InactiveFactError):
        log.record_kv(fid, "fp", 0, "v1", "/kv/late.safetensors", 7, 700)
    # re-extracting it from the old turns does not resurrect it ...
    assert log.add_fact(p, "my pin is 1234.") == (fid, False)
    assert [f.id for f in log.active_facts(p)] == [keep]
    # ... unless the user deliberately tells it again
    again, created = log.add_fact(p, "My PIN is 1234", allow_forgotten=True)
    assert created and again != fid
    assert log.forget_fact(fid, cause="twice") == []  # forgetting again changes nothing
    with pytest.raises(InactiveFactError):
        log.update_fact(fid, "My PIN is 0000", cause="x")


def test_delete_fact_and_prune_kv(log):
    p = log.profile()
    a, _ = log.add_fact(p, "I am 30")
    log.record_kv(a, "fp", 0, 1, "/kv/a", 3, 30)
    b = log.update_fact(a, "I am 31", cause="birthday")
    assert log.prune_kv(p) == ["/kv/a"]  # the superseded fact's tensors
    log.record_kv(b, "fp", 0, 1, "/kv/b", 3, 30)
    assert log.delete_fact(b, cause="no longer true") == ["/kv/b"]
    assert log.get_fact(b).text == "I am 31" and log.get_fact(b).status == "superseded"
    assert log.active_facts(p) == []
    assert log.audit(p)[-1].action == "delete"


def test_embeddings_live_and_die_with_their_active_fact(log):
    p, other = log.profile(), log.profile("other")
    a, _ = log.add_fact(p, "fact a")
    b, _ = log.add_fact(p, "fact b")
    c, _ = log.add_fact(p, "fact c")
    d, _ = log.add_fact(p, "fact d")
    o, _ = log.add_fact(other, "fact o")
    for fid in (a, b, c, d, o):
        log.store_embedding(fid, "m", f"v{fid}".encode(), 2)
        log.store_embedding(fid, "m2", b"x", 1)
    log.store_embedding(a, "m", b"new", 3)  # replaces
    assert log.embeddings(p, "m") == [(a, b"new")] + [(f, f"v{f}".encode()) for f in (b, c, d)]
    assert log.embeddings(other, "m") == [(o, f"v{o}".encode())]
    assert log.embeddings(p, "unknown") == []

    new_b = log.update_fact(b, "fact b2", cause="x")
    log.delete_fact(c, cause="x")
    log.forget_fact(d, cause="x")
    assert [fid for fid, _ in log.embeddings(p, "m")] == [a]
    for fid in (b, c, d):  # every model's rows went with the fact
        assert count(log, "SELECT count(*) FROM fact_embeddings WHERE fact_id = ?", (fid,)) == 0
    with pytest.raises(InactiveFactError):  # an embedder racing with the forget
        log.store_embedding(d, "m", b"late", 2)
    with pytest.raises(KeyError):
        log.store_embedding(9999, "m", b"x", 1)
    with pytest.raises(ValueError):
        log.store_embedding(a, "m", b"", 1)
    log.store_embedding(new_b, "m", b"b2", 2)
    assert [fid for fid, _ in log.embeddings(p, "m")] == [a, new_b]


def test_facts_without_kv_and_record_kv(log):
    p = log.profile()
    a, _ = log.add_fact(p, "fact a")
    b, _ = log.add_fact(p, "fact b")
    c, _ = log.add_fact(p, "fact c")
    assert [f.id for f in log.facts_without_kv(p, "fp", 2, "v1", 10)] == [a, b, c]
    assert [f.id for f in log.facts_without_kv(p, "fp", 2, "v1", 2)] == [a, b]
    assert log.record_kv(b, "fp", 2, "v1", "/kv/b1", 4, 400) is None
    assert [f.id for f in log.facts_without_kv(p, "fp", 2, "v1", 10)] == [a, c]
    assert [f.id for f in log.facts_without_kv(p, "fp", 0, "v1", 10)] == [a, b, c]
    assert [f.id for f in log.facts_without_kv(p, "other", 2, "v1", 10)] == [a, b, c]
    assert [f.id for f in log.facts_without_kv(p, "fp", 2, "v2", 10)] == [a, b, c]
    # re-encoding replaces the entry and hands back the old location
    assert log.record_kv(b, "fp", 2, "v1", "/kv/b2", 4, 400) == "/kv/b1"
    assert log.record_kv(b, "fp", 2, "v1", "/kv/b2", 4, 400) is None
    assert count(log, "SELECT count(*) FROM kv_entries") == 1
    # many facts' keys in one query: only this encoding's, only encoded facts
    log.record_kv(c, "fp", 2, "v2", "/kv/c-v2", 4, 400)
    assert log.kv_keys_for([a, b, c, b], "fp", 2, "v1") == {b: "/kv/b2"}
    assert log.kv_keys_for([a, b, c], "fp", 2, "v2") == {c: "/kv/c-v2"}
    assert log.kv_keys_for([], "fp", 2, "v1") == {}
    assert all(
        log.kv_key(f, "fp", 2, "v1") == log.kv_keys_for([f], "fp", 2, "v1").get(f)
        for f in (a, b, c)
    )


def test_profiles_are_isolated(log):
    alice, bob = log.profile("alice"), log.profile("bob")
    assert alice != bob and log.profile("alice") == alice
    a, created_a = log.add_fact(alice, "My sister is called Ann")
    b, created_b = log.add_fact(bob, "my sister is called ann.")
    assert created_a and created_b and a != b
    assert [f.id for f in log.active_facts(alice)] == [a]
    assert [f.id for f in log.active_facts(bob)] == [b]
    assert [e.fact_id for e in log.audit(alice)] == [a]
    assert log.audit(alice, fact_id=b) == []
    assert [f.id for f in log.facts_without_kv(bob, "fp", 0, "v", 10)] == [b]
    log.forget_fact(a, cause="alice forgot it")
    assert [f.id for f in log.active_facts(bob)] == [b]
    assert log.add_fact(bob, "My sister is called Ann") == (b, False)

    # same conversation source ids in two profiles are two conversations
    ca, _ = log.add_conversation(alice, conv("shared-id", 2))
    cb, n = log.add_conversation(bob, conv("shared-id", 2))
    assert ca != cb and n == 2
    assert {t.text for _, t in log.turns(alice)} == {"turn 0", "turn 1"}
    assert len(log.turns(bob)) == 2
    # a fact can't cite another profile's turns
    bob_turn = log.turns(bob)[0][0]
    with pytest.raises(ValueError):
        log.add_fact(alice, "stolen", source_turn_ids=[bob_turn])
    # and the schema itself refuses rows that point across profiles
    with pytest.raises(sqlite3.IntegrityError):
        log.db.execute(
            "INSERT INTO turns (conversation_id, profile_id, idx, speaker, text, source)"
            " VALUES (?, ?, 9, 'u', 'x', 'jsonl')",
            (ca, bob),
        )
    with pytest.raises(sqlite3.IntegrityError):
        log.db.execute(
            "INSERT INTO audit (profile_id, fact_id, action, cause, at)"
            " VALUES (?, ?, 'add', 'x', 'now')",
            (bob, a),
        )


def test_concurrent_writers_wait_instead_of_failing(tmp_path):
    path = tmp_path / "memory.db"
    FactLog.open(path).close()
    errors: list[BaseException] = []

    def writer(i: int) -> None:
        try:
            with FactLog.open(path) as log:
                p = log.profile("shared")
                for c in range(100):
                    log.add_fact(p, f"fact {i} {c}")
                    log.add_fact(p, f"common fact {c}")
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    with FactLog.open(path) as log:
        assert len(log.active_facts(log.profile("shared"))) == 4 * 100 + 100


# -- crash -----------------------------------------------------------------------------------

N_CONVERSATIONS = 1000


def crash_conversation(c: int) -> Conversation:
    return Conversation(
        title=f"conversation {c}",
        turns=[Turn("user", f"c{c} t{i} " + "x" * (c % 50)) for i in range(5 + c % 11)],
        source="crashtest",
        source_id=f"conv-{c}",
    )


def import_all(log: FactLog) -> int:
    p = log.profile()
    return sum(log.add_conversation(p, crash_conversation(c))[1] for c in range(N_CONVERSATIONS))


def crash_child(db_path: str) -> None:
    log = FactLog.open(Path(db_path))
    p = log.profile()
    # Slow every turn insert a little (inside the transaction) so the parent's SIGKILL lands
    # partway through the import, and most likely in the middle of a conversation.
    log.db.conn.set_trace_callback(
        lambda sql: time.sleep(0.0003) if sql.startswith("INSERT INTO turns") else None
    )
    for c in range(N_CONVERSATIONS):
        log.add_conversation(p, crash_conversation(c))
        if c == 0:
            print("started", flush=True)
    print("finished", flush=True)


def test_import_survives_sigkill(tmp_path):
    db_path = tmp_path / "crash.db"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    child = subprocess.Popen(
        [sys.executable, __file__, "child", str(db_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        line = child.stdout.readline()
        assert line.strip() == "started", child.stderr.read()
        reader = sqlite3.connect(db_path, timeout=10)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            stored = reader.execute("SELECT count(*) FROM conversations").fetchone()[0]
            if stored >= 50 or child.poll() is not None:
                break
            time.sleep(0.005)
        reader.close()
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == -signal.SIGKILL, "the child finished before it was killed"

    expected = {c: len(crash_conversation(c).turns) for c in range(N_CONVERSATIONS)}
    with FactLog.open(db_path) as log:
        assert log.db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        partial = log.db.execute(
            "SELECT c.source_id, count(t.id) FROM conversations c"
            " LEFT JOIN turns t ON t.conversation_id = c.id GROUP BY c.id"
        ).fetchall()
        assert 0 < len(partial) < N_CONVERSATIONS
        # every conversation the child committed is complete: none half-imported
        for source_id, n in partial:
            assert n == expected[int(source_id.removeprefix("conv-"))], source_id
        stored_turns = sum(n for _, n in partial)

        added = import_all(log)  # re-run the same import to completion

        total = sum(expected.values())
        assert added == total - stored_turns
        assert count(log, "SELECT count(*) FROM conversations") == N_CONVERSATIONS
        assert count(log, "SELECT count(*) FROM turns") == total
        dupes = log.db.execute(
            "SELECT conversation_id, idx FROM turns GROUP BY conversation_id, idx"
            " HAVING count(*) > 1"
        ).fetchall()
        assert dupes == []
        rows = log.db.execute(
            "SELECT c.source_id, t.idx, t.text FROM turns t"
            " JOIN conversations c ON c.id = t.conversation_id"
        ).fetchall()
        got = {(s, i, t) for s, i, t in rows}
        want = {
            (f"conv-{c}", i, t.text)
            for c in range(N_CONVERSATIONS)
            for i, t in enumerate(crash_conversation(c).turns)
        }
        assert got == want  # nothing lost, nothing extra
        assert import_all(log) == 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "child":
        crash_child(sys.argv[2])
    else:
        sys.exit(f"usage: {sys.argv[0]} child DB")


def test_extraction_cursor_moves_forward_per_profile():
    log = FactLog(Database(memory=True))
    a, b = log.profile("a"), log.profile("b")
    assert log.extraction_cursor(a) == 0
    log.set_extraction_cursor(a, 12)
    log.set_extraction_cursor(a, 15)
    assert log.extraction_cursor(a) == 15
    assert log.extraction_cursor(b) == 0


# -- queries for the UI and the memory command ------------------------------------------------


def test_conversations_are_listed_newest_first_and_searched(log):
    pid = log.profile("p")
    other = log.profile("other")
    a, _ = log.add_conversation(pid, conv("a", 2, title="Trip to Norway"))
    b, _ = log.add_conversation(pid, conv("b", 3, title="Cello lessons"))
    log.add_conversation(other, conv("c", 1, title="Trip to Norway"))
    log.append_turn(a, Turn("user", "we saw the fjords, 100% worth it"))
    empty, _ = log.add_conversation(pid, Conversation("New chat"))
    infos = log.conversations(pid)
    assert [i.id for i in infos] == [empty, a, b]  # empty (just started) first, then by activity
    assert [(i.title, i.turns) for i in infos] == [
        ("New chat", 0),
        ("Trip to Norway", 3),
        ("Cello lessons", 3),
    ]
    assert [i.id for i in log.conversations(pid, "norway")] == [a]  # title, any case
    assert [i.id for i in log.conversations(pid, "fjords")] == [a]  # turn text
    assert [i.id for i in log.conversations(pid, "100%")] == [a]  # % is literal
    assert log.conversations(pid, "1_0") == []  # _ is literal
    assert len(log.conversations(pid, limit=1)) == 1


def test_conversation_turns_rename_and_delete(log):
    pid = log.profile("p")
    cid, _ = log.add_conversation(pid, conv("a", 3))
    turns = log.conversation_turns(cid)
    assert [t.text for _, t in turns] == ["turn 0", "turn 1", "turn 2"]
    assert log.get_turns([turns[2][0], turns[0][0], 999]) == [turns[0], turns[2]]
    fid, _ = log.add_fact(pid, "I like tea", source_turn_ids=[turns[0][0]])
    log.rename_conversation(cid, "  Tea   talk ")
    assert log.conversations(pid)[0].title == "Tea talk"
    with pytest.raises(ValueError):
        log.rename_conversation(cid, "   ")
    assert log.delete_conversation(cid) == 3
    assert log.conversations(pid) == [] and log.conversation_turns(cid) == []
    assert log.get_fact(fid).status == "active"  # memories outlive their conversation
    with pytest.raises(KeyError):
        log.delete_conversation(cid)
    with pytest.raises(KeyError):
        log.rename_conversation(cid, "x")


def test_search_facts_counts_and_kv_keys(log):
    pid = log.profile("p")
    cat, _ = log.add_fact(pid, "My cat is called Miso")
    tea, _ = log.add_fact(pid, "I drink green tea")
    old, _ = log.add_fact(pid, "I live in Porto")
    new = log.update_fact(old, "I live in Lisbon", "moved")
    log.record_kv(cat, "fp1", 2, "v1", "key-a", 10, 100)
    log.record_kv(cat, "fp2", 2, "v1", "key-b", 10, 100)
    assert log.kv_keys_by_model(cat) == [("fp1", "key-a"), ("fp2", "key-b")]
    log.forget_fact(tea, "test")
    assert [f.id for f in log.search_facts(pid)] == [new, cat]  # newest first, active only
    assert [f.id for f in log.search_facts(pid, "LISBON")] == [new]
    assert [f.id for f in log.search_facts(pid, "", ("active", "superseded", "forgotten"))] == [
        new,
        old,
        tea,
        cat,
    ]
    assert log.search_facts(pid, "tea", ("forgotten",)) == []  # its text is gone
    assert log.search_facts(pid, statuses=()) == []
    assert log.count_facts(pid) == {"active": 2, "superseded": 1, "forgotten": 1}
    log.store_embedding(cat, "mini", b"\0" * 8, 2)
    log.store_embedding(new, "mini", b"\0" * 8, 2)
    assert log.count_embeddings(pid) == {"mini": 2}


def test_kv_key_kv_keys_and_kv_keys_by_model(log):
    pid = log.profile()
    cat, _ = log.add_fact(pid, "My cat is called Miso")
    tea, _ = log.add_fact(pid, "I drink green tea")
    log.record_kv(cat, "fp2", 2, "v1", "key-b", 10, 100)
    log.record_kv(cat, "fp1", 2, "v1", "key-a", 10, 100)
    log.record_kv(cat, "fp1", 0, 1, "key-0", 10, 100)  # encoder_version is stored as text
    log.record_kv(tea, "fp1", 2, "v1", "key-t", 10, 100)
    assert log.kv_key(cat, "fp1", 2, "v1") == "key-a"
    assert log.kv_key(cat, "fp2", 2, "v1") == "key-b"
    assert log.kv_key(cat, "fp1", 0, "1") == log.kv_key(cat, "fp1", 0, 1) == "key-0"
    assert log.kv_key(cat, "fp1", 2, "v2") is None  # not encoded for that encoder version
    assert log.kv_key(cat, "fp3", 2, "v1") is None
    assert log.kv_keys(cat) == ["key-0", "key-a", "key-b"]
    assert log.kv_keys_by_model(cat) == [("fp1", "key-0"), ("fp1", "key-a"), ("fp2", "key-b")]
    assert log.kv_keys(9999) == [] and log.kv_keys_by_model(9999) == []
    # forgetting returns the same keys kv_keys named, and leaves none behind
    assert log.forget_fact(cat, "test") == ["key-0", "key-a", "key-b"]
    assert log.kv_keys(cat) == [] and log.kv_key(cat, "fp1", 2, "v1") is None
    assert log.kv_keys(tea) == ["key-t"]


def test_path_of_the_log(tmp_path, log):
    assert log.path == tmp_path / "memory.db"
    assert FactLog(Database(memory=True)).path is None


# -- imports, conversation lookup and the public transaction ---------------------------------


def imports_rows(log: FactLog) -> list[tuple]:
    return log.db.execute(
        "SELECT profile_id, path, sha256, format, status, reason, conversations, turns_added"
        " FROM imports ORDER BY id"
    ).fetchall()


def test_record_import_and_is_imported(tmp_path):
    with FactLog.open(tmp_path / "memory.db") as log:
        alice, bob = log.profile("alice"), log.profile("bob")
        assert not log.is_imported(alice, "h1")
        log.record_import(
            alice,
            tmp_path / "a.json",
            "h1",
            fmt="chatgpt",
            status="imported",
            conversations=3,
            turns_added=40,
        )
        assert log.is_imported(alice, "h1")
        assert not log.is_imported(bob, "h1")  # per profile
        assert not log.is_imported(alice, "h2")

        # a quarantined file is not imported: it is tried again next time
        log.record_import(
            alice, "/in/bad.txt", "h2", fmt=None, status="quarantined", reason="not a chat"
        )
        assert not log.is_imported(alice, "h2")
        # importing it again replaces its row (one row per content and profile)
        log.record_import(
            alice,
            "/in/fixed.txt",
            "h2",
            fmt="whatsapp",
            status="imported",
            conversations=1,
            turns_added=2,
        )
        assert log.is_imported(alice, "h2")
        at = log.db.execute("SELECT at FROM imports WHERE sha256 = 'h2'").fetchone()[0]
        assert datetime.fromisoformat(at).tzinfo is not None

        with pytest.raises(ValueError):
            log.record_import(alice, "/x", "h3", fmt=None, status="skipped")
        with pytest.raises(sqlite3.IntegrityError):
            log.record_import(alice, "/x", "h3", fmt=None, status="imported", turns_added=-1)

    with FactLog.open(tmp_path / "memory.db") as log:  # it is on disk
        assert log.is_imported(alice, "h1") and log.is_imported(alice, "h2")
        assert imports_rows(log) == [
            (alice, str(tmp_path / "a.json"), "h1", "chatgpt", "imported", None, 3, 40),
            (alice, "/in/fixed.txt", "h2", "whatsapp", "imported", None, 1, 2),
        ]


def test_conversation_by_source(tmp_path):
    with FactLog.open(tmp_path / "memory.db") as log:
        alice, bob = log.profile("alice"), log.profile("bob")
        cid, _ = log.add_conversation(alice, conv("k", 2))
        assert log.conversation_by_source(alice, "jsonl", "k") == cid
        assert log.conversation_by_source(alice, "whatsapp", "k") is None
        assert log.conversation_by_source(alice, "jsonl", "k~2") is None
        assert log.conversation_by_source(bob, "jsonl", "k") is None
        log.add_conversation(alice, conv(None, 2))  # no source_id: never found by one
        assert log.db.execute("SELECT count(*) FROM conversations").fetchone()[0] == 2


def test_conversation_agrees_compares_the_turns_both_have(tmp_path):
    t = datetime(2024, 3, 1, 10, 0, tzinfo=timezone(timedelta(hours=1)))
    stored = [Turn("user", "hi", t, "m1"), Turn("assistant", "hello"), Turn("user", "bye")]
    with FactLog.open(tmp_path / "memory.db") as log:
        p = log.profile()
        cid, _ = log.add_conversation(p, Conversation("t", stored, source="whatsapp"))
        empty, _ = log.add_conversation(p, Conversation("e", [], source="whatsapp"))
        assert log.conversation_agrees(cid, stored)
        assert log.conversation_agrees(cid, stored[:2])  # a shorter export
        assert log.conversation_agrees(cid, [*stored, Turn("user", "more")])  # a grown one
        assert log.conversation_agrees(cid, [])
        assert log.conversation_agrees(empty, stored)
        assert log.conversation_agrees(9999, stored)  # nothing stored: nothing disagrees
        # source_id is not compared; speaker, text and timestamp are
        assert log.conversation_agrees(cid, [Turn("user", "hi", t, "other"), *stored[1:]])
        assert not log.conversation_agrees(cid, [stored[0], Turn("assistant", "hello!")])
        assert not log.conversation_agrees(cid, [stored[0], Turn("user", "hello")])
        assert not log.conversation_agrees(cid, [Turn("user", "hi"), *stored[1:]])
        same_instant = t.astimezone(UTC)  # the same moment, another offset: not the same turn
        assert not log.conversation_agrees(cid, [Turn("user", "hi", same_instant), *stored[1:]])


def test_transaction_is_atomic_and_nests(tmp_path):
    path = tmp_path / "memory.db"
    with FactLog.open(path) as log, FactLog.open(path) as other:
        p = log.profile()
        with log.transaction():
            log.add_fact(p, "one")
            log.add_conversation(p, conv("a", 2))
            assert log.db.conn.in_transaction
        assert not log.db.conn.in_transaction
        assert len(other.active_facts(p)) == 1  # committed

        with pytest.raises(RuntimeError), log.transaction():
            log.add_fact(p, "two")
            log.record_import(p, "/f", "h", fmt="jsonl", status="imported")
            raise RuntimeError("stop")
        assert [f.text for f in log.active_facts(p)] == ["one"]
        assert not log.is_imported(p, "h")

        # a failing call inside rolls back only its own savepoint when caught
        with log.transaction():
            log.add_fact(p, "three")
            with pytest.raises(ValueError):
                log.add_fact(p, "four", source_turn_ids=[12345])
        assert [f.text for f in other.active_facts(p)] == ["one", "three"]

        # the transaction holds the write lock from its start: no other writer gets in between
        other.db.execute("PRAGMA busy_timeout = 0")
        with log.transaction():
            assert log.conversation_by_source(p, "jsonl", "b") is None
            with pytest.raises(sqlite3.OperationalError, match="locked"):
                other.add_conversation(p, conv("b", 1))
            log.add_conversation(p, conv("b", 1))
        assert other.conversation_by_source(p, "jsonl", "b") is not None


def test_opening_a_new_log_waits_for_another_connections_write_to_switch_to_wal(tmp_path):
    """The chat opens its session and its reader on two threads at once: while one migrates the
    new file (a write transaction), the other's switch to WAL must wait, not fail."""
    import sqlite3
    import threading

    path = tmp_path / "memory.db"
    holder = sqlite3.connect(path, check_same_thread=False)  # a new file, not yet WAL
    holder.execute("BEGIN IMMEDIATE")
    holder.execute("CREATE TABLE busy (x)")
    threading.Timer(0.3, holder.commit).start()
    with FactLog.open(path) as log:  # waits for the holder's commit instead of failing
        assert log.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert log.profile("default") > 0
    holder.close()


def test_after_a_model_switch_the_most_recently_used_facts_are_encoded_first(log):
    """facts_without_kv for the new model: by the last injection of any model's entry, newest
    first; facts never injected after them, by id."""
    p = log.profile()
    ids = [log.add_fact(p, f"fact {n}")[0] for n in range(5)]
    for fid in ids:
        log.record_kv(fid, "old", 2, "v1", f"old-{fid}", 4, 400)
    day = datetime(2026, 12, 1, tzinfo=UTC)
    log.note_kv_used([f"old-{ids[1]}"], day)
    log.note_kv_used([f"old-{ids[3]}"], day + timedelta(days=2))
    log.note_kv_used([f"old-{ids[4]}"], day + timedelta(days=1))
    order = [f.id for f in log.facts_without_kv(p, "new", 2, "v1")]
    assert order == [ids[3], ids[4], ids[1], ids[0], ids[2]]
    assert [f.id for f in log.facts_without_kv(p, "new", 2, "v1", 2)] == [ids[3], ids[4]]
    log.record_kv(ids[3], "new", 2, "v1", f"new-{ids[3]}", 4, 400)
    assert [f.id for f in log.facts_without_kv(p, "new", 2, "v1", 1)] == [ids[4]]
