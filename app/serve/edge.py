"""The server's edge: what a request passes before any route reads it, in one process and in
the front of several alike (``server.py`` and ``launch.py`` put :class:`Edge` outermost).

In this order, from the headers alone: one ``Authorization`` header (:func:`bearer_token`, the
one parser of it: a front and an API process that picked different ones of two would open a
user's memory in the wrong process), a token of a user (else 401), then the body's size for its
route: a declared ``Content-Length`` over the limit is refused before a byte of the body is
read, a chunked body is counted as it streams and cut at the limit. So no body is read without
a valid token, and none past its limit. Refusals carry OpenAI's error body (400, 401, 413);
one refused with a body still on its way closes the connection instead of reading the rest.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.serve.protocol import error

OPEN_PATHS = frozenset({"/health"})  # answered without a token (and without a body)
MISSING_TOKEN = (
    "missing API token: send 'Authorization: Bearer <token>' (the server's admin makes one"
    " with `inferscale-assistant users add NAME`)"
)


class HeaderError(ValueError):
    """A request whose headers cannot say who it is from."""


def bearer_token(headers: Iterable[tuple[bytes, bytes]]) -> str | None:
    """The bearer token of a request's raw (ASGI) headers, or None without one.

    Raises HeaderError for more than one ``Authorization`` header: which one counted would
    depend on who reads them (a dict keeps the last, Starlette's ``get`` the first)."""
    values = [value for name, value in headers if name.lower() == b"authorization"]
    if len(values) > 1:
        raise HeaderError(f"{len(values)} Authorization headers: send one")
    if not values:
        return None
    scheme, _, token = values[0].decode("latin-1").partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


class Edge:
    """ASGI middleware: the token, then the body's size, before ``app`` sees the request.

    ``authenticate(token)`` gives the user (or None: 401); it is put in ``scope["user"]``
    (Starlette's place for it) for the routes and the front. Paths ending in ``/import``
    may carry ``import_limit`` bytes, others ``limit``."""

    def __init__(
        self,
        app: ASGIApp,
        authenticate: Callable[[str], Any],
        limit: int,
        import_limit: int,
    ) -> None:
        self.app, self.authenticate = app, authenticate
        self.limit, self.import_limit = limit, import_limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # lifespan
            await self.app(scope, receive, send)
            return
        headers = scope["headers"]
        pending = _has_body(headers)  # refusing it: close rather than read it
        if scope["path"] not in OPEN_PATHS:
            try:
                token = bearer_token(headers)
            except HeaderError as exc:
                await refuse(send, 400, str(exc), close=pending)
                return
            user = None if token is None else self.authenticate(token)
            if user is None:
                message = MISSING_TOKEN if token is None else "invalid API token"
                await refuse(send, 401, message, "authentication_error", close=pending)
                return
            scope["user"] = user
        limit = self.import_limit if scope["path"].endswith("/import") else self.limit
        if _declared_length(headers) > limit:
            await _too_large(send, limit)
            return
        received = 0
        started = refused = False

        async def counted() -> Message:
            nonlocal received, refused
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:  # cut here: answered, and the app sees its client go
                    refused = True
                    if not started:
                        await _too_large(send, limit)
                    return {"type": "http.disconnect"}
            return message

        async def watched(message: Message) -> None:
            nonlocal started
            if refused:  # the edge answered: whatever the app says after is dropped
                return
            started = started or message["type"] == "http.response.start"
            await send(message)

        await self.app(scope, counted, watched)


async def refuse(
    send: Send,
    status: int,
    message: str,
    kind: str = "invalid_request_error",
    *,
    close: bool = False,
) -> None:
    """Answer ``status`` with OpenAI's error body (``close``: and close the connection, the
    request's body unread)."""
    headers = [(b"content-type", b"application/json")]
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    if close:
        headers.append((b"connection", b"close"))
    body = json.dumps(error(message, kind)).encode()
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _too_large(send: Send, limit: int) -> None:
    message = f"the request body is over the limit of {limit:,} bytes"
    await refuse(send, 413, message, close=True)


def _declared_length(headers: Iterable[tuple[bytes, bytes]]) -> int:
    """The largest ``Content-Length`` declared (0 without one; the HTTP server refuses a
    malformed one before the app)."""
    lengths = [v.strip() for k, v in headers if k.lower() == b"content-length"]
    return max((int(v) for v in lengths if v.isdigit()), default=0)


def _has_body(headers: Iterable[tuple[bytes, bytes]]) -> bool:
    return any(
        (k == b"content-length" and v.strip() not in (b"", b"0")) or k == b"transfer-encoding"
        for k, v in ((k.lower(), v) for k, v in headers)
    )
