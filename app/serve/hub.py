"""Each user's memory on the server: a session per user over one engine, one thread per user.

A :class:`Desk` is one user's :class:`~inferscale_core.session.Session` (its profile in the
server's fact log, its retriever, its memory worker) with a thread of its own: everything that
reads or writes the user's memory runs there, one call at a time (SQLite connections and the
retriever's index belong to one thread). Generation does not: the reply streams on any thread,
so a user's requests run concurrently in the engine, like every other user's.

With leases (``lease.py``; ``serve --ray``, whose replicas share one data folder) a desk is
opened only under its user's lease, so one process at a time writes a user's memory;
:meth:`Hub.release` closes the desk and gives the lease up.

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
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from app.serve.ids import FactIds
from app.serve.users import User
from inferscale_core import desk as core

if TYPE_CHECKING:
    from app.serve.lease import Leases
    from inferscale_core import wiring
    from inferscale_core.config import AppConfig
    from inferscale_core.embedder import Embedder
    from inferscale_core.session import PreparedTurn, Reply, Session

T = TypeVar("T")
LEASE_WAIT_S = 10.0  # for a user's lease held by another replica, before a 503
API = "api"  # title, source and source id of the conversation a user's requests are logged in


class Desk(core.Desk):
    """One user's desk (:class:`inferscale_core.desk.Desk`), opened at once, with the API's
    ids of the user's facts and the user's requests in the engine."""

    session: Session

    def __init__(self, user: User, open_session: Callable[[], Session], db_path: Path) -> None:
        super().__init__(
            db_path, user.profile, lambda on_step: open_session(), name=f"memory-{user.name}"
        )
        self.user = user
        # The user's own engine requests, for their /v1/status (on the server's event loop):
        # in flight now, and aborted before their end (the client went away, or the reply
        # was cut off as looping), as the engine counts aborts for all users.
        self.in_engine = 0
        self.aborted = 0
        self.ids = FactIds(user.secret)  # the user's memory ids in the API
        self.start().result()
        self.conversation_id: int = self.conversation(API)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` on this user's memory thread, for a coroutine (the handlers)."""
        return await asyncio.wrap_future(self.submit(lambda session: fn(*args)))

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


class Hub:
    """The desks of a server's users, opened on first use; one engine for all.

    ``leases``: take a user's lease before opening their desk (waiting up to ``lease_wait_s``
    for another replica to give it up, else :class:`~app.serve.lease.LeaseBusy`)."""

    def __init__(
        self,
        assistant: wiring.Assistant,
        config: AppConfig,
        db_path: Path,
        embedder: Embedder | None = None,
        *,
        leases: Leases | None = None,
        lease_wait_s: float = LEASE_WAIT_S,
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
        self.leases = leases
        self.lease_wait_s = lease_wait_s
        self._desks: dict[str, Desk] = {}  # user id -> desk
        self._lock = threading.Lock()  # guards the dicts
        self._opening = threading.Lock()  # one desk opened at a time (each loads its index)
        self._users: dict[str, threading.Lock] = {}  # user id -> held while opening/closing

    def desk(self, user: User) -> Desk:
        """``user``'s desk (opened, with its memory worker started, on first use)."""
        with self._lock:
            desk = self._desks.get(user.id)  # by id: a new user of a removed one's name
            if desk is not None:  # gets a desk (and memory) of their own
                return desk
            own = self._users.setdefault(user.id, threading.Lock())
        with own:  # not the hub's lock: waiting for one user's lease holds up no other user
            with self._lock:
                desk = self._desks.get(user.id)
            if desk is not None:  # opened while this thread waited
                return desk
            if self.leases is not None:
                self.leases.acquire(user.id, self.lease_wait_s)
            try:
                with self._opening:
                    desk = self._open(user)
            except BaseException:
                if self.leases is not None:
                    self.leases.release(user.id)
                raise
            with self._lock:
                self._desks[user.id] = desk
            return desk

    def release(self, user_id: str) -> bool:
        """Close ``user_id``'s desk (what its thread was given runs first) and give up their
        lease. False if the desk did not close in time: then the lease is kept, so no other
        replica writes their memory while this one might."""
        with self._lock:
            own = self._users.setdefault(user_id, threading.Lock())
        with own:
            with self._lock:
                desk = self._desks.pop(user_id, None)
            if desk is not None:
                desk.close()
                if desk.session is not None:
                    return False
            if self.leases is not None:
                self.leases.release(user_id)
            return True

    def _open(self, user: User) -> Desk:
        from dataclasses import replace

        from inferscale_core import wiring

        config = replace(self.config, profile=user.profile)
        assistant = replace(self.assistant, builder=self.assistant.builder.scoped(user.secret))
        return Desk(
            user,
            lambda: wiring.open_session(assistant, config, self.db_path, embedder=self.embedder),
            self.db_path,
        )

    def close(self) -> None:
        with self._lock:
            desks, self._desks = list(self._desks.values()), {}
        for desk in desks:
            desk.close()
        if self.leases is not None:
            self.leases.close()
