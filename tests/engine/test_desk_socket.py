"""The desk behind its Unix socket: a real session on the embedded model, real sockets."""

from __future__ import annotations

import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

from app import cli
from app.commands.memory import FORGET_CAUSE
from inferscale_core import paths
from inferscale_core.composer import TurnRejected
from inferscale_core.desk_socket import (
    DeskBusyError,
    DeskServer,
    RemoteDesk,
    RemoteDeskError,
    peer_uid,
    socket_path,
)
from tests.support.desk import started_desk

NOBODY = 65534


@pytest.fixture(scope="module")
def desk(runtime, tmp_path_factory):
    desk = started_desk(runtime, tmp_path_factory.mktemp("desk") / "memory.db")
    yield desk
    desk.close()


@pytest.fixture(scope="module")
def served(desk):
    server = DeskServer(desk)
    yield server
    server.close()


def test_the_socket_is_private_and_found_by_memory_and_profile(desk, served):
    assert served.path == socket_path(desk.db_path, "default")
    assert served.path != socket_path(desk.db_path, "work")
    assert stat.S_IMODE(served.path.stat().st_mode) == 0o600
    assert stat.S_IMODE(served.path.parent.stat().st_mode) == 0o700
    with RemoteDesk.connect(desk.db_path, "default") as remote:
        hello = remote.hello()
        assert hello["protocol"] == 1 and hello["pid"] == os.getpid() and hello["ready"]
        assert peer_uid(remote._sock) == os.getuid()
    assert RemoteDesk.connect(desk.db_path, "work") is None  # nobody serves that one


def test_a_fact_added_through_the_socket_is_searched_and_forgotten(served, desk):
    with RemoteDesk.connect(desk.db_path, "default") as remote:
        fact = remote.add_fact("My sister Ines plays the cello in Porto.", "2026-11-02")
        assert fact["text"].startswith("My sister Ines") and fact["refers_to"] == "2026-11-02"
        hits = remote.search("Who plays the cello?", k=3)
        assert hits[0]["id"] == fact["id"] and hits[0]["rank"] == 1
        assert hits[0]["refers_to"] == "2026-11-02" and hits[0]["score"] > 0
        assert remote.forget(fact["id"]) is True
        assert remote.forget(fact["id"]) is False  # no longer active
        assert fact["id"] not in [h["id"] for h in remote.search("Who plays the cello?", k=3)]
        with pytest.raises(ValueError):
            remote.add_fact("A date that is none.", "2026-13-45")


def test_ask_streams_then_ends_with_the_reply_and_logs_it(served, desk):
    with RemoteDesk.connect(desk.db_path, "default") as remote:
        conversation = remote.conversation("socket-test")
        assert remote.conversation("socket-test") == conversation  # found, not made again
        items = list(remote.ask_plain("My cat is called Miso.", conversation_id=conversation))
        *deltas, reply = items
        assert deltas and all(isinstance(d, str) for d in deltas)
        assert reply["text"] == "".join(deltas).strip()
        assert reply["conversation_id"] == conversation and reply["assistant_turn_id"]
        assert remote.wait_remembered([reply["user_turn_id"]], timeout_s=120)
        recent = remote.recent_conversations(limit=5)
        assert conversation in [c["id"] for c in recent]
        with pytest.raises(TurnRejected):
            list(remote.ask_plain("   ", conversation_id=conversation))
        # the connection still serves after a refusal
        assert remote.hello()["protocol"] == 1


def test_bad_calls_get_errors_and_the_connection_stays(served, desk):
    with RemoteDesk.connect(desk.db_path, "default") as remote:
        with pytest.raises(LookupError, match="no method 'drop_tables'"):
            remote.call("drop_tables")
        with pytest.raises(ValueError, match="unexpected keyword"):
            remote.call("search", query="cello", limit=3)
        assert remote.hello()["ready"]
    with socket.socket(socket.AF_UNIX) as raw:
        raw.connect(str(served.path))
        raw.sendall(b"not json\n")
        answer = raw.makefile("rb").readline()
        assert b'"ValueError"' in answer and b"not a call" in answer


