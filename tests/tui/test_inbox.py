"""The inbox watched while the app runs: a real watchdog observer, a real fact log.

The engine test drops a ChatGPT export into the running app's inbox and finds its memory in the
memory browser; then the same export again (nothing new) and a broken file (quarantined, with
its reason). The others need no engine: the status line when the inbox cannot be watched, and a
new inbox from the settings screen, taken at once.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest
from textual.widgets import DataTable, Input

from app.tui.app import AssistantApp
from app.tui.screens.memory import MemoryScreen
from app.tui.widgets.status import StatusBar, short_path
from inferscale_core.config import load
from inferscale_core.importers import detect_format, parse_file
from inferscale_core.importers.pipeline import REASON_SUFFIX
from tests.support import FIXTURES
from tests.tui.fakes import scripted_app
from tests.tui.test_app_engine import SIZE, _app

pytestmark = pytest.mark.asyncio

EXPORT = FIXTURES / "chatgpt" / "conversations.json"
BROKEN = '{"this is": "not an export"'


def drop(inbox: Path, name: str, data: bytes) -> None:
    """As a browser saves a download: written under a partial name, then renamed."""
    part = inbox / f"{name}.part"
    part.write_bytes(data)
    part.rename(inbox / name)


async def until(pilot, condition, timeout: float, what: str) -> float:
    """Poll ``condition`` every 0.1 s; the seconds it took, or fail after ``timeout``."""
    start = time.monotonic()
    while not condition():
        assert time.monotonic() - start < timeout, f"timed out ({timeout} s) waiting for {what}"
        await pilot.pause(0.1)
    return time.monotonic() - start


def notes(app: AssistantApp) -> list[tuple[str, str]]:
    return [(n.severity, n.message) for n in app._notifications]


def status(app: AssistantApp) -> str:
    bar = app.screen.query_one(StatusBar)
    bar.refresh_status()
    return str(bar.render())


def counts(log, pid: int) -> dict[str, int]:
    infos = log.conversations(pid)
    imports = log.db.execute("SELECT status, COUNT(*) FROM imports GROUP BY status").fetchall()
    return {
        "conversations": len(infos),
        "turns": sum(i.turns for i in infos),
        "facts": len(log.search_facts(pid, "", ("active", "superseded", "forgotten"))),
        **{f"imports {status}": n for status, n in imports},
    }


@pytest.mark.engine
async def test_a_dropped_export_is_imported_once_and_a_broken_one_quarantined(
    runtime, minilm, tmp_path
):
    conversations = list(parse_file(EXPORT, detect_format(EXPORT)))
    turns = sum(len(c.turns) for c in conversations)
    app = _app(runtime, minilm, tmp_path, seed=[])
    inbox = tmp_path / "inbox"
    try:
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: app.host.ready, 240, "the session")
            await until(pilot, lambda: app.inbox_state.state == "watching", 10, "the watcher")
            assert f"inbox: watching {short_path(inbox)}" in status(app)
            assert inbox.is_dir() and inbox.stat().st_mode & 0o777 == 0o700

            # a valid export: imported once, its memory in the browser within 5 s
            dropped = time.monotonic()
            drop(inbox, "conversations.json", EXPORT.read_bytes())
            await until(pilot, lambda: notes(app), 5, "the notification")
            ((severity, message),) = notes(app)
            assert severity == "information"
            assert message.startswith(
                f"Inbox: imported conversations.json: {len(conversations)} conversations,"
                f" {turns} new turns"
            )
            assert (inbox / "imported" / "conversations.json").is_file()
            assert not (inbox / "conversations.json").exists()
            facts = []

            async def extracted() -> None:
                facts[:] = await app.read(lambda log, pid: log.search_facts(pid, "", ("active",)))

            while not facts:
                assert time.monotonic() - dropped < 5, "no memory extracted within 5 s"
                await extracted()
                await pilot.pause(0.1)
            await pilot.press("f4")
            screen = app.screen
            assert isinstance(screen, MemoryScreen)
            table = screen.query_one("#facts", DataTable)
            await until(pilot, lambda: table.row_count > 0, 5, "the memory browser")
            seconds = time.monotonic() - dropped
            print(f"\ndrop -> memory in the browser: {seconds:.2f} s")
            assert seconds < 5
            # the fixture's one statement (its other user turns are questions)
            (fact,) = screen.facts.values()
            assert "planning a trip to Lisbon in May" in fact.text
            assert table.row_count == 1
            expected = {
                "conversations": len(conversations),
                "turns": turns,
                "facts": 1,
                "imports imported": 1,
            }
            assert await app.read(counts) == expected

            # the same export again (another name): recognised, nothing added
            app.clear_notifications()
            drop(inbox, "conversations (1).json", EXPORT.read_bytes())
            await until(pilot, lambda: notes(app), 5, "the second notification")
            assert "was already imported" in notes(app)[0][1]
            assert (inbox / "imported" / "conversations (1).json").is_file()

            # a broken file: quarantined with a reason the user can read
            app.clear_notifications()
            drop(inbox, "broken.json", BROKEN.encode())
            await until(pilot, lambda: notes(app), 5, "the quarantine notification")
            ((severity, message),) = notes(app)
            assert severity == "warning"
            assert message.startswith("Inbox: broken.json was quarantined: ")
            assert "not a supported chat export" in message and str(tmp_path) not in message
            assert f"details in quarantine/broken.json{REASON_SUFFIX}" in message
            quarantined = inbox / "quarantine" / "broken.json"
            assert quarantined.read_text(encoding="utf-8") == BROKEN
            reason = Path(f"{quarantined}{REASON_SUFFIX}").read_text(encoding="utf-8")
            assert "broken.json could not be imported" in reason
            assert "not a supported chat export" in reason
            assert "watching" in status(app)

            # nothing imported twice, the quarantined file recorded as such
            await pilot.pause(1.0)
            after = await app.read(counts)
            assert after == dict(expected, **{"imports quarantined": 1})
            await screen.reload()
            assert table.row_count == 1

            # ... and listed under the import screen's quarantined files, with its reason
            app.action_open_import()

            def quarantine_rows() -> int:
                tables = app.screen.query("#quarantine")
                return tables.first(DataTable).row_count if tables else 0

            await until(pilot, lambda: quarantine_rows() == 1, 5, "the quarantined files")
            name, why = app.screen.query_one("#quarantine", DataTable).get_row_at(0)
            assert str(name) == "broken.json" and "not a supported chat export" in str(why)
        assert app._watcher is None  # stopped on exit
    finally:
        app.host.close()


async def test_an_inbox_that_cannot_be_made_is_told_and_the_app_runs_on(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder", encoding="utf-8")
    app = scripted_app(tmp_path)
    app.inbox = blocker / "inbox"
    try:
        async with app.run_test(size=(160, 40)) as pilot:
            await until(pilot, lambda: app.inbox_state.state == "off", 10, "the watcher to fail")
            line = status(app)
            assert "inbox: off (" in line and "a-file" in line, line
            assert any(s == "warning" and "is not watched" in m for s, m in notes(app)), notes(app)
            # the app runs on: the memory browser opens and reads
            await pilot.press("f4")
            table = app.screen.query_one("#facts", DataTable)
            await until(pilot, lambda: table.row_count > 0, 10, "the memory browser")
        assert app._watcher is None
    finally:
        app.host.close()


async def test_a_new_inbox_from_the_settings_is_watched_at_once(tmp_path):
    app = scripted_app(tmp_path)
    app.config_path = tmp_path / "config.toml"
    new = tmp_path / "exports" / "dropped"
    try:
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: app.inbox_state.state == "watching", 10, "the watcher")
            await pilot.press("f6")
            await until(pilot, lambda: app.screen.id == "settings", 5, "the settings")
            field = app.screen.query_one("#set-inbox", Input)
            assert field.value == ""  # the default: the data folder's inbox
            field.value = "exports/dropped"
            await pilot.press("ctrl+s")
            error = str(app.screen.query_one("#settings-error").render())
            assert "inbox must be an absolute path" in error
            field.value = str(new)
            await pilot.press("ctrl+s")
            await until(pilot, lambda: app.screen is app.chat, 5, "the settings to be saved")
            assert load(app.config_path).inbox == str(new) == app.config.inbox
            await until(pilot, lambda: app.inbox_state.state == "watching", 10, "the new inbox")
            assert app.inbox == new and new.is_dir() and os.stat(new).st_mode & 0o777 == 0o700
            drop(new, "chat.jsonl", (FIXTURES / "jsonl" / "chat.jsonl").read_bytes())
            await until(pilot, lambda: (new / "imported" / "chat.jsonl").exists(), 5, "import")
            imported = lambda: [m for _, m in notes(app) if "Inbox: imported chat.jsonl" in m]  # noqa: E731
            await until(pilot, imported, 5, "the notification")
            # the old inbox is no longer watched
            old = tmp_path / "inbox"
            shutil.copy(FIXTURES / "markdown" / "transcript.md", old / "transcript.md")
            await pilot.pause(3.0)
            assert (old / "transcript.md").exists() and not (old / "imported").exists()
    finally:
        app.host.close()


async def test_the_status_line_shows_a_conversion_and_a_full_disk(tmp_path):
    app = scripted_app(tmp_path)
    try:
        async with app.run_test(size=(200, 40)) as pilot:
            await until(pilot, lambda: app.host.ready, 10, "the scripted engine")
            stats = app.host.session.worker.stats
            stats.errors, stats.to_convert = 1, 1234
            assert "· 1 error " in status(app) and "converting, 1,234 left" in status(app)
            stats.disk_full = True  # what the worker sets on StoreFullError
            line = status(app)
            assert "disk full: new memories go in as text" in line and "error" not in line
    finally:
        app.host.close()
