"""The HTTP API: OpenAI's chat completions over each user's memory, and a memory API per user.

Routes (every one but ``/health`` needs ``Authorization: Bearer <token>``)::

    GET    /v1/models                      the one model served
    POST   /v1/chat/completions            OpenAI's; "stream": true for server-sent events
    GET    /v1/memories?q=&limit=          the user's facts, newest first
    POST   /v1/memories                    {"text", "refers_to"?}: remember a fact (201)
    GET    /v1/memories/{id}               one fact (404 unless it is the user's)
    DELETE /v1/memories/{id}               forget it everywhere: log, indexes, KV (204)
    POST   /v1/memories/search             {"query", "k"}: what a question would retrieve
    POST   /v1/memories/import?filename=   an export file as the body (ChatGPT, Claude, ...)
    GET    /v1/memories/export             every active fact, as JSON
    GET    /v1/status                      the caller's requests in flight, memory counts
    GET    /health                         200 once the engine answers

Errors use OpenAI's body (``{"error": {"message", "type", ...}}``): 400 malformed JSON or an
invalid/unknown field, 401 a missing or wrong token, 404 an unknown model or another user's
memory, 413 a body over the limit. Logs hold requests' paths and statuses, never their text.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException

from app.serve import memory_routes
from app.serve.deps import ApiError, DeskDep, UserDep
from app.serve.edge import Edge
from app.serve.hub import Desk, Hub
from app.serve.protocol import (
    ChatRequest,
    chunk,
    completion,
    completion_id,
    error,
    usage,
)
from app.serve.users import Users

if TYPE_CHECKING:
    from inferscale_core.session import PreparedTurn, Reply

log = logging.getLogger(__name__)
T = TypeVar("T")

MAX_BODY_BYTES = 1 << 20  # a chat request (1 MiB holds a long conversation)
MAX_IMPORT_BYTES = 256 << 20  # an export file
OPENING_THREADS = 8  # users' desks opened at once (each loads its index); replies need none


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    first = exc.errors()[0] if exc.errors() else {}
    if first.get("type") in ("json_invalid", "dict_type", "model_attributes_type"):
        return "the request body is not a valid JSON object", None
    loc = [str(part) for part in first.get("loc", ())]
    if loc[:1] in (["body"], ["query"], ["path"]):
        loc = loc[1:]
    where = ".".join(loc) or None
    message = str(first.get("msg", "invalid request")).removeprefix("Value error, ")
    if first.get("type") == "extra_forbidden":
        message = f"unknown field {where!r}"
    return (f"{where}: {message}" if where and where not in message else message), where


def create_app(
    hub: Hub,
    users: Users,
    model_name: str,
    *,
    max_body_bytes: int = MAX_BODY_BYTES,
    max_import_bytes: int = MAX_IMPORT_BYTES,
    inbox: Path | None = None,
    inbox_quota_bytes: int = memory_routes.INBOX_QUOTA_BYTES,
    api_process: int = 0,
) -> FastAPI:
    """The server's ASGI app over ``hub`` (its users' desks and the engine); ``api_process``:
    its number among the server's API processes (``launch.py``), in ``/v1/status``;
    ``inbox_quota_bytes``: what each user's uploads may keep in ``inbox``."""
    app = FastAPI(title="InferScale assistant", docs_url=None, redoc_url=None, openapi_url=None)
    # Outermost: the token, then the size, before any route reads a body (edge.py).
    app.add_middleware(
        Edge, authenticate=users.authenticate, limit=max_body_bytes, import_limit=max_import_bytes
    )
    pool = ThreadPoolExecutor(OPENING_THREADS, thread_name_prefix="open-desk")
    app.state.users, app.state.hub, app.state.pool = users, hub, pool

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
        if exc.status == 503:
            headers = {"Retry-After": "1"}
        return JSONResponse(error(exc.message, exc.kind), exc.status, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = _validation_message(exc)
        return JSONResponse(error(message, param=param), 400)

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
        """Starlette's and FastAPI's own errors (no such route, a method not allowed, a body
        that is not UTF-8) in OpenAI's body, like ours."""
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        if exc.status_code == 404:
            message = f"no route {request.method} {request.url.path}"
        elif exc.status_code == 400:
            message = "the request body is not a valid JSON object (UTF-8 text)"
        else:
            message = str(exc.detail)
        return JSONResponse(error(message, kind), exc.status_code, headers=exc.headers)

    @app.exception_handler(Exception)
    async def _server_error(request: Request, exc: Exception) -> JSONResponse:
        return JSONResponse(error("the server failed this request", "server_error"), 500)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok", "model": model_name}

    @app.get("/v1/models")
    async def models(user: UserDep) -> dict[str, Any]:
        entry = {"id": model_name, "object": "model", "created": 0, "owned_by": "inferscale"}
        return {"object": "list", "data": [entry]}

    @app.get("/v1/status")
    async def status(desk: DeskDep) -> dict[str, Any]:
        """The caller's own: requests in the engine, those their clients stopped, and
        memory (facts, and how many still wait to be encoded). Nothing of other users'."""
        facts, waiting = await desk.run(_memory_counts, desk)
        return {
            "api_process": api_process,
            "requests_in_engine": desk.in_engine,  # the desk's counts: on this loop
            "aborted_by_clients": desk.aborted,
            "memory": {"facts": facts, "not_encoded": waiting},
        }

    @app.post("/v1/chat/completions")
    async def chat(body: ChatRequest, desk: DeskDep, request: Request) -> Any:
        if body.model != model_name:
            raise ApiError(
                404,
                f"model {body.model!r} is not served here; GET /v1/models lists {model_name!r}",
                "not_found_error",
            )
        try:
            question, history = body.question_and_history()
        except ValueError as exc:
            raise ApiError(400, str(exc)) from None
        turn = await desk.run(_prepare, desk, body, question, history)
        ident = completion_id()
        if not body.stream:
            reply = await _while_connected(request, _answer(desk, turn))
            if reply is None:  # the client hung up: its engine request was aborted
                return Response(status_code=499)
            return completion(
                ident,
                model_name,
                reply.text,
                _finish_reason(reply),
                _usage(reply),
                _memories(desk, reply),
            )
        return StreamingResponse(
            _events(desk, turn, ident, model_name, body),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store"},
        )

    memory_routes.add(app, inbox, inbox_quota_bytes)
    return app


# How long an idle kept-alive connection stays open (uvicorn's default is 5 s). Longer than a
# client's pool keeps one idle: httpx's, under the official `openai` client and the front, 5 s.
# At equal times the two race: a request sent on a connection as the server closes it fails
# with no response (seen on the H200: "Server disconnected", a ReadError in the load).
KEEP_ALIVE_S = 60


def run_server(
    app: FastAPI,
    engine: Any,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    uds: str | None = None,
    verbose: bool = False,
) -> None:
    """Serve ``app`` with uvicorn on the serving engine's event loop (``ServingEngine.run``):
    each reply goes from vLLM's output handler to its client with no thread in between.
    On ``host:port``, or on the Unix socket ``uds`` (an API process behind the front).
    Returns when the server stops (Ctrl+C)."""
    import uvicorn

    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        uds=uds,
        timeout_keep_alive=KEEP_ALIVE_S,
        log_level="info" if verbose else "warning",
        access_log=verbose,
        timeout_graceful_shutdown=5,
    )
    server = uvicorn.Server(config)
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl+C: stop serving, then close
        engine.run(server.serve())