def test_a_client_hanging_up_mid_reply_stops_it_and_others_are_served(served, desk):
    aborted = desk.session.engine.aborted
    remote = RemoteDesk.connect(desk.db_path, "default")
    replies = remote.ask_plain("Tell me a long story about the sea.", log=False, max_tokens=64)
    assert isinstance(next(replies), str)
    replies.close()  # hangs up
    with pytest.raises(RemoteDeskError):
        remote.hello()
    # two clients at once: one asks while the other searches
    done = []

    def other():
        with RemoteDesk.connect(desk.db_path, "default") as second:
            done.append(second.search("cat", k=1))

    with RemoteDesk.connect(desk.db_path, "default") as first:
        thread = threading.Thread(target=other)
        thread.start()
        assert list(first.ask_plain("Hello!", log=False))[-1]["text"] is not None
        thread.join(60)
    assert done and isinstance(done[0], list)
    assert desk.session.engine.aborted > aborted


def test_a_second_server_is_refused_and_a_stale_socket_replaced(served, desk, tmp_path):
    with pytest.raises(DeskBusyError, match="another assistant"):
        DeskServer(desk)
    stale = tmp_path / "run" / "stale.sock"
    stale.parent.mkdir(mode=0o700)
    dead = socket.socket(socket.AF_UNIX)
    dead.bind(str(stale))  # bound, never listening: what a killed process leaves
    dead.close()
    server = DeskServer(desk, stale)
    try:
        with RemoteDesk(stale) as remote:
            assert remote.hello()["protocol"] == 1
    finally:
        server.close()
    assert not stale.exists()


CONNECT_AS_NOBODY = """
import os, socket, sys
os.setgid(65534); os.setuid(65534)
s = socket.socket(socket.AF_UNIX)
try:
    s.connect(sys.argv[1])
except PermissionError:
    print("EACCES"); sys.exit(0)
try:
    s.sendall(b'{"method": "hello"}\\n')
except OSError:  # refused and closed before this was sent: its answer is already here
    pass
print(s.makefile("rb").readline().decode().strip())
"""


@pytest.mark.skipif(os.getuid() != 0, reason="switching to a second uid needs root")
def test_another_user_is_refused_by_mode_and_by_peer_credentials(served, desk):
    def as_nobody(path):
        done = subprocess.run(
            [sys.executable, "-c", CONNECT_AS_NOBODY, str(path)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    assert as_nobody(served.path) == "EACCES"  # the 0700 folder and 0600 socket
    # A socket another user could reach (open modes): the peer's uid refuses it all the same.
    shared = Path(tempfile.mkdtemp(prefix="desk-open-", dir="/tmp"))  # /tmp: others may pass
    shared.chmod(0o777)
    server = DeskServer(desk, shared / "desk.sock")
    try:
        (shared / "desk.sock").chmod(0o666)
        answer = as_nobody(shared / "desk.sock")
        assert "PermissionError" in answer and f"uid {NOBODY} may not" in answer
        assert "result" not in answer
    finally:
        server.close()
        shutil.rmtree(shared)


def test_memory_forget_goes_through_the_running_desk(runtime, tmp_path, monkeypatch, capsys):
    """With the assistant running, ``memory forget`` asks its desk, so the running index and
    memory tiers drop the fact too, not only the log."""
    monkeypatch.setenv(paths.HOME_ENV, str(tmp_path / "home"))
    desk = started_desk(runtime, paths.memory_db())
    server = DeskServer(desk)
    try:
        fact = desk.add_fact("My neighbour Rui repairs old valve radios.")
        question = "Who repairs old radios?"
        assert desk.search(question, k=3)[0]["id"] == fact["id"]
        assert cli.main(["memory", "forget", str(fact["id"]), "--yes"]) == 0
        said = capsys.readouterr()
        assert f"forgot #{fact['id']} through the running assistant" in said.out + said.err
        assert fact["id"] not in [h["id"] for h in desk.search(question, k=3)]
        audit = desk.call(lambda s: s.factlog.audit(s.profile_id, fact["id"]))
        assert (audit[-1].action, audit[-1].cause) == ("forget", FORGET_CAUSE)
    finally:
        server.close()
        desk.close()
    assert cli.main(["memory", "forget", str(fact["id"]), "--yes"]) == 0  # none running now
    said = capsys.readouterr()
    assert "already forgotten" in said.out + said.err
