"""The public listener of a server with several API processes: each request to its user's.

Every user belongs to one API process (:func:`owner`, a hash of the name), which holds their
desk: the memory thread that is the only writer of their memory, their retriever's index, their
memory worker. The front reads the request's token, finds the user (``users.db``, as the API
processes do; cached) and passes the request on, body and response streamed, over that
process's Unix socket; the API process authenticates it again and answers, so a token the
front cannot place (missing, wrong, revoked) goes to process 0 for its 401. A client that goes
away mid-stream closes the front's connection to the API process, which aborts the request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from app.serve.users import Users

log = logging.getLogger(__name__)

# Hop-by-hop headers (RFC 9110 7.6.1): each connection's own, never passed on.
HOP_BY_HOP = {
    b"connection",
    b"keep-alive",
    b"proxy-connection",
    b"te",
    b"trailer",
    b"transfer-encoding",
    b"upgrade",
}
ROUTES_CACHED = 4096  # tokens whose user the front remembers
UPSTREAM_CONNECTIONS = 512  # open to each API process at most (streams in flight)


def owner(name: str, count: int) -> int:
    """The API process (0..count-1) that serves user ``name``: the same on every start."""
    return zlib.crc32(name.encode()) % count


class Front:
    """An ASGI app that forwards each request to the API process of its user."""

    def __init__(self, users_db: Path, sockets: Sequence[Path]) -> None:
        self.users = Users(users_db)
        self.sockets = list(sockets)
        self._routes: dict[str, int] = {}  # token -> API process
        self._clients: list[httpx.AsyncClient] = []

    def route(self, headers: dict[bytes, bytes]) -> int:
        """The API process for a request with these headers (0 when no user is found)."""
        scheme, _, token = headers.get(b"authorization", b"").decode("latin-1").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return 0
        index = self._routes.get(token)
        if index is None:
            user = self.users.authenticate(token)
            if user is None:  # not cached: a token made later must still reach its user
                return 0
            if len(self._routes) >= ROUTES_CACHED:
                self._routes.clear()
            index = self._routes[token] = owner(user.name, len(self.sockets))
        return index

    def _client(self, index: int) -> httpx.AsyncClient:
        if not self._clients:  # made on the server's event loop, their connections too
            self._clients = [
                httpx.AsyncClient(
                    transport=httpx.AsyncHTTPTransport(uds=str(path)),
                    base_url="http://inferscale-api",
                    timeout=httpx.Timeout(None),
                    # Bounded: a Unix socket refuses connects beyond its accept backlog
                    # (EAGAIN), seen as 503s when 6,000 requests came at once; beyond
                    # the bound, requests wait for a connection instead.
                    limits=httpx.Limits(
                        max_connections=UPSTREAM_CONNECTIONS,
                        max_keepalive_connections=UPSTREAM_CONNECTIONS,
                        keepalive_expiry=5.0,
                    ),
                )
                for path in self.sockets
            ]
        return self._clients[index]

    async def close(self) -> None:
        for client in self._clients:
            await client.aclose()
        self.users.close()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":  # no websockets here
            return
        headers = dict(scope["headers"])
        index = self.route(headers)
        client = self._client(index)
        path = scope["raw_path"] or scope["path"].encode()
        if scope["query_string"]:
            path += b"?" + scope["query_string"]
        forwarded = [(k, v) for k, v in scope["headers"] if k.lower() not in HOP_BY_HOP]
        # Read whole (within the server's limits: BodyLimit in front of this app), so that
        # the connection pool may send it again on a fresh connection when a kept-alive one
        # turns out closed (a stream, read once, went out empty then: seen on the H200).
        content = await _read_body(receive)
        if content is None:  # the client went away first
            return
        request = client.build_request(
            scope["method"], path.decode("latin-1"), headers=forwarded, content=content
        )
        try:
            response = await client.send(request, stream=True)
        except httpx.TransportError as exc:
            log.warning(
                "%s %s: API process %d: %s: %s",
                scope["method"],
                scope["path"],
                index,
                type(exc).__name__,
                exc,
            )
            await _plain(
                send,
                503,
                b'{"error": {"message": "the API process is not reachable",'
                b' "type": "server_error"}}',
            )
            return
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": response.status_code,
                    "headers": [
                        (k, v) for k, v in response.headers.raw if k.lower() not in HOP_BY_HOP
                    ],
                }
            )
            await _stream(response, receive, send)
        finally:
            await response.aclose()  # mid-stream: the API process sees its client go

    async def _lifespan(self, receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.close()
                await send({"type": "lifespan.shutdown.complete"})
                return


async def _read_body(receive: Any) -> bytes | None:
    """The request's body, or None if the client disconnected first."""
    parts = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        parts.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(parts)


async def _stream(response: httpx.Response, receive: Any, send: Any) -> None:
    """The API process's response to the client, until it ends or the client goes away."""

    async def forward() -> None:
        async for piece in response.aiter_raw():
            await send({"type": "http.response.body", "body": piece, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def gone() -> None:  # the body is read: what comes next can only be a disconnect
        while (await receive())["type"] != "http.disconnect":
            pass

    forwarding = asyncio.ensure_future(forward())
    watching = asyncio.ensure_future(gone())
    try:
        await asyncio.wait({forwarding, watching}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (forwarding, watching):
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError, OSError):
            await forwarding
    if forwarding.done() and not forwarding.cancelled() and forwarding.exception():
        raise forwarding.exception()  # type: ignore[misc]


async def _plain(send: Any, status: int, body: bytes) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json")],
        }
    )
    await send({"type": "http.response.body", "body": body})
