"""``serve`` end to end on the CPU engine: the official ``openai`` client against the real
server on loopback, two users with 50 memories each, errors, disconnects, the soak bench's load
for 15 s and a kill -9."""

from __future__ import annotations

import sqlite3
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from tests.importers._helpers import FIXTURES
from tests.serve.conftest import idle_connection_still_served, started

NAMES = [
    f"{a}{b}" for a in ("Ka", "Lo", "Mi", "Nu", "Pe") for b in ("ran", "tis", "vel", "dor", "mex")
]
CITIES = ["Lisbon", "Oslo", "Quito", "Hanoi", "Lagos", "Perth", "Tunis", "Lima", "Riga", "Cork"]
TOPICS = ["beekeeping", "violins", "rowing", "ceramics", "orchids", "chess", "kites", "sourdough"]


def ana_facts() -> list[str]:
    return [f"My friend {NAMES[i % 25]}{i} lives in {CITIES[i % 10]}." for i in range(50)]


def bo_facts() -> list[str]:
    return [
        f"Project {i} at my studio is about {TOPICS[i % 8]} and started in {1990 + i}."
        for i in range(50)
    ]


QUESTIONS = {
    "ana": [f"Where does my friend {NAMES[i % 25]}{i} live?" for i in range(0, 50, 5)],
    "bo": [f"What is project {i} at my studio about?" for i in range(0, 50, 5)],
}


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def status(server, user: str) -> dict:
    r = httpx.get(f"{server.base}/status", headers=auth(server.tokens[user]), timeout=30)
    r.raise_for_status()
    return r.json()


def hang_up_on_a_whole_reply(server, user: str, content: str, within_s: float) -> None:
    """Ask ``user``'s long reply without streaming, give up after 3 s, and check the request
    left the engine, as a client's abort, within ``within_s`` seconds."""
    body = {
        "model": model_name(server),
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 1500,
        "min_tokens": 1500,  # still running after 3 s, whatever the model says
        "temperature": 0,
        "store": False,
    }
    aborted = status(server, user)["aborted_by_clients"]
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            f"{server.base}/chat/completions",
            json=body,
            headers=auth(server.tokens[user]),
            timeout=httpx.Timeout(30, read=3),
        )
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        now = status(server, user)
        if now["requests_in_engine"] == 0 and now["aborted_by_clients"] > aborted:
            return
        time.sleep(0.2)
    pytest.fail(f"the request still ran after the client left: {now}")


def wait_encoded(server, user: str, facts: int, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        memory = status(server, user)["memory"]
        if memory["facts"] == facts and memory["not_encoded"] == 0:
            return
        time.sleep(0.5)
    pytest.fail(f"{user}: not encoded in {timeout:.0f} s: {memory}")


def remember_all(server, user: str, texts: list[str]) -> list[int]:
    ids = []
    with httpx.Client(headers=auth(server.tokens[user]), timeout=60) as client:
        for text in texts:
            r = client.post(f"{server.base}/memories", json={"text": text})
            assert r.status_code == 201, r.text
            ids.append(r.json()["id"])
    return ids


@pytest.fixture(scope="module")
def server(one_process):
    """The package's one-process ``serve``; this module uses it first (ana and bo get their 50
    memories each on a fresh server) and kills it last (a kill -9 mid-encode, then a start)."""
    return started(one_process)


@pytest.fixture(scope="module")
def memories(server) -> dict[str, set[int]]:
    """ana and bo with 50 memories each, all encoded."""
    ids = {
        "ana": remember_all(server, "ana", ana_facts()),
        "bo": remember_all(server, "bo", bo_facts()),
    }
    for user in ids:
        wait_encoded(server, user, 50)
    return {user: set(v) for user, v in ids.items()}


def client(server, user: str) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=server.base, api_key=server.tokens[user], max_retries=0, timeout=600
    )


def model_name(server) -> str:
    return client(server, "ana").models.list().data[0].id


