"""The chat loop: user turn -> retrieve -> compose -> engine -> reply -> log -> extract -> encode.

The UI only calls this. Retrieval runs on the caller's thread; extraction and encoding run in
the :class:`~inferscale_core.memory_worker.MemoryWorker` thread, which tells the session which
facts became injectable. A retrieved fact whose KV is not stored yet still reaches the model,
as plain text after the injected span (prefilled like the question), so nothing retrieved is
ever dropped while encoding catches up. One whose KV the disk budget dropped (or whose encoding
an import deferred) goes in so too, and is queued for encoding again; the entries a reply
injects are reported to the worker, which records when each was last used.
"""

from __future__ import annotations

import contextlib
import queue
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from typing import Any

from inferscale_core.composer import ComposedPrompt, EmptyTurn, fact_line
from inferscale_core.context_window import ANCHORED, encoding_version
from inferscale_core.engine import Engine
from inferscale_core.factlog import FactLog
from inferscale_core.generation import GREEDY, LoopGuard, Sampling
from inferscale_core.kvstore import EntryMissingError, KVStore
from inferscale_core.memory_worker import MemoryWorker
from inferscale_core.prompt_budget import fit_turn
from inferscale_core.prompt_builder import MemoryFact, PromptBuilder
from inferscale_core.retriever import Retriever
from inferscale_core.types import HOWS as HOWS  # re-exported: tests name it from here
from inferscale_core.types import (
    INJECTED,
    RECOMPUTED,
    REENCODING,
    TEXT,
    Conversation,
    Fact,
    GenerationResult,
    Hit,
    ReplyDetails,
    ReplyMemory,
    Turn,
)

SYNC_THRESHOLD = 64  # more new facts than this: rebuild the index from stored embeddings


def _line(fact: Fact) -> str:
    """The fact's line in a prompt (with its end, when it stopped being true)."""
    return fact_line(fact.text, fact.refers_to, fact.valid_until)


@dataclass(slots=True)
class SessionConfig:
    k: int = 50  # facts retrieved per turn (AppConfig.k says why 50)
    w: int = 20  # context turns each fact is encoded with
    window: str = ANCHORED  # which turns those are (inferscale_core.context_window)
    history_turns: int = 6  # recent turns of this conversation kept in the prompt
    history_tokens: int | None = 1024  # ... and at most this many tokens of their text
    max_tokens: int = 512  # of a reply; the prompt leaves room for them
    sampling: Sampling = GREEDY  # the app passes the model's (inferscale_core.generation)
    loop_guard: bool = True  # stop a reply that repeats itself
    recompute: int = 0  # the best hits prefilled with the question instead of injected
    mode: str = "inject"  # "inject" (KV injection) or "prompt" (facts as prompt text)


@dataclass(slots=True)
class InjectedFact:
    """One memory as it went into a reply, for the memory panel."""

    fact_id: int | str  # an ad-hoc memory's (Desk.ask's facts): its KV key
    text: str
    refers_to: str | None
    score: float | None  # None: an ad-hoc memory (not retrieved)
    # "injected" (KV from the store), "recomputed" (one of the best hits, prefilled after the
    # injected ones: it attends to them), "text" (KV not ready: prefilled likewise), "text
    # (re-encoding)" (KV dropped for the disk budget: prefilled, encoded again): HOWS
    how: str
    tier: str | None = None  # which store tier served it, when injected


@dataclass(slots=True)
class Reply:
    """A finished (or streaming) answer and what memory it used."""

    conversation_id: int | None  # None: asked outside a conversation (nothing logged)
    text: str = ""
    facts: list[InjectedFact] = field(default_factory=list)
    result: GenerationResult | None = None
    mode: str = "inject"
    user_turn_id: int | None = None
    assistant_turn_id: int | None = None
    trimmed: str = ""  # what was left out to fit the context ("" = nothing)
    stopped: str | None = None  # "loop": the guard stopped a reply repeating itself

    @property
    def notes(self) -> list[str]:
        """What the user should know about how this reply came about."""
        notes = [self.trimmed] if self.trimmed else []
        if self.stopped == "loop":
            notes.append("stopped: the reply began repeating itself")
        return notes

    @property
    def injected_fact_ids(self) -> list[int]:
        return [f.fact_id for f in self.facts if f.how == INJECTED]


