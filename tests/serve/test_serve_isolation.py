"""What one user of a real ``serve`` can learn about, or make the server hold for, another
(issue 35, part C): search ranking that another user's memory never moves, a new user of a
removed user's name who starts empty, refused over-long questions that leave no memory held,
``/v1/status`` that counts the caller's requests only, private folders and files."""

from __future__ import annotations

import os
import sqlite3
import stat
import time
from pathlib import Path

import httpx
import pytest

from tests.serve.conftest import started

MiB = 1 << 20


@pytest.fixture(scope="module")
def server(one_process):
    """The package's one-process ``serve``, after test_serve_api's: what each test here checks
    holds whatever other users (or the same users, earlier) stored."""
    return started(one_process)


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def remember(server, token: str, text: str) -> int:
    r = httpx.post(f"{server.base}/memories", json={"text": text}, headers=auth(token), timeout=60)
    assert r.status_code == 201, r.text
    return r.json()["id"]


def search(server, token: str, query: str) -> httpx.Response:
    r = httpx.post(
        f"{server.base}/memories/search", json={"query": query}, headers=auth(token), timeout=60
    )
    assert r.status_code == 200, r.text
    return r


def status(server, user: str) -> dict:
    r = httpx.get(f"{server.base}/status", headers=auth(server.tokens[user]), timeout=30)
    r.raise_for_status()
    return r.json()


def rss(pid: int) -> int:
    """Resident anonymous bytes of process ``pid`` (RssAnon: what it holds, not the mapped
    files, model weights included, that the kernel may drop and read again)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no RssAnon for {pid}")


def test_another_users_memory_never_moves_a_search(server):
    """The BM25 side channel: ana's search answers byte for byte the same whatever bo stores
    or forgets with ana's rare words (with one index for all users, bo's "Zanetti" facts
    made that word common and put ana's "4812" fact first)."""
    ana, bo = server.tokens["ana"], server.tokens["bo"]
    for text in (
        "Doctor Zanetti works in Porto",
        "The gate code at the old farm house by the river is 4812",
        "I play the cello on Tuesdays",
        "My sister lives in Lisbon",
        "I am allergic to peanuts",
        "I drive a blue Toyota",
    ):
        remember(server, ana, text)
    before = search(server, ana, "Zanetti 4812").content
    theirs = [remember(server, bo, f"Zanetti note {i}: Zanetti called again") for i in range(6)]
    assert search(server, ana, "Zanetti 4812").content == before
    for fid in theirs:
        r = httpx.delete(f"{server.base}/memories/{fid}", headers=auth(bo), timeout=60)
        assert r.status_code == 204, r.text
    assert search(server, ana, "Zanetti 4812").content == before


def test_a_new_user_of_a_removed_name_starts_empty(server):
    """`users remove dan` then `users add dan`: the new token reaches none of the old memory
    (it is archived under the old user's id), and the old token is refused."""
    old = server.add_user("dan")
    remember(server, old, "My locker code is 7731")
    r = httpx.post(
        f"{server.base}/memories/import?filename=broken.json",
        content=b'[{"mapping": ',  # kept in inbox/dan/quarantine/ with its reason
        headers=auth(old),
        timeout=60,
    )
    assert r.status_code == 422 and (server.data / "inbox" / "dan").is_dir(), r.text
    done = server.cli("users", "remove", "dan")
    assert done.returncode == 0, done.stderr
    assert not (server.data / "inbox" / "dan").exists()  # the old uploads: archived too
    new = server.add_user("dan")
    r = httpx.get(f"{server.base}/memories", headers=auth(new), timeout=60)
    assert r.status_code == 200 and r.json()["data"] == [], r.text
    assert search(server, new, "locker code 7731").json()["data"] == []
    assert httpx.get(f"{server.base}/memories", headers=auth(old), timeout=60).status_code == 401
    remember(server, new, "My bike is green")
    found = search(server, new, "locker code bike").json()["data"]
    assert [h["text"] for h in found] == ["My bike is green"]
    said = " ".join((done.stdout + done.stderr).split())
    assert "memory is archived (fact-log profile user:" in said, said


def test_memory_ids_show_nothing_of_other_users(server):
    """The API's ids are the user's own (a keyed permutation of the log's, ids.py): the
    gap between two of ana's ids no longer counts what bo stored between them."""
    ana, bo = server.tokens["ana"], server.tokens["bo"]
    first = remember(server, ana, "I collect stamps from Peru")
    for i in range(3):
        remember(server, bo, f"Bo's errand number {i}")
    second = remember(server, ana, "I collect coins from Chile")
    with sqlite3.connect(server.data / "memory.db") as db:
        logged = {row[0] for row in db.execute("SELECT id FROM facts")}
    assert first not in logged and second not in logged and abs(second - first) != 4
    r = httpx.get(f"{server.base}/memories/{second}", headers=auth(ana), timeout=60)
    assert r.status_code == 200 and r.json()["text"] == "I collect coins from Chile"
    assert httpx.get(f"{server.base}/memories/{second}", headers=auth(bo)).status_code == 404
    assert httpx.delete(f"{server.base}/memories/{first}", headers=auth(ana)).status_code == 204
    assert httpx.get(f"{server.base}/memories/{first}", headers=auth(ana)).status_code == 404
    found = search(server, ana, "collect coins stamps").json()["data"]
    assert second in {h["id"] for h in found} and first not in {h["id"] for h in found}


