"""What a client sends, checked at the route (issue 35, part B): ids out of SQLite's range, text
with a NUL or a lone surrogate, upload names that are paths or too long, uploads past the
inbox's quota, bodies that are not JSON, a client that hangs up on a reply. Each is answered
with OpenAI's error body and a 4xx, never a 500, and leaves no traceback and no file behind."""

from __future__ import annotations

import json

import httpx
import pytest

from app.serve.memory_routes import INBOX_QUOTA_BYTES
from tests.serve.conftest import STALE_UPLOAD, started
from tests.serve.test_serve_api import auth, hang_up_on_a_whole_reply, model_name


@pytest.fixture(scope="module")
def server(one_process):
    """The package's one-process ``serve``: ana's inbox held an unfinished upload before its
    first start (conftest's ``STALE_UPLOAD``)."""
    return started(one_process)


def openai_error(r: httpx.Response, code: int) -> dict:
    """The body of ``r``, asserted to be ``code`` with OpenAI's error shape."""
    assert r.status_code == code, (r.status_code, r.text)
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["message"] and body["error"]["type"]
    return body["error"]


@pytest.fixture
def log_start(server) -> int:
    """Where the server's log stands when the test begins."""
    return server.log.stat().st_size


def no_traceback(server, since: int) -> None:
    said = server.log.read_bytes()[since:].decode(errors="replace")
    assert "Traceback" not in said and "Exception in ASGI" not in said, said[-4000:]


def uploads_left(server) -> list[str]:
    return [p.name for p in (server.data / "inbox").rglob(".upload-*")]


def raw_json(payload: dict) -> bytes:
    """``payload`` as JSON with ASCII escapes (``"\\ud800"`` as a client can send it; httpx's
    own encoder refuses to write a lone surrogate as UTF-8)."""
    return json.dumps(payload).encode()


def test_unfinished_uploads_are_removed_at_start(server):
    assert not (server.data / "inbox" / "ana" / STALE_UPLOAD).exists()


@pytest.mark.parametrize("fact_id", ["1" + "0" * 22, str(1 << 63), str((1 << 63) - 1), "-1"])
def test_an_id_out_of_range_is_an_unknown_id(server, log_start, fact_id):
    with httpx.Client(headers=auth(server.tokens["ana"]), timeout=30) as api:
        for method in ("GET", "DELETE"):
            r = api.request(method, f"{server.base}/memories/{fact_id}")
            assert openai_error(r, 404)["type"] == "not_found_error"
            assert r.headers.get("connection") != "close"  # the kept-alive one still serves
        assert api.get(f"{server.base}/models").status_code == 200
    no_traceback(server, log_start)


BAD_TEXT = {"surrogate": "before \ud800 after", "nul": "before \x00 after"}


@pytest.mark.parametrize("kind", sorted(BAD_TEXT))
def test_text_with_a_lone_surrogate_or_nul_is_a_400(server, log_start, kind):
    text = BAD_TEXT[kind]
    model = model_name(server)
    requests = [
        ("chat/completions", {"model": model, "messages": [{"role": "user", "content": text}]}),
        (
            "chat/completions",
            {
                "model": model,
                "messages": [{"role": "user", "content": [{"type": "text", "text": text}]}],
            },
        ),
        ("memories", {"text": text}),
        ("memories/search", {"query": text}),
    ]
    ivy = auth(server.tokens["ivy"])  # a user who has remembered nothing
    as_json = {**ivy, "Content-Type": "application/json"}
    for route, payload in requests:
        r = httpx.post(
            f"{server.base}/{route}", content=raw_json(payload), headers=as_json, timeout=60
        )
        error = openai_error(r, 400)
        assert error["param"] and ("NUL" in error["message"] or "surrogate" in error["message"])
    r = httpx.get(f"{server.base}/memories", params={"q": "a\x00b"}, headers=ivy)
    assert openai_error(r, 400)["param"] == "q"
    r = httpx.get(f"{server.base}/memories", params={"q": "x" * 1001}, headers=ivy)
    assert "at most 1000 characters" in openai_error(r, 400)["message"]
    r = httpx.get(f"{server.base}/memories/export", headers=ivy)
    assert r.status_code == 200 and r.json()["facts"] == []  # nothing was remembered
    no_traceback(server, log_start)


@pytest.mark.parametrize(
    "name",
    ["a\x00b.json", "é" * 150 + ".json", "../../x.json", "sub/x.json", "a\\b.json", "..", ".x"],
)
def test_an_upload_name_that_is_no_plain_file_name_is_a_400(server, log_start, name):
    url = f"{server.base}/memories/import"
    r = httpx.post(url, params={"filename": name}, content=b"{}", headers=auth(server.tokens["cy"]))
    assert "filename" in openai_error(r, 400)["message"]
    assert uploads_left(server) == []
    no_traceback(server, log_start)


def test_a_quarantined_upload_says_why_with_its_name_only(server, log_start):
    url = f"{server.base}/memories/import"
    r = httpx.post(
        url,
        params={"filename": "broken.json"},
        content=b'[{"mapping": ',
        headers=auth(server.tokens["cy"]),
    )
    message = openai_error(r, 422)["message"]
    assert "broken.json" in message and str(server.home) not in message, message
    assert str(server.data) not in message and "/inbox" not in message, message
    no_traceback(server, log_start)


