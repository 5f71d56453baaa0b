"""Snapshots of the main screens at 120x40, on the scripted session (fixed texts and numbers).

Update them after a deliberate UI change with ``pytest tests/tui/test_snapshots.py
--snapshot-update`` and look at the SVGs in ``__snapshots__/`` before committing.
"""

from __future__ import annotations

import os
import shutil
import threading
import time

from textual.widgets import Input

from tests.support import FIXTURES
from tests.tui.fakes import ScriptedSession, scripted_app

SIZE = (120, 40)


async def _until(pilot, condition, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {condition}"
        await pilot.pause(0.02)


async def _ask(pilot, text: str) -> None:
    app = pilot.app
    await _until(pilot, lambda: app.host.ready and app.chat.is_mounted)
    await pilot.press(*text)
    await pilot.press("enter")
    await _until(pilot, lambda: app.chat.answering is None and app.chat.query(".note"))
    await _until(pilot, lambda: app.chat.answering is None)


def _snap(snap_compare, app, run_before, before_close=lambda: None) -> bool:
    async def before(pilot):
        await run_before(pilot)
        for box in pilot.app.screen.query(Input):
            box.cursor_blink = False  # a blinking cursor would differ from run to run
        await pilot.pause(0.1)
        pilot.app.clear_notifications()

    try:
        return snap_compare(app, terminal_size=SIZE, run_before=before)
    finally:
        before_close()
        app.host.close()


def test_chat_with_the_memory_panel(snap_compare, tmp_path):
    async def run_before(pilot):
        await _ask(pilot, "What is my cat called?")
        await pilot.press("ctrl+t")  # the next reply with prompt injection: both compared
        await _ask(pilot, "Where did Miso come from?")

    assert _snap(snap_compare, scripted_app(tmp_path), run_before)


def test_start_up_while_the_engine_loads(snap_compare, tmp_path):
    gate = threading.Event()
    app = scripted_app(tmp_path)
    db = app.host.db_path

    def slow_open(on_step):
        on_step("preparing the model")
        on_step("loading the encoder")
        on_step("starting the engine")
        gate.wait(30)
        return ScriptedSession(db)

    app.host.opener = slow_open

    async def run_before(pilot):
        await _until(pilot, lambda: app.load_step == "starting the engine")
        await pilot.press(*"Hello, are you there?")
        await pilot.press("enter")
        await _until(pilot, lambda: app.chat.answering is not None)

    assert _snap(snap_compare, app, run_before, before_close=gate.set)


async def _memory_browser(pilot) -> None:
    """F4, its facts listed and its footprint line measured (in a home of the test's own: KV
    folders the other tests fill would change the line)."""
    await pilot.press("f4")
    await _until(pilot, lambda: pilot.app.screen.id == "memories" and pilot.app.screen.facts)
    line = pilot.app.screen.query_one("#footprint")
    await _until(pilot, lambda: " · KV " in str(line.render()))


def test_memory_browser(snap_compare, tmp_path, monkeypatch):
    monkeypatch.setenv("INFERSCALE_HOME", str(tmp_path / "home"))

    async def run_before(pilot):
        await _memory_browser(pilot)
        await pilot.press("down", "down", "down", "down")  # the cat: source turn and audit

    assert _snap(snap_compare, scripted_app(tmp_path), run_before)


def test_forget_asks_first(snap_compare, tmp_path, monkeypatch):
    monkeypatch.setenv("INFERSCALE_HOME", str(tmp_path / "home"))

    async def run_before(pilot):
        await _memory_browser(pilot)
        await pilot.press("f")

    assert _snap(snap_compare, scripted_app(tmp_path), run_before)


def test_import_with_a_quarantined_file(snap_compare, tmp_path):
    folder = tmp_path / "exports"
    folder.mkdir()
    files = [
        (FIXTURES / "jsonl" / "chat.jsonl", "chat.jsonl"),
        (FIXTURES / "markdown" / "transcript.md", "transcript.md"),
        (None, "notes.json"),
    ]
    for i, (source, name) in enumerate(files):
        if source is None:
            (folder / name).write_text('{"not": "an export"', encoding="utf-8")
        else:
            shutil.copy(source, folder / name)
        os.utime(folder / name, ns=(1_700_000_000_000_000_000 + i, 1_700_000_000_000_000_000 + i))
    app = scripted_app(tmp_path, import_root=folder)

    async def run_before(pilot):
        await pilot.press("f5")
        screen = pilot.app.screen
        await _until(pilot, lambda: screen.id == "import")
        screen.query_one("#import-path").value = str(folder)
        await pilot.press("ctrl+s")
        await _until(pilot, lambda: screen.report is not None)
        screen.query_one("#import-path").value = "exports/"  # the temporary path differs per run

    assert _snap(snap_compare, app, run_before)


def test_settings(snap_compare, tmp_path):
    async def run_before(pilot):
        await pilot.press("f6")
        await _until(pilot, lambda: pilot.app.screen.id == "settings")

    assert _snap(snap_compare, scripted_app(tmp_path), run_before)


def test_keys_panel(snap_compare, tmp_path):
    async def run_before(pilot):
        # Once the (scripted) session is up, so the status line is the same on every run.
        await _until(pilot, lambda: pilot.app.load_step == "ready" and pilot.app.chat.is_mounted)
        await pilot.press("f1")

    assert _snap(snap_compare, scripted_app(tmp_path), run_before)
