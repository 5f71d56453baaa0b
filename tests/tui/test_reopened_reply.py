"""A reopened conversation shows what its replies used: the memory panel reads the details the
fact log stored for each assistant turn (a real SQLite file, the real reader thread; no engine:
the model folder does not exist, so the session never opens, and reading needs none)."""

from __future__ import annotations

import time
from datetime import date
from pathlib import Path

import pytest
from textual.widgets import ListView, Static

from app.commands.chat import make_opener
from app.tui.app import AssistantApp
from app.tui.widgets.conversations import ConversationItem
from app.tui.widgets.memory_panel import MemoryPanel
from app.tui.widgets.transcript import ChatMessage
from inferscale_core.config import AppConfig
from inferscale_core.factlog import FactLog
from inferscale_core.types import Conversation, ReplyDetails, ReplyMemory, Turn
from tests.tui.test_app_engine import SIZE, _screen_text

pytestmark = pytest.mark.asyncio

CAT = "I adopted a grey cat named Miso from the shelter."
TEA = "I switched from coffee to green tea in January."
SECRET = "My locker code is 4417."
NOTE = "left out to fit the context: 2 of 8 memories"


def seed(db: Path) -> tuple[int, int]:
    """A chat whose second reply has stored details (one of its facts since forgotten), and
    an older chat with no details at all; returns their ids."""
    with FactLog.open(db) as log:
        pid = log.profile("default")
        turns = [
            Turn("user", "hello"),
            Turn("assistant", "Hi! How can I help?"),
            Turn("user", "What is my cat called?"),
            Turn("assistant", "Your cat is called Miso."),
        ]
        cid, _ = log.add_conversation(pid, Conversation("Miso the cat", turns, "chat"))
        old, _ = log.add_conversation(pid, Conversation("Before issue 20", turns[:2], "chat"))
        cat, _ = log.add_fact(pid, CAT, refers_to=date(2023, 5, 8))
        tea, _ = log.add_fact(pid, TEA)
        secret, _ = log.add_fact(pid, SECRET)
        reply_turn = log.conversation_turns(cid)[3][0]
        memories = (
            ReplyMemory(cat, CAT, "2023-05-08", 0.83, "injected", "host"),
            ReplyMemory(secret, SECRET, None, 0.41, "injected", "disk"),
            ReplyMemory(tea, TEA, None, 0.22, "text"),
        )
        details = ReplyDetails("inject", 7, memories, (NOTE,), 0.041, 212, 124, 61, 27)
        log.save_reply_details(reply_turn, details)
        log.forget_fact(secret, "forgotten by the user")
    return cid, old


async def until(pilot, condition, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await pilot.pause(0.05)


async def open_from_list(pilot, app: AssistantApp, conversation_id: int) -> list[ChatMessage]:
    """Pick the conversation in the list, as the user does; its messages once shown."""
    view = app.chat.query_one("#conv-list", ListView)
    items = list(app.chat.query(ConversationItem))
    view.focus()
    view.index = next(i for i, item in enumerate(items) if item.info.id == conversation_id)
    await pilot.press("enter")
    await until(pilot, lambda: app.chat.conversation_id == conversation_id, "the conversation")
    await until(pilot, lambda: app.chat.query(ChatMessage), "its messages")
    return list(app.chat.query(ChatMessage))


async def test_a_reopened_reply_shows_the_memory_it_used(tmp_path):
    db = tmp_path / "memory.db"
    cid, old = seed(db)
    config = AppConfig(model=str(tmp_path / "no-such-model"))
    app = AssistantApp(
        config,
        make_opener(config, db),
        db_path=db,
        config_path=tmp_path / "config.toml",
        inbox=tmp_path / "inbox",
        import_root=tmp_path,
    )
    try:
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: len(app.chat.query(ConversationItem)) == 2, "the list")
            messages = await open_from_list(pilot, app, cid)
            assert [m.role for m in messages] == ["user", "assistant"] * 2
            first, second = messages[1], messages[3]
            assert first.reply is None  # nothing stored for it: no panel, as before
            reply = second.reply
            assert reply is not None and (second.k, second.mode) == (7, "inject")
            assert second.note.startswith("inject · 3 memories · TTFT 41 ms")
            assert NOTE in second.note

            second.focus()
            panel = app.chat.query_one(MemoryPanel)
            await until(pilot, lambda: panel.shown is reply, "the panel")
            numbers = str(panel.query_one("#memory-numbers", Static).render())
            for line in (
                "KV injection",
                "k 7 · 3 facts retrieved (2 injected, 0 recomputed, 1 as text)",
                "injected tokens  124",
                "TTFT             41 ms",
                "prompt tokens    212",
                "computed         61",
                "prefix cache     27",
                NOTE,
            ):
                assert line in numbers, numbers
            await until(  # the facts' table renders after the numbers
                pilot,
                lambda: "grey cat named Miso" in _screen_text(app, tmp_path / "reopened.svg"),
                "the facts in the panel",
            )
            screen = _screen_text(app, tmp_path / "reopened.svg")
            assert "grey cat named Miso" in screen and "host #1" in screen
            assert "2023-05-08 0.83" in screen
            assert "as text #2" in screen and "green tea" in screen
            assert "disk #3" in screen and "(forgotten)" in screen
            assert "4417" not in screen  # forgotten: its text is gone from the details too

            # a conversation from before the details were stored opens as it always did
            messages = await open_from_list(pilot, app, old)
            assert [m.reply for m in messages] == [None, None]
            assert panel.shown is None
    finally:
        app.host.close()