def ask(server, user: str, question: str, stream: bool) -> tuple[str, list[dict]]:
    """One greedy answer (not logged: ``store=False``) and the memories it used."""
    api = client(server, user)
    kwargs = dict(
        model=model_name(server),
        messages=[{"role": "user", "content": question}],
        max_tokens=16,
        temperature=0,
        store=False,
    )
    if not stream:
        done = api.chat.completions.create(**kwargs)
        return done.choices[0].message.content, done.model_extra["memories"]
    text, memories = [], None
    for piece in api.chat.completions.create(stream=True, **kwargs):
        if piece.choices and piece.choices[0].delta.content:
            text.append(piece.choices[0].delta.content)
        if piece.model_extra.get("memories") is not None:
            memories = piece.model_extra["memories"]
    assert memories is not None, "the last chunk names the memories"
    return "".join(text), memories


def test_concurrent_users_get_their_own_memory_and_the_same_answers(server, memories):
    alone = {
        (user, q): ask(server, user, q, stream=False) for user, qs in QUESTIONS.items() for q in qs
    }
    jobs = [(user, q, n % 2 == 0) for n in range(5) for user, qs in QUESTIONS.items() for q in qs]
    assert len(jobs) == 100
    with ThreadPoolExecutor(len(jobs)) as pool:
        futures = [(job, pool.submit(ask, server, *job)) for job in jobs]
        results = [(job, f.result()) for job, f in futures]  # any error fails the test here
    for (user, question, _), (text, used) in results:
        other = memories["bo" if user == "ana" else "ana"]
        injected = {m["id"] for m in used if m["how"] == "injected"}
        assert len(used) == 10 and injected == {m["id"] for m in used}, used
        assert injected <= memories[user] and not injected & other
        assert text == alone[(user, question)][0], (user, question)
    assert status(server, "ana")["requests_in_engine"] == 0


def test_a_client_cannot_name_kv_or_salt(server, memories):
    """What a client sends never decides which KV is loaded: the fields are refused before
    anything reaches the engine (the connector's own check is tested in test_signed_loads)."""
    ana_key = sqlite_keys(server, "ana")[0]
    forged = {"inferscale": {"v": 1, "entries": [[ana_key, 0, 10]]}}
    before = status(server, "bo")
    for field, value in (("kv_transfer_params", forged), ("cache_salt", "inferscale/ana")):
        r = httpx.post(
            f"{server.base}/chat/completions",
            headers=auth(server.tokens["bo"]),
            json={
                "model": model_name(server),
                "messages": [{"role": "user", "content": "hi"}],
                field: value,
            },
        )
        assert r.status_code == 400 and field in r.json()["error"]["message"]
    with pytest.raises(openai.BadRequestError):
        client(server, "bo").chat.completions.create(
            model=model_name(server),
            messages=[{"role": "user", "content": "hi"}],
            extra_body={"kv_transfer_params": forged},
        )
    assert status(server, "bo")["memory"] == before["memory"]


def sqlite_keys(server, user: str) -> list[str]:
    with sqlite3.connect(server.data / "users.db") as users:  # the user's id: their profile
        (user_id,) = users.execute("SELECT id FROM users WHERE name = ?", (user,)).fetchone()
    with sqlite3.connect(server.data / "memory.db") as db:
        return [
            row[0]
            for row in db.execute(
                "SELECT k.location FROM kv_entries k JOIN facts f ON f.id = k.fact_id"
                " JOIN profiles p ON p.id = f.profile_id WHERE p.name = ?",
                (f"user:{user_id}",),
            )
        ]


def test_errors(server, memories):
    base, model = server.base, model_name(server)
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    assert httpx.get(f"{base}/models").status_code == 401
    assert httpx.get(f"{base}/models", headers=auth("isk-wrong")).status_code == 401
    assert (
        httpx.post(f"{base}/chat/completions", json=body, headers=auth("nope")).status_code == 401
    )
    bo = auth(server.tokens["bo"])
    ana_fact = min(memories["ana"])
    assert httpx.get(f"{base}/memories/{ana_fact}", headers=bo).status_code == 404
    assert httpx.delete(f"{base}/memories/{ana_fact}", headers=bo).status_code == 404
    r = httpx.get(f"{base}/memories/{ana_fact}", headers=auth(server.tokens["ana"]))
    assert r.status_code == 200 and r.json()["id"] == ana_fact
    big = {**body, "messages": [{"role": "user", "content": "x" * (2 << 20)}]}
    assert httpx.post(f"{base}/chat/completions", json=big, headers=bo).status_code == 413
    r = httpx.post(f"{base}/chat/completions", content=b'{"model": ', headers=bo)
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]
    r = httpx.post(f"{base}/chat/completions", json={**body, "temprature": 0}, headers=bo)
    assert r.status_code == 400 and "temprature" in r.json()["error"]["message"]
    r = httpx.post(f"{base}/chat/completions", json={**body, "model": "gpt-4o"}, headers=bo)
    assert r.status_code == 404 and model in r.json()["error"]["message"]
    with pytest.raises(openai.NotFoundError):
        client(server, "bo").chat.completions.create(model="gpt-4o", messages=body["messages"])


