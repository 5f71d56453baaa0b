"""KV as a cache the fact log can rebuild: deferred encoding, LRU eviction, the disk budget.

Real SQLite files (the ``log`` fixture); the store tests write real entry files."""

from __future__ import annotations

import zlib
from datetime import UTC, datetime, timedelta

import pytest
import torch
from sqlite_utils import Database

from inferscale_core.config import AppConfig, ConfigError, parse_size
from inferscale_core.factlog import FactLog
from inferscale_core.factlog.migrations import migrations
from inferscale_core.kvstore import EntryMissingError, KVStore
from inferscale_core.memory_worker import evict_over_budget
from inferscale_core.types import Conversation, FactKV, Turn

NOW = datetime.now(UTC)


def _facts(log: FactLog, n: int, profile: str = "default") -> tuple[int, list[int]]:
    pid = log.profile(profile)
    return pid, [log.add_fact(pid, f"{profile} fact number {i}")[0] for i in range(n)]


def _record(log: FactLog, ids: list[int], nbytes: int = 100, fp: str = "fp") -> None:
    """An entry of ``nbytes`` for each fact, created a day ago, a minute apart in id order."""
    for n, i in enumerate(ids):
        log.record_kv(i, fp, 0, "v", f"key-{i}", 3, nbytes)
        created = (NOW - timedelta(days=1, minutes=-n)).isoformat(timespec="microseconds")
        log.db.execute(
            "UPDATE kv_entries SET created_at = ? WHERE fact_id = ? AND model_fingerprint = ?",
            (created, i, fp),
        )


def _pending(log: FactLog, pid: int, fp: str = "fp") -> list[int]:
    return [f.id for f in log.facts_without_kv(pid, fp, 0, "v")]


# ---- the migration ----


def test_the_migration_keeps_an_existing_log_and_adds_use_and_deferral(tmp_path):
    path = tmp_path / "memory.db"
    db = Database(path)
    migrations.apply(db, stop_before="m014_kv_deferred")
    db.execute("INSERT INTO profiles (name, created_at) VALUES ('default', '2026-01-01')")
    db.execute(
        "INSERT INTO facts (profile_id, text, text_hash, created_at, updated_at)"
        " VALUES (1, 'I live in Porto', 'h', '2026-01-01', '2026-01-01')"
    )
    db.execute("INSERT INTO kv_entries VALUES (1, 'fp', 0, 'v', 'key-1', 3, 300, '2026-01-01')")
    db.conn.commit()
    db.close()
    with FactLog.open(path) as log:
        assert "m014_kv_deferred" in [m.name for m in migrations.applied(log.db)]
        assert log.db.execute("SELECT location, used_at FROM kv_entries").fetchall() == [
            ("key-1", None)
        ]
        assert log.kv_bytes("fp") == 300 and log.kv_bytes("other") == 0
        assert log.deferred_kv(1) == {}
        assert log.evict_kv("fp", 0, NOW) == ["key-1"]  # never used: it can go
        assert log.deferred_kv(1) == {"evicted": 1}
        assert log.get_fact(1).text == "I live in Porto"


# ---- deferral ----


def test_deferred_facts_are_not_encoded_until_wanted(log):
    pid, ids = _facts(log, 4)
    assert log.defer_kv(ids[:2], "import") == 2
    assert log.defer_kv(ids[:1], "evicted") == 0  # deferred already: keeps its first reason
    assert _pending(log, pid) == ids[2:]
    assert log.deferred_kv(pid) == {"import": 2}
    assert log.deferred_facts(pid, "import") == ids[:2] and log.deferred_facts(pid, "x") == []
    assert log.want_kv([ids[0], ids[3]]) == {ids[0]: "import"}
    assert log.want_kv([ids[0]]) == {}  # nothing deferred: nothing written
    assert _pending(log, pid) == [ids[0], *ids[2:]]
    with pytest.raises(ValueError, match="'evicted' or 'import'"):
        log.defer_kv(ids, "later")


