"""The TUI on the real engine: a real Session on a temporary fact log, driven with a pilot.

Each app opens its Session on the app's session thread (as the real command does), over the
session's one vLLM engine (the ``runtime`` fixture). Memories are seeded as conversation turns,
so they go through the real extraction, embedding and KV encoding before they are injected.
"""

from __future__ import annotations

import asyncio
import html
import os
import re
import shutil
import statistics
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from textual import events
from textual.widgets import DataTable, Input, Markdown, ProgressBar, Static

from app.tui.app import AssistantApp
from app.tui.screens.dialogs import ConfirmDialog, KeysDialog, TextDialog
from app.tui.screens.import_screen import FileProgress, ImportScreen
from app.tui.screens.memory import MemoryScreen
from app.tui.widgets.conversations import ConversationItem
from app.tui.widgets.memory_panel import MemoryPanel
from app.tui.widgets.prompt import PromptInput
from app.tui.widgets.transcript import ChatMessage
from inferscale_core import wiring
from inferscale_core.config import AppConfig, load
from inferscale_core.extractor import DeterministicExtractor
from inferscale_core.session import SessionConfig
from inferscale_core.types import Conversation, Turn
from tests.support import FIXTURES

pytestmark = [pytest.mark.engine, pytest.mark.asyncio]


SIZE = (120, 40)
SEED = [
    "I adopted a grey cat named Miso from the shelter last week.",
    "My sister Ana moved to Lisbon for a job in biotech.",
    "I started learning the cello and I practise every morning.",
]
BUSY_SEED = [  # enough distinct facts to keep the memory worker busy for a while
    f"On trip number {i} I visited the {place} and bought a {thing} for my {who}."
    for i, (place, thing, who) in enumerate(
        (p, t, w)
        for p in ("old harbour", "mountain village", "night market", "glass museum")
        for t in ("red scarf", "clay teapot", "wooden whistle", "star map")
        for w in ("niece", "grandfather")
    )
]


def _opener(runtime, embedder, db: Path, seed: list[str], gate: threading.Event | None = None):
    """Open a real Session (on the app's session thread) and let it encode ``seed`` first."""

    def open_session(on_step):
        on_step("starting the engine")
        if gate is not None:
            assert gate.wait(120), "the test never opened the gate"
        session = wiring.open_session(
            runtime,
            AppConfig(k=5, w=2),
            db,
            embedder=embedder,  # the session's one MiniLM
            extractor=DeterministicExtractor(),
            session_config=SessionConfig(k=5, w=2, max_tokens=12, history_turns=2),
        )
        if seed:
            now = datetime.now(UTC)
            turns = [Turn("user", text, now) for text in seed]
            session.factlog.add_conversation(session.profile_id, Conversation("seed", turns))
            assert session.worker.wait_idle(timeout=240), session.worker.stats
        on_step("opening the memory")
        return session

    return open_session


def _app(runtime, embedder, tmp_path: Path, seed=SEED, gate=None) -> AssistantApp:
    db = tmp_path / "memory.db"
    return AssistantApp(
        AppConfig(k=5, w=2, recompute=0),  # r=0: every hit injected, what these tests look at
        _opener(runtime, embedder, db, seed, gate),
        db_path=db,
        config_path=tmp_path / "config.toml",
        inbox=tmp_path / "inbox",
        import_root=tmp_path,
    )


def _screen_text(app: AssistantApp, path: Path) -> str:
    """The screen as an SVG file (kept for a look), read back as plain text lines."""
    app.save_screenshot(str(path))
    rows: dict[float, list[tuple[float, str]]] = {}
    pattern = r'<text[^>]*x="([\d.]+)"[^>]*y="([\d.]+)"[^>]*>(.*?)</text>'
    for x, y, text in re.findall(pattern, path.read_text(encoding="utf-8")):
        rows.setdefault(float(y), []).append((float(x), html.unescape(text).replace("\xa0", " ")))
    lines = []
    for y in sorted(rows):
        line = ""
        for x, text in sorted(rows[y]):
            line = line.ljust(round(x / 12.2)) + text  # 12.2 px per cell in Rich's SVG
        lines.append(line)
    return "\n".join(lines)


