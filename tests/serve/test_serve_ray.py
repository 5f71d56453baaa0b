"""``serve --ray 2`` end to end on the CPU: a local Ray, two replicas of the embedded model (an
engine each) over one data folder, the official ``openai`` client on loopback.

The isolation and API tests of ``serve`` run here unchanged against the Ray deployment (they are
imported, so they bind to this module's ``server`` and ``memories``): two users with 50
memories each, 100 concurrent mixed requests whose injected ids are all the caller's and whose
answers equal the same request alone, errors, aborts, private files. Then what only replicas
have: a user's requests all land on the replica that holds their lease, unloading users gives
leases up, and ``kill -9`` of the replica holding a user during their writes loses and
duplicates nothing (Ray reroutes, another replica takes the user's memory over)."""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.serve import test_serve_api as api
from tests.serve import test_serve_isolation as isolation
from tests.serve.conftest import ENGINE_STATS, Server, wait_healthy

pytest.importorskip("ray.serve", reason="the [ray] extra (Ray Serve) is not installed")

DESKS = 3  # users a replica keeps loaded: the six users here make each unload some

# The same tests as `serve`'s, against the Ray deployment: taken into this module, they bind
# to its fixtures (`server`, `memories`).
SHARED = {
    api: [
        "test_concurrent_users_get_their_own_memory_and_the_same_answers",
        "test_a_client_cannot_name_kv_or_salt",
        "test_errors",
        "test_search_retrieves_what_a_chat_would",
        "test_a_client_that_goes_away_aborts_its_request",
        "test_import_an_export_and_quarantine_a_broken_one",
        "test_logs_hold_no_memory_text",
    ],
    isolation: [
        "test_another_users_memory_never_moves_a_search",
        "test_memory_ids_show_nothing_of_other_users",
        "test_status_counts_the_callers_requests_only",
        "test_the_servers_folders_and_files_are_private",
    ],
}
for _module, _names in SHARED.items():
    globals().update({name: getattr(_module, name) for name in _names})

auth = api.auth


class RayServer(Server):
    """``serve --ray 2`` in a process group of its own (Ray's processes in it too)."""

    def start(self) -> None:
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "app", "serve", "--port", str(self.port)]
                + ["--max-model-len", "2048", "--ray", "2", "--desks-per-replica", str(DESKS)],
                env=dict(self.env, **ENGINE_STATS),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        wait_healthy(self.proc, f"http://127.0.0.1:{self.port}", self.log)

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(90)
        with_group = self.group_members()
        if with_group:  # Ray's processes left behind: end them, then say so
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            pytest.fail(f"processes outlived the stopped server: {with_group}")

    def user_id(self, name: str) -> str:
        with sqlite3.connect(self.data / "users.db") as db:
            return db.execute("SELECT id FROM users WHERE name = ?", (name,)).fetchone()[0]

    def lease_holder(self, name: str) -> int | None:
        """The pid of the replica that holds ``name``'s lease now, or None."""
        from app.serve.lease import LeaseBusy, Leases

        probe = Leases(self.data / "leases", "the test")
        try:
            probe.acquire(self.user_id(name), timeout_s=0)
        except LeaseBusy as busy:
            found = re.search(r"pid (\d+)", busy.holder or "")
            return int(found.group(1)) if found else -1
        finally:
            probe.close()
        return None


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path):
    srv = RayServer(tmp_path_factory.mktemp("serve-ray"))
    srv.tokens = {  # type: ignore[attr-defined]
        name: srv.add_user(name) for name in ("ana", "bo", "cy", "ed", "fay", "kim")
    }
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def memories(server) -> dict[str, set[int]]:
    """ana and bo with 50 memories each, all encoded (on the replica of each)."""
    ids = {
        "ana": api.remember_all(server, "ana", api.ana_facts()),
        "bo": api.remember_all(server, "bo", api.bo_facts()),
    }
    for user in ids:
        api.wait_encoded(server, user, 50)
    return {user: set(v) for user, v in ids.items()}


@pytest.fixture(autouse=True)
def _no_server_errors(server):
    """No test here may make a replica or the front log a traceback (Ray's workers log to the
    server's output at WARNING, without access lines)."""
    said = server.log.stat().st_size if server.log.exists() else 0
    yield
    new = server.log.read_bytes()[said:].decode(errors="replace")
    assert "Traceback" not in new, new[-4000:]


def test_a_client_that_hangs_up_on_a_whole_reply_aborts_it(server):
    """Not streamed: the client gives up after 3 s; the front cancels the replica's call and
    the request leaves the engine."""
    api.hang_up_on_a_whole_reply(server, "cy", "Write a very long story about a dragon.", 15)


def test_each_users_requests_go_to_the_replica_holding_their_lease(server, memories):
    """ana's and bo's requests, many at once: each user's lease stays with one replica (the
    one Ray routes them to), and the replica's pid is the lease's."""
    for user in ("ana", "bo"):  # loaded again (the tests before used more users than desks)
        api.ask(server, user, api.QUESTIONS[user][0], stream=False)
    holders = {user: server.lease_holder(user) for user in ("ana", "bo")}
    assert all(pid and pid > 0 for pid in holders.values()), holders
    jobs = [(user, q) for user, qs in api.QUESTIONS.items() for q in qs[:4]] * 3
    with ThreadPoolExecutor(len(jobs)) as pool:
        list(pool.map(lambda job: api.ask(server, *job, stream=False), jobs))
    assert {user: server.lease_holder(user) for user in holders} == holders