def _memory_counts(desk: Desk) -> tuple[int, int]:
    """``(active facts, of them not encoded yet)`` of the desk's user."""
    session = desk.session
    log, profile = session.factlog, session.profile_id
    waiting = log.facts_without_kv(
        profile, session.builder.fingerprint, session.config.w, session.encoding, limit=None
    )
    return log.count_facts(profile).get("active", 0), len(waiting)


def _prepare(
    desk: Desk, body: ChatRequest, question: str, history: list[tuple[str, str]]
) -> PreparedTurn:
    """On the user's memory thread: retrieval and composition (and the user's turn logged)."""
    from inferscale_core.composer import TurnRejected

    session = desk.session
    sampling = session.config.sampling.with_overrides(
        temperature=body.temperature, top_p=body.top_p, min_tokens=body.min_tokens
    )
    most = body.reply_tokens or session.config.max_tokens
    if sampling.min_tokens > most:
        raise ApiError(
            400, f"min_tokens ({sampling.min_tokens}) is more than the reply's {most} tokens"
        )
    try:
        return session.prepare(
            desk.conversation_id if body.store else None,
            question,
            log=body.store,
            history=history,
            max_tokens=body.reply_tokens,
            sampling=sampling,
            k=0 if body.memory.mode == "none" else body.memory.k,
            mode="prompt" if body.memory.mode == "prompt" else "inject",
        )
    except TurnRejected as exc:
        raise ApiError(400, str(exc)) from None