def test_min_tokens_makes_every_reply_that_long(server, memories):
    """vLLM's ``min_tokens`` (the openai client's extra_body): end-of-text and the loop guard
    wait for it, so a bench compares equal work; more than the reply's tokens is a 400."""
    api = client(server, "ana")
    messages = [{"role": "user", "content": "Say yes."}]
    # how long the reply is when the model ends it (end-of-text or the loop guard): what the
    # 135M model says depends on the memories' KV, so the length is read, not assumed
    short = api.chat.completions.create(
        model=model_name(server), messages=messages, max_tokens=160, temperature=0, store=False
    )
    assert short.choices[0].finish_reason == "stop", short.usage
    longer = short.usage.completion_tokens + 8
    forced = api.chat.completions.create(
        model=model_name(server),
        messages=messages,
        max_tokens=longer,
        temperature=0,
        store=False,
        extra_body={"min_tokens": longer},
    )
    assert forced.usage.completion_tokens == longer
    assert forced.choices[0].finish_reason == "length"
    with pytest.raises(openai.BadRequestError, match="min_tokens"):
        api.chat.completions.create(
            model=model_name(server),
            messages=messages,
            max_tokens=8,
            store=False,
            extra_body={"min_tokens": 9},
        )


def test_an_idle_connection_outlives_the_clients_pool_expiry(server):
    """httpx (under the official client) keeps an idle connection 5 s; a server that closes
    one at the same age races it, and a request sent as it closes gets no response."""
    assert idle_connection_still_served(server.port, idle_s=6.0)


def test_search_retrieves_what_a_chat_would(server, memories):
    """Without a k, a search returns the server's k (the config's 10, what a chat injects);
    only the caller's own facts, best first."""
    ana = auth(server.tokens["ana"])
    question = QUESTIONS["ana"][0]
    r = httpx.post(f"{server.base}/memories/search", json={"query": question}, headers=ana)
    assert r.status_code == 200, r.text
    hits = r.json()["data"]
    assert len(hits) == 10 and [h["rank"] for h in hits] == list(range(1, 11))
    assert {h["id"] for h in hits} <= memories["ana"]
    r = httpx.post(f"{server.base}/memories/search", json={"query": question, "k": 3}, headers=ana)
    found = r.json()["data"]  # its own search (2k candidates a list): not hits[:3] always
    assert len(found) == 3 and {h["id"] for h in found} <= memories["ana"]


def test_a_client_that_goes_away_aborts_its_request(server, memories):
    body = {
        "model": model_name(server),
        "messages": [{"role": "user", "content": "Count from 1 to 1000, one number a line."}],
        "max_tokens": 1500,
        "min_tokens": 1500,  # a reply still streaming when the client leaves, whatever it says
        "temperature": 0,
        "stream": True,
        "store": False,
    }
    aborted = status(server, "cy")["aborted_by_clients"]
    with httpx.stream(
        "POST",
        f"{server.base}/chat/completions",
        json=body,
        headers=auth(server.tokens["cy"]),
        timeout=60,
    ) as r:
        got = []  # a few pieces of a long reply, then hang up
        for line in r.iter_lines():
            got.append(line)
            if len(got) == 8:
                break
    assert len(got) == 8 and any('"content"' in line for line in got), got
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        now = status(server, "cy")
        if now["requests_in_engine"] == 0 and now["aborted_by_clients"] > aborted:
            return
        time.sleep(0.2)
    pytest.fail(f"the request still ran after the client left: {now}")


