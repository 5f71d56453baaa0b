"""The edge every request passes before a route (app/serve/edge.py), in ``serve`` and in
``serve --api-processes 2`` (the front and its API processes): the token first, from the
headers alone, then the body's size for its route; one ``Authorization`` header; the API
processes' socket folder in the runtime dir, a killed server's removed at the next start."""

from __future__ import annotations

import socket
from pathlib import Path

import httpx
import pytest

from tests.importers._helpers import FIXTURES
from tests.serve.conftest import RuntimeDirServer, started
from tests.serve.test_serve_api import auth, model_name

MIB = 1 << 20
BIG_MIB = 200  # an unauthenticated body, as in the attack (issue 35, finding 2)
ERROR_KEYS = {"message", "type", "param", "code"}  # OpenAI's error object


@pytest.fixture(scope="module", params=[1, 2], ids=["one-process", "front"])
def edge(request: pytest.FixtureRequest) -> RuntimeDirServer:
    """The package's shared ``serve``, in one process or behind the front."""
    return started(request.getfixturevalue("one_process" if request.param == 1 else "front"))


def raw_post(
    port: int,
    path: str,
    *,
    token: str | None = None,
    length: int = 0,
    chunked: bool = False,
    send_mib: int = 0,
    wait_s: float = 10.0,
) -> int | None:
    """POST over a raw socket: the headers (``Content-Length: length``, or chunked), then up
    to ``send_mib`` MiB of body for as long as the server takes it. The response's status, or
    None if the connection ended without one reaching us (closed on a body still coming)."""
    head = [f"POST {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", "Content-Type: application/json"]
    if token is not None:
        head.append(f"Authorization: Bearer {token}")
    head.append("Transfer-Encoding: chunked" if chunked else f"Content-Length: {length}")
    piece = b"x" * MIB
    if chunked:
        piece = b"%x\r\n%s\r\n" % (MIB, piece)
    with socket.create_connection(("127.0.0.1", port), timeout=wait_s) as sock:
        sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode())
        try:
            for _ in range(send_mib):
                sock.sendall(piece)
            if chunked and send_mib:
                sock.sendall(b"0\r\n\r\n")
        except OSError:  # the server answered and closed, or stopped reading
            pass
        try:
            line = sock.makefile("rb").readline()
        except OSError:
            return None
    return int(line.split()[1]) if line.startswith(b"HTTP/") else None


def memory_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise KeyError(field)


def test_the_token_is_checked_before_a_byte_of_the_body(edge):
    """A 401 (and a 413 over the limit) comes while the body has not been sent at all: no
    route, and not the front, waits for it first."""
    chat = "/v1/chat/completions"
    imports = "/v1/memories/import"
    assert raw_post(edge.port, chat, length=1000, wait_s=10) == 401
    assert raw_post(edge.port, imports, token="isk-wrong", length=BIG_MIB * MIB) == 401
    assert raw_post(edge.port, chat, token=edge.tokens["bo"], length=2 * MIB) == 413
    # Malformed JSON without a token: 401, not the 400 that would show it was parsed.
    r = httpx.post(f"{edge.base}/chat/completions", content=b'{"model": ')
    assert r.status_code == 401 and set(r.json()["error"]) == ERROR_KEYS


def test_unauthenticated_big_bodies_leave_every_process_as_it_was(edge):
    """Five 200 MB bodies without a valid token (declared and chunked): every process of
    the server (front, API processes, engine) within +50 MiB of before, at its peak too."""
    pids = edge.pids()
    before = {pid: memory_kib(pid, "VmRSS") for pid in pids}
    for pid in pids:  # the peak (VmHWM) from here on
        Path(f"/proc/{pid}/clear_refs").write_text("5")
    for i in range(5):
        token = None if i % 2 == 0 else "isk-wrong"
        chunked = i >= 3
        length = 0 if chunked else BIG_MIB * MIB
        status = raw_post(
            edge.port,
            "/v1/memories/import",
            token=token,
            length=length,
            chunked=chunked,
            send_mib=BIG_MIB,
        )
        assert status in (401, None), status  # None: closed on the body still coming
    grown = {
        pid: (max(memory_kib(pid, "VmRSS"), memory_kib(pid, "VmHWM")) - before[pid]) // 1024
        for pid in pids
    }
    print(f"MiB grown per process (RSS or peak over RSS before): {grown}")
    assert max(grown.values()) < 50, f"MiB grown per process: {grown}"
    assert httpx.get(f"{edge.base}/models", headers=auth(edge.tokens["ana"])).is_success


def test_two_authorization_headers_are_refused(edge):
    """Two headers are read by nobody: whichever one a front or an API process picked, the
    request could open a user's memory in a process that does not own it."""
    ana, bo = (f"Bearer {edge.tokens[u]}" for u in ("ana", "bo"))
    for pair in ((ana, bo), (bo, ana), (ana, ana)):
        headers = [("Authorization", value) for value in pair]
        r = httpx.get(f"{edge.base}/status", headers=headers, timeout=30)
        assert r.status_code == 400, r.text
        assert set(r.json()["error"]) == ERROR_KEYS and "Authorization" in r.text
    r = httpx.get(f"{edge.base}/status", headers={"Authorization": bo}, timeout=30)
    assert r.status_code == 200 and r.json()["api_process"] == (edge.api_processes - 1)


def test_a_chunked_body_over_the_limit_gets_413(edge):
    """413 with OpenAI's error body, as for a declared length (the body is cut at the limit,
    in one process as behind the front)."""

    def pieces():
        yield b'{"model": "x", "messages": [{"role": "user", "content": "'
        for _ in range(17):  # 1 MiB + 64 KiB of content, chunked (no Content-Length)
            yield b"y" * (64 << 10)
        yield b'"}]}'

    r = httpx.post(
        f"{edge.base}/chat/completions",
        content=pieces(),
        headers=auth(edge.tokens["bo"]),
        timeout=30,
    )
    assert r.status_code == 413, r.text
    assert set(r.json()["error"]) == ERROR_KEYS
    assert "limit" in r.json()["error"]["message"]
    assert model_name(edge)  # the server goes on


def test_an_import_of_unknown_length_streams_through(edge):
    """A chunked upload (the front streams it to the API process) is imported whole."""
    export = (FIXTURES / "chatgpt" / "conversations.json").read_bytes()

    def pieces():
        for start in range(0, len(export), 4096):
            yield export[start : start + 4096]

    r = httpx.post(
        f"{edge.base}/memories/import?filename=conversations.json",
        content=pieces(),
        headers=auth(edge.tokens["fay"]),  # the shared servers' importer
        timeout=120,
    )
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "imported" and r.json()["turns_added"] > 0


def test_a_killed_servers_socket_folder_is_removed_at_the_next_start(edge):
    if edge.api_processes == 1:
        pytest.skip("one process: no Unix sockets")
    root = edge.runtime / "inferscale-assistant"
    [folder] = root.glob("serve-*")
    assert sorted(p.name for p in folder.iterdir()) == ["api-0.sock", "api-1.sock"]
    assert folder.stat().st_mode & 0o777 == 0o700 and root.stat().st_mode & 0o777 == 0o700
    edge.kill9()
    assert folder.exists()  # nobody left to remove it
    edge.start()
    [now] = root.glob("serve-*")
    assert now != folder and not folder.exists()
