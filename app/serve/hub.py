"""Each user's memory on the server: a session per user over one engine, one thread per user.

A :class:`Desk` is one user's :class:`~inferscale_core.session.Session` (its profile in the
server's fact log, its retriever, its memory worker) with a thread of its own: everything that
reads or writes the user's memory runs there, one call at a time (SQLite connections and the
retriever's index belong to one thread). Generation does not: the reply streams on any thread,
so a user's requests run concurrently in the engine, like every other user's.

The session's prompt builder is scoped by the user's secret (``PromptBuilder.scoped``): every
cache salt of the user's requests and encodings carries it, so vLLM never serves one user's
prefix-cache blocks to another. The entries a request injects come from the user's own
retrieval only; nothing a client sends names them.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from app.serve.ids import FactIds
from app.serve.users import User

if TYPE_CHECKING:
    from inferscale_core import wiring
    from inferscale_core.config import AppConfig
    from inferscale_core.embedder import Embedder
    from inferscale_core.session import PreparedTurn, Reply, Session

T = TypeVar("T")
API = "api"  # title, source and source id of the conversation a user's requests are logged in


class Desk:
    """One user's session and the thread that touches its memory."""

    def __init__(self, user: User, open_session: Callable[[], Session]) -> None:
        self.user = user
        # The user's own engine requests, for their /v1/status (on the server's event loop):
        # in flight now, and aborted before their end (the client went away, or the reply
        # was cut off as looping), as the engine counts aborts for all users.
        self.in_engine = 0
        self.aborted = 0
        self.ids = FactIds(user.secret)  # the user's memory ids in the API
        self._thread = ThreadPoolExecutor(1, thread_name_prefix=f"memory-{user.name}")
        # Opened on the thread that will own its fact log connection.
        self.session: Session = self.call(open_session)
        self.conversation_id: int = self.call(api_conversation, self.session)

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` on this user's memory thread and wait for it (from any thread)."""
        return self._thread.submit(fn, *args).result()

    def submit(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        """Queue ``fn(*args)`` on this user's memory thread."""
        return self._thread.submit(fn, *args)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """:meth:`call` for a coroutine (the server's handlers)."""
        return await asyncio.wrap_future(self._thread.submit(fn, *args))

    async def agenerate(self, turn: PreparedTurn) -> AsyncIterator[tuple[str, Reply]]:
        """``session.agenerate(turn)``, counted in :attr:`in_engine` and :attr:`aborted`."""
        self.in_engine += 1
        try:
            async with contextlib.aclosing(self.session.agenerate(turn)) as replies:
                async for item in replies:
                    yield item
            if turn.reply.stopped is not None:  # cut off (a loop): its request aborted
                self.aborted += 1
        except (asyncio.CancelledError, GeneratorExit):
            self.aborted += 1  # its client went away: the engine's request is aborted
            raise
        finally:
            self.in_engine -= 1

    def close(self) -> None:
        self._thread.submit(self.session.close).result()
        self._thread.shutdown()


class Hub:
    """The desks of a server's users, opened on first use; one engine for all."""

    def __init__(
        self,
        assistant: wiring.Assistant,
        config: AppConfig,
        db_path: Path,
        embedder: Embedder | None = None,
    ) -> None:
        from inferscale_core.embedder import SentenceTransformerEmbedder
        from inferscale_core.factlog import FactLog

        self.assistant = assistant
        self.config = config
        self.db_path = Path(db_path)
        # Created and migrated once, at start: a file that cannot be opened stops the server
        # here, not at a user's first request.
        FactLog.open(self.db_path).close()
        self.embedder = embedder or SentenceTransformerEmbedder()
        self._desks: dict[str, Desk] = {}  # user id -> desk
        self._lock = threading.Lock()

    def desk(self, user: User) -> Desk:
        """``user``'s desk (opened, with its memory worker started, on first use)."""
        with self._lock:
            desk = self._desks.get(user.id)  # by id: a new user of a removed one's name
            if desk is None:  # gets a desk (and memory) of their own
                desk = self._desks[user.id] = self._open(user)
            return desk

    def _open(self, user: User) -> Desk:
        from dataclasses import replace

        from inferscale_core import wiring

        config = replace(self.config, profile=user.profile)
        assistant = replace(self.assistant, builder=self.assistant.builder.scoped(user.secret))
        return Desk(
            user,
            lambda: wiring.open_session(assistant, config, self.db_path, embedder=self.embedder),
        )

    def close(self) -> None:
        with self._lock:
            desks, self._desks = list(self._desks.values()), {}
        for desk in desks:
            desk.close()


def api_conversation(session: Session) -> int:
    """The user's "api" conversation (created once): where the server logs their exchanges."""
    from inferscale_core.types import Conversation

    log = session.factlog
    found = log.conversation_by_source(session.profile_id, API, API)
    if found is not None:
        return found
    conversation = Conversation(title=API, source=API, source_id=API)
    return log.add_conversation(session.profile_id, conversation)[0]
