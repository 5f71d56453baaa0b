"""``bench serve fuzz``: the assistant's HTTP server against random and hostile requests
(issue 35: 0 responses with status 500, 0 tracebacks in its log, its memory back after).

``python -m bench.serve_fuzz --minutes 3 --seed 0 --json OUT.json`` makes a temporary
``INFERSCALE_HOME``, two users with the real ``inferscale-assistant users add``, starts the
real ``inferscale-assistant serve --port P`` on 127.0.0.1 (``--api-processes 2`` with
``--api-processes 2``), remembers a few facts for each user, reads the resident memory of every
server process (:func:`bench.serve_soak.sample`), then sends requests one at a time, each
drawn by ``hypothesis`` (seeded by ``--seed``; generation only, no shrinking, no database):

* routes: the served ones (from the route models and the API's table) and unknown ones (random
  segments, ``..``, percent escapes, long paths), with any method;
* headers: a user's token, none, a garbage or foreign one, two ``Authorization`` headers, an
  odd ``Content-Type``, a large header (up to 6 KiB), a foreign ``Host``;
* bodies: JSON of each route's own schema (``pydantic``'s, the models the routes take: the
  server serves no ``/openapi.json``), then mutated or not: a field of the wrong type, an
  unknown field, deep nesting, huge numbers, a lone surrogate or a NUL in a string, bytes that
  are not UTF-8, truncated JSON, a chunked body;
* ids: real ones (the caller's and the other user's), 0, negative, 20+ digits, not numbers;
* import file names: long, with NUL, slashes, dots, control characters, and small bodies.

Every request goes to ``127.0.0.1`` (checked before it is sent) with a timeout; the run stops
at ``--minutes`` or ``--max-requests``. Then, after ``--idle-s`` of quiet, the memory again.
The report: requests sent, the status histogram, every 5xx (method, route, a short
description of the input, never a user's text), transport errors, the tracebacks in the
server's log (count and first lines), each server process's RSS at start, peak and end and
whether the end is within 10% of the start. Exit status 1 on a 5xx, a traceback or an RSS
past 10%.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.report import provenance, write_json
from bench.serve_http import free_port, stop, wait_healthy
from bench.serve_soak import sample

USERS = ("ana", "bo")
FACTS = 3  # per user, remembered before the run
CONFIG = "k = 5\nrecompute = 0\nmax_tokens = 16\n"
HOST = "127.0.0.1"
TIMEOUT_S = 60.0  # per request
RSS_TOLERANCE = 0.10
FACT_TEXTS = (  # nothing private: the users' memory in this run
    "My sister lives in Lisbon.",
    "The bike lock code is kept in the blue drawer.",
    "Dentist appointment is on a Tuesday.",
)
ROUTES = (  # (method, path template) as the server serves them (docs/SERVING.md)
    ("GET", "/health"),
    ("GET", "/v1/models"),
    ("GET", "/v1/status"),
    ("POST", "/v1/chat/completions"),
    ("GET", "/v1/memories"),
    ("POST", "/v1/memories"),
    ("GET", "/v1/memories/{id}"),
    ("DELETE", "/v1/memories/{id}"),
    ("POST", "/v1/memories/search"),
    ("POST", "/v1/memories/import"),
    ("GET", "/v1/memories/export"),
)
METHODS = ("GET", "POST", "DELETE", "PUT", "PATCH", "OPTIONS", "HEAD")


# ---- the server ----
@dataclass(slots=True)
class Server:
    home: Path
    port: int
    process: subprocess.Popen[bytes]
    tokens: dict[str, str]
    log: Path

    @property
    def root(self) -> str:
        return f"http://{HOST}:{self.port}"


def cli(home: Path, *args: str) -> str:
    env = dict(os.environ, INFERSCALE_HOME=str(home))
    done = subprocess.run(
        [sys.executable, "-m", "app", *args], env=env, capture_output=True, text=True, timeout=120
    )
    if done.returncode != 0:
        raise RuntimeError(f"inferscale-assistant {args[0]} failed: {done.stderr[-500:]}")
    return done.stdout.strip()


@contextlib.contextmanager
def start_server(api_processes: int, start_timeout: float, log: Path) -> Iterator[Server]:
    """A temporary home with :data:`USERS` (``users add``) and ``serve`` over it; stopped
    (its process group) and removed on exit."""
    from inferscale_core import paths

    # The model cache stays the caller's (a built SmolLM2), as the serve tests keep it.
    os.environ.setdefault(paths.CACHE_ENV, str(paths.cache_dir()))
    home = Path(tempfile.mkdtemp(prefix="serve-fuzz-"))
    (home / "config").mkdir()
    (home / "config" / "config.toml").write_text(CONFIG)
    tokens = {name: cli(home, "users", "add", name).splitlines()[-1].strip() for name in USERS}
    port = free_port()
    command = [sys.executable, "-m", "app", "serve", "--host", HOST, "--port", str(port)]
    command += ["--max-model-len", "2048", "--api-processes", str(api_processes)]
    with log.open("wb") as out:
        process = subprocess.Popen(
            command,
            env=dict(os.environ, INFERSCALE_HOME=str(home)),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_healthy(port, process, start_timeout)
        yield Server(home, port, process, tokens, log)
    finally:
        stop(process)
        shutil.rmtree(home, ignore_errors=True)


# ---- requests ----
@dataclass(slots=True)
class Fuzzed:
    """One request to send, and a short description of it (no text of a user's)."""

    method: str
    path: str  # raw, percent escapes kept
    headers: list[tuple[bytes, bytes]]
    body: bytes | None
    route: str  # the template it targets, or "unknown"
    what: list[str] = field(default_factory=list)
    chunked: bool = False

    def __repr__(self) -> str:  # never the tokens or a body
        return f"Fuzzed({self.method} {self.route} {self.what})"


class Done(Exception):  # noqa: N818 (not an error: the time is up)
    """Raised once the run's time is up: hypothesis stops generating."""


def strategies(tokens: dict[str, str], ids: dict[str, list[int]], model: str) -> Any:
    """The ``hypothesis`` strategy of one :class:`Fuzzed` request."""
    from hypothesis import strategies as st

    from app.serve.protocol import ChatRequest, MemorySearch, NewMemory

    schemas = {
        "/v1/chat/completions": ChatRequest.model_json_schema(),
        "/v1/memories": NewMemory.model_json_schema(),
        "/v1/memories/search": MemorySearch.model_json_schema(),
    }
    text = st.text(max_size=40)
    nasty_text = st.one_of(
        text,
        st.sampled_from(["\x00", "a\x00b", "\ud800", "x\udfffy", "\u202e", "\ufeff", "..", "/"]),
        st.text(min_size=3000, max_size=6000),
    )

    def from_schema(schema: dict[str, Any], defs: dict[str, Any], depth: int = 0) -> Any:
        if "$ref" in schema:
            return from_schema(defs[schema["$ref"].rsplit("/", 1)[1]], defs, depth)
        if "anyOf" in schema:
            return st.one_of(*(from_schema(s, defs, depth) for s in schema["anyOf"]))
        if "const" in schema:
            return st.just(schema["const"])
        if "enum" in schema:
            return st.sampled_from(schema["enum"])
        kind = schema.get("type")
        if kind == "object":
            props = schema.get("properties", {})
            required = set(schema.get("required", ()))
            optional = {k: from_schema(v, defs, depth + 1) for k, v in props.items()}
            return st.fixed_dictionaries(
                {k: optional.pop(k) for k in list(optional) if k in required},
                optional=optional,
            )
        if kind == "array":
            return st.lists(from_schema(schema["items"], defs, depth + 1), min_size=1, max_size=3)
        if kind == "string":
            if schema.get("format") == "date":
                return st.one_of(st.dates().map(str), text)
            return st.one_of(st.text(min_size=1, max_size=60), nasty_text)
        if kind == "integer":
            low, high = schema.get("minimum", -5), schema.get("maximum", 64)
            return st.one_of(st.integers(low, high), st.integers(), st.just(10**30))
        if kind == "number":
            return st.one_of(
                st.floats(schema.get("minimum", 0), schema.get("maximum", 2)), st.floats()
            )
        if kind == "boolean":
            return st.booleans()
        if kind == "null":
            return st.none()
        return st.none()

    leaves = st.one_of(
        st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), nasty_text
    )
    shallow = st.one_of(
        leaves, st.lists(leaves, max_size=3), st.dictionaries(text, leaves, max_size=3)
    )
    small_json = st.one_of(
        shallow, st.lists(shallow, max_size=3), st.dictionaries(text, shallow, max_size=3)
    )

    bodies = {route: from_schema(s, s.get("$defs", {})) for route, s in schemas.items()}

    @st.composite
    def mutated(draw: Any, value: Any, what: list[str], valid: int = 4) -> bytes:
        """``value`` as JSON, mutated or not (``valid`` in ``valid`` + 11)."""
        how = draw(
            st.sampled_from(
                ["valid-shape"] * valid
                + ["wrong-type", "extra-field", "deep-nesting", "huge-number", "surrogate"]
                + ["nul", "not-utf8", "truncated", "not-an-object", "empty", "infinity"]
            )
        )
        what.append(f"body:{how}")
        if how == "wrong-type" and isinstance(value, dict) and value:
            key = draw(st.sampled_from(sorted(value)))
            value[key] = draw(small_json)
            what.append(f"field:{key}")
        elif how == "extra-field" and isinstance(value, dict):
            value[draw(text)] = draw(small_json)
        elif how == "deep-nesting":
            depth = draw(st.sampled_from([100, 1000, 20_000, 200_000]))
            what.append(f"depth:{depth}")
            opener, closer = draw(st.sampled_from([("[", "]"), ('{"a":', "}")]))
            core = json.dumps(value, ensure_ascii=True) if draw(st.booleans()) else "1"
            return (opener * depth + core + closer * depth).encode()
        elif how == "huge-number":
            raw = json.dumps(value, ensure_ascii=True)
            number = draw(st.sampled_from(["1" + "0" * 5000, "-1e999", "1e-999", "9" * 30]))
            if isinstance(value, dict) and value:
                key = draw(st.sampled_from(sorted(value)))
                what.append(f"field:{key}")
                value[key] = "@@N@@"
                raw = json.dumps(value, ensure_ascii=True)
            return raw.replace('"@@N@@"', number).encode()
        elif how in ("surrogate", "nul") and isinstance(value, dict) and value:
            key = draw(st.sampled_from(sorted(value)))
            what.append(f"field:{key}")
            value[key] = "a\ud800b" if how == "surrogate" else "a\x00b"
        elif how == "not-utf8":
            return b'{"text": "\xff\xfe\xc3("}'
        elif how == "truncated":
            raw = json.dumps(value, ensure_ascii=True).encode()
            return raw[: draw(st.integers(0, max(0, len(raw) - 1)))]
        elif how == "not-an-object":
            value = draw(small_json)
        elif how == "empty":
            return b""
        elif how == "infinity":
            return b'{"k": Infinity, "limit": NaN}'
        return json.dumps(value, ensure_ascii=True, allow_nan=True).encode()

    def fact_ids() -> Any:
        real = [i for user in ids for i in ids[user]]
        return st.one_of(
            st.sampled_from(real or [1]).map(str),
            st.integers(-(10**25), 10**25).map(str),
            st.sampled_from(["0", "-1", "9" * 23, "1e3", "0x10", "1.5", "%00", "%2e%2e", "NaN"]),
            st.text(min_size=1, max_size=30).map(lambda s: quote(s)),
        )

    def quote(s: str) -> str:
        from urllib.parse import quote as q

        return q(s.encode("utf-8", "surrogatepass"), safe="")

    file_names = st.one_of(
        st.sampled_from(
            ["export.json", "a.md", ".", "..", "../x", "a/b", "a\\b", ".hidden", "a\x00b"]
            + ["x" * 201, "é" * 101, "%", "chat\n.txt", " ", "con", "a" * 199 + ".md"]
        ),
        st.text(min_size=0, max_size=250),
    )
    import_bodies = st.one_of(
        st.binary(max_size=2048),
        st.sampled_from(
            [
                b'{"role": "user", "content": "I like tea."}\n',
                b"# Notes\n\n- I like green tea.\n",
                b"[]",
                b"",
            ]
        ),
    )

    garbage_auth = st.one_of(
        st.sampled_from([b"Bearer", b"Bearer ", b"bearer x", b"Basic YWxhZGRpbg==", b"Token x"]),
        st.binary(max_size=80)
        .filter(lambda b: b"\r" not in b and b"\n" not in b and b"\0" not in b)
        .map(lambda b: b"Bearer " + b),
        st.integers(1, 6000).map(lambda n: b"Bearer " + b"A" * n),
    )
    content_types = st.sampled_from(
        [
            None,
            b"application/json",
            b"application/json; charset=utf-16",
            b"text/plain",
            b"multipart/form-data; boundary=x",
            b"application/x-www-form-urlencoded",
            b"application/octet-stream",
            b"*/*",
            b"application/json;;;",
        ]
    )

    @st.composite
    def request(draw: Any) -> Fuzzed:
        what: list[str] = []
        if draw(st.integers(0, 9)) == 0:  # an unknown route
            segments = draw(
                st.lists(
                    st.one_of(
                        st.sampled_from(["v1", "memories", "..", ".", "%2e%2e", "%00", "", "v2"]),
                        text.map(quote),
                    ),
                    max_size=6,
                )
            )
            path = "/" + "/".join(segments)
            if draw(st.booleans()):
                path += "/" + "x" * draw(st.integers(1, 4000))
            method, route = draw(st.sampled_from(METHODS)), "unknown"
            what.append(f"path-len:{len(path)}")
        else:
            method, route = draw(st.sampled_from(ROUTES))
            if draw(st.integers(0, 9)) == 0:
                method = draw(st.sampled_from(METHODS))
                what.append("other-method")
            path = route.replace("{id}", draw(fact_ids())) if "{id}" in route else route
            if "{id}" in route:
                what.append(f"id:{path.rsplit('/', 1)[1][:30]}")
        query: list[str] = []
        if route == "/v1/memories" and method == "GET":
            if draw(st.booleans()):
                query.append("q=" + quote(draw(nasty_text))[:5000])
            if draw(st.booleans()):
                query.append("limit=" + quote(draw(st.one_of(st.integers().map(str), text))))
        if route == "/v1/memories/import":
            name = draw(file_names)
            what.append(f"filename:len={len(name)}")
            if any(c in name for c in "/\\\x00\n") or name.startswith("."):
                what.append("filename:odd")
            query.append("filename=" + quote(name))
        if draw(st.integers(0, 19)) == 0:
            query.append(quote(draw(text)) + "=" + quote(draw(text)))
        if query:
            path += "?" + "&".join(query)

        headers: list[tuple[bytes, bytes]] = []
        user = draw(st.sampled_from(USERS))
        auth = draw(st.sampled_from(["user"] * 6 + ["none", "garbage", "two", "two-same"]))
        what.append(f"auth:{auth}")
        own = f"Bearer {tokens[user]}".encode()
        other = f"Bearer {tokens[USERS[1] if user == USERS[0] else USERS[0]]}".encode()
        if auth == "user":
            headers.append((b"Authorization", own))
        elif auth == "garbage":
            headers.append((b"Authorization", draw(garbage_auth)))
        elif auth == "two":
            headers += [(b"Authorization", own), (b"Authorization", other)]
        elif auth == "two-same":
            headers += [(b"Authorization", own), (b"authorization", own)]
        content_type = draw(content_types)
        if content_type is not None:
            headers.append((b"Content-Type", content_type))
        extra = draw(st.sampled_from(["none"] * 6 + ["large", "host", "many", "accept"]))
        if extra == "large":
            headers.append((b"X-Fuzz", b"z" * draw(st.integers(1000, 6000))))
        elif extra == "host":
            headers.append((b"Host", b"evil.example"))
        elif extra == "many":
            headers += [(f"X-F{i}".encode(), b"1") for i in range(draw(st.integers(10, 90)))]
        elif extra == "accept":
            headers.append((b"Accept", b"text/event-stream"))
        if extra != "none":
            what.append(f"header:{extra}")

        body: bytes | None = None
        if route == "/v1/memories/import":
            body = draw(import_bodies)
            what.append(f"upload:{len(body)}B")
        elif route in bodies and method == "POST":
            value = draw(bodies[route])
            # mostly short replies: the engine is the CPU's, and shared with the run
            chat = route == "/v1/chat/completions" and isinstance(value, dict)
            if chat and draw(st.integers(0, 9)) > 0:
                value["max_tokens"] = draw(st.integers(1, 8))
                value.pop("max_completion_tokens", None)
            if chat and draw(st.booleans()):  # one the engine runs, unless mutated
                value = {
                    "model": model,
                    "messages": [{"role": "user", "content": draw(st.text(max_size=200))}],
                    "max_tokens": draw(st.integers(1, 8)),
                    "stream": draw(st.booleans()),
                    "store": draw(st.booleans()),
                    "memory": {
                        "mode": draw(st.sampled_from(["inject", "prompt", "none"])),
                        "k": draw(st.integers(0, 10)),
                    },
                }
                what.append("chat:served")
            body = draw(mutated(value, what, valid=4 + 8 * chat))
        elif method in ("POST", "PUT", "PATCH") and draw(st.booleans()):
            body = draw(mutated(draw(small_json), what))
        chunked = body is not None and draw(st.integers(0, 9)) == 0
        if chunked:
            what.append("chunked")
        return Fuzzed(method, path, headers, body, route, what, chunked)

    return request()


