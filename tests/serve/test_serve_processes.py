"""``serve --api-processes 2`` on the CPU engine: one vLLM engine core, two API processes, the
front passing each request to its user's process (app/serve/front.py): answers, isolation,
errors, a disconnect and a kill -9, all through the front with the official client."""

from __future__ import annotations

import re
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from app.serve.front import owner
from tests.serve.conftest import idle_connection_still_served, started
from tests.serve.test_serve_api import (
    CITIES,
    NAMES,
    TOPICS,
    ask,
    auth,
    client,
    hang_up_on_a_whole_reply,
    model_name,
    remember_all,
    status,
    wait_encoded,
)

VLLM_EXIT_NOISE = (
    r"Exception ignored in: <function EngineZmqListeners.__del__ at 0x[0-9a-f]+>\n"
    r"Traceback \(most recent call last\):\n.*\n"
    r"AttributeError: 'NoneType' object has no attribute 'suppress'\n"
)
USERS = ("ana", "bo")  # process 0 and process 1 (asserted below)
FACTS = {
    "ana": [f"My friend {NAMES[i]} lives in {CITIES[i % 10]}." for i in range(12)],
    "bo": [f"Project {i} at my studio is about {TOPICS[i % 8]}." for i in range(12)],
}
QUESTIONS = {
    "ana": [f"Where does my friend {NAMES[i]} live?" for i in (0, 3, 7)],
    "bo": [f"What is project {i} at my studio about?" for i in (1, 4, 6)],
}


@pytest.fixture(scope="module")
def group(front):
    """The package's ``serve --api-processes 2`` (the tests here stop and kill it last), ana
    and bo with 12 memories each, encoded."""
    srv = started(front)
    ids = {user: set(remember_all(srv, user, FACTS[user])) for user in USERS}
    for user in USERS:
        wait_encoded(srv, user, len(FACTS[user]))
    srv.memories = ids  # type: ignore[attr-defined]
    return srv


def test_each_user_is_served_by_their_own_process_from_their_own_memory(group):
    assert [owner(user, 2) for user in USERS] == [0, 1]
    assert [status(group, user)["api_process"] for user in USERS] == [0, 1]
    alone = {(u, q): ask(group, u, q, stream=False) for u in USERS for q in QUESTIONS[u]}
    jobs = [(u, q, n % 2 == 0) for n in range(4) for u in USERS for q in QUESTIONS[u]]
    with ThreadPoolExecutor(len(jobs)) as pool:
        results = [(job, pool.submit(ask, group, *job)) for job in jobs]
        done = [(job, future.result()) for job, future in results]
    for (user, question, _), (text, used) in done:
        other = group.memories["bo" if user == "ana" else "ana"]
        injected = {m["id"] for m in used if m["how"] == "injected"}
        assert injected and injected <= group.memories[user] and not injected & other
        assert text == alone[(user, question)][0], (user, question)
    for user in USERS:
        assert status(group, user)["requests_in_engine"] == 0


def test_errors_through_the_front(group):
    base, model = group.base, model_name(group)
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    assert httpx.get(f"{base}/models").status_code == 401
    assert httpx.get(f"{base}/models", headers=auth("isk-wrong")).status_code == 401
    ana, bo = auth(group.tokens["ana"]), auth(group.tokens["bo"])
    ana_fact = min(group.memories["ana"])
    assert httpx.get(f"{base}/memories/{ana_fact}", headers=bo).status_code == 404
    assert httpx.get(f"{base}/memories/{ana_fact}", headers=ana).status_code == 200
    big = {**body, "messages": [{"role": "user", "content": "x" * (2 << 20)}]}
    assert httpx.post(f"{base}/chat/completions", json=big, headers=bo).status_code == 413
    r = httpx.post(f"{base}/chat/completions", content=b'{"model": ', headers=bo)
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]
    r = httpx.post(f"{base}/chat/completions", json={**body, "model": "gpt-4o"}, headers=ana)
    assert r.status_code == 404 and model in r.json()["error"]["message"]
    page = client(group, "bo").models.list()
    assert [m.id for m in page.data] == [model]


def test_the_front_keeps_an_idle_connection_past_the_clients_pool_expiry(group):
    assert idle_connection_still_served(group.port, idle_s=6.0)


def test_a_client_that_goes_away_aborts_its_request_behind_the_front(group):
    body = {
        "model": model_name(group),
        "messages": [{"role": "user", "content": "Count from 1 to 1000, one number a line."}],
        "max_tokens": 1500,
        "temperature": 0,
        "stream": True,
        "store": False,
    }
    aborted = status(group, "bo")["aborted_by_clients"]
    with httpx.stream(
        "POST", f"{group.base}/chat/completions", json=body, headers=auth(group.tokens["bo"])
    ) as r:
        lines = r.iter_lines()
        got = [next(lines) for _ in range(8)]
    assert any('"content"' in line for line in got)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        now = status(group, "bo")
        if now["requests_in_engine"] == 0 and now["aborted_by_clients"] > aborted:
            return
        time.sleep(0.2)
    pytest.fail(f"the request still ran after the client left: {now}")


def test_a_client_that_hangs_up_on_a_whole_reply_aborts_it_behind_the_front(group):
    """Not streamed: nothing comes until the reply's end, and the client gives up first. The
    front closes its connection to the API process, which aborts the engine's request."""
    hang_up_on_a_whole_reply(group, "bo", "Count from 1 to 1000, one number a line.", 20)


def test_ctrl_c_stops_every_process_quietly(group):
    """Ctrl+C (SIGINT) of the front: it exits 0, no process of its group outlives it, and its
    log says nothing that reads like a failure (the processes end because it stops them)."""
    said_before = group.log.stat().st_size
    group.proc.send_signal(signal.SIGINT)
    code = group.proc.wait(90)
    deadline = time.monotonic() + 60
    while group.group_alive() and time.monotonic() < deadline:
        time.sleep(0.2)
    said = group.log.read_bytes()[said_before:].decode(errors="replace")
    assert code == 0, said
    # vLLM 0.32's own noise at interpreter exit, not ours: EngineZmqListeners.__del__ calls
    # contextlib after the module is torn down (its sockets are closed before, by shutdown).
    said = re.sub(VLLM_EXIT_NOISE, "", said)
    assert not group.group_alive(), group.group_members()
    for alarming in ("ERROR", "Traceback", "exit code", "died"):
        assert alarming not in said, said
    group.start()  # for the kill -9 that follows


def test_kill9_of_the_front_takes_every_process_with_it(group):
    assert len(group.group_members()) >= 5  # front, engine core, its worker, 2 API processes
    gone_s = group.kill9()
    assert gone_s < 60