def test_forgetting_or_retiring_a_deferred_fact_drops_its_deferral(log):
    pid, ids = _facts(log, 3)
    log.defer_kv(ids, "evicted")
    assert log.forget_fact(ids[0], "by the user") == []
    assert log.delete_fact(ids[1], "no longer true") == []
    assert log.deferred_kv(pid) == {"evicted": 1}
    assert log.db.execute("SELECT fact_id FROM kv_deferred").fetchall() == [(ids[2],)]
    assert log.defer_kv([ids[0]], "evicted") == 0  # a forgotten fact is never deferred
    # told again after being forgotten: a new fact, encoded as usual
    again, created = log.add_fact(pid, "default fact number 0", allow_forgotten=True)
    assert created and _pending(log, pid) == [again]


def test_an_edited_fact_leaves_no_deferral_behind(log):
    pid, ids = _facts(log, 1)
    log.defer_kv(ids, "evicted")
    new = log.update_fact(ids[0], "default fact number 0, edited", "edited")
    log.prune_kv(pid)
    assert log.db.execute("SELECT count(*) FROM kv_deferred").fetchone()[0] == 0
    assert _pending(log, pid) == [new]


# ---- eviction ----


def test_eviction_drops_the_least_recently_used_and_spares_the_recent(log):
    pid, ids = _facts(log, 6)
    _record(log, ids)  # created in id order: ids[0] is the oldest
    log.note_kv_used([f"key-{ids[0]}"], NOW - timedelta(minutes=5))  # the oldest, used since
    log.note_kv_used([f"key-{ids[1]}"], NOW - timedelta(seconds=10))  # used just now
    assert log.note_kv_used([f"key-{ids[0]}"], NOW - timedelta(hours=2)) == 0  # never back
    assert log.kv_bytes("fp") == 600
    # the never-used go by age; ids[0] was used after they were made; ids[1] is spared
    gone = log.evict_kv("fp", 200, spare_since=NOW - timedelta(seconds=60))
    assert gone == sorted(f"key-{i}" for i in ids[2:])
    assert log.kv_bytes("fp") == 200
    assert log.kv_keys_for(ids, "fp", 0, "v") == {i: f"key-{i}" for i in ids[:2]}
    assert log.deferred_kv(pid) == {"evicted": 4}
    assert _pending(log, pid) == []  # the evicted wait for a retrieval
    assert log.evict_kv("fp", 200, NOW) == []  # at the target: nothing to do
    # one more over: the least recent of the two left goes, whatever the target
    assert log.evict_kv("fp", 150, NOW) == [f"key-{ids[0]}"]
    # everything recent: nothing can go, however far over
    assert log.evict_kv("fp", 0, NOW - timedelta(seconds=60)) == []
    assert log.want_kv(ids) == dict.fromkeys([ids[0], *ids[2:]], "evicted")
    assert _pending(log, pid) == [ids[0], *ids[2:]]


def test_eviction_is_per_model_and_defers_only_facts_left_without_kv(log):
    pid, ids = _facts(log, 2)
    _record(log, ids, fp="fp")
    _record(log, ids, fp="other")
    log.record_kv(ids[0], "fp", 2, "v", f"key-{ids[0]}-w2", 3, 100)  # a second encoding
    assert log.kv_bytes("fp") == 300 and log.kv_bytes("other") == 200
    gone = log.evict_kv("fp", 100, NOW)
    assert len(gone) == 2 and log.kv_bytes("fp") == 100 and log.kv_bytes("other") == 200
    # the fact that still has an entry of this model is not deferred
    left = log.db.execute("SELECT fact_id FROM kv_entries WHERE model_fingerprint = 'fp'")
    (kept,) = left.fetchone()
    assert log.deferred_facts(pid) == [i for i in ids if i != kept]