# ---- the run ----
@dataclass(slots=True)
class Tally:
    statuses: Counter[str] = field(default_factory=Counter)
    by_route: dict[str, Counter[str]] = field(default_factory=dict)
    server_errors: list[dict[str, Any]] = field(default_factory=list)
    transport_errors: list[dict[str, Any]] = field(default_factory=list)
    sent: int = 0
    not_sent: int = 0  # refused by the client itself
    seconds: float = 0.0


def send(client: Any, root: str, fuzzed: Fuzzed, tally: Tally) -> None:
    import httpx

    url = httpx.URL(root + fuzzed.path) if fuzzed.path.startswith("/") else None
    if url is None or url.host != HOST:  # loopback only, whatever a path says
        raise RuntimeError(f"refusing a request to {fuzzed.path[:80]!r}")
    content: Any = fuzzed.body
    if fuzzed.chunked and fuzzed.body is not None:
        data = fuzzed.body
        content = (data[i : i + 4096] for i in range(0, len(data), 4096))
    request = client.build_request(fuzzed.method, url, headers=fuzzed.headers, content=content)
    if request.url.host != HOST or request.url.port is None:
        raise RuntimeError("refusing a request off loopback")
    key = f"{fuzzed.method} {fuzzed.route}"
    tally.sent += 1
    t0 = time.perf_counter()
    try:
        response = client.send(request, stream=True)
        try:
            for _ in response.iter_raw():
                pass
        finally:
            response.close()
    except httpx.LocalProtocolError:  # h11 would not send it (a control byte in a header)
        tally.sent -= 1
        tally.not_sent += 1
        return
    except httpx.HTTPError as exc:
        tally.statuses[type(exc).__name__] += 1
        tally.transport_errors.append(
            {"request": key, "error": type(exc).__name__, "input": fuzzed.what}
        )
        return
    finally:
        tally.seconds += time.perf_counter() - t0
    status = str(response.status_code)
    tally.statuses[status] += 1
    tally.by_route.setdefault(key, Counter())[status] += 1
    if response.status_code >= 500:
        tally.server_errors.append(
            {"status": response.status_code, "request": key, "input": fuzzed.what}
        )


