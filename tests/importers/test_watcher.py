"""The inbox watcher with a real watchdog observer and a real SQLite file."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from inferscale_core.factlog import FactLog
from inferscale_core.importers.pipeline import REASON_SUFFIX, FileResult, Importer
from inferscale_core.importers.watcher import InboxWatcher

STABLE, POLL = 1.5, 0.1


def jsonl(tag: str, n: int) -> str:
    return "".join(
        json.dumps({"role": "user" if i % 2 == 0 else "assistant", "content": f"{tag} {i}"}) + "\n"
        for i in range(n)
    )


@pytest.fixture
def setup(tmp_path):
    db, inbox = tmp_path / "memory.db", tmp_path / "inbox"
    results: list[FileResult] = []
    lock = threading.Lock()

    def make_importer() -> Importer:
        log = FactLog.open(db)
        return Importer(log, log.profile(), inbox)

    def on_result(result: FileResult) -> None:
        with lock:
            results.append(result)

    def watcher() -> InboxWatcher:
        return InboxWatcher(inbox, make_importer, STABLE, POLL, on_result=on_result)

    return db, inbox, watcher, results


def rows(db: Path) -> list[tuple[str, str, int]]:
    with FactLog.open(db) as log:
        return [
            (Path(p).name, s, n)
            for p, s, n in log.db.execute("SELECT path, status, turns_added FROM imports")
        ]


def test_watcher_imports_drops_waits_for_slow_files_and_catches_up_on_start(setup):
    db, inbox, make_watcher, results = setup
    bad = {
        "notes.txt": "eggs, milk and bread\nremember to buy stamps\n",
        "broken.json": '[{"mapping": {}, "current_node": ',
        "blob.bin": bytes(range(256)) * 4,
    }
    slow_text = jsonl("slow", 40)
    with make_watcher() as watcher:
        for n in range(15):
            (inbox / f"chat{n:02d}.jsonl").write_text(jsonl(f"chat{n}", 4))
        for name, content in bad.items():
            path = inbox / name
            path.write_bytes(content) if isinstance(content, bytes) else path.write_text(content)
        (inbox / "renamed.jsonl.part").write_text(jsonl("renamed", 3))  # a finished download
        (inbox / "renamed.jsonl.part").rename(inbox / "renamed.jsonl")
        (inbox / ".hidden.jsonl").write_text(jsonl("hidden", 2))
        (inbox / "still-downloading.jsonl.crdownload").write_text(jsonl("partial", 2))

        # one file written in 8 chunks over ~3 s, pausing well under STABLE between chunks
        # (cut mid-line: an early import would fail and quarantine it)
        slow = inbox / "slow.jsonl"
        step = len(slow_text) // 8 + 1
        with slow.open("w") as f:
            for start in range(0, len(slow_text), step):
                f.write(slow_text[start : start + step])
                f.flush()
                time.sleep(0.35)
        assert watcher.wait_idle(timeout=30)

    by_name = {r.path.name: r for r in results}
    assert len(results) == len(by_name) == 20  # every file handled exactly once
    imported = {n for n, r in by_name.items() if r.status == "imported"}
    assert len(imported) >= 17
    assert imported == {f"chat{n:02d}.jsonl" for n in range(15)} | {"renamed.jsonl", "slow.jsonl"}
    assert by_name["slow.jsonl"].turns_added == 40
    assert [r for r in rows(db) if r[0] == "slow.jsonl"] == [("slow.jsonl", "imported", 40)]
    assert sorted(p.name for p in (inbox / "imported").iterdir()) == sorted(imported)

    quarantine = inbox / "quarantine"
    for name in bad:
        assert by_name[name].status == "quarantined"
        assert (quarantine / name).exists()
        reason = (quarantine / (name + REASON_SUFFIX)).read_text()
        assert by_name[name].reason in reason
    assert "not a supported chat export" in by_name["notes.txt"].reason
    assert "malformed" in by_name["broken.json"].reason
    # ignored names stay where they are
    assert {p.name for p in inbox.iterdir() if p.is_file()} == {
        ".hidden.jsonl",
        "still-downloading.jsonl.crdownload",
    }

    # a file that arrives while the watcher is down is imported when it starts again
    (inbox / "while-down.jsonl").write_text(jsonl("down", 5))
    with make_watcher() as watcher:
        assert watcher.wait_idle(timeout=15)
    assert results[-1].path.name == "while-down.jsonl" and results[-1].turns_added == 5
    assert (inbox / "imported" / "while-down.jsonl").exists()
    with FactLog.open(db) as log:
        assert log.db.execute("SELECT count(*) FROM turns").fetchone()[0] == 15 * 4 + 3 + 40 + 5
        assert log.db.execute("SELECT count(*) FROM imports").fetchone()[0] == 21


def test_files_are_imported_in_arrival_order(setup):
    db, inbox, make_watcher, results = setup
    inbox.mkdir()
    for n, name in enumerate(["c.jsonl", "a.jsonl", "b.jsonl"]):  # waiting before the start
        (inbox / name).write_text(jsonl(name, 2))
        t = time.time() - 100 + n
        os.utime(inbox / name, (t, t))
    with make_watcher() as watcher:
        assert watcher.wait_idle(timeout=15)
        for name in ["z.jsonl", "y.jsonl"]:
            (inbox / name).write_text(jsonl(name, 2))
            time.sleep(0.2)
        assert watcher.wait_idle(timeout=15)
    assert [r.path.name for r in results] == ["c.jsonl", "a.jsonl", "b.jsonl", "z.jsonl", "y.jsonl"]


def test_a_broken_database_fails_start(tmp_path):
    def make_importer() -> Importer:
        raise RuntimeError("no database")

    watcher = InboxWatcher(tmp_path / "inbox", make_importer)
    with pytest.raises(RuntimeError, match="no database"):
        watcher.start()
    watcher.stop()


def test_run_watch_prints_a_line_per_file_and_stops_on_ctrl_c(tmp_path):
    from tests.support import REPO as repo

    inbox = tmp_path / "inbox"
    inbox.mkdir()
    (inbox / "waiting.jsonl").write_text(jsonl("waiting", 3))
    (inbox / "junk.txt").write_text("eggs, milk and bread\n")
    env = {**os.environ, "INFERSCALE_HOME": str(tmp_path / "home"), "PYTHONPATH": str(repo)}
    code = (
        "import sys; from pathlib import Path; from rich.console import Console;"
        "from app.commands.imports import run_watch;"
        "sys.exit(run_watch(Path(sys.argv[1]), Console(width=1000)))"  # one line per file
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code, str(inbox)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        lines = [child.stdout.readline() for _ in range(3)]
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=20)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 0, err
    text = "".join(lines)
    assert "watching" in lines[0]
    assert "imported waiting.jsonl: 1 conversations, 3 new turns" in text
    assert "quarantined junk.txt" in text and ".reason.txt" in text
    assert (tmp_path / "home" / "data" / "memory.db").exists()
