"""The import screen on the scripted session: every file's row names it, reasons are readable."""

from __future__ import annotations

import os
import shutil
import time

import pytest
from rich.cells import cell_len
from textual.widgets import DataTable

from app.tui.screens.import_screen import FileName, FileProgress, fit_name
from tests.support import FIXTURES
from tests.tui.fakes import scripted_app

LONG = "my_whatsapp_chat_with_the_whole_family_2024.txt"


def test_fit_name_cuts_the_middle_and_keeps_the_extension():
    assert fit_name("chat.jsonl", 18) == "chat.jsonl"
    assert fit_name("claude_conversations.json", 20) == "claude_con…ions.json"
    fitted = fit_name(LONG, 18)
    assert cell_len(fitted) == 18 and fitted.startswith("my_what") and fitted.endswith("2024.txt")
    assert fit_name("日本語のファイル名.json", 12) == "日本語….json"  # wide characters: 2 cells
    assert fit_name("README", 4) == "RE…E"
    assert fit_name("x.json", 1) == "…" and fit_name("x.json", 0) == ""


async def _until(pilot, condition, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {condition}"
        await pilot.pause(0.02)


@pytest.mark.asyncio
async def test_every_file_row_shows_its_name_and_the_reason_is_readable(tmp_path):
    folder = tmp_path / "exports"
    folder.mkdir()
    shutil.copy(FIXTURES / "claude" / "conversations.json", folder / "claude_conversations.json")
    shutil.copy(FIXTURES / "jsonl" / "chat.jsonl", folder / "chat.jsonl")
    (folder / LONG).write_text("Just some thoughts.\nNothing like a chat here.\n", encoding="utf-8")
    for i, name in enumerate(["claude_conversations.json", "chat.jsonl", LONG]):
        os.utime(folder / name, ns=(1_700_000_000_000_000_000 + i,) * 2)
    app = scripted_app(tmp_path, import_root=folder)
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.press("f5")
            screen = app.screen
            await _until(pilot, lambda: screen.id == "import")
            screen.query_one("#import-path").value = str(folder)
            await pilot.press("ctrl+s")
            await _until(pilot, lambda: screen.report is not None)
            await pilot.pause(0.1)

            shown = {}
            for row in screen.query(FileProgress):
                label = row.query_one(FileName)
                text = str(label.render())
                assert cell_len(text) <= label.content_size.width
                shown[row.path.name] = text
            assert shown["chat.jsonl"] == "[2/3] chat.jsonl"
            assert shown["claude_conversations.json"].startswith("[1/3] claude_co")
            assert shown["claude_conversations.json"].endswith("ons.json")
            assert "…" in shown[LONG] and shown[LONG].endswith("2024.txt")

            table = screen.query_one("#quarantine", DataTable)
            assert table.row_count == 1
            name, reason = table.get_row_at(0)
            assert name.endswith(".txt") and "…" in name
            assert reason.startswith("not a supported chat export. Import a ChatGPT")
            assert "conversations.json" in reason and "JSON Lines" in reason
            (row,) = table.rows.values()
            assert row.height > 1  # wrapped to the table's width, not cut off at its edge
            widths = sum(c.get_render_width(table) for c in table.columns.values())
            assert widths <= table.scrollable_content_region.width
    finally:
        app.host.close()