def remember_facts(server: Server) -> dict[str, list[int]]:
    import httpx

    ids: dict[str, list[int]] = {}
    with httpx.Client(base_url=server.root + "/v1", timeout=TIMEOUT_S) as client:
        for user, token in server.tokens.items():
            for text in FACT_TEXTS[:FACTS]:
                r = client.post(
                    "/memories", json={"text": text}, headers={"Authorization": f"Bearer {token}"}
                )
                r.raise_for_status()
                ids.setdefault(user, []).append(int(r.json()["id"]))
        deadline = time.monotonic() + 300
        for token in server.tokens.values():  # encoded: the run starts from a quiet server
            while time.monotonic() < deadline:
                r = client.get("/status", headers={"Authorization": f"Bearer {token}"})
                if r.json()["memory"]["not_encoded"] == 0:
                    break
                time.sleep(0.5)
    return ids


def server_model(server: Server) -> str:
    import httpx

    token = next(iter(server.tokens.values()))
    r = httpx.get(
        server.root + "/v1/models", headers={"Authorization": f"Bearer {token}"}, timeout=30
    )
    r.raise_for_status()
    return str(r.json()["data"][0]["id"])


def fuzz(server: Server, ids: dict[str, list[int]], args: argparse.Namespace) -> Tally:
    import httpx
    from hypothesis import HealthCheck, Phase, Verbosity, given, settings
    from hypothesis import seed as seeded

    tally = Tally()
    deadline = time.monotonic() + 60 * args.minutes
    client = httpx.Client(timeout=TIMEOUT_S)

    @seeded(args.seed)
    @settings(
        max_examples=args.max_requests,
        phases=[Phase.generate],
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        print_blob=False,
        report_multiple_bugs=False,
        verbosity=Verbosity.quiet,
    )
    @given(strategies(server.tokens, ids, server_model(server)))
    def one(fuzzed: Fuzzed) -> None:
        if time.monotonic() >= deadline:
            raise Done
        send(client, server.root, fuzzed, tally)
        if tally.sent % 200 == 0:
            print(f"{tally.sent} requests: {dict(tally.statuses)}", flush=True)

    try:
        one()
    except Done:
        pass
    finally:
        client.close()
    return tally


