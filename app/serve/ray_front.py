"""The front of ``serve --ray`` (``ray_app.py``): Ray Serve's ingress, behind Ray's HTTP proxy.

Each request meets the edge first (the token, then the size, before a byte of the body is
read: ``edge.py``), as in every API process of ``serve``; then it goes to its user's replica
as a :class:`Relayed` (the body read whole, within the edge's limit), the user's id as Ray
Serve's multiplexed model id (``ray_router.py`` picks the replica), and the response streams
back as the replica's app makes it. A client that goes away, or Ray's proxy cancelling this
call, cancels the replica's call, which aborts the engine request. A replica that dies before
answering is a 503 with ``Retry-After``; one that dies mid-stream ends the stream with an error
event, as the server says an engine's failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from starlette.responses import JSONResponse, Response

from app.serve.edge import Edge
from app.serve.front import HOP_BY_HOP
from app.serve.protocol import error
from app.serve.server import MAX_BODY_BYTES, MAX_IMPORT_BYTES
from app.serve.users import Users

log = logging.getLogger(__name__)

BUSY = "the replica serving you stopped; retry (another one takes your memory over)"


@dataclass(slots=True, frozen=True)
class Relayed:
    """What the front passes on of a request (its body read whole, within the edge's limit)."""

    method: str
    path: str
    raw_path: bytes
    query_string: bytes
    headers: list[tuple[bytes, bytes]]
    client: tuple[str, int] | None
    body: bytes

    def scope(self) -> dict[str, Any]:
        return {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "scheme": "http",
            "method": self.method,
            "path": self.path,
            "raw_path": self.raw_path,
            "root_path": "",
            "query_string": self.query_string,
            "headers": self.headers,
            "client": self.client,
            "server": None,
            "state": {},
        }


front_api = FastAPI(title="InferScale assistant", docs_url=None, redoc_url=None, openapi_url=None)
_front_users: list[Users] = []  # the front replica's users.db (Front.__init__)


def _authenticate(token: str) -> Any:
    return _front_users[0].authenticate(token)


# Outermost, as in every API process: the token, then the size, before a body is read.
front_api.add_middleware(
    Edge, authenticate=_authenticate, limit=MAX_BODY_BYTES, import_limit=MAX_IMPORT_BYTES
)
METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]


class Front:
    """The ingress: each request to the replica of its user (see the module)."""

    def __init__(self, replica: Any, users_db: str) -> None:
        os.umask(0o077)
        _front_users[:] = [Users(users_db)]
        self.replica = replica

    @front_api.api_route("/{path:path}", methods=METHODS)
    async def forward(self, request: Request) -> Response:
        scope = request.scope
        user = scope.get("user")  # None only for the paths the edge lets through untokened
        relayed = Relayed(
            scope["method"],
            scope["path"],
            scope.get("raw_path") or scope["path"].encode(),
            scope.get("query_string", b""),
            list(scope["headers"]),
            tuple(scope["client"]) if scope.get("client") else None,
            await request.body(),
        )
        handle = self.replica.options(
            stream=True, multiplexed_model_id=user.id if user is not None else ""
        )
        return _Relay(handle.http.remote(relayed))


class _Relay(Response):
    """The replica's response streamed to the client as it comes; the client gone (a
    disconnect, or this call cancelled by Ray's proxy) cancels the replica's call."""

    def __init__(self, replies: Any) -> None:
        self.replies = replies  # Ray's DeploymentResponseGenerator
        self.background = None

    async def __call__(self, scope: Any, receive: Callable[..., Any], send: Any) -> None:
        relay = asyncio.ensure_future(self._relay(send))
        watch = asyncio.ensure_future(_disconnected(receive))
        try:
            await asyncio.wait({relay, watch}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watch.cancel()
            if not relay.done():
                self.replies.cancel()
                relay.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await relay

    async def _relay(self, send: Any) -> None:
        started, events = False, False
        try:
            async for item in self.replies:
                if isinstance(item, tuple):
                    status, headers = item
                    headers = [(k, v) for k, v in headers if k.lower() not in HOP_BY_HOP]
                    await send(
                        {"type": "http.response.start", "status": status, "headers": headers}
                    )
                    started = True
                    events = any(
                        k.lower() == b"content-type" and v.startswith(b"text/event-stream")
                        for k, v in headers
                    )
                else:
                    await send({"type": "http.response.body", "body": item, "more_body": True})
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the replica died mid-call, or Ray could not place it
            log.warning("a replica failed a request: %s", type(exc).__name__)
            if not started:
                refusal = JSONResponse(error(BUSY, "server_error"), 503, {"Retry-After": "1"})
                await refusal({"type": "http"}, _no_receive, send)
                return
            if events:  # a stream cut off: said as the server says an engine's failure
                cut = error("the replica serving this reply stopped", "server_error")
                piece = f"data: {json.dumps(cut)}\n\n".encode()
                await send({"type": "http.response.body", "body": piece, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _disconnected(receive: Callable[..., Any]) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _no_receive() -> dict[str, Any]:
    return {"type": "http.disconnect"}
