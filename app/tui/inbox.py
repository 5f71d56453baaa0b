"""The inbox watched while the app runs.

:class:`InboxWatching` (mixed into the app) watches the configured folder with an
:class:`~inferscale_core.importers.watcher.InboxWatcher` (a watchdog observer): each export
dropped there is imported once, into the app's profile, on the watcher's own thread and
fact-log connection; the watcher tells the app by messages (``post_message`` is thread-safe and
never waits, so stopping the watcher on exit cannot deadlock with the UI), the app notifies the
user, wakes the memory worker to extract the new turns, and the status bar shows the state.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from dataclasses import dataclass
from pathlib import Path

from textual import work
from textual.message import Message

from app.tui.widgets.status import StatusBar
from inferscale_core.importers.pipeline import (
    IMPORTED_DIR,
    QUARANTINE_DIR,
    REASON_SUFFIX,
    FileResult,
    ProgressEvent,
)
from inferscale_core.importers.watcher import InboxWatcher

# A dropped file is imported once unchanged this long (a copy in progress keeps changing it):
# shorter than `watch`'s 2 s, so what the user drops shows within about 1.5 s.
STABLE_SECONDS = 1.0
POLL_SECONDS = 0.25


@dataclass(slots=True)
class InboxState:
    """What the status bar says of the inbox."""

    state: str = "starting"  # starting | watching | importing | off
    detail: str = ""  # the file being imported, or why the inbox is not watched


@dataclass
class InboxEvent(Message):
    """From the inbox watcher's threads to the app.

    ``kind``: "watching" (started), "importing" (``path``), "result" (``result``), "error"
    (``path``; ``detail``: why, not the file's fault), "off" (``detail``: why it did not start).
    """

    inbox: Path
    kind: str
    path: Path | None = None
    result: FileResult | None = None
    detail: str = ""


def one_line(exc: BaseException) -> str:
    """An exception as one short line for the user."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def quarantine_reason(path: Path, reason: str | None) -> str:
    """The first line of why a file was quarantined (what is wrong, what to do), without its
    path (the file's name is shown beside it); the details are in its reason file."""
    lines = (reason or "").strip().splitlines()
    first = lines[0].strip() if lines else "not a chat export"
    for long in sorted({str(path.resolve()), str(path)}, key=len, reverse=True):
        first = first.replace(long, path.name)
    return first.removeprefix(f"{path.name}: ")


def inbox_note(result: FileResult) -> tuple[str, str]:
    """The notification for one file from the inbox: ``(message, severity)``."""
    name = result.path.name
    if result.status == "quarantined":
        reason = quarantine_reason(result.path, result.reason)
        where = (
            f"details in {QUARANTINE_DIR}/{result.moved_to.name}{REASON_SUFFIX}"
            if result.moved_to
            else "left in the inbox"
        )
        return f"Inbox: {name} was quarantined: {reason} ({where})", "warning"
    if result.status == "skipped":
        moved = f" (moved to {IMPORTED_DIR}/)" if result.moved_to else ""
        return f"Inbox: {name} was already imported{moved}.", "information"
    if result.format == "memories":
        return f"Inbox: imported {name}: {result.facts_added:,} new memories.", "information"
    return (
        f"Inbox: imported {name}: {result.conversations:,} conversations, "
        f"{result.turns_added:,} new turns (memories are extracted in the background).",
        "information",
    )


class InboxWatching:
    """The app's inbox: call :meth:`init_inbox` in ``__init__`` and :meth:`watch_inbox` once
    mounted; :meth:`stop_inbox` on the way out (``on_unmount`` does)."""

    inbox: Path
    inbox_state: InboxState

    def init_inbox(self, inbox: Path) -> None:
        self.inbox = Path(inbox)
        self.inbox_state = InboxState()
        self._watcher: InboxWatcher | None = None
        self._inbox_lock = threading.Lock()  # starting, stopping and closing the watcher
        self._inbox_closed = False

    def watch_inbox(self, inbox: Path) -> None:
        """Watch ``inbox`` (instead of the folder watched so far); the status bar follows."""
        self.inbox = Path(inbox)
        self._inbox_changed(InboxState("starting"))
        self._restart_watcher(self.inbox)

    @work(thread=True, group="inbox")
    def _restart_watcher(self, inbox: Path) -> None:
        """Stop the watcher (it finishes the file it is importing), then start one on ``inbox``.

        A thread: opening the watcher's fact log and stopping it may wait on SQLite or an import.
        """
        with self._inbox_lock:
            if self._watcher is not None:
                self._watcher.stop()
                self._watcher = None
            if self._inbox_closed or inbox != self.inbox:  # closing, or a newer folder was set
                return
            watcher = InboxWatcher(
                inbox,
                lambda: self.host.importer(inbox),
                STABLE_SECONDS,
                POLL_SECONDS,
                on_result=lambda result: self._post_inbox(inbox, "result", result=result),
                on_error=lambda path, exc: self._post_inbox(inbox, "error", path, one_line(exc)),
                on_progress=lambda event: self._inbox_progress(inbox, event),
            )
            try:
                watcher.start()
            except Exception as exc:  # noqa: BLE001 - the app runs on; the status says why
                self._post_inbox(inbox, "off", detail=one_line(exc))
                return
            self._watcher = watcher
        self._post_inbox(inbox, "watching")

    def stop_inbox(self) -> None:
        """Stop watching for good (waits for the file being imported); any thread, repeatable."""
        with self._inbox_lock:
            self._inbox_closed = True
            if self._watcher is not None:
                self._watcher.stop()
                self._watcher = None

    async def on_unmount(self) -> None:
        await asyncio.to_thread(self.stop_inbox)

    def _inbox_progress(self, inbox: Path, event: ProgressEvent) -> None:
        if event.kind == "start":
            self._post_inbox(inbox, "importing", event.path)

    def _post_inbox(
        self,
        inbox: Path,
        kind: str,
        path: Path | None = None,
        detail: str = "",
        result: FileResult | None = None,
    ) -> None:
        """From the watcher's threads; once the app has closed there is no one to tell."""
        with contextlib.suppress(RuntimeError):  # the event loop closed meanwhile
            self.post_message(InboxEvent(inbox, kind, path, result, detail))

    async def on_inbox_event(self, event: InboxEvent) -> None:
        current = event.inbox == self.inbox  # not a watcher replaced since
        if event.kind == "result" and event.result is not None:
            message, severity = inbox_note(event.result)
            self.notify(message, severity=severity, timeout=15 if severity == "warning" else 8)
            if event.result.status == "imported":
                self.host.wake()  # extract and encode the new turns now, not at a poll
                if self.screen is self.chat:
                    await self.chat.reload_conversations()
        elif event.kind == "error" and event.path is not None:
            self.notify(
                f"Inbox: could not import {event.path.name}: {event.detail}. It stays in the"
                " inbox and is tried again when it changes.",
                severity="error",
                timeout=15,
            )
        elif event.kind == "off" and current:
            self.notify(
                f"The inbox {self.inbox} is not watched: {event.detail}", severity="warning"
            )
        if not current:
            return
        if event.kind == "importing" and event.path is not None:
            self._inbox_changed(InboxState("importing", event.path.name))
        elif event.kind == "off":
            self._inbox_changed(InboxState("off", event.detail))
        else:  # watching, or a file done
            self._inbox_changed(InboxState("watching"))

    def _inbox_changed(self, state: InboxState) -> None:
        self.inbox_state = state
        for bar in self.screen.query(StatusBar):
            bar.refresh_status()