def test_status_counts_the_callers_requests_only(server):
    model = httpx.get(f"{server.base}/models", headers=auth(server.tokens["cy"])).json()
    quiet = status(server, "ed")
    # A reply in flight is needed: the 135M model may end one early or repeat itself (then the
    # loop guard cuts it), and how it goes can change with what else the engine batches. So
    # each question is tried until cy's status sees its reply streaming.
    questions = [
        "Count from 1 to 1000, one number a line.",
        "Write a long story about a lighthouse keeper and the sea, in many chapters.",
        "List every country of the world with its capital, one a line.",
    ]
    counted = None
    for question in questions:
        body = {
            "model": model["data"][0]["id"],
            "messages": [{"role": "user", "content": question}],
            "max_tokens": 1500,
            "temperature": 0,
            "stream": True,
            "store": False,
        }
        before = status(server, "cy")
        with httpx.stream(
            "POST",
            f"{server.base}/chat/completions",
            json=body,
            headers=auth(server.tokens["cy"]),
            timeout=60,
        ) as r:
            lines = r.iter_lines()
            got = [next(lines) for _ in range(4)]
            assert any('"content"' in line for line in got)
            streaming = status(server, "cy")["requests_in_engine"]
            if streaming != 1:
                for _ in lines:  # it ended already: read it out, try the next question
                    pass
                continue
            assert status(server, "ed")["requests_in_engine"] == 0  # not cy's
            # the client hangs up on a reply in flight (leaving the with-block closes it)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            now = status(server, "cy")
            if now["requests_in_engine"] == 0 and (
                now["aborted_by_clients"] > before["aborted_by_clients"]
                or time.monotonic() > deadline - 25  # 5 s on, nothing in flight: it ended
            ):
                break
            time.sleep(0.2)
        assert now["requests_in_engine"] == 0, now
        aborted = now["aborted_by_clients"] - before["aborted_by_clients"]
        if aborted == 1:
            counted = now
            break
        # 0: the reply reached its end (or the loop guard cut it) between the status read and
        # the hang-up, so there was nothing to abort: try the next question.
        assert aborted == 0, now
    assert counted is not None, "no hang-up on a streaming reply was counted as an abort"
    assert status(server, "ed") == quiet  # ed saw nothing of cy's requests, or their ends


def test_refused_over_long_questions_leave_no_memory_held(server):
    """Each distinct question too long for the model is refused with 400; twenty of them
    (~1M tokens each: a digit is a token) leave the server within +50 MiB of before."""
    model = httpx.get(f"{server.base}/models", headers=auth(server.tokens["ed"])).json()
    name = model["data"][0]["id"]

    def ask(i: int) -> None:
        question = f"{i:04d}" + "1234567890" * 99_990  # under the 1 MiB body limit
        body = {"model": name, "messages": [{"role": "user", "content": question}]}
        r = httpx.post(
            f"{server.base}/chat/completions",
            json=body,
            headers=auth(server.tokens["ed"]),
            timeout=120,
        )
        assert r.status_code == 400 and "tokens" in r.text, r.text[:300]

    for i in range(2):  # the allocator's pools and the tokenizer's buffers, warmed
        ask(i)
    before = rss(server.proc.pid)
    for i in range(2, 22):
        ask(i)
    grown = rss(server.proc.pid) - before
    print(f"RSS {before / MiB:.0f} MiB, +{grown / MiB:.1f} MiB after 20 refused questions")
    assert grown < 50 * MiB, f"+{grown / MiB:.0f} MiB after 20 refused questions"


def test_the_servers_folders_and_files_are_private(server):
    """Every folder the server makes is 0700 and every file 0600 (kv/ and inbox/ were 0755)."""
    remember(server, server.tokens["ed"], "I keep bees on the roof")
    deadline = time.monotonic() + 120  # until ed's memories are encoded (KV files written)
    while status(server, "ed")["memory"]["not_encoded"] and time.monotonic() < deadline:
        time.sleep(0.5)
    assert (server.data / "kv").is_dir() and (server.data / "inbox").is_dir()
    loose = []
    for root, dirs, files in os.walk(server.data):
        for name, want in [*((d, 0o700) for d in dirs), *((f, 0o600) for f in files)]:
            mode = stat.S_IMODE(os.lstat(Path(root) / name).st_mode)
            if mode != want:
                loose.append(f"{Path(root, name).relative_to(server.data)} {mode:o}")
    assert stat.S_IMODE(server.data.stat().st_mode) == 0o700
    assert not loose, loose


@pytest.fixture(autouse=True)
def _no_server_errors(server):
    """No test here may make the server fail a request (500) or log a traceback."""
    said = server.log.stat().st_size if server.log.exists() else 0
    yield
    new = server.log.read_bytes()[said:].decode(errors="replace")
    assert "Traceback" not in new, new[-4000:]
