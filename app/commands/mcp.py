"""``inferscale-assistant mcp``: the memory as an MCP server (stdio), for local agents.

Tools: ``search_memory``, ``add_memory``, ``forget_memory``, ``recent_conversations``. The server
uses the resident assistant (the open chat app, or ``inferscale-assistant daemon``) when one
runs; otherwise it opens the memory itself, starts the engine in the background (a new memory is
encoded by it) and serves the desk to the other commands while it runs.

stdout is the protocol's: the MCP SDK points fd 1 at stderr while it serves, and the engine
starts after that, so nothing else reaches the wire.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import AsyncIterator
from datetime import date
from typing import Annotated, Any

from pydantic import Field  # the tools' argument rules (annotations read at registration)
from rich.console import Console

from app.user_config import load_config

INSTRUCTIONS = """\
The user's long-term memory, kept on this machine by InferScale assistant. Search it before
answering questions about the user's life, people, plans and preferences; add a memory when the
user states a durable fact about themselves; forget one when they ask you to. Each memory has an
id, its text, the day it refers to (refers_to), when it was learned (created_at), and, once a
later memory replaced it, valid_until."""


def build_server(desk: Any) -> Any:
    """The MCP server over ``desk`` (a :class:`~inferscale_core.desk.Desk` or a
    :class:`~inferscale_core.desk_socket.RemoteDesk`: the same plain-data methods)."""
    import anyio
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError

    server = MCPServer("inferscale-memory", instructions=INSTRUCTIONS)

    async def on_desk(fn: Any, *args: Any, **kwargs: Any) -> Any:
        """Run a desk call on a thread; its refusals become the tool's error."""
        from inferscale_core.desk import SessionNotReadyError

        try:
            return await anyio.to_thread.run_sync(lambda: fn(*args, **kwargs))
        except (ValueError, LookupError, SessionNotReadyError) as exc:
            raise ToolError(str(exc)) from exc

    @server.tool()
    async def search_memory(
        query: Annotated[str, Field(min_length=1, max_length=4000, description="the question")],
        k: Annotated[int, Field(ge=1, le=200, description="how many memories")] = 10,
    ) -> list[dict[str, Any]]:
        """The memories the assistant would use to answer `query`, best first, each with its
        id, text, refers_to (the day it is about), created_at, valid_until, score and rank."""
        hits = await on_desk(desk.search, query, k)
        keep = ("id", "text", "refers_to", "created_at", "valid_until", "score", "rank")
        return [{name: hit.get(name) for name in keep} for hit in hits]

    @server.tool()
    async def add_memory(
        text: Annotated[str, Field(min_length=1, max_length=4000, description="the fact")],
        refers_to: Annotated[
            date | None, Field(description="the day the fact is about (YYYY-MM-DD), if any")
        ] = None,
    ) -> dict[str, Any]:
        """Remember a fact about the user (deduplicated); it is searchable at once."""
        day = refers_to.isoformat() if refers_to else None
        fact = await on_desk(desk.add_fact, text, day)
        return {name: fact.get(name) for name in ("id", "text", "refers_to", "created_at")}

    @server.tool()
    async def forget_memory(
        id: Annotated[int, Field(ge=1, description="the memory's id, from search_memory")],
    ) -> dict[str, Any]:
        """Forget a memory for good: its text, its index entry and its stored KV."""
        if not await on_desk(desk.forget, id):
            raise ToolError(f"no memory #{id} to forget (unknown, or already forgotten)")
        return {"forgotten": id}

    @server.tool()
    async def recent_conversations(
        limit: Annotated[int, Field(ge=1, le=200, description="how many")] = 10,
    ) -> list[dict[str, Any]]:
        """The user's conversations with the assistant, most recently active first."""
        return await on_desk(desk.recent_conversations, limit)

    return server


@contextlib.asynccontextmanager
async def _door(config: Any, verbose: bool) -> AsyncIterator[Any]:
    """The resident desk, or one of this process's own (served while it runs)."""
    from app.resident import Resident, connect
    from inferscale_core.desk_socket import DeskBusyError

    remote = connect(config)
    if remote is None:
        try:
            resident = Resident(config, verbose=verbose)
        except DeskBusyError:  # another one started meanwhile
            remote = connect(config)
        else:
            resident.start()
            try:
                yield resident.desk
            finally:
                resident.close()
            return
    if remote is None:
        raise RuntimeError("the resident assistant went away as this server started")
    with remote:
        yield remote


def run_mcp(config: Any, verbose: bool = False) -> int:
    import anyio

    from app.startup import quiet_engine_logs

    if not verbose:
        quiet_engine_logs()

    async def serve() -> None:
        from mcp.server.stdio import stdio_server

        async with stdio_server() as (read, write), _door(config, verbose) as desk:
            server = build_server(desk)
            low = server._lowlevel_server  # noqa: SLF001 - the SDK's documented stdio pattern
            await low.run(read, write, low.create_initialization_options())

    anyio.run(serve)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    mcp = sub.add_parser(
        "mcp",
        help="serve the memory to local agents over MCP (stdio)",
        description="An MCP server on stdin/stdout with the tools search_memory, add_memory,"
        " forget_memory and recent_conversations. It uses the running assistant (the chat app"
        " or `daemon`) when there is one; otherwise it opens the memory itself and starts the"
        " engine in the background (~25 s on a CPU before the first answer). Mount it in an MCP"
        ' client as the command `inferscale-assistant mcp`, e.g. {"mcpServers": {"memory":'
        ' {"command": "inferscale-assistant", "args": ["mcp"]}}}.',
    )
    mcp.set_defaults(func=_run)


def _run(args: argparse.Namespace, console: Console) -> int:
    config = load_config(console)
    if config is None:
        return 2
    return run_mcp(config, verbose=args.verbose)
