"""The public listener of a server with several API processes: each request to its user's.

Every user belongs to one API process (:func:`owner`, a hash of the name), which holds their
desk: the memory thread that is the only writer of their memory, their retriever's index, their
memory worker. The front sits behind the same :class:`~app.serve.edge.Edge` as each API
process: a request without a valid token gets its 401 there, and one over its size limit its
413, before its body is read. Then it goes on over its user's process's Unix socket, which
checks it again and answers: a body up to :data:`BUFFERED_BYTES` whole, a larger one (an
import) streamed as it arrives, the response streamed back. A client that goes away, mid-stream
or while a whole reply is made, closes the front's connection to the API process, which
aborts the request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import zlib
from collections.abc import AsyncIterator, Awaitable, Sequence
from pathlib import Path
from typing import Any

import httpx

from app.serve.edge import refuse
from app.serve.users import Users

UPSTREAM = "http://inferscale-api"  # the API processes' URL (over their Unix sockets)

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
UPSTREAM_CONNECTIONS = 512  # open to each API process at most (streams in flight)
BUFFERED_BYTES = 1 << 20  # bodies up to this size go on whole; larger ones (imports) streamed


def owner(name: str, count: int) -> int:
    """The API process (0..count-1) that serves user ``name``: the same on every start."""
    return zlib.crc32(name.encode()) % count


class Front:
    """An ASGI app that forwards each request to the API process of its user."""

    def __init__(self, users_db: Path, sockets: Sequence[Path]) -> None:
        self.users = Users(users_db)  # for the edge in front of this app (launch.py)
        self.sockets = list(sockets)
        self._clients: list[httpx.AsyncClient] = []  # kept-alive connections
        self._uploads: list[httpx.AsyncClient] = []  # a fresh connection per streamed body

    def route(self, scope: dict[str, Any]) -> int:
        """The API process for a request: its user's (the edge put the user in the scope);
        0 for the paths that need no token."""
        user = scope.get("user")
        return 0 if user is None else owner(user.name, len(self.sockets))

    def _client(self, index: int, streamed: bool) -> httpx.AsyncClient:
        if not self._clients:  # made on the server's event loop, their connections too
            self._clients = [_upstream(path, UPSTREAM_CONNECTIONS) for path in self.sockets]
            self._uploads = [_upstream(path, 0) for path in self.sockets]
        return (self._uploads if streamed else self._clients)[index]

    async def close(self) -> None:
        for client in self._clients + self._uploads:
            await client.aclose()
        self.users.close()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":  # no websockets here
            return
        index = self.route(scope)
        path = scope["raw_path"] or scope["path"].encode()
        if scope["query_string"]:
            path += b"?" + scope["query_string"]
        forwarded = [(k, v) for k, v in scope["headers"] if k.lower() not in HOP_BY_HOP]
        # A body up to BUFFERED_BYTES is read whole (the edge in front of this app has checked
        # the token and cuts it at its limit), so that the connection pool may send it again
        # on a fresh connection when a kept-alive one turns out closed (a stream, read once,
        # went out empty then: seen on the H200). A larger one, or one of unknown length, is
        # passed on as it arrives, on a connection of its own: never more than a piece held.
        streamed = not 0 <= _declared(scope["headers"]) <= BUFFERED_BYTES
        client = self._client(index, streamed)
        if streamed:
            content: bytes | AsyncIterator[bytes] = _body_pieces(receive)
        else:
            whole = await _read_body(receive)
            if whole is None:  # the client went away first
                return
            content = whole
        # An absolute URL: a relative one starting with "//" would be read as naming a host
        # ("//x/v1/models" went on as /v1/models; others raised InvalidURL, a 500).
        url = UPSTREAM + path.decode("latin-1")
        try:
            request = client.build_request(scope["method"], url, headers=forwarded, content=content)
        except httpx.InvalidURL:
            await refuse(send, 400, "the request's path is not a valid URL path")
            return
        # Once the body is read, a client's going is watched for: while the API process works
        # on a reply that comes at its end (not streamed), the request is then cancelled,
        # which closes its connection, and the API process aborts it in the engine.
        watching = None if streamed else asyncio.ensure_future(_gone(receive))
        try:
            response = await _sent(client.send(request, stream=True), watching)
        except (_ClientGone, httpx.TransportError) as exc:
            if watching is not None:
                watching.cancel()
            if isinstance(exc, _ClientGone):  # mid-body (or cut at its limit by the edge)
                return
            log.warning(
                "%s %s: API process %d: %s: %s",
                scope["method"],
                scope["path"],
                index,
                type(exc).__name__,
                exc,
            )
            await refuse(send, 503, "the API process is not reachable", "server_error")
            return
        if response is None:  # the client went first
            return
        watching = watching or asyncio.ensure_future(_gone(receive))
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
            await _stream(response, watching, send)
        finally:
            watching.cancel()
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


def _upstream(path: Path, keepalive: int) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=httpx.AsyncHTTPTransport(uds=str(path)),
        base_url=UPSTREAM,
        timeout=httpx.Timeout(None),
        # Bounded: a Unix socket refuses connects beyond its accept backlog (EAGAIN), seen as
        # 503s when 6,000 requests came at once; beyond the bound, requests wait for one.
        limits=httpx.Limits(
            max_connections=UPSTREAM_CONNECTIONS,
            max_keepalive_connections=keepalive,
            keepalive_expiry=5.0,
        ),
    )


class _ClientGone(Exception):
    pass


def _declared(headers: list[tuple[bytes, bytes]]) -> int:
    """The body's declared length; 0 without a body, -1 for one of unknown length (chunked)."""
    declared = -1 if any(k.lower() == b"transfer-encoding" for k, _ in headers) else 0
    for name, value in headers:
        if name.lower() == b"content-length" and value.strip().isdigit():
            declared = int(value)
    return declared


async def _body_pieces(receive: Any) -> AsyncIterator[bytes]:
    """The request's body as it arrives (raises _ClientGone if the client disconnects)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _ClientGone
        if message.get("body"):
            yield message["body"]
        if not message.get("more_body", False):
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


async def _sent(
    sending: Awaitable[httpx.Response], watching: asyncio.Future[None] | None
) -> httpx.Response | None:
    """The API process's response, or None if ``watching`` (the client's going) ends first:
    then the request is cancelled, which closes its connection to the API process."""
    task = asyncio.ensure_future(sending)
    if watching is not None:
        try:
            await asyncio.wait({task, watching}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not task.done():  # the client went (or the server stops)
                task.cancel()
        if task.cancelled() or not task.done():
            with contextlib.suppress(asyncio.CancelledError, httpx.TransportError, _ClientGone):
                await task
            return None
    return await task


async def _gone(receive: Any) -> None:
    """Returns when the client disconnects (the request's body is read: nothing else comes)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def _stream(response: httpx.Response, watching: asyncio.Future[None], send: Any) -> None:
    """The API process's response to the client, until it ends or ``watching`` sees the
    client go."""

    async def forward() -> None:
        async for piece in response.aiter_raw():
            await send({"type": "http.response.body", "body": piece, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    forwarding = asyncio.ensure_future(forward())
    try:
        await asyncio.wait({forwarding, watching}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        forwarding.cancel()
        with contextlib.suppress(asyncio.CancelledError, OSError):
            await forwarding
    if forwarding.done() and not forwarding.cancelled() and forwarding.exception():
        raise forwarding.exception()  # type: ignore[misc]
