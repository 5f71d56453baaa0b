"""The resident assistant: one process owns the engine and the memory, the others use it.

The process that opens the memory's desk (the chat app, ``inferscale-assistant daemon``, or an
MCP server that found none) serves it on the desk's private socket
(:mod:`inferscale_core.desk_socket`); ``ask``, ``memory``, ``import`` and ``mcp`` find it there
with :func:`connect` and start no engine of their own.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from inferscale_core import paths
from inferscale_core.config import AppConfig
from inferscale_core.desk import Desk
from inferscale_core.desk_socket import DeskServer, RemoteDesk
from inferscale_core.importers.pipeline import FileResult
from inferscale_core.importers.watcher import InboxWatcher


def connect(config: AppConfig) -> RemoteDesk | None:
    """The resident desk of this user's memory and profile, or None when none runs."""
    return RemoteDesk.connect(paths.memory_db(), config.profile)


class Resident:
    """A desk this process owns, its engine started in the background, served on its socket.

    Args:
        config: the settings (model, profile, inbox).
        verbose: the engine's logs are shown.
        watch_inbox: import what is dropped into the inbox while this runs.
        on_result: told each inbox file's outcome (on the watcher's thread).

    Raises:
        DeskBusyError: another process already serves this memory.
    """

    def __init__(
        self,
        config: AppConfig,
        *,
        verbose: bool = False,
        watch_inbox: bool = False,
        on_result: Callable[[FileResult], None] | None = None,
    ) -> None:
        from app.commands.chat import make_opener

        db_path = paths.memory_db()
        self.desk = Desk(db_path, config.profile, make_opener(config, db_path, verbose))
        self.server = DeskServer(self.desk)
        self.inbox: Path | None = paths.inbox_dir(config.inbox) if watch_inbox else None
        self._on_result = on_result
        self._watcher: InboxWatcher | None = None

    def start(self, on_step: Callable[[str], None] = lambda step: None) -> None:
        """Start the engine (in the background) and the inbox watcher."""
        self.desk.start(on_step)  # the memory worker takes up the backlog once it is open
        if self.inbox is not None:
            inbox = self.inbox

            def imported(result: FileResult) -> None:
                self.desk.wake()
                if self._on_result is not None:
                    self._on_result(result)

            self._watcher = InboxWatcher(
                inbox, lambda: self.desk.importer(inbox), on_result=imported
            )
            self._watcher.start()

    def close(self) -> None:
        """Stop serving, stop the watcher (it finishes the file it imports), close the desk."""
        self.server.close()
        if self._watcher is not None:
            self._watcher.stop()
        self.desk.close()