def test_a_key_two_rows_share_is_deleted_only_with_the_last(log):
    pid, ids = _facts(log, 1)
    log.record_kv(ids[0], "fp", 0, "v", "shared", 3, 100)
    log.record_kv(ids[0], "fp", 2, "v", "shared", 3, 100)  # no context turns: same key
    assert log.evict_kv("fp", 100, NOW) == []  # one row went; the other still names the file
    assert log.evict_kv("fp", 0, NOW) == ["shared"]
    assert log.deferred_facts(pid) == ids


def _entry(key: str, n: int = 4) -> FactKV:
    g = torch.Generator().manual_seed(zlib.crc32(key.encode()))
    k = torch.randn(2, n, 2, 8, generator=g)  # [layers, tokens, kv_heads, head_dim]
    return FactKV(key, list(range(100, 100 + n)), k, -k, "fp")


def test_evict_over_budget_deletes_the_files_after_the_rows(log, tmp_path):
    store = KVStore(tmp_path / "kv", fingerprint="fp")
    pid, ids = _facts(log, 10)
    for i in ids:
        key = f"key-{i}"
        store.put(_entry(key))
        log.record_kv(i, "fp", 0, "v", key, 4, store.header(key).nbytes)
    one = store.header(f"key-{ids[0]}").nbytes
    log.note_kv_used([f"key-{ids[0]}"], datetime.now(UTC))  # a reply is loading it
    assert evict_over_budget(log, store, 10 * one) == []  # at the budget, not over
    gone = evict_over_budget(log, store, 5 * one)  # over: down to 90% of it, 4 entries
    assert len(gone) == 6 and f"key-{ids[0]}" not in gone
    assert log.kv_bytes("fp") == 4 * one <= 0.9 * 5 * one
    assert sorted(store.keys()) == sorted(log.kv_keys_for(ids, "fp", 0, "v").values())
    for key in gone:
        with pytest.raises(EntryMissingError):
            store.get(key)
    assert len(log.active_facts(pid)) == 10 and log.deferred_kv(pid) == {"evicted": 6}


# ---- which imported facts wait ----


def test_turn_recency_says_how_old_a_turn_was_when_its_conversation_ended(log):
    pid = log.profile()
    days = [datetime(2024, 1, 1) + timedelta(days=d) for d in (0, 50, 60)]
    turns = [Turn("user", f"turn {i}", when) for i, when in enumerate(days)]
    turns.append(Turn("assistant", "undated", None))
    conv_id, _ = log.add_conversation(pid, Conversation("old", turns, "whatsapp"))
    ids = [t for t, _ in log.turns(pid)]
    found = log.turn_recency(ids)
    assert found[ids[0]] == ("whatsapp", days[0], days[2])  # the last *dated* turn
    assert found[ids[3]] == ("whatsapp", None, days[2])


# ---- the setting ----


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("20 GB", 20 * 10**9),
        ("500MB", 500 * 10**6),
        ("1.5GiB", 3 << 29),
        ("2 kib", 2048),
        ("12345", 12345),
        (12345, 12345),
        (" 7 b ", 7),
    ],
)
def test_sizes_parse(text, size):
    assert parse_size(text) == size
    assert AppConfig(kv_disk_budget=text).disk_budget(free_bytes=0, held_bytes=0) == size


@pytest.mark.parametrize("bad", ["20 GX", "-1", "0", "0 GB", "abc", "", "1e9", True, 2.5, None])
def test_a_bad_budget_is_refused_with_what_to_write(bad):
    with pytest.raises(ConfigError, match="kv_disk_budget must be auto, off or a size"):
        AppConfig(kv_disk_budget=bad)


def test_auto_and_off():
    assert AppConfig().disk_budget(free_bytes=300, held_bytes=100) == 100  # 25% of 400
    assert AppConfig(kv_disk_budget="off").disk_budget(free_bytes=300, held_bytes=100) is None
    assert AppConfig().encode_recent_days == 30
    assert AppConfig(kv_encode_recent_days="all").encode_recent_days is None
    for bad in (-1, "some", 1.5, True):
        with pytest.raises(ConfigError, match="kv_encode_recent_days must be"):
            AppConfig(kv_encode_recent_days=bad)
