"""``inferscale-assistant mcp`` driven by the official MCP client over stdio.

The server process finds the resident desk (this test's, on the session's engine, served on its
socket) and starts no engine of its own."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import anyio
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from inferscale_core import paths
from inferscale_core.desk_socket import DeskServer, socket_path
from tests.support.desk import started_desk

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    """A home of the server process's own: its memory is the resident desk's."""
    return tmp_path_factory.mktemp("mcp-home")


@pytest.fixture(scope="module")
def resident(runtime, home):
    db = home / "data" / "memory.db"
    paths.private_dir(db.parent)

    desk = started_desk(runtime, db)
    old = os.environ["INFERSCALE_HOME"]
    os.environ["INFERSCALE_HOME"] = str(home)  # the socket where the server process looks
    try:
        server = DeskServer(desk, socket_path(db, "default"))
    finally:
        os.environ["INFERSCALE_HOME"] = old
    yield desk
    server.close()
    desk.close()


def structured(result) -> object:
    assert not result.is_error, result.content
    found = result.structured_content
    if isinstance(found, dict) and set(found) == {"result"}:
        return found["result"]
    return found


async def _session(home: Path) -> None:
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "app", "mcp"],
        env={**os.environ, "INFERSCALE_HOME": str(home)},
        cwd=str(ROOT),
    )
    async with Client(params, read_timeout_seconds=120) as client:
        names = {tool.name for tool in (await client.list_tools()).tools}
        assert names == {"search_memory", "add_memory", "forget_memory", "recent_conversations"}

        added = structured(
            await client.call_tool(
                "add_memory",
                {"text": "My brother Tomas keeps bees in Evora.", "refers_to": "2026-10-03"},
            )
        )
        assert added["text"].startswith("My brother Tomas") and added["refers_to"] == "2026-10-03"
        hits = structured(await client.call_tool("search_memory", {"query": "Who keeps bees?"}))
        assert hits[0]["id"] == added["id"] and hits[0]["refers_to"] == "2026-10-03"
        assert hits[0]["rank"] == 1 and hits[0]["created_at"]

        assert structured(await client.call_tool("forget_memory", {"id": added["id"]})) == {
            "forgotten": added["id"]
        }
        hits = structured(await client.call_tool("search_memory", {"query": "Who keeps bees?"}))
        assert added["id"] not in [h["id"] for h in hits]
        again = await client.call_tool("forget_memory", {"id": added["id"]})
        assert again.is_error and "no memory" in again.content[0].text

        # Malformed arguments: an MCP error, and the server goes on.
        for name, arguments in (
            ("search_memory", {"query": ""}),
            ("search_memory", {"query": "bees", "k": "many"}),
            ("add_memory", {"text": "x", "refers_to": "2026-13-45"}),
            ("forget_memory", {}),
            ("recent_conversations", {"limit": -1}),
        ):
            bad = await client.call_tool(name, arguments)
            assert bad.is_error, (name, arguments)
        recent = structured(await client.call_tool("recent_conversations", {"limit": 3}))
        assert isinstance(recent, list)
        assert json.dumps(recent)  # plain data


def test_an_mcp_client_adds_searches_and_forgets_through_the_resident_desk(resident, home):
    anyio.run(_session, home)
    # what the MCP server did went into the resident desk's memory
    assert "Tomas" not in json.dumps(resident.search("Who keeps bees?", k=5))
