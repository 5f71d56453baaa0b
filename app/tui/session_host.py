"""Runs every call into the chat :class:`Session` on one thread, and fact-log reads on another.

A SQLite connection belongs to the thread that opened it, and the session's retriever and KV
store are not meant to be shared across threads, so the session is opened, used and closed on
one thread of its own (a single-thread executor): jobs queue there in order, and a message sent
while the engine is still loading simply waits behind the job that loads it. The UI's reads and
small writes (conversation list, memory browser) use a second connection on a second thread,
so browsing never waits for a reply being generated.

The UI never blocks on a future: Textual workers wait on them (``future.result()`` in a thread
worker, or ``await asyncio.wrap_future(...)`` in an async one).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol, TypeVar

from inferscale_core.factlog import FactLog
from inferscale_core.session import Reply, SessionConfig

T = TypeVar("T")


class ChatSession(Protocol):
    """What the UI needs of :class:`inferscale_core.session.Session` (a fake has the same)."""

    config: SessionConfig
    profile_id: int
    worker: Any  # MemoryWorker: .stats (WorkerStats), .wake()

    def ask(self, conversation_id: int, text: str) -> Iterator[tuple[str, Reply]]: ...

    def forget(self, fact_id: int, cause: str = ...) -> None: ...

    def edit(self, fact_id: int, new_text: str, cause: str = ...) -> int: ...

    def reopen(self, fact_id: int, cause: str = ...) -> None: ...

    def close(self) -> None: ...


#: Opens the session on the session thread; reports start-up steps to its argument.
SessionOpener = Callable[[Callable[[str], None]], ChatSession]


class SessionNotReadyError(RuntimeError):
    """The session could not be opened (the message says why)."""


class SessionHost:
    """Owns the session thread and the reader thread.

    Args:
        opener: opens the session (slow: it may start the engine); runs on the session thread.
        db_path: the fact log the reader thread opens its own connection to.
        profile: the profile the reader works in.
    """

    def __init__(self, opener: SessionOpener, db_path: Path, profile: str = "default") -> None:
        self.opener = opener
        self.db_path = Path(db_path)
        self.profile = profile
        self.session: ChatSession | None = None
        self.error: BaseException | None = None
        self._session_pool = ThreadPoolExecutor(1, thread_name_prefix="session")
        self._reader_pool = ThreadPoolExecutor(1, thread_name_prefix="factlog-reader")
        self._reader: tuple[FactLog, int] | None = None
        self._started: Future[ChatSession] | None = None
        self._closed = threading.Event()

    @property
    def ready(self) -> bool:
        return self.session is not None

    def start(self, on_step: Callable[[str], None]) -> Future[ChatSession]:
        """Open the session (once); the future resolves when it is ready."""
        if self._started is None:
            self._started = self._session_pool.submit(self._open, on_step)
        return self._started

    def _open(self, on_step: Callable[[str], None]) -> ChatSession:
        try:
            self.session = self.opener(on_step)
        except BaseException as exc:
            self.error = exc
            raise
        return self.session

    def submit(self, fn: Callable[[ChatSession], T]) -> Future[T]:
        """Run ``fn(session)`` on the session thread, after what was submitted before."""

        def job() -> T:
            if self.session is None:
                why = f": {self.error}" if self.error is not None else ""
                raise SessionNotReadyError(f"the assistant did not start{why}")
            return fn(self.session)

        return self._session_pool.submit(job)

    def read(self, fn: Callable[[FactLog, int], T]) -> Future[T]:
        """Run ``fn(factlog, profile_id)`` on the reader thread (its own connection)."""

        def job() -> T:
            if self._reader is None:
                log = FactLog.open(self.db_path)
                self._reader = (log, log.profile(self.profile))
            return fn(*self._reader)

        return self._reader_pool.submit(job)

    def close(self, timeout: float = 60.0) -> None:
        """Close the session and the reader on their own threads, then stop both threads."""
        if self._closed.is_set():
            return
        self._closed.set()

        def close_session() -> None:
            if self.session is not None:
                self.session.close()
                self.session = None

        def close_reader() -> None:
            if self._reader is not None:
                self._reader[0].close()
                self._reader = None

        done = [self._session_pool.submit(close_session), self._reader_pool.submit(close_reader)]
        for future in done:
            with contextlib.suppress(Exception):  # closing: nothing left to tell the user
                future.result(timeout)
        self._session_pool.shutdown(wait=False)
        self._reader_pool.shutdown(wait=False)
