"""The memory service every door uses: a :class:`~inferscale_core.session.Session` on one thread.

A SQLite connection belongs to the thread that opened it, and the session's retriever and KV
store are not shared across threads, so a :class:`Desk` opens, uses and closes its session on a
thread of its own (a one-thread executor): calls queue there in order, and one made while the
engine is still loading waits behind the job that loads it. A second thread with its own
connection serves reads that must not wait for a reply being generated (:meth:`Desk.read`);
imports open a connection on the caller's thread (they are long, and need no session).

The public methods take and return plain data (str, int, float, None, lists and dicts of them;
:meth:`Desk.ask` streams text and ends with :func:`reply_json`'s form), so a door may be a
Textual screen, a shell command, an HTTP route, a Unix-socket daemon or an MCP server. They may
be called from any thread; none blocks on the UI.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from inferscale_core.factlog import FactLog

if TYPE_CHECKING:
    from inferscale_core.importers.pipeline import Importer, ImportReport, ProgressEvent
    from inferscale_core.session import Reply, Session
    from inferscale_core.types import Fact

T = TypeVar("T")

#: Opens the session on the desk's thread; reports its start-up steps to its argument.
SessionOpener = Callable[[Callable[[str], None]], "Session"]
ADDED = "added"  # the cause of a fact added through a desk (Session.remember's default)
FORGOTTEN = "forgotten by the user"


class SessionNotReadyError(RuntimeError):
    """The session is not open: it failed to start (the message says why) or was closed."""


def fact_json(fact: Fact, public_id: Callable[[int], int] | None = None) -> dict[str, Any]:
    """A fact's one JSON form (``memory list --json``, ``memory export``, the HTTP API).

    Args:
        fact: the fact.
        public_id: maps fact ids to the ids a client sees (a server's per-user ids); with it
            the fact's source turns are left out (turn ids are not the client's to see).

    Returns:
        ``{"id", "text", "refers_to", "created_at", "status", "supersedes", "valid_until",
        "ended_by"}`` (dates ISO, ``valid_until`` None while it is true), plus
        ``"source_turn_ids"`` without ``public_id``.
    """
    ident = public_id or (lambda fact_id: fact_id)
    found: dict[str, Any] = {
        "id": ident(fact.id),
        "text": fact.text,
        "refers_to": fact.refers_to.isoformat() if fact.refers_to else None,
        "created_at": fact.created_at.isoformat(),
        "status": fact.status,
        "supersedes": None if fact.supersedes is None else ident(fact.supersedes),
        # null: true now; else the day a later fact (ended_by) replaced or ended it
        "valid_until": fact.valid_until.isoformat() if fact.valid_until else None,
        "ended_by": None if fact.ended_by is None else ident(fact.ended_by),
    }
    if public_id is None:
        found["source_turn_ids"] = list(fact.source_turn_ids)
    return found


def reply_json(reply: Reply) -> dict[str, Any]:
    """A finished reply as plain data: what :meth:`Desk.ask` yields last, in a socket's form.

    Returns:
        ``{"text", "mode", "conversation_id", "user_turn_id", "assistant_turn_id", "facts":
        [{"id", "text", "date", "score", "how", "tier"}], "notes", "ttft_s", "prompt_tokens",
        "injected_tokens", "prefix_cached_tokens", "computed_tokens", "refused"}``; an ad-hoc
        fact's id is its KV key and its score None.
    """
    result = reply.result
    return {
        "text": reply.text.strip(),
        "mode": reply.mode,
        "conversation_id": reply.conversation_id,
        "user_turn_id": reply.user_turn_id,
        "assistant_turn_id": reply.assistant_turn_id,
        "facts": [
            {
                "id": f.fact_id,
                "text": f.text,
                "date": f.refers_to,
                "score": None if f.score is None else round(f.score, 4),
                "how": f.how,
                "tier": f.tier,
            }
            for f in reply.facts
        ],
        "notes": reply.notes,
        "ttft_s": None if result is None else result.ttft_s,
        "prompt_tokens": 0 if result is None else result.prompt_tokens,
        "injected_tokens": 0 if result is None else result.injected_tokens,
        "prefix_cached_tokens": 0 if result is None else result.prefix_cached_tokens,
        "computed_tokens": 0 if result is None else result.computed_tokens,
        "refused": None if result is None else result.refused,
    }


class Desk:
    """One profile's memory service: its session on one thread, reads on another.

    Args:
        db_path: the fact log (created and migrated if new).
        profile: the profile every call works in.
        opener: opens the session (slow: it may start the engine), on the desk's thread, when
            :meth:`start` is called; None: a desk for imports and reads only.
        name: the session thread's name (shown in thread dumps).
    """

    def __init__(
        self,
        db_path: Path,
        profile: str = "default",
        opener: SessionOpener | None = None,
        *,
        name: str = "session",
    ) -> None:
        self.db_path = Path(db_path)
        self.profile = profile
        self.opener = opener
        self.session: Session | None = None
        self.error: BaseException | None = None
        self._pool = ThreadPoolExecutor(1, thread_name_prefix=name)
        self._reader_pool = ThreadPoolExecutor(1, thread_name_prefix=f"{name}-reader")
        self._reader: tuple[FactLog, int] | None = None
        self._started: Future[Session] | None = None
        self._closed = threading.Event()

    # ---- the thread ----
    @property
    def ready(self) -> bool:
        """Whether the session is open."""
        return self.session is not None

    def start(self, on_step: Callable[[str], None] = lambda step: None) -> Future[Session]:
        """Open the session (once; later calls return the same future).

        Args:
            on_step: told each start-up step (on the desk's thread).

        Returns:
            A future that resolves to the session when it is open (or raises why not).
        """
        if self._started is None:
            if self.opener is None:
                raise SessionNotReadyError("this desk has no session to open")
            self._started = self._pool.submit(self._open, self.opener, on_step)
        return self._started

    def _open(self, opener: SessionOpener, on_step: Callable[[str], None]) -> Session:
        try:
            self.session = opener(on_step)
        except BaseException as exc:
            self.error = exc
            raise
        return self.session

    def submit(self, fn: Callable[[Session], T]) -> Future[T]:
        """Run ``fn(session)`` on the desk's thread, after what was submitted before."""

        def job() -> T:
            if self.session is None:
                why = f": {self.error}" if self.error is not None else ""
                raise SessionNotReadyError(f"the assistant did not start{why}")
            return fn(self.session)

        return self._pool.submit(job)

    def call(self, fn: Callable[[Session], T]) -> T:
        """:meth:`submit` and wait for the result (from any thread but the desk's)."""
        return self.submit(fn).result()

    def read(self, fn: Callable[[FactLog, int], T]) -> Future[T]:
        """Run ``fn(factlog, profile_id)`` on the reader thread (its own connection): for
        reads and small writes that must not wait behind a reply."""

        def job() -> T:
            if self._reader is None:
                log = FactLog.open(self.db_path)
                self._reader = (log, log.profile(self.profile))
            return fn(*self._reader)

        return self._reader_pool.submit(job)

    def close(self, timeout: float = 60.0) -> None:
        """Close the session and the reader on their own threads, then stop both (repeatable).

        Args:
            timeout: how long to wait for each to close.
        """
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

        done = [self._pool.submit(close_session), self._reader_pool.submit(close_reader)]
        for future in done:
            with contextlib.suppress(Exception):  # closing: nothing left to tell anyone
                future.result(timeout)
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._reader_pool.shutdown(wait=False)

    # ---- conversations ----
    def conversation(self, source: str, title: str | None = None) -> int:
        """The profile's conversation of ``source`` ("shell", "api", ...), created on first use.

        Found by source, not title, so a title the user gave it later is kept.

        Args:
            source: its source and source id.
            title: its title when created (default: ``source``).

        Returns:
            The conversation's id.
        """
        return self.call(
            lambda session: find_or_create(session.factlog, session.profile_id, source, title)
        )

    def recent_conversations(self, limit: int = 20) -> list[dict[str, Any]]:
        """The profile's conversations, most recently active first.

        Args:
            limit: at most this many.

        Returns:
            ``[{"id", "title", "source", "created_at", "turns"}]``.
        """
        rows = self.read(lambda log, pid: log.conversations(pid, limit=limit)).result()
        return [
            {
                "id": c.id,
                "title": c.title,
                "source": c.source,
                "created_at": c.created_at.isoformat(),
                "turns": c.turns,
            }
            for c in rows
        ]

    # ---- facts ----
    def search(self, query: str, k: int | None = None) -> list[dict[str, Any]]:
        """What a reply to ``query`` would retrieve, best first.

        Args:
            query: the question.
            k: how many (None: the session's k).

        Returns:
            :func:`fact_json` of each hit with its ``"score"`` and ``"rank"``.
        """

        def run(session: Session) -> list[dict[str, Any]]:
            session.sync_changes()
            hits = session.retriever.search(
                session.profile_id, query, session.config.k if k is None else k
            )
            return [
                dict(fact_json(h.fact), score=round(h.score, 4), rank=h.rank)
                for h in sorted(hits, key=lambda h: h.rank)
            ]

        return self.call(run)

    def add_fact(self, text: str, refers_to: str | None = None, cause: str = ADDED) -> dict:
        """Remember a fact the user states (deduplicated; searchable at once, encoded soon).

        Args:
            text: the fact.
            refers_to: the ISO day it is about, if any.
            cause: why it was added (kept in its history).

        Returns:
            Its :func:`fact_json`. Raises ValueError for an empty text or a bad date.
        """
        day = date.fromisoformat(refers_to) if refers_to else None
        return fact_json(self.call(lambda session: session.remember(text, day, cause)))

    def forget(self, fact_id: int, cause: str = FORGOTTEN) -> bool:
        """Forget the profile's active fact ``fact_id`` (the log, the index and its KV).

        Args:
            fact_id: the fact's id.
            cause: why (kept in its history).

        Returns:
            False when the profile has no such active fact.
        """

        def run(session: Session) -> bool:
            fact = session.factlog.get_fact(fact_id)
            if fact is None or fact.profile_id != session.profile_id or fact.status != "active":
                return False
            session.forget(fact_id, cause)
            return True

        return self.call(run)

    # ---- asking ----
    def ask(
        self,
        question: str,
        *,
        conversation_id: int | None = None,
        log: bool = True,
        facts: Iterable[tuple[str, str | None]] | None = None,
        k: int | None = None,
        mode: str | None = None,
        recompute: int | None = None,
        max_tokens: int | None = None,
    ) -> Iterator[tuple[str, Reply]]:
        """Answer ``question``, streaming ``(delta, reply so far)``; the last item's delta is
        "" and its reply finished (:func:`reply_json` gives its plain form).

        The turn runs on the desk's thread; its deltas cross to the caller's through one
        queue. Closing the iterator early stops the reply (the engine's request is aborted).

        Args:
            question: the user's message.
            conversation_id: where the exchange is logged (and its history comes from); None:
                no history, nothing logged.
            log: False: nothing is written (the memory is only read).
            facts: ``(text, ISO day or None)`` ad-hoc memories: the reply uses these alone,
                encoded for it; nothing is retrieved or logged.
            k, mode, recompute, max_tokens: this reply's memories retrieved, "inject" or
                "prompt", best hits prefilled instead of injected, reply length (None: the
                session's).

        Raises:
            TurnRejected: the question is empty, or it (or the ad-hoc memories) cannot fit
                the model's context; raised before anything is logged.
        """
        options = {"k": k, "mode": mode, "recompute": recompute, "max_tokens": max_tokens}
        adhoc = None if facts is None else list(facts)

        def turn(session: Session) -> Iterator[tuple[str, Reply]]:
            if adhoc is not None:
                return ask_with_facts(session, question, adhoc, mode=mode, max_tokens=max_tokens)
            return session.ask(conversation_id, question, log=log, **options)

        return self.stream(turn)

    def ask_plain(self, question: str, **options: Any) -> Iterator[str | dict[str, Any]]:
        """:meth:`ask` as plain data (what the socket sends): the text deltas (str), then the
        finished reply's :func:`reply_json` (dict). Closing it early stops the reply.

        Args:
            question: the user's message.
            options: :meth:`ask`'s (``facts`` as ``(text, ISO day or None)`` pairs).
        """
        replies = self.ask(question, **options)
        last = None
        try:
            for delta, reply in replies:
                last = reply
                if delta:
                    yield delta
        finally:
            replies.close()  # stopped early: the engine aborts the request
        if last is not None:
            yield reply_json(last)

    def stream(self, make: Callable[[Session], Iterator[T]]) -> Iterator[T]:
        """Run the generator ``make(session)`` on the desk's thread and yield its items here.

        One queue between the two threads, read blocking (no polling); closing this iterator
        closes the generator at its next item.
        """
        items: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        stop = threading.Event()

        def job(session: Session) -> None:
            source = make(session)
            try:
                for item in source:
                    if stop.is_set():
                        return
                    items.put(("item", item))
            finally:
                close = getattr(source, "close", None)
                if close is not None:
                    close()  # stopped early: the engine aborts the request

        future = self.submit(job)
        # Done, failed or cancelled (the desk closed): the reader is told, whatever happened.
        future.add_done_callback(lambda f: items.put(("end", f)))
        try:
            while True:
                kind, value = items.get()
                if kind == "end":
                    value.result()  # raises the job's error, or CancelledError
                    return
                yield value
        finally:
            stop.set()

    # ---- imports ----
    def importer(self, inbox: Path) -> Importer:
        """An importer on its own connection, opened on (and for) the calling thread.

        Args:
            inbox: the watched inbox: files directly in it are filed away after import.
        """
        from inferscale_core.importers.pipeline import Importer

        log = FactLog.open(self.db_path)
        try:
            return Importer(log, log.profile(self.profile), inbox)
        except BaseException:
            log.close()
            raise

    def import_path(
        self,
        path: Path,
        inbox: Path,
        on_progress: Callable[[ProgressEvent], None] | None = None,
    ) -> ImportReport:
        """Import a chat export (a file or a folder of them) on the calling thread, then wake
        the memory worker to extract and encode what arrived.

        Args:
            path: the file or folder.
            inbox: the watched inbox (files directly in it are moved to ``imported/`` or
                ``quarantine/``).
            on_progress: told each file's progress (on the calling thread).

        Returns:
            The import's :class:`~inferscale_core.importers.pipeline.ImportReport` (its
            ``files`` hold plain fields: status, format, conversations, turns_added, reason).
        """
        importer = self.importer(inbox)
        try:
            report = importer.import_path(path, on_progress=on_progress)
        finally:
            importer.factlog.close()
        self.wake()
        return report

    # ---- the memory worker ----
    def wake(self) -> None:
        """New turns were logged: the memory worker extracts and encodes them now (a no-op
        while the session is not open)."""
        session = self.session
        if session is not None and session.worker is not None:
            session.worker.wake()

    def wait_remembered(self, turn_ids: Iterable[int], timeout_s: float) -> bool:
        """Wait until the facts told in ``turn_ids`` are extracted and encoded (then the next
        reply injects them), woken by each batch the memory worker finishes.

        Args:
            turn_ids: the turns (e.g. a reply's ``user_turn_id`` and ``assistant_turn_id``).
            timeout_s: at most this long.

        Returns:
            False if the time ran out first, or no memory worker runs (the fact log is its
            queue: the work is done the next time one runs).
        """
        turns = set(turn_ids)
        session = self.session
        worker = None if session is None else session.worker
        if worker is None or not worker.started or not turns or timeout_s <= 0:
            return False
        deadline = time.monotonic() + timeout_s
        while True:
            seen = worker.batches  # before looking: a batch ending meanwhile is not missed
            if self.call(lambda s: remembered(s, turns)):
                return True
            left = deadline - time.monotonic()
            if left <= 0 or not worker.started:
                return False
            worker.wait_batch(seen, left)


def find_or_create(log: FactLog, profile_id: int, source: str, title: str | None = None) -> int:
    """The profile's conversation stored under ``(source, source)``, created on first use."""
    from inferscale_core.types import Conversation

    found = log.conversation_by_source(profile_id, source, source)
    if found is not None:
        return found
    conversation = Conversation(title=title or source, source=source, source_id=source)
    return log.add_conversation(profile_id, conversation)[0]


def remembered(session: Session, turns: set[int]) -> bool:
    """Whether ``turns`` are extracted and none of their facts waits for its KV."""
    log, profile_id = session.factlog, session.profile_id
    if log.extraction_cursor(profile_id) < max(turns):
        return False
    pending = log.facts_without_kv(
        profile_id, session.builder.fingerprint, session.config.w, session.encoding
    )
    return not any(turns.intersection(fact.source_turn_ids) for fact in pending)


def ask_with_facts(
    session: Session,
    question: str,
    facts: list[tuple[str, str | None]],
    *,
    mode: str | None = None,
    max_tokens: int | None = None,
) -> Iterator[tuple[str, Reply]]:
    """Answer from ``facts`` alone (encoded into the store as ad-hoc memories); nothing is
    retrieved or logged. See :meth:`Desk.ask`."""
    from inferscale_core.composer import EmptyTurn, TurnRejected, fact_line
    from inferscale_core.prompt_budget import fit_turn
    from inferscale_core.prompt_builder import MemoryFact
    from inferscale_core.session import INJECTED, TEXT, InjectedFact, PreparedTurn, Reply

    if not question.strip():
        raise EmptyTurn()
    builder, settings = session.builder, session.config
    mode = mode or settings.mode
    max_tokens = max_tokens or settings.max_tokens
    memory = [MemoryFact(text, date.fromisoformat(day) if day else None) for text, day in facts]
    lengths = [len(builder.layout.fact_ids(fact_line(f.text, f.when))) for f in memory]
    fit = fit_turn(
        builder.layout,
        question,
        (),
        lengths,
        context=session.engine.max_model_len,
        reply_tokens=max_tokens,
    )
    if fit.dropped_memories:
        raise TurnRejected(
            f"the --fact memories ({sum(lengths):,} tokens) do not fit the model's context"
            f" with the question and {max_tokens} tokens for the reply"
        )
    entries = builder.encode_many(memory)
    how = TEXT if mode == "prompt" else INJECTED
    reply = Reply(None, mode=mode)
    reply.facts = [
        InjectedFact(key, f.text, f.when.isoformat() if f.when else None, None, how)
        for f, (key, _) in zip(memory, entries, strict=True)
    ]
    prompt: Any = (
        builder.prompt_injection_ids(memory, question)
        if mode == "prompt"
        else builder.compose(entries, question)
    )
    turn = PreparedTurn(
        reply,
        [key for key, _ in entries] if how == INJECTED else [],
        prompt,
        max_tokens=max_tokens,
        sampling=settings.sampling,
    )
    yield from session.generate(turn)
    session.finish(turn)  # no user turn: nothing is logged; settles how the facts went in
    yield "", turn.reply