def test_unloaded_users_give_their_leases_up(server):
    """Six users over two replicas keeping three each: after each has used the server, at most
    six leases are held, and every user's memory is theirs alone, whole."""
    names = ["ana", "bo", "cy", "ed", "fay", "kim"]
    for round_ in range(2):
        for name in names:
            isolation.remember(server, server.tokens[name], f"{name}'s note {round_}")
    held = [name for name in names if server.lease_holder(name) is not None]
    assert len(held) <= 2 * DESKS, held
    for name in names:
        r = httpx.get(
            f"{server.base}/memories", params={"q": "note"}, headers=auth(server.tokens[name])
        )
        texts = [f["text"] for f in r.json()["data"] if "'s note " in f["text"]]
        assert sorted(texts) == [f"{name}'s note 0", f"{name}'s note 1"], texts


def test_kill9_of_a_users_replica_mid_writes_loses_and_duplicates_nothing(server):
    """Four of kim's clients write memories at once; the replica holding kim's lease is
    killed (-9) once five are stored, with writes in flight. Ray reroutes (and starts a new
    replica): kim's writes are answered again, by a replica that took the lease over. Every
    write that got a 201 is in kim's memory once, nothing else is, and kim's next question is
    answered from all of it."""
    kim = auth(server.tokens["kim"])
    isolation.remember(server, server.tokens["kim"], "kim's first words")
    facts_before = api.status(server, "kim")["memory"]["facts"]
    victim = server.lease_holder("kim")
    assert victim and victim > 0
    children = _children(victim)
    stored: list[str] = []  # 201
    unsure: list[str] = []  # 503, or no answer: written or not, never twice
    lock = threading.Lock()
    killed: dict[str, float] = {}  # "at": stored when killed, "t": when, "answered": 1st 201
    deadline = time.monotonic() + 300

    def done() -> bool:
        return time.monotonic() > deadline or len(stored) >= killed.get("at", 0) + 15

    def writer(w: int) -> None:
        with httpx.Client(headers=kim, timeout=60) as client:
            for n in itertools.count():
                if "at" in killed and done():
                    return
                text = f"kim's memory number {w}-{n}"
                try:
                    r = client.post(f"{server.base}/memories", json={"text": text})
                    ok = r.status_code == 201
                    assert ok or r.status_code == 503, r.text
                except httpx.TransportError:
                    ok = False
                with lock:
                    (stored if ok else unsure).append(text)
                    if "at" not in killed and len(stored) == 5:
                        streaming.wait(60)  # kim's reply is streaming from the victim too
                        os.kill(victim, signal.SIGKILL)  # the other writers' requests in flight
                        killed.update(at=5, t=time.monotonic())
                    elif ok and "at" in killed and "answered" not in killed:
                        killed["answered"] = time.monotonic() - killed["t"]
                if not ok:
                    time.sleep(0.3)

    streaming = threading.Event()
    cut: list[str] = []

    def long_reply() -> None:
        """A reply (logged: ``store``) that is still streaming when the replica dies."""
        body = {
            "model": api.model_name(server),
            "messages": [{"role": "user", "content": "Tell me everything you remember."}],
            "max_tokens": 1500,
            "min_tokens": 1500,
            "stream": True,
        }
        lines = []
        try:
            with httpx.stream(
                "POST", f"{server.base}/chat/completions", json=body, headers=kim, timeout=60
            ) as r:
                for line in r.iter_lines():
                    lines.append(line)
                    if len(lines) == 6:
                        streaming.set()
        except httpx.TransportError as exc:
            cut.append(type(exc).__name__)
        else:
            cut.append("ended" if lines[-1:] != ["data: [DONE]"] else "done")

    with ThreadPoolExecutor(5) as pool:
        replying = pool.submit(long_reply)
        list(pool.map(writer, range(4)))
        replying.result()
    assert cut and cut[0] != "done", cut  # the reply was cut off, not finished
    assert "at" in killed and len(stored) >= killed["at"] + 15, (stored, unsure)
    print(
        f"kill -9 of kim's replica: first 201 after {killed['answered']:.1f} s;"
        f" {len(stored)} writes stored, {len(unsure)} refused (503) or cut off;"
        f" the streaming reply: {cut[0]}"
    )
    after = server.lease_holder("kim")
    assert after not in (None, victim), after
    r = httpx.get(f"{server.base}/memories/export", headers=kim, timeout=60)
    everything = {f["text"] for f in r.json()["facts"]}
    texts = [f["text"] for f in r.json()["facts"] if f["text"].startswith("kim's memory")]
    assert len(texts) == len(set(texts)), "a memory stored twice"
    assert set(stored) <= set(texts), set(stored) - set(texts)
    assert set(texts) <= set(stored) | set(unsure)
    api.wait_encoded(server, "kim", facts_before + len(texts), timeout=300)
    hits = httpx.post(
        f"{server.base}/memories/search",
        json={"query": f"kim's memory number {stored[0].rsplit(' ', 1)[1]}", "k": 50},
        headers=kim,
        timeout=60,
    ).json()["data"]
    assert {h["text"] for h in hits} == everything  # the new holder's index: all of it
    _, used = api.ask(server, "kim", f"What is {stored[-1]}?", stream=False)
    assert used and all(m["how"] == "injected" for m in used)
    gone = time.monotonic() + 60  # the killed replica's engine processes go by themselves
    while any(_alive(pid) for pid in children) and time.monotonic() < gone:
        time.sleep(0.5)
    assert not [pid for pid in children if _alive(pid)], "engine processes outlived a replica"


def _children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(stat.parent.name))
        except (OSError, ValueError, IndexError):
            continue
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
