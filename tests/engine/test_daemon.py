"""``inferscale-assistant daemon``: the resident assistant with no window, as a real process.

A backlog of memories and an export dropped into the inbox are imported and encoded with no
window open; kill -9 mid-encode, then a restart, loses and doubles nothing; SIGTERM stops it
cleanly and takes its socket away."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from inferscale_core.desk_socket import RemoteDesk, socket_path
from inferscale_core.factlog import FactLog

ROOT = Path(__file__).resolve().parents[2]
EXPORT = ROOT / "tests" / "fixtures" / "exports" / "chatgpt" / "conversations.json"
SECOND_EXPORT = ROOT / "tests" / "fixtures" / "exports" / "claude" / "conversations.json"
BACKLOG = 24  # facts waiting to be encoded when the daemon starts
START_S = 300


class Daemon:
    """``python -m app daemon`` in ``home``; its stderr lines gathered on a thread."""

    def __init__(self, home: Path) -> None:
        self.lines: list[str] = []
        self.process = subprocess.Popen(
            [sys.executable, "-m", "app", "daemon"],
            cwd=ROOT,
            env={**os.environ, "INFERSCALE_HOME": str(home)},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.process.stderr:
            self.lines.append(line.rstrip())

    def wait_for(self, text: str, timeout_s: float = START_S) -> None:
        deadline = time.monotonic() + timeout_s
        while not any(text in line for line in self.lines):
            assert self.process.poll() is None, "\n".join(self.lines[-30:])
            assert time.monotonic() < deadline, f"no {text!r}: " + "\n".join(self.lines[-30:])
            time.sleep(0.2)


def _socket(home: Path, db: Path) -> Path:
    """The daemon's socket (found under its own home)."""
    old = os.environ["INFERSCALE_HOME"]
    os.environ["INFERSCALE_HOME"] = str(home)
    try:
        return socket_path(db, "default")
    finally:
        os.environ["INFERSCALE_HOME"] = old


def _count(db: Path, sql: str) -> int:
    log = FactLog.open(db)
    try:
        return log.db.execute(sql).fetchone()[0]
    finally:
        log.close()


ENCODED = "SELECT count(DISTINCT fact_id) FROM kv_entries"
ACTIVE_WITHOUT_KV = (
    "SELECT count(*) FROM facts WHERE status = 'active'"
    " AND id NOT IN (SELECT fact_id FROM kv_entries)"
)


def _wait(db: Path, sql: str, done, timeout_s: float, daemon: Daemon) -> int:
    deadline = time.monotonic() + timeout_s
    while not done(value := _count(db, sql)):
        assert daemon.process.poll() is None, "\n".join(daemon.lines[-30:])
        assert time.monotonic() < deadline, f"{sql}: {value}"
        time.sleep(0.3)
    return value


@pytest.fixture
def home():
    """The daemon's home, in a short folder of its own: its socket's path must fit in 107
    bytes, and a pytest-xdist worker's tmp_path is longer by the worker's folder."""
    folder = Path(tempfile.mkdtemp(prefix="daemon-"))
    yield folder / "home"
    shutil.rmtree(folder, ignore_errors=True)


def test_the_daemon_imports_encodes_survives_kill9_and_stops_cleanly(smollm2_path, home):
    (home / "config").mkdir(parents=True, mode=0o700)
    (home / "config" / "config.toml").write_text('w = 0\nkv_encode_recent_days = "all"\n')
    db = home / "data" / "memory.db"
    db.parent.mkdir(parents=True, mode=0o700)
    with FactLog.open(db) as log:
        profile = log.profile("default")
        for i in range(BACKLOG):
            log.add_fact(profile, f"Fact {i}: the green folder number {i} is in drawer {i % 7}.")

    first = Daemon(home)
    first.wait_for("ready")
    inbox = home / "data" / "inbox"
    shutil.copy(EXPORT, inbox / "conversations.json.part")
    (inbox / "conversations.json.part").rename(inbox / "conversations.json")
    _wait(db, ENCODED, lambda n: n >= 3, 300, first)
    first.process.send_signal(signal.SIGKILL)
    first.process.wait(30)
    at_kill = _count(db, ENCODED)
    # the socket the killed process left is stale: nobody answers there
    with pytest.raises(OSError):
        RemoteDesk(_socket(home, db))

    second = Daemon(home)
    second.wait_for("ready")
    if _count(db, "SELECT count(*) FROM conversations WHERE source = 'chatgpt'") == 0:
        second.wait_for("conversations.json imported")  # the kill came before the import
    _wait(db, ACTIVE_WITHOUT_KV, lambda n: n == 0, 600, second)
    print(f"encoded {at_kill} facts before the kill; all of them after the restart")

    assert _count(db, "SELECT count(*) FROM facts WHERE status = 'active'") > BACKLOG
    doubled = (
        "SELECT count(*) FROM (SELECT fact_id FROM kv_entries"
        " GROUP BY fact_id, model_fingerprint, w, encoder_version HAVING count(*) > 1)"
    )
    assert _count(db, doubled) == 0
    conversations = _count(db, "SELECT count(*) FROM conversations WHERE source = 'chatgpt'")
    assert conversations >= 1
    turns = _count(
        db,
        "SELECT count(*) FROM turns t JOIN conversations c ON c.id = t.conversation_id"
        " WHERE c.source = 'chatgpt'",
    )
    distinct = _count(
        db,
        "SELECT count(*) FROM (SELECT DISTINCT t.conversation_id, t.text FROM turns t"
        " JOIN conversations c ON c.id = t.conversation_id WHERE c.source = 'chatgpt')",
    )
    assert turns == distinct  # imported once
    assert (inbox / "imported").is_dir() and not (inbox / "conversations.json").exists()

    with RemoteDesk(_socket(home, db)) as remote:
        assert remote.hello()["pid"] == second.process.pid
        assert remote.search("Which drawer holds green folder number 12?", k=5)
    # `import` beside the daemon: it imports, and the daemon encodes what came at once
    imported = subprocess.run(
        [sys.executable, "-m", "app", "import", str(SECOND_EXPORT)],
        cwd=ROOT,
        env={**os.environ, "INFERSCALE_HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert imported.returncode == 0, imported.stderr[-2000:]
    assert f"running assistant (pid {second.process.pid}) extracts" in imported.stderr
    assert _count(db, "SELECT count(*) FROM conversations WHERE source = 'claude'") >= 1
    _wait(db, ACTIVE_WITHOUT_KV, lambda n: n == 0, 300, second)
    # a second daemon on the same memory says so and leaves
    third = subprocess.run(
        [sys.executable, "-m", "app", "daemon"],
        cwd=ROOT,
        env={**os.environ, "INFERSCALE_HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert third.returncode == 1 and "already runs" in third.stderr
    second.process.send_signal(signal.SIGTERM)
    assert second.process.wait(120) == 0, "\n".join(second.lines[-30:])
    assert not _socket(home, db).exists()
