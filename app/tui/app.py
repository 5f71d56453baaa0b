"""The Textual app: the chat screen at once, the engine loading behind it.

``AssistantApp(config, open_session, db_path=...)`` is all it needs: ``open_session`` runs on
the desk's thread (:class:`~inferscale_core.desk.Desk`) and may take half a minute (it
starts the engine); tests pass one that opens a Session on the test engine, snapshots one that
returns a scripted fake. The first screen is usable at once: a message typed while the engine
loads waits in the session thread's queue and is answered when it is ready.

While the app runs it watches ``inbox`` (:mod:`app.tui.inbox`).
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from textual import work
from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.worker import get_current_worker

from app.startup import STEPS
from app.tui.inbox import InboxWatching, one_line
from app.tui.screens.chat import ChatScreen
from app.tui.screens.dialogs import KeysDialog
from app.tui.screens.import_screen import ImportScreen
from app.tui.screens.memory import MemoryScreen
from app.tui.screens.settings import SettingsScreen
from inferscale_core import paths
from inferscale_core.config import AppConfig
from inferscale_core.desk import Desk, SessionOpener
from inferscale_core.factlog import FactLog

if TYPE_CHECKING:
    from inferscale_core.desk_socket import DeskServer
    from inferscale_core.session import Session

T = TypeVar("T")


def _keys(bindings) -> list[tuple[str, str]]:
    """``(keys, description)`` of Binding objects, keys as the footer writes them."""
    out = []
    for binding in bindings:
        if not isinstance(binding, Binding) or not binding.description:
            continue
        keys = [
            k.replace("ctrl+", "^").replace("question_mark", "?") for k in binding.key.split(",")
        ]
        out.append((" ".join(keys), binding.description))
    return out


class AssistantApp(InboxWatching, App[None]):
    CSS_PATH = "app.tcss"  # beside this module
    TITLE = "InferScale assistant"
    BINDINGS = [
        Binding("f1,question_mark", "toggle_keys", "Keys"),
        Binding("f4", "open_memories", "Memories"),
        Binding("f5", "open_import", "Import"),
        Binding("f6", "open_settings", "Settings"),
    ]

    def __init__(
        self,
        config: AppConfig,
        open_session: SessionOpener,
        *,
        db_path: Path,
        config_path: Path,
        inbox: Path,
        import_root: Path | None = None,
        model_label: str = "SmolLM2-135M-Instruct",
    ) -> None:
        super().__init__()
        self.config = config
        self.config_path = Path(config_path)
        self.import_root = Path(import_root) if import_root else Path.home()
        self.model_label = model_label
        self.host = Desk(db_path, config.profile, open_session)
        self.desk_server: DeskServer | None = None  # the desk served to other commands
        self.mode = "inject"  # for the next reply: "inject" (KV) or "prompt" (text)
        self.startup_steps = len(STEPS) + 1  # + opening the memory
        self.steps_done = 0
        self.load_step = "starting"
        self.load_error: str | None = None
        self.chat = ChatScreen()
        self.init_inbox(inbox)

    # ---- start-up ----
    def on_mount(self) -> None:
        self.sub_title = self.model_label
        self.push_screen(self.chat)
        self.start_session()
        self.watch_inbox(self.inbox)

    @work(thread=True, exclusive=True, group="startup")
    def start_session(self) -> None:
        """Open the session on its thread; relay its steps to the chat screen."""
        worker = get_current_worker()
        steps: queue.SimpleQueue[str] = queue.SimpleQueue()
        future = self.host.start(steps.put)
        while True:
            try:
                step = steps.get(timeout=0.1)
            except queue.Empty:
                if worker.is_cancelled:
                    return
                if future.done() and steps.empty():
                    break
                continue
            self.call_from_thread(self._session_step, step)
        try:
            future.result()
        except BaseException as exc:  # noqa: BLE001 - shown on screen
            message = one_line(exc)
            self.call_from_thread(self._session_failed, message)
            return
        self._serve_desk()
        self.call_from_thread(self._session_ready)

    def _serve_desk(self) -> None:
        """Serve the open desk on its private socket: ``ask``, ``memory``, ``import`` and
        ``mcp`` then use this engine and memory instead of starting their own."""
        from inferscale_core.desk_socket import DeskServer

        try:
            self.desk_server = DeskServer(self.host)
        except Exception as exc:  # noqa: BLE001 - the chat works without; the user is told
            self.call_from_thread(
                self.notify,
                f"Other commands start their own engine: {one_line(exc)}",
                severity="warning",
                timeout=15,
            )

    def stop_serving(self) -> None:
        """Stop serving the desk to other commands (repeatable)."""
        server, self.desk_server = self.desk_server, None
        if server is not None:
            server.close()

    async def on_unmount(self) -> None:  # beside InboxWatching's (Textual calls both)
        await asyncio.to_thread(self.stop_serving)

    def _session_step(self, step: str) -> None:
        self.load_step = step
        self.steps_done = min(self.steps_done + 1, self.startup_steps - 1)
        self._sync_chat()

    def _session_ready(self) -> None:
        self.load_step = "ready"
        self._sync_chat()

    def _session_failed(self, message: str) -> None:
        self.load_error = message
        self._sync_chat()
        self.notify(f"The engine did not start: {message}", severity="error", timeout=30)

    def _sync_chat(self) -> None:
        # Before the chat screen is composed there is nothing to update: it syncs on mount.
        with contextlib.suppress(NoMatches):
            self.chat.sync_startup()

    # ---- calls down to the session and the fact log (awaited, never blocking the UI) ----
    async def read(self, fn: Callable[[FactLog, int], T]) -> T:
        return await asyncio.wrap_future(self.host.read(fn))

    async def call(self, fn: Callable[[Session], T]) -> T:
        return await asyncio.wrap_future(self.host.submit(fn))

    def apply_config(self, config: AppConfig) -> None:
        """Settings saved: k and r apply to the next reply, a new inbox at once; the rest at
        the next start."""
        changed_inbox = config.inbox != self.config.inbox
        self.config = config
        if changed_inbox:
            self.watch_inbox(paths.inbox_dir(config.inbox))

    # ---- screens ----
    def _open(self, screen_id: str, make: Callable[[], Screen | str]) -> None:
        if self.screen.id == screen_id:
            return
        if self.screen is not self.chat:
            self.pop_screen()
        self.push_screen(make())

    def action_open_memories(self) -> None:
        self._open("memories", MemoryScreen)

    def action_open_import(self) -> None:
        # Installed once: an import goes on (and can be watched again) after Esc.
        if not self.is_screen_installed("import"):
            self.install_screen(ImportScreen(self.import_root), "import")
        self._open("import", lambda: "import")

    def action_open_settings(self) -> None:
        self._open("settings", lambda: SettingsScreen(self.config, self.config_path))

    def action_toggle_keys(self) -> None:
        if isinstance(self.screen, KeysDialog):
            self.screen.dismiss(None)
            return
        screen = self.screen
        groups = [(screen.__class__.__name__.removesuffix("Screen"), _keys(screen.BINDINGS))]
        if screen is self.chat:
            groups.append(("Message box", [("Enter", "send"), ("↑ ↓", "earlier messages")]))
        app_keys = _keys(self.BINDINGS) + [("^p", "command palette"), ("^q", "quit")]
        groups.append(("Everywhere", app_keys))
        self.push_screen(KeysDialog("Keys", groups))

    def _on_chat(self, action: str) -> Callable[[], None]:
        """A palette callback that runs a chat-screen action (going back to the chat first)."""

        async def run() -> None:
            while self.screen is not self.chat and len(self.screen_stack) > 1:
                self.pop_screen()
            await self.chat.run_action(action)

        return run

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        chat = (
            ("New chat", "Start a new conversation (Ctrl+N)", "new_chat"),
            ("Rename chat", "Rename the open conversation (Ctrl+R)", "rename_chat"),
            ("Delete chat", "Delete the open conversation (F8)", "delete_chat"),
            ("Search chats", "Find a conversation by title or text (Ctrl+F)", "find_chat"),
            ("Memory panel", "Show or hide what memory each reply used (F3)", "toggle_panel"),
            (
                "Switch injection mode",
                "Next reply with KV injection or prompt injection, to compare (Ctrl+T)",
                "toggle_mode",
            ),
            ("Copy reply", "Copy the selected or last reply (Ctrl+Y)", "copy_reply"),
            ("Stop reply", "Stop the reply being generated (Esc)", "stop"),
        )
        for title, help_text, action in chat:
            yield SystemCommand(title, help_text, self._on_chat(action))
        yield SystemCommand(
            "Memory browser",
            "Search, edit and forget memories; see the audit (F4)",
            self.action_open_memories,
        )
        yield SystemCommand(
            "Import", "Import chat exports: a file or a folder (F5)", self.action_open_import
        )
        yield SystemCommand(
            "Settings", "Model, k, w, GPU pool, profile (F6)", self.action_open_settings
        )