async def _until(pilot, condition, timeout: float = 120.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            notes = [m.note for m in pilot.app.query(ChatMessage)] if pilot.app.is_running else []
            raise AssertionError(f"timed out waiting for {what or condition}; notes: {notes}")
        await pilot.pause(0.05)


async def _send(pilot, app: AssistantApp, text: str) -> ChatMessage:
    prompt = app.chat.query_one("#prompt", PromptInput)
    prompt.focus()
    prompt.value = text
    await pilot.press("enter")
    await _until(pilot, lambda: app.chat.answering is not None or app.chat.query(ChatMessage))
    message = app.chat.query(ChatMessage).last()
    return message


async def test_chat_streams_a_reply_with_its_memory_and_compares_modes(
    runtime, minilm, tmp_path, monkeypatch
):
    deltas = []
    original = ChatMessage.append

    async def counting_append(self, delta):
        deltas.append(delta)
        await original(self, delta)

    monkeypatch.setattr(ChatMessage, "append", counting_append)
    gate = threading.Event()
    app = _app(runtime, minilm, tmp_path, gate=gate)
    try:
        async with app.run_test(size=SIZE) as pilot:
            # usable at once: typing while the engine "loads" (the gate holds the opener)
            await _until(pilot, lambda: app.load_step == "starting the engine")
            assert app.chat.query_one("#startup").display
            await pilot.press(*"What is the name of my cat?")
            await pilot.press("enter")
            reply = app.chat.query(ChatMessage).last()
            assert "waiting for the engine" in reply.note
            gate.set()
            await _until(pilot, lambda: app.chat.answering is None, what="the first reply")
            assert app.host.ready and not app.chat.query_one("#startup").display
            assert reply.reply is not None, reply.note
            assert len(deltas) > 1  # streamed, not written at once
            markdown = reply.query_one(Markdown)
            assert markdown.source.strip() == reply.reply.text.strip() != ""
            # the memory panel: the injected facts with date, score and tier, k, tokens, TTFT
            panel = app.chat.query_one(MemoryPanel)
            assert panel.shown is reply.reply
            cat = [f for f in reply.reply.facts if "Miso" in f.text]
            assert cat and cat[0].how == "injected" and cat[0].tier in ("device", "host", "disk")
            numbers = str(panel.query_one("#memory-numbers", Static).render())
            assert "KV injection" in numbers and "k 5" in numbers and "TTFT" in numbers
            assert reply.reply.result.injected_tokens > 0
            assert f"injected tokens  {reply.reply.result.injected_tokens:,}" in numbers
            screen_text = _screen_text(app, tmp_path / "chat.svg")
            assert "grey cat named Miso" in screen_text and f"{cat[0].tier} #{cat[0].fact_id}" in (
                screen_text
            )
            # one key switches the next reply to prompt injection; the panel compares both
            await pilot.press("ctrl+t")
            assert app.mode == "prompt"
            second = await _send(pilot, app, "Which animal did I adopt?")
            await _until(pilot, lambda: app.chat.answering is None, what="the second reply")
            assert second.reply is not None and second.reply.mode == "prompt"
            assert second.reply.result.injected_tokens == 0
            assert set(panel.last) == {"inject", "prompt"}
            # the panel draws on its next refresh: on a busy machine after the check above.
            # Both columns are there since the first reply ("–" for prompt), their spacing
            # set by the widest value; what this waits for is the prompt column's own value
            # in the "injected" row (0 tokens), beside the injected reply's count
            await _until(
                pilot,
                lambda: (
                    re.search(r"injected +[\d,]+ +0\b", _screen_text(app, tmp_path / "compare.svg"))
                    is not None
                ),
                timeout=30,
                what="the panel's comparison of both modes",
            )
            assert "last reply per mode" in _screen_text(app, tmp_path / "compare.svg")
            reply.focus()  # selecting an earlier reply shows its memory again
            await _until(pilot, lambda: panel.shown is reply.reply, what="the first reply")
            docs = os.environ.get("INFERSCALE_DOCS_SCREENSHOT")  # how docs/ got its picture
            if docs:
                await pilot.pause(0.3)
                app.save_screenshot(docs)
            # history recall and copy
            prompt = app.chat.query_one("#prompt", PromptInput)
            prompt.focus()
            await pilot.press("up")
            assert prompt.value == "Which animal did I adopt?"
            await pilot.press("up")
            assert prompt.value == "What is the name of my cat?"
            await pilot.press("down", "down")
            assert prompt.value == ""
            await pilot.press("ctrl+y")
            assert app.clipboard == second.reply.text.strip()
            # the conversation is listed and logged
            infos = await app.read(lambda log, pid: log.conversations(pid))
            chat = [i for i in infos if i.source == "chat" and i.title != "seed"]
            assert len(chat) == 1 and chat[0].turns == 4
    finally:
        app.host.close()


async def test_escape_stops_a_reply(runtime, minilm, tmp_path):
    app = _app(runtime, minilm, tmp_path, seed=[])
    try:
        async with app.run_test(size=SIZE) as pilot:
            await _until(pilot, lambda: app.host.ready, what="the session")
            app.host.session.config.max_tokens = 400
            message = await _send(pilot, app, "Write a long story about a lighthouse keeper.")
            await _until(pilot, lambda: len(message.text) > 0, what="the first tokens")
            await pilot.press("escape")
            await _until(pilot, lambda: app.chat.answering is None, what="the stop")
            assert message.note == "stopped (Esc)" and message.reply is None
            # the engine is free again: the next reply comes normally
            app.host.session.config.max_tokens = 8
            again = await _send(pilot, app, "hi")
            await _until(pilot, lambda: app.chat.answering is None, what="the next reply")
            assert again.reply is not None
    finally:
        app.host.close()


async def test_a_looping_reply_stops_with_a_note_and_an_overlong_turn_is_refused(
    runtime, minilm, tmp_path
):
    from inferscale_core.generation import GREEDY

    app = _app(runtime, minilm, tmp_path, seed=[])
    try:
        async with app.run_test(size=SIZE) as pilot:
            await _until(pilot, lambda: app.host.ready, what="the session")
            config = app.host.session.config
            config.max_tokens, config.sampling = 512, GREEDY  # no penalty: SmolLM2 loops on it
            looping = await _send(
                pilot,
                app,
                "Hi! I'm Dana. My daughter Aiko started violin lessons last week, and our dog is"
                " a beagle named Pretzel.",
            )
            await _until(pilot, lambda: app.chat.answering is None, 300, "the looping reply")
            assert "stopped: the reply began repeating itself" in looping.note
            assert "stopped: the reply began repeating" in _screen_text(app, tmp_path / "loop.svg")
            config.max_tokens = 12
            refused = await _send(pilot, app, "lorem ipsum dolor sit amet " * 3200)
            await _until(pilot, lambda: app.chat.answering is None, what="the refusal")
            assert refused.note.startswith("not sent: the message is") and refused.reply is None
            assert "Shorten it or split it" in refused.note
            again = await _send(pilot, app, "What is my dog called?")
            await _until(pilot, lambda: app.chat.answering is None, what="the next reply")
            assert again.reply is not None and again.text.strip()
            turns = await app.read(
                lambda log, pid: log.conversation_turns(app.chat.conversation_id)
            )
            assert [t.speaker for _, t in turns] == ["user", "assistant"] * 2  # not the long one
    finally:
        app.host.close()


async def test_memory_browser_edits_and_forgets_a_fact(runtime, minilm, tmp_path):
    app = _app(runtime, minilm, tmp_path)
    try:
        async with app.run_test(size=SIZE) as pilot:
            await _until(pilot, lambda: app.host.ready, what="the session")
            session = app.host.session
            await pilot.press("f4")
            screen = app.screen
            assert isinstance(screen, MemoryScreen)
            table = screen.query_one("#facts", DataTable)
            await _until(pilot, lambda: table.row_count == len(SEED), what="the facts")
            # edit: the old fact is superseded by a new one, with an audit row
            screen.query_one("#fact-search").value = "cello"
            await _until(pilot, lambda: table.row_count == 1, what="the cello fact")
            (cello_id,) = screen.facts
            table.focus()
            await pilot.press("e")
            await _until(pilot, lambda: isinstance(app.screen, TextDialog), what="the editor")
            app.screen.query_one(Input).value = "I started learning the viola"
            await pilot.press("enter")
            texts = lambda: [f.text for f in screen.facts.values()]  # noqa: E731
            await _until(pilot, lambda: "I started learning the viola" in texts(), what="edit")
            assert screen.query_one("#fact-search", Input).value == ""  # kept in view
            viola_id = screen.selected_id
            assert screen.facts[viola_id].text == "I started learning the viola"
            old = await app.read(lambda log, pid: log.get_fact(cello_id))
            new = await app.read(lambda log, pid: log.get_fact(viola_id))
            assert old.status == "superseded" and new.supersedes == cello_id
            detail = str(screen.query_one("#fact-detail", Static).render())
            assert "update" in detail and "was: I started learning the cello" in detail
            # forget, after confirming
            screen.query_one("#fact-search").value = "Miso"
            await _until(pilot, lambda: viola_id not in screen.facts, what="the search")
            (cat_id,) = screen.facts
            detail_view = screen.query_one("#fact-detail", Static)
            await _until(pilot, lambda: "Miso" in str(detail_view.render()), what="its detail")
            keys = await app.call(lambda s: s.factlog.kv_keys(cat_id))
            assert keys and all(session.builder.store.has(k) for k in keys)
            detail = str(screen.query_one("#fact-detail", Static).render())
            assert "Source turns" in detail and "grey cat named Miso" in detail
            assert "Audit" in detail and "add" in detail
            table.focus()
            await pilot.press("f")
            await _until(pilot, lambda: isinstance(app.screen, ConfirmDialog), what="the dialog")
            await pilot.press("y")
            await _until(pilot, lambda: table.row_count == 0, what="the forgotten fact to go")
            fact = await app.read(lambda log, pid: log.get_fact(cat_id))
            assert fact.status == "forgotten" and fact.text == ""
            assert not any(session.builder.store.has(k) for k in keys)
            hits = await app.call(lambda s: s.retriever.search(s.profile_id, "my cat Miso", 5))
            assert cat_id not in [h.fact.id for h in hits]
            screen.query_one("#fact-search").value = ""
            await _until(pilot, lambda: table.row_count == len(SEED) - 1, what="the others")
            table.focus()
            await pilot.press("a")  # show all: the forgotten and the replaced ones too
            await _until(pilot, lambda: table.row_count == len(SEED) + 1, what="all facts")
            assert screen.facts[cello_id].status == "superseded"
            assert screen.facts[cat_id].status == "forgotten"
    finally:
        app.host.close()


async def test_import_shows_a_bar_per_file_and_the_quarantined_files(runtime, minilm, tmp_path):
    folder = tmp_path / "exports"
    folder.mkdir()
    shutil.copy(FIXTURES / "jsonl" / "chat.jsonl", folder / "chat.jsonl")
    shutil.copy(FIXTURES / "markdown" / "transcript.md", folder / "transcript.md")
    (folder / "broken.json").write_text('{"this is": "not an export"', encoding="utf-8")
    app = _app(runtime, minilm, tmp_path, seed=[])
    try:
        async with app.run_test(size=SIZE) as pilot:
            await pilot.press("f5")
            screen = app.screen
            assert isinstance(screen, ImportScreen)
            screen.query_one("#import-path").value = str(folder)
            await pilot.press("ctrl+s")
            await _until(pilot, lambda: screen.report is not None, what="the import")
            rows = list(screen.query(FileProgress))
            assert len(rows) == 3
            for row in rows:
                bar = row.query_one(ProgressBar)
                assert bar.total == 1 and bar.progress == 1
            total = screen.query_one("#import-total", ProgressBar)
            assert total.total == 3 and total.progress == 3
            quarantine = screen.query_one("#quarantine", DataTable)
            assert quarantine.row_count == 1
            assert quarantine.get_row_at(0)[0] == "broken.json"
            assert quarantine.get_row_at(0)[1]  # the reason
            assert len(screen.report.imported) == 2
            infos = await app.read(lambda log, pid: log.conversations(pid))
            assert sum(i.turns for i in infos) == screen.report.turns_added > 0
    finally:
        app.host.close()


async def test_keypresses_are_handled_fast_while_the_encoder_is_busy(runtime, minilm, tmp_path):
    app = _app(runtime, minilm, tmp_path, seed=[])
    try:
        async with app.run_test(size=SIZE) as pilot:
            await _until(pilot, lambda: app.host.ready, what="the session")
            worker = app.host.session.worker
            now = datetime.now(UTC)
            turns = [Turn("user", text, now) for text in BUSY_SEED]
            await app.call(
                lambda s: s.factlog.add_conversation(s.profile_id, Conversation("busy", turns))
            )
            worker.wake()
            await _until(pilot, lambda: worker.stats.extracted_facts > 0, what="busy worker")
            prompt = app.chat.query_one("#prompt", PromptInput)
            prompt.focus()
            latencies = []
            encoded_before = worker.stats.encoded_facts
            deadline = time.monotonic() + 60
            while not worker._idle.is_set() and time.monotonic() < deadline:
                char = "abcdefghij"[len(latencies) % 10]
                expected = prompt.value + char
                # As the terminal driver does; pilot.press would also wait for the whole
                # process to go idle, which it never does while the encoder works.
                start = time.perf_counter()
                app.post_message(events.Key(char, char))
                while prompt.value != expected:
                    assert time.perf_counter() - start < 10, "the key was never handled"
                    await asyncio.sleep(0.001)
                latencies.append(time.perf_counter() - start)
                await asyncio.sleep(0.1)
            stats = worker.stats
            encoded = stats.encoded_facts - encoded_before
            median = statistics.median(latencies)
            p95 = statistics.quantiles(latencies, n=20)[-1]
            print(
                f"\nkeypress latency while the memory worker extracted and encoded {encoded} "
                f"facts ({stats.encode_rate:.1f} facts/s): {len(latencies)} keys, median "
                f"{median * 1e3:.1f} ms, p95 {p95 * 1e3:.1f} ms, max {max(latencies) * 1e3:.1f} ms"
            )
            assert encoded >= 16, "the encoder never ran while keys were pressed"
            assert median < 0.1  # the target
            assert p95 < 0.5  # generous: 2 cores shared with other work
    finally:
        app.host.close()


async def test_conversations_settings_keys_and_commands(runtime, minilm, tmp_path):
    app = _app(runtime, minilm, tmp_path)
    try:
        async with app.run_test(size=SIZE) as pilot:
            await _until(pilot, lambda: app.host.ready, what="the session")
            first = await _send(pilot, app, "Tell me about my cat.")
            await _until(pilot, lambda: app.chat.answering is None, what="a reply")
            assert first.reply is not None and first.k == 5
            cid = app.chat.conversation_id
            # rename (Ctrl+R opens a dialog), then find it by the new title
            await pilot.press("ctrl+r")
            await _until(pilot, lambda: isinstance(app.screen, TextDialog), what="the dialog")
            app.screen.query_one(Input).value = "Cat talk"
            await pilot.press("enter")
            titles = lambda: [i.info.title for i in app.chat.query(ConversationItem)]  # noqa: E731
            await _until(pilot, lambda: "Cat talk" in titles(), what="the new title")
            search = app.chat.query_one("#conv-search", Input)
            search.value = "cat t"
            await _until(pilot, lambda: titles() == ["Cat talk"], what="the search")
            search.value = ""
            await _until(pilot, lambda: len(titles()) == 2, what="both chats")
            # settings: k applies to the next reply and is saved to the TOML file
            await pilot.press("f6")
            await _until(pilot, lambda: app.screen.id == "settings", what="settings")
            app.screen.query_one("#set-k", Input).value = "3"
            await pilot.press("ctrl+s")
            await _until(pilot, lambda: app.screen is app.chat, what="settings saved")
            assert app.config.k == 3 and load(tmp_path / "config.toml").k == 3
            second = await _send(pilot, app, "And my sister?")
            await _until(pilot, lambda: app.chat.answering is None, what="a reply")
            assert second.k == 3 and len(second.reply.facts) <= 3
            # the command palette lists the assistant's commands
            titles_in_palette = {c.title for c in app.get_system_commands(app.chat)}
            for title in (
                "New chat",
                "Rename chat",
                "Delete chat",
                "Search chats",
                "Memory panel",
                "Switch injection mode",
                "Copy reply",
                "Memory browser",
                "Import",
                "Settings",
                "Keys",
                "Theme",
            ):
                assert title in titles_in_palette
            # ? shows the keys (when the focus is not in a text box), F1 anywhere
            app.chat.query_one("#transcript").focus()
            await pilot.press("question_mark")
            await _until(pilot, lambda: isinstance(app.screen, KeysDialog), what="the keys")
            keys = dict(pair for _, group in app.screen.groups for pair in group)
            assert keys["escape"] == "Stop" and keys["^t"] == "Inject⇄prompt"
            assert keys["f4"] == "Memories" and keys["f1 ?"] == "Keys" and "^p" in keys
            await pilot.press("f1")
            await _until(pilot, lambda: app.screen is app.chat, what="keys hidden")
            # new chat, then delete the renamed one after confirming
            await pilot.press("ctrl+n")
            assert app.chat.conversation_id is None and app.chat.query("#welcome")
            app.chat.conversation_id = cid
            await pilot.press("f8")
            await _until(pilot, lambda: isinstance(app.screen, ConfirmDialog), what="confirm")
            await pilot.press("y")
            await _until(pilot, lambda: "Cat talk" not in titles(), what="the deletion")
            assert await app.read(lambda log, pid: log.conversation_turns(cid)) == []
    finally:
        app.host.close()


async def test_memory_browser_shows_and_undoes_a_replacement(runtime, minilm, tmp_path):
    seed = ["I live in Lisbon with my partner.", "We moved to Porto with the kids."]
    app = _app(runtime, minilm, tmp_path, seed=seed)
    try:
        async with app.run_test(size=SIZE) as pilot:
            await _until(pilot, lambda: app.host.ready, what="the session")
            hits = await app.call(lambda s: s.retriever.search(s.profile_id, "Where do I live?", 2))
            assert hits[-1].fact.text == seed[1]  # best last: the current home
            await pilot.press("f4")
            screen = app.screen
            table = screen.query_one("#facts", DataTable)
            await _until(pilot, lambda: table.row_count == 2, what="the facts")
            screen.query_one("#fact-search").value = "Lisbon"
            await _until(pilot, lambda: table.row_count == 1, what="the Lisbon fact")
            (lisbon_id,) = screen.facts
            assert str(table.get_cell(str(lisbon_id), "status")).startswith("until ")
            detail = screen.query_one("#fact-detail", Static)
            await _until(pilot, lambda: "true until" in str(detail.render()), what="its end")
            assert "close" in str(detail.render()) and "We moved to Porto" in str(detail.render())
            table.focus()
            await pilot.press("u")
            await _until(
                pilot,
                lambda: screen.facts.get(lisbon_id) and screen.facts[lisbon_id].valid_until is None,
                what="the undo",
            )
            fact = await app.read(lambda log, pid: log.get_fact(lisbon_id))
            assert fact.valid_until is None and fact.ended_by is None
            assert (await app.read(lambda log, pid: log.audit(pid, lisbon_id)))[-1].action == (
                "reopen"
            )
            assert str(table.get_cell(str(lisbon_id), "status")) == "active"
    finally:
        app.host.close()