TRACEBACK = re.compile(r"Traceback \(most recent call last\)")


def tracebacks(log: Path, since: int) -> dict[str, Any]:
    """The tracebacks the server's log holds past ``since``: their count, and for each of the
    first five the line before it (uvicorn's "Exception in ASGI application") and its last
    (the exception), cut at 200 characters."""
    lines = log.read_bytes()[since:].decode(errors="replace").splitlines()
    found = []
    for i, line in enumerate(lines):
        if TRACEBACK.search(line):
            end = i + 1
            while end < len(lines) and (lines[end].startswith((" ", "\t")) or not lines[end]):
                end += 1
            last = lines[end] if end < len(lines) else ""
            before = lines[i - 1].strip() if i else ""
            found.append({"after": before[:200], "exception": last.strip()[:200]})
    return {"count": len(found), "first": found[:5]}


def rss_report(start: dict[str, Any], samples: Sequence[dict[str, Any]], end: dict[str, Any]):
    """Each process's RSS (MiB) at start, peak and end, and whether its end is within
    :data:`RSS_TOLERANCE` of its start; the same for their sum."""
    rows = []
    for pid, first in start["processes"].items():
        seen = [s["processes"][pid]["rss_kib"] for s in (*samples, end) if pid in s["processes"]]
        last = end["processes"].get(pid)
        row = {
            "pid": int(pid),
            "name": first["name"],
            "start_mib": round(first["rss_kib"] / 1024, 1),
            "peak_mib": round(max([first["rss_kib"], *seen]) / 1024, 1),
            "end_mib": round(last["rss_kib"] / 1024, 1) if last else None,
        }
        row["end_growth_pct"] = (
            round(100 * (last["rss_kib"] - first["rss_kib"]) / first["rss_kib"], 2)
            if last
            else None
        )
        row["within_10pct"] = bool(last) and last["rss_kib"] <= first["rss_kib"] * (
            1 + RSS_TOLERANCE
        )
        rows.append(row)
    total0, total1 = start["rss_kib"], end["rss_kib"]
    return {
        "processes": rows,
        "total_start_mib": round(total0 / 1024, 1),
        "total_peak_mib": round(max(s["rss_kib"] for s in (start, *samples, end)) / 1024, 1),
        "total_end_mib": round(total1 / 1024, 1),
        "total_end_growth_pct": round(100 * (total1 - total0) / total0, 2),
        "within_10pct": all(r["within_10pct"] for r in rows)
        and total1 <= total0 * (1 + RSS_TOLERANCE),
    }