def test_uploads_past_the_inbox_quota_are_refused_and_nothing_kept_is_deleted(server, log_start):
    """The user's quarantine already holds nearly their quota (a sparse file: no disk used):
    an upload that does not fit gets a 413 and the old file stays; one that fits is taken."""
    quarantine = server.data / "inbox" / "bo" / "quarantine"
    for folder in (quarantine.parent, quarantine):  # private, as the server makes its own
        folder.mkdir(exist_ok=True, mode=0o700)
    old = quarantine / "old.json"
    with old.open("wb") as f:
        f.truncate(INBOX_QUOTA_BYTES - 1000)
    url = f"{server.base}/memories/import"
    bo = auth(server.tokens["bo"])
    try:
        r = httpx.post(url, params={"filename": "new.json"}, content=b" " * 2000, headers=bo)
        assert "quota" in openai_error(r, 413)["message"]
        assert sorted(p.name for p in quarantine.parent.rglob("*") if p.is_file()) == ["old.json"]
        assert old.stat().st_size == INBOX_QUOTA_BYTES - 1000
        r = httpx.post(url, params={"filename": "small.json"}, content=b"[1]", headers=bo)
        assert r.status_code in (200, 422), r.text  # within the quota: taken and read
    finally:
        old.unlink()
    assert uploads_left(server) == []
    no_traceback(server, log_start)


def test_what_is_not_json_gets_openai_errors(server, log_start):
    ana = auth(server.tokens["ana"])
    chat = f"{server.base}/chat/completions"
    json_type = {"Content-Type": "application/json"}
    for body in (b'{"model": ', b'{"model": "\xff\xfe"}', b"[" * 50_000 + b"]" * 50_000, b"[]"):
        openai_error(httpx.post(chat, content=body, headers={**ana, **json_type}), 400)
    openai_error(
        httpx.post(chat, content=b"{}", headers={**ana, "Content-Type": "text/plain"}), 400
    )
    assert openai_error(httpx.get(f"{server.base}/nothing", headers=ana), 404)["type"] == (
        "not_found_error"
    )
    openai_error(httpx.post(f"{server.base}/models", headers=ana), 405)
    openai_error(httpx.get(f"{server.base}/memories/abc", headers=ana), 400)
    no_traceback(server, log_start)


def test_a_client_that_hangs_up_on_a_reply_aborts_it(server, log_start):
    """Not streamed: the client waits for the whole reply, gives up after 3 s and closes its
    connection; the request leaves the engine as a stream's does (without the abort, this
    reply runs on for minutes: seen 527 tokens in 155 s on the busy 2-core machine)."""
    hang_up_on_a_whole_reply(server, "cy", "Write a very long story about a dragon.", 15)
    no_traceback(server, log_start)


@pytest.fixture(scope="module")
def group(front):
    """``serve --api-processes 2``: ana's requests go to process 0, bo's to process 1."""
    return started(front)


def test_the_same_errors_behind_the_front(group):
    since = group.log.stat().st_size
    model = model_name(group)
    chat = f"{group.base}/chat/completions"
    for user in ("ana", "bo"):
        token = auth(group.tokens[user])
        as_json = {**token, "Content-Type": "application/json"}
        openai_error(httpx.get(f"{group.base}/memories/{'1' + '0' * 22}", headers=token), 404)
        openai_error(httpx.post(chat, content=b'{"model": "\xff"}', headers=as_json), 400)
        openai_error(httpx.post(chat, content=b'{"model": ', headers=as_json), 400)
        surrogate = {"model": model, "messages": [{"role": "user", "content": "\ud800"}]}
        openai_error(httpx.post(chat, content=raw_json(surrogate), headers=as_json), 400)
        url = f"{group.base}/memories/import"
        r = httpx.post(url, params={"filename": "a\x00b.json"}, content=b"{}", headers=token)
        openai_error(r, 400)
        openai_error(httpx.get(f"{group.base}/nothing", headers=token), 404)
        openai_error(httpx.post(chat, content=b"x" * (2 << 20), headers=as_json), 413)
    assert [p.name for p in (group.data / "inbox").rglob(".upload-*")] == []
    no_traceback(group, since)


def test_a_path_that_starts_with_two_slashes_is_a_404_behind_the_front(group):
    """Found by ``bench/serve_fuzz.py``: the front passed ``//x`` on as a relative URL, which
    httpx reads as naming a host (``InvalidURL``): a 500 and a traceback in the log."""
    since = group.log.stat().st_size
    root = group.base.removesuffix("/v1")
    with httpx.Client(headers=auth(group.tokens["ana"]), timeout=30) as api:
        for path in ("//x", "//evil.example/v1/models", "//", "/v1//memories"):
            assert openai_error(api.get(root + path), 404)["type"] == "not_found_error"
        assert api.get(f"{group.base}/models").status_code == 200
    no_traceback(group, since)
