"""Backup then restore on an empty home, through the CLI: everything comes back.

The live test writes to the fact log from a thread for the whole time the backup runs (each
write one transaction of a conversation, two turns and a fact): the restored log must hold
every row there was before the backup, only rows that existed after it, and whole
transactions only.
"""

from __future__ import annotations

import stat
import threading
import time
from pathlib import Path

from tests.backup.helpers import (
    FINGERPRINT,
    PASSPHRASE,
    add_kv_entries,
    build_home,
    cli,
    tables,
    tree,
)


class _Writer(threading.Thread):
    """Adds "live" conversations (two turns and a fact each, one transaction) until stopped."""

    def __init__(self, db: Path) -> None:
        super().__init__(daemon=True)
        self.db = db
        self.done = 0
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        from inferscale_core.factlog import FactLog
        from inferscale_core.types import Conversation, Turn

        try:
            with FactLog.open(self.db) as log:
                pid = log.profile("work")
                while not self.stop.is_set():
                    n = self.done
                    with log.transaction():
                        turns = [Turn("user", f"live {n} question"), Turn("assistant", "ok")]
                        conv, _ = log.add_conversation(pid, Conversation(f"live {n}", turns))
                        first = log.conversation_turns(conv)[0][0]
                        log.add_fact(pid, f"Live fact number {n}", None, [first])
                    self.done += 1
                    time.sleep(0.002)
        except BaseException as exc:  # reported by the test
            self.error = exc


def test_live_backup_restores_every_row_on_an_empty_home(tmp_path: Path):
    from inferscale_core.factlog import FactLog

    src, dst = tmp_path / "src", tmp_path / "dst"
    made = build_home(src)
    add_kv_entries(src)  # without --with-kv: left out, and their rows dropped from the copy
    db = src / "data" / "memory.db"
    before = tables(db)
    assert len(before["facts"]) >= 1000 and len(before["conversations"]) == 50
    assert len(before["kv_entries"]) == 3

    writer = _Writer(db)
    writer.start()
    while writer.done < 5:
        time.sleep(0.01)
    started = writer.done
    t0 = time.perf_counter()
    done = cli(src, "backup", str(tmp_path / "memory.isbak"))
    seconds = time.perf_counter() - t0
    ended = writer.done
    writer.stop.set()
    writer.join()
    assert writer.error is None, writer.error
    assert done.returncode == 0, done.stderr
    assert ended - started > 10, "the writer must keep writing while the backup runs"
    assert "1 server users" in done.stderr and "none (rebuilt" in done.stderr
    after = tables(db)
    backup = tmp_path / "memory.isbak"
    assert stat.S_IMODE(backup.stat().st_mode) == 0o600
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "work files left"

    restored = cli(dst, "restore", str(backup))
    assert restored.returncode == 0, restored.stderr
    assert "KV entries: none in the backup" in restored.stderr
    rows = tables(dst / "data" / "memory.db")

    # Row by row: everything from before, nothing that never existed.
    assert rows["kv_entries"] == set()
    for name, old in before.items():
        if name == "kv_entries":
            continue
        assert old <= rows[name], f"{name}: rows from before the backup are missing"
        assert rows[name] <= after[name], f"{name}: rows that never existed"
    # Whole transactions only: each live conversation with both turns and its fact.
    live = {c[0] for c in rows["conversations"] if str(c[2]).startswith("live ")}
    live_facts = [f for f in rows["facts"] if str(f[2]).startswith("Live fact")]
    assert started < len(live) <= ended, (started, len(live), ended)  # taken while writing
    assert len(live_facts) == len(live)
    turns_per_conv = {c: 0 for c in live}
    for turn in rows["turns"]:
        if turn[1] in live:
            turns_per_conv[turn[1]] += 1
    assert set(turns_per_conv.values()) == {2}
    # The users and the settings, byte for byte.
    assert tables(dst / "data" / "serve" / "users.db") == tables(
        src / "data" / "serve" / "users.db"
    )
    assert tree(dst / "config") == tree(src / "config")
    assert not list((dst / "data").glob("kv/*/*.safetensors"))

    # Private: folders 0700, files 0600.
    for path in [
        dst / "data",
        dst / "config",
        *(dst / "data").rglob("*"),
        *(dst / "config").rglob("*"),
    ]:
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode == (0o700 if path.is_dir() else 0o600), (path, oct(mode))

    # What the memory worker queues after the restore: every active, not deferred fact, the
    # three that had KV too; the keyword index answers as before.
    with FactLog.open(db) as old, FactLog.open(dst / "data" / "memory.db") as new:
        for name in ("default", "work"):
            pid = new.profile(name)
            assert pid == old.profile(name)
            active = {f.id for f in new.active_facts(pid)}
            waiting = {f.id for f in new.facts_without_kv(pid, FINGERPRINT, 20, "v1")}
            assert waiting == active - set(new.deferred_facts(pid))
            assert len(waiting) > 400
            # A fact's own words find it first in both (a query that ties several facts, as
            # "town 33 parks" did, may break the tie either way: the live writes after the
            # backup move every BM25 score of the old corpus)
            fact = next(f for f in new.active_facts(pid) if f.text.startswith("Fact "))
            top = new.keyword_search(pid, fact.text, 3)
            assert [fid for fid, _ in top][:1] == [fact.id], top
            assert old.keyword_search(pid, fact.text, 1)[0][0] == fact.id
        pid = old.profile("default")  # the three facts with KV at home wait for it now
        had = {f.id for f in old.facts_without_kv(pid, FINGERPRINT, 20, "v1")}
        has = {f.id for f in new.facts_without_kv(pid, FINGERPRINT, 20, "v1")}
        assert len(has - had) == 3
    assert made["deferred"] == 25
    print(f"backup of a live store: {seconds:.2f} s, {writer.done} live writes")


def test_encrypted_backup_with_kv_round_trips_entries_byte_equal(tmp_path: Path):
    from inferscale_core.factlog import FactLog

    src, dst = tmp_path / "src", tmp_path / "dst"
    build_home(src, conversations=10, facts=200)
    entries = add_kv_entries(src, count=4)
    kv = src / "data" / "kv" / FINGERPRINT
    (kv / "orphan.safetensors").write_bytes(b"no row names this file")
    with FactLog.open(src / "data" / "memory.db") as log:  # a row whose file is gone
        fact = log.active_facts(log.profile("work"))[0]
        log.record_kv(fact.id, FINGERPRINT, 20, "v1", "gone-entry", 5, 100)
    backup = tmp_path / "kv.isbak"

    done = cli(src, "backup", "--with-kv", "--encrypt", str(backup), passphrase=PASSPHRASE)
    assert done.returncode == 0, done.stderr
    assert "encrypted" in done.stderr and "KV entries: 4" in done.stderr
    assert b"Fact 1-1" not in backup.read_bytes()  # the text is not readable in the file

    restored = cli(dst, "restore", str(backup), passphrase=PASSPHRASE)
    assert restored.returncode == 0, restored.stderr
    assert "KV entries: 4 restored" in restored.stderr
    back = tree(dst / "data" / "kv" / FINGERPRINT)
    assert back == entries  # byte-equal; the orphan left out
    before = tables(src / "data" / "memory.db")
    rows = tables(dst / "data" / "memory.db")
    assert rows["kv_entries"] == {r for r in before["kv_entries"] if r[4] != "gone-entry"}
    for name in before:
        if name != "kv_entries":
            assert rows[name] == before[name], name