async def _answer(desk: Desk, turn: PreparedTurn, on_delta: Any = None) -> Reply:
    """Stream the reply on the engine's loop (``on_delta(text)`` per piece; the first token
    at once, even before it makes text), then log it on the user's memory thread. A caller
    cancelled mid-reply (a client gone) aborts the engine's request; the reply so far is
    logged all the same."""
    first = True
    try:
        async with contextlib.aclosing(desk.agenerate(turn)) as replies:
            async for delta, _ in replies:
                if (delta or first) and on_delta is not None:
                    await on_delta(delta)
                    first = False
    finally:
        finishing = asyncio.wrap_future(desk.submit(lambda session: session.finish(turn)))
    return await finishing


async def _while_connected(request: Request, work: Awaitable[T]) -> T | None:
    """What ``work`` returns, or None if the client hangs up first: then ``work`` is
    cancelled (a reply's engine request aborted, as a stream's is when its client goes)."""
    task = asyncio.ensure_future(work)

    async def gone() -> None:  # the body is read: what comes next can only be a disconnect
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watch = asyncio.ensure_future(gone())
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        task.cancel()  # a no-op once it is done
    with contextlib.suppress(asyncio.CancelledError):
        return await task
    return None


async def _events(
    desk: Desk, turn: PreparedTurn, ident: str, model: str, body: ChatRequest
) -> AsyncIterator[str]:
    """Server-sent events of one streamed reply. A client that goes away cancels this
    generator, and so the reply (its engine request is aborted)."""
    pieces: asyncio.Queue[str | None] = asyncio.Queue()

    async def on_delta(text: str) -> None:
        await pieces.put(text)

    async def run() -> Reply:
        try:
            return await _answer(desk, turn, on_delta)
        finally:
            await pieces.put(None)

    task = asyncio.ensure_future(run())
    try:
        yield _sse(chunk(ident, model, {"role": "assistant", "content": ""}))
        while (text := await pieces.get()) is not None:
            yield _sse(chunk(ident, model, {"content": text}))
        try:
            reply = await task
        except Exception as exc:  # the engine failed the request
            log.warning("a streamed reply failed: %s", type(exc).__name__)
            yield _sse(error("the engine failed this request", "server_error"))
            return
        extra: dict[str, Any] = {"memories": _memories(desk, reply)}
        if body.stream_options is not None and body.stream_options.include_usage:
            extra["usage"] = _usage(reply)
        yield _sse(chunk(ident, model, {}, _finish_reason(reply), **extra))
        yield "data: [DONE]\n\n"
    finally:
        task.cancel()  # a client gone mid-stream: the reply stops, its request is aborted


def _sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


def _finish_reason(reply: Reply) -> str:
    result = reply.result
    if reply.stopped == "loop" or result is None:
        return "stop"
    return "length" if result.finish_reason == "length" else "stop"


def _usage(reply: Reply) -> dict[str, int]:
    result = reply.result
    if result is None:
        return usage(0, 0)
    return usage(result.prompt_tokens, len(result.token_ids))


def _memories(desk: Desk, reply: Reply) -> list[dict[str, Any]]:
    """The memories a reply used, by the user's own ids (``ids.py``)."""
    return [
        {"id": desk.ids.public(f.fact_id), "how": f.how, "score": round(f.score, 4)}
        for f in reply.facts
    ]