def run(args: argparse.Namespace) -> int:
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    log = out.with_suffix(".server.log")
    t0 = time.perf_counter()
    with start_server(args.api_processes, args.start_timeout, log) as server:
        print(f"server up (pid {server.process.pid}, port {server.port})", flush=True)
        ids = remember_facts(server)
        time.sleep(args.idle_s)
        root = server.process.pid
        start = sample(root, 0.0)
        since = log.stat().st_size
        samples: list[dict[str, Any]] = []
        done = threading.Event()

        def watch(root: int = root) -> None:
            while not done.wait(args.sample_s):
                samples.append(sample(root, time.perf_counter() - t0))

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        t_run = time.perf_counter()
        try:
            tally = fuzz(server, ids, args)
        finally:
            run_s = time.perf_counter() - t_run
            done.set()
            watcher.join()
        time.sleep(args.idle_s)  # the server settles: background encodings, idle connections
        end = sample(root, time.perf_counter() - t0)
        found = tracebacks(log, since)
        rss = rss_report(start, samples, end)
        alive = server.process.poll() is None
    result = {
        **provenance("serve_fuzz", "SmolLM2-135M-Instruct", args.command),
        "seed": args.seed,
        "minutes": args.minutes,
        "api_processes": args.api_processes,
        "run_s": round(run_s, 1),
        "requests": tally.sent,
        "not_sent_by_client": tally.not_sent,
        "requests_per_s": round(tally.sent / run_s, 1) if run_s else None,
        "statuses": dict(sorted(tally.statuses.items())),
        "by_route": {k: dict(sorted(v.items())) for k, v in sorted(tally.by_route.items())},
        "server_errors_5xx": len(tally.server_errors),
        "server_error_examples": tally.server_errors[:50],
        "transport_errors": len(tally.transport_errors),
        "transport_error_examples": tally.transport_errors[:20],
        "tracebacks": found,
        "server_alive_at_end": alive,
        "idle_s": args.idle_s,
        "rss": rss,
        "server_log": str(log),
    }
    write_json(result, out)
    ok = not tally.server_errors and not found["count"] and rss["within_10pct"] and alive
    print(
        json.dumps(
            {
                "requests": result["requests"],
                "statuses": result["statuses"],
                "5xx": result["server_errors_5xx"],
                "tracebacks": found["count"],
                "rss": [
                    (r["name"], r["start_mib"], r["peak_mib"], r["end_mib"])
                    for r in rss["processes"]
                ],
                "rss_within_10pct": rss["within_10pct"],
            }
        )
    )
    return 0 if ok else 1


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="python -m bench.serve_fuzz", description=__doc__)
    parser.add_argument("--minutes", type=float, default=3.0, help="of requests (3)")
    parser.add_argument("--seed", type=int, default=0, help="hypothesis's seed (0)")
    parser.add_argument("--json", required=True, help="the report (its server log beside it)")
    parser.add_argument("--max-requests", type=int, default=50_000, help="at most (50000)")
    parser.add_argument("--api-processes", type=int, default=1, help="serve's (1; or 2)")
    parser.add_argument("--idle-s", type=float, default=20.0, help="quiet before each RSS (20)")
    parser.add_argument("--sample-s", type=float, default=5.0, help="RSS sampling period (5)")
    parser.add_argument("--start-timeout", type=float, default=420.0)
    args = parser.parse_args(argv)
    if args.minutes <= 0 or args.max_requests < 1:
        parser.error("--minutes and --max-requests must be positive")
    args.command = "python -m bench.serve_fuzz " + " ".join(argv)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