@dataclass(slots=True)
class PreparedTurn:
    """A turn between :meth:`Session.prepare` and :meth:`Session.finish`."""

    reply: Reply
    injected_keys: list[str]  # the entry keys of the reply's "injected" facts, in order
    prompt: ComposedPrompt | list[int] = field(default_factory=list)
    cache_salt: str | None = None  # of a plain prompt (prompt injection) on a server
    max_tokens: int = 512  # of the reply
    sampling: Sampling = GREEDY
    k: int = 0  # memories asked for


class Session:
    def __init__(
        self,
        factlog: FactLog,
        profile_id: int,
        retriever: Retriever,
        builder: PromptBuilder,
        store: KVStore,
        engine: Engine,
        worker: MemoryWorker | None = None,
        config: SessionConfig | None = None,
    ) -> None:
        self.factlog = factlog
        self.profile_id = profile_id
        self.retriever = retriever
        self.builder = builder
        self.store = store
        self.engine = engine
        self.worker = worker
        self.config = config or SessionConfig()
        self._changes: queue.SimpleQueue[tuple[list[int], list[int]]] = queue.SimpleQueue()

    @property
    def encoding(self) -> str:
        """The fact log's name for the encoding this session injects (the worker writes it)."""
        return encoding_version(self.builder.encoder_version, self.config.w, self.config.window)

    def close(self) -> None:
        if self.worker is not None:
            self.worker.stop()
        self.factlog.close()

    # ---- called by the memory worker's thread ----
    def notify_changed(self, added: list[int], removed: list[int]) -> None:
        self._changes.put((added, removed))

    def sync_changes(self) -> None:
        """Bring the index up to date now (what :meth:`prepare` does first)."""
        self._apply_changes()

    def _apply_changes(self) -> None:
        """Bring this thread's index up to date with what the memory worker extracted."""
        added: list[int] = []
        while True:
            try:
                new, removed = self._changes.get_nowait()
            except queue.Empty:
                break
            added.extend(new)
            for fact_id in removed:
                self.retriever.remove(fact_id)
        if len(added) > SYNC_THRESHOLD:  # e.g. after an import: reload the stored vectors
            self.retriever.sync(self.profile_id)
        elif added:
            facts = [self.factlog.get_fact(fact_id) for fact_id in added]
            self.retriever.add_many([f for f in facts if f is not None and f.status == "active"])

    # ---- conversations ----
    def new_conversation(self, title: str = "New chat") -> int:
        conversation_id, _ = self.factlog.add_conversation(
            self.profile_id, Conversation(title=title, source="chat")
        )
        return conversation_id

    def _history(self, conversation_id: int) -> list[tuple[str, str]]:
        turns = self.factlog.recent_turns(conversation_id, self.config.history_turns)
        return [("assistant" if t.speaker == "assistant" else "user", t.text) for t in turns]

    def _plan(
        self, hits: list[Hit], recompute: int
    ) -> tuple[list[tuple[str, list[int]]], list[str], list[InjectedFact]]:
        """Split hits into stored KV entries and text lines, in hit order: a fact goes in as
        text when its KV is not ready, or when it is one of the ``recompute`` best hits (then
        it is prefilled with the question, after every injected fact, and attends to them).
        A text fact whose encoding was deferred is queued again (when a worker runs to do
        it); the injected entries are noted as used (the budget drops the least recent)."""
        entries, lines, used = [], [], []
        injectable = [h.fact.id for h in hits if h.rank > recompute]
        # one query and one folder stat for all the hits (not a query and 3 stats each)
        keys = self.factlog.kv_keys_for(
            injectable, self.builder.fingerprint, self.config.w, self.encoding
        )
        headers = self.store.header_reader()
        tiers = self.store.fastest_tiers(keys.values())
        for hit in hits:
            fact = hit.fact
            when = fact.refers_to.isoformat() if fact.refers_to else None
            if hit.rank <= recompute:  # rank 1 = the best hit
                lines.append(_line(fact))
                used.append(InjectedFact(fact.id, fact.text, when, hit.score, RECOMPUTED))
                continue
            key = keys.get(fact.id)
            header = None
            if key is not None:
                with contextlib.suppress(EntryMissingError):  # forgotten, or not stored yet
                    header = headers([key])[0]
            if header is not None:
                entries.append((key, list(header.token_ids)))
                used.append(InjectedFact(fact.id, fact.text, when, hit.score, INJECTED, tiers[key]))
            else:
                lines.append(_line(fact))
                used.append(InjectedFact(fact.id, fact.text, when, hit.score, TEXT))
        self._encode_lost()
        self._encode_deferred([f for f in used if f.how == TEXT])
        if entries and self.worker is not None:
            self.worker.note_used(key for key, _ in entries)
        return entries, lines, used

    def _encode_deferred(self, text_facts: list[InjectedFact]) -> None:
        """Retrieved facts going in as text whose encoding was deferred are queued again; one
        whose KV the budget dropped says so ("text (re-encoding)"). Only while a worker runs
        here (``ask --no-log`` writes nothing)."""
        if not text_facts or self.worker is None or not self.worker.started:
            return
        deferred = self.factlog.want_kv([f.fact_id for f in text_facts])
        if not deferred:
            return
        for fact in text_facts:
            if deferred.get(fact.fact_id) == "evicted":
                fact.how = REENCODING
        self.worker.wake()

    def _encode_lost(self) -> None:
        """Entries the store found damaged (and deleted) are encoded again: their facts go in
        as text until then."""
        lost = self.store.lost()
        if lost and self.factlog.drop_kv_locations(lost) and self.worker is not None:
            self.worker.wake()

    def ask(
        self, conversation_id: int | None, text: str, *, log: bool = True, **options: Any
    ) -> Iterator[tuple[str, Reply]]:
        """Answer ``text`` in a conversation, streaming ``(delta, reply so far)``; with
        ``log=False`` nothing is written (the conversation only gives the history; None: none).
        ``options``: this reply's ``k``, ``mode``, ``recompute``, ``max_tokens``
        (:meth:`prepare`).

        Raises :class:`~inferscale_core.composer.TurnRejected` (empty, or too long for the
        model's context by itself) before anything is logged or sent."""
        turn = self.prepare(conversation_id, text, log=log, **options)
        yield from self.generate(turn)
        self.finish(turn)
        yield "", turn.reply

    # The three steps of ``ask``, for a server: ``prepare`` and ``finish`` use this session's
    # fact log (one thread at a time); ``generate`` only the engine (any thread, concurrently).
    def prepare(
        self,
        conversation_id: int | None,
        text: str,
        *,
        log: bool = True,
        history: list[tuple[str, str]] | None = None,
        max_tokens: int | None = None,
        sampling: Sampling | None = None,
        k: int | None = None,
        mode: str | None = None,
        recompute: int | None = None,
    ) -> PreparedTurn:
        """Retrieve, fit and compose the request for ``text``; log the user's turn (``log``).
        ``history``: ``(role, text)`` turns to use instead of the conversation's own;
        ``max_tokens``, ``sampling``, ``k``, ``mode`` ("inject" or "prompt") and
        ``recompute``: this reply's, instead of the session's."""
        if not text.strip():
            raise EmptyTurn()
        self._apply_changes()
        k = self.config.k if k is None else k
        mode = mode or self.config.mode
        hits = self.retriever.search(self.profile_id, text, k) if k else []
        layout = self.builder.layout
        by_rank = sorted(hits, key=lambda h: h.rank)  # the best first (hits: prompt order)
        if history is None:
            history = self._history(conversation_id) if conversation_id is not None else []
        fit = fit_turn(
            layout,
            text,
            history,
            [len(layout.fact_ids(_line(h.fact))) for h in by_rank],
            context=self.engine.max_model_len,
            reply_tokens=max_tokens or self.config.max_tokens,
            history_tokens=self.config.history_tokens,
        )
        # the least relevant are left out (ranks stay 1..n: the recompute split relies on it)
        hits, history = [h for h in hits if h.rank <= fit.memories], fit.history
        user_turn_id = (
            self.factlog.append_turn(conversation_id, Turn("user", text, datetime.now(UTC)))
            if log and conversation_id is not None
            else None
        )
        reply = Reply(conversation_id, mode=mode, user_turn_id=user_turn_id)
        reply.trimmed = fit.describe()
        turn = PreparedTurn(
            reply,
            [],
            max_tokens=max_tokens or self.config.max_tokens,
            sampling=sampling or self.config.sampling,
            k=k,
        )
        if mode == "prompt":
            memory = [
                MemoryFact(h.fact.text, h.fact.refers_to, until=h.fact.valid_until) for h in hits
            ]
            turn.prompt = self.builder.prompt_injection_ids(memory, text, history)
            if self.builder.salt_scope:  # a server's user: no prefix-cache blocks shared
                turn.cache_salt = f"inferscale/prompt/{self.builder.salt_scope}"
            when = [h.fact.refers_to.isoformat() if h.fact.refers_to else None for h in hits]
            reply.facts = [
                InjectedFact(h.fact.id, h.fact.text, d, h.score, TEXT)
                for h, d in zip(hits, when, strict=True)
            ]
        else:
            recompute = self.config.recompute if recompute is None else recompute
            entries, lines, reply.facts = self._plan(hits, recompute)
            turn.injected_keys = [key for key, _ in entries]
            recomputed = sum(1 for f in reply.facts if f.how == RECOMPUTED)
            turn.prompt = self.builder.compose(
                entries, text, history, self.config.w, lines, self.config.window, recomputed
            )
        return turn

    def generate(self, turn: PreparedTurn) -> Iterator[tuple[str, Reply]]:
        """Stream the reply to a prepared turn: ``(delta, reply so far)``. Closing the
        iterator early aborts the engine's request."""
        reply, guard = turn.reply, self._begin(turn)
        stream = self.engine.stream(turn.prompt, **self._request_kwargs(turn))
        try:
            for delta, result in stream:
                reply.text, reply.result = result.text, result
                yield delta, reply
                if self._looping(reply, guard):
                    break
        finally:
            stream.close()  # a reply stopped early: the engine aborts its request
            self._end()

    async def agenerate(self, turn: PreparedTurn) -> AsyncIterator[tuple[str, Reply]]:
        """:meth:`generate` on an engine's event loop (``astream``: the serving engine), for
        a server running on that loop: no thread between the engine and the client."""
        reply, guard = turn.reply, self._begin(turn)
        stream = self.engine.astream(turn.prompt, **self._request_kwargs(turn))
        try:
            async for delta, result in stream:
                reply.text, reply.result = result.text, result
                yield delta, reply
                if self._looping(reply, guard):
                    break
        finally:
            await stream.aclose()  # stopped early (or the client went away): aborted
            self._end()

    def _begin(self, turn: PreparedTurn) -> LoopGuard | None:
        """Pause the memory worker; the reply's loop guard (none for a reply asked to run
        ``min_tokens`` long: the guard would cut it short)."""
        if self.worker is not None:
            self.worker.pause()
        wanted = self.config.loop_guard and not turn.sampling.min_tokens
        return LoopGuard() if wanted else None

    def _end(self) -> None:
        if self.worker is not None:
            self.worker.resume()

    @staticmethod
    def _request_kwargs(turn: PreparedTurn) -> dict[str, Any]:
        salt = {"cache_salt": turn.cache_salt} if turn.cache_salt else {}
        return {"max_tokens": turn.max_tokens, **salt, **turn.sampling.engine_kwargs()}

    @staticmethod
    def _looping(reply: Reply, guard: LoopGuard | None) -> bool:
        """True when the loop guard stops the reply (it began repeating itself)."""
        if guard is not None and guard.feed(reply.text):
            reply.stopped = "loop"
            return True
        return False

    def finish(self, turn: PreparedTurn) -> Reply:
        """Settle how each memory went in, and log the reply with its details (if the user's
        turn was logged)."""
        reply = turn.reply
        injected = [f for f in reply.facts if f.how == INJECTED]
        if reply.result is not None and reply.result.refused:
            for fact in reply.facts:
                fact.how = TEXT if fact.how == INJECTED else fact.how
        elif reply.result is not None:
            for fact, key in zip(injected, turn.injected_keys, strict=True):
                fact.tier = reply.result.entry_tiers.get(key, fact.tier)  # none if stopped early
        if reply.user_turn_id is not None and reply.conversation_id is not None:
            memories = [
                ReplyMemory(f.fact_id, f.text, f.refers_to, f.score, f.how, f.tier)
                for f in reply.facts
            ]
            details = ReplyDetails.of(reply.result, reply.mode, turn.k, memories, reply.notes)
            with self.factlog.transaction():  # the turn and what it used, together
                reply.assistant_turn_id = self.factlog.append_turn(
                    reply.conversation_id,
                    Turn("assistant", reply.text.strip(), datetime.now(UTC)),
                )
                self.factlog.save_reply_details(reply.assistant_turn_id, details)
            if self.worker is not None:
                self.worker.wake()
        return reply

    def ask_all(self, conversation_id: int | None, text: str, *, log: bool = True) -> Reply:
        reply = None
        for _, reply in self.ask(conversation_id, text, log=log):  # noqa: B007 - the last one
            pass
        assert reply is not None
        return reply

    # ---- memory edits: one operation across the log, the index and every KV tier ----
    def remember(self, text: str, refers_to: date | None = None, cause: str = "added") -> Fact:
        """Add a fact the user states directly (deduplicated, like an extracted one); it is
        searchable at once and encoded by the memory worker."""
        fact_id, _ = self.factlog.add_fact(
            self.profile_id, text, refers_to, cause=cause, allow_forgotten=True
        )
        fact = self.factlog.get_fact(fact_id)
        assert fact is not None
        self.retriever.add(fact)
        if self.worker is not None:
            self.worker.wake()
        return fact

    def forget(self, fact_id: int, cause: str = "forgotten by the user") -> None:
        for key in self.factlog.forget_fact(fact_id, cause):
            self.store.delete(key)
        self.retriever.remove(fact_id)

    def reopen(self, fact_id: int, cause: str = "undone by the user") -> None:
        """Undo a replacement: the fact a later one closed is true now again. Its KV goes (its
        line no longer says "until"); the worker encodes it again."""
        for key in self.factlog.reopen_fact(fact_id, cause):
            self.store.delete(key)
        if self.worker is not None:
            self.worker.wake()

    def edit(self, fact_id: int, new_text: str, cause: str = "edited by the user") -> int:
        old_keys = self.factlog.kv_keys(fact_id)
        new_id = self.factlog.update_fact(fact_id, new_text, cause)
        for key in old_keys:
            self.store.delete(key)
        self.retriever.remove(fact_id)
        fact = self.factlog.get_fact(new_id)
        if fact is not None:
            self.retriever.add(fact)
        if self.worker is not None:
            self.worker.wake()
        return new_id