def test_import_an_export_and_quarantine_a_broken_one(server, memories):
    base, ed = server.base, auth(server.tokens["ed"])
    export = (FIXTURES / "chatgpt" / "conversations.json").read_bytes()
    url = f"{base}/memories/import?filename=conversations.json"
    r = httpx.post(url, content=export, headers=ed, timeout=120)
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "imported" and r.json()["turns_added"] > 0
    again = httpx.post(url, content=export, headers=ed, timeout=120).json()
    assert again["status"] == "skipped" and again["turns_added"] == 0  # once only
    broken = f"{base}/memories/import?filename=broken.json"
    r = httpx.post(broken, content=b'[{"mapping": ', headers=ed)
    assert r.status_code == 422 and "not imported" in r.json()["error"]["message"]
    quarantine = server.data / "inbox" / "ed" / "quarantine"
    assert sorted(p.name for p in quarantine.iterdir()) == ["broken.json", "broken.json.reason.txt"]
    assert (quarantine / "broken.json.reason.txt").read_text().strip()


def test_logs_hold_no_memory_text(server, memories):
    text = server.log.read_text(errors="replace")
    leaked = [fact for fact in ana_facts() + bo_facts() if fact in text]
    assert not leaked, leaked[:3]


def test_the_soak_bench_load_runs_without_errors(server):
    """bench/serve_soak.py's mixed load (chats streamed or not, hang-ups, remember, forget,
    search) on this server for 15 s: every request succeeds, the hung-up ones leave the
    engine, and the report samples every process's memory (its figures go to BENCHMARKS.md,
    not to a test's threshold)."""
    import asyncio

    from bench.serve_soak import SoakSettings, soak

    server.tokens["soak"] = server.add_user("soak")
    tokens = {"soak": server.tokens["soak"]}
    settings = SoakSettings(seconds=15, clients=4, warmup_s=5, sample_s=2)
    report = asyncio.run(
        soak(server.base, tokens, server.proc.pid, settings, model=model_name(server))
    )
    assert report["errors"] == 0, report["error_examples"]
    assert report["requests"] >= settings.clients
    assert len(report["samples"]) >= 3
    rss = report["rss"]
    assert rss["baseline_mib"] > 0 and rss["end_mib"] > 0
    assert len(rss["processes"]) >= 2  # the server and vLLM's engine core
    # In flight after the load: the last chats and the encodings of what the load remembered
    # (seen: 7 still queued 20 s on, on a busy 2-core machine); all of them finish. The engine
    # can be empty for a moment before the memory worker sends those encodings (seen: 0 in the
    # engine, then 6 encodings of the 6 facts not yet encoded), so wait for both to settle. A
    # hung-up request that was not aborted never would: a generous deadline keeps it exact.
    deadline = time.monotonic() + 180
    after = status(server, "soak")
    while (after["requests_in_engine"] or after["memory"]["not_encoded"]) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.5)
        after = status(server, "soak")
    assert after["requests_in_engine"] == 0, f"{after}\nthe server's log:\n{server.log_tail()}"
    assert after["memory"]["not_encoded"] == 0, after


def test_kill9_during_encoding_loses_and_duplicates_nothing(server, memories):
    facts = [f"Cy's recipe {i} needs {TOPICS[i % 8]} and {CITIES[i % 10]} salt." for i in range(50)]
    remember_all(server, "cy", facts)
    assert status(server, "cy")["memory"]["not_encoded"] > 0, "killed while encoding"
    gone_s = server.kill9()
    server.start()
    wait_encoded(server, "cy", 50)
    r = httpx.get(f"{server.base}/memories/export", headers=auth(server.tokens["cy"]))
    texts = [f["text"] for f in r.json()["facts"]]
    assert sorted(texts) == sorted(facts)  # none lost, none twice
    keys = sqlite_keys(server, "cy")
    assert len(keys) == len(set(keys)) == 50
    store = next((server.data / "kv").iterdir())
    assert all(list(store.glob(f"{key}.*")) for key in keys), "an entry file is missing"
    assert gone_s < 60
