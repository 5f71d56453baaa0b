"""Background memory work: extract facts from new turns, then encode their KV durably.

A worker thread that never blocks a chat turn. The fact log is the queue: turns after the
extraction cursor still need extracting, and active facts without a ``kv_entries`` row for the
current (model, w, encoder) still need encoding. A fact becomes injectable only once its
tensors are durably stored *and* the row is written, so a crash at any point leaves work that
the next start simply finds again — nothing is lost and content-addressed keys make a redo a
no-op. After a model change the same query finds every fact stale, and they are re-encoded.

KV is a cache the fact log can rebuild. With a disk budget, after each batch and when idle the
worker drops the least recently injected entries of its model down to 90% of the budget
(:func:`evict_over_budget`); their facts are deferred, encoded again only once retrieved. The
chat thread tells it which entries a reply injected (:meth:`MemoryWorker.note_used`); it
writes them, one UPDATE a batch, on its own thread. Facts from old turns of an imported
conversation are deferred likewise (``encode_recent_days``).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from inferscale_core.composer import fact_line
from inferscale_core.context_window import ANCHORED, encoding_version
from inferscale_core.extractor import Extractor, FactOp
from inferscale_core.factlog import FactLog, InactiveFactError
from inferscale_core.importers import FORMATS as IMPORTED_SOURCES
from inferscale_core.kvstore import EntryMissingError, KVStore, StoreFullError
from inferscale_core.prompt_builder import MemoryFact, PromptBuilder
from inferscale_core.retriever import Retriever
from inferscale_core.types import Fact, Turn

log = logging.getLogger(__name__)

EVICT_TO = 0.9  # over budget: drop entries down to this share of it
SPARE_SECONDS = 60.0  # entries injected this recently are never dropped
FULL_DISK_WAIT = 60.0  # the longest wait between tries while the disk is full


@dataclass(slots=True)
class WorkerStats:
    """What the footer shows: how much is queued, done, and how fast."""

    pending_turns: int = 0
    pending_facts: int = 0
    extracted_facts: int = 0
    encoded_facts: int = 0
    encode_rate: float = 0.0  # facts per second over the recent batches
    errors: int = 0
    last_error: str | None = None
    disk_full: bool = False  # the last batch could not write for want of room (last_error)
    to_convert: int = 0  # stored entries of another kv_store_dtype, left to rewrite
    # Of pending_facts, those with KV of another model (or window, encoder) only: a switch's
    # re-encode, most recently used first.
    reencoding: int = 0
    converted: int = 0
    evicted: int = 0  # entries dropped for the disk budget (their facts deferred)
    deferred: int = 0  # the profile's facts whose encoding waits until they are retrieved
    kv_bytes: int = 0  # what the model's entries take, as recorded (every profile)
    disk_budget: int | None = None  # bytes; None: no budget
    running: bool = False
    paused: bool = False


@dataclass(slots=True)
class _Rate:
    window: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=20))

    def add(self, seconds: float, count: int) -> None:
        self.window.append((seconds, count))

    @property
    def per_second(self) -> float:
        seconds = sum(s for s, _ in self.window)
        return sum(c for _, c in self.window) / seconds if seconds > 0 else 0.0


def evict_over_budget(
    factlog: FactLog,
    store: KVStore,
    budget: int,
    spare_seconds: float = SPARE_SECONDS,
    now: datetime | None = None,
) -> list[str]:
    """Over ``budget`` bytes (the rows of ``store``'s model, every profile): drop the least
    recently injected entries down to :data:`EVICT_TO` of it, sparing those injected in the
    last ``spare_seconds``. The rows go first, in one transaction; then the files. Returns the
    keys deleted."""
    fingerprint = store.fingerprint
    assert fingerprint is not None, "a budget needs the store of one model"
    if factlog.kv_bytes(fingerprint) <= budget:
        return []
    now = now or datetime.now(UTC)
    spare_since = now - timedelta(seconds=spare_seconds)
    keys = factlog.evict_kv(fingerprint, int(budget * EVICT_TO), spare_since)
    for key in keys:  # after the commit: a crash here leaves files no row names
        store.delete(key)
    return keys


def context_line(turn: Turn) -> str:
    """A context turn as the encoder sees it before a fact (same shape as a fact line)."""
    return fact_line(f"{turn.speaker}: {turn.text}", turn.timestamp)


class _ChatTurn(Exception):
    """A chat turn started (pause()) before this batch did anything: it is redone after."""


class MemoryWorker:
    """Runs extraction and encoding for one profile in a background thread.

    ``builder`` encodes into ``store``, where the worker also drops the entries of facts that
    stopped being facts. ``open_log`` opens a fact-log connection for the worker's own thread
    (SQLite connections belong to one thread); ``make_retriever`` builds the worker's own retriever
    over it, used to find the facts similar to a turn (update/delete targets, near-duplicates) and
    to store new facts' embeddings. ``on_change(added, removed)`` is told which fact ids were
    extracted or stopped being facts, so the chat thread can update its own index.
    ``pause()`` holds it for its own user's turns; ``wait_for_chat`` (the engine's) makes it
    step aside, between turns and batches, for any user's turn.
    """

    def __init__(
        self,
        open_log: Callable[[], FactLog],
        profile_id: int,
        builder: PromptBuilder,
        store: KVStore,
        extractor: Extractor,
        w: int = 20,
        window: str = ANCHORED,
        batch_size: int = 16,
        on_change: Callable[[list[int], list[int]], None] = lambda added, removed: None,
        make_retriever: Callable[[FactLog], Retriever] | None = None,
        poll_seconds: float = 1.0,
        wait_for_chat: Callable[[float], bool] | None = None,
        disk_budget: int | None = None,
        encode_recent_days: int | None = None,
        spare_seconds: float = SPARE_SECONDS,
    ) -> None:
        self.open_log = open_log
        self.profile_id = profile_id
        self.builder = builder
        self.store = store
        self.extractor = extractor
        self.w = w
        self.window = window
        self.batch_size = batch_size
        self.on_change = on_change
        self.make_retriever = make_retriever
        self._retriever: Retriever | None = None
        self.poll_seconds = poll_seconds
        # The engine's Engine.wait_for_chat: called between turns and batches, so that this
        # thread's Python work never competes with a chat turn's prompt (any profile's).
        self.wait_for_chat = wait_for_chat
        self.stats = WorkerStats()
        self._rate = _Rate()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._resume = threading.Event()
        self._resume.set()
        self._pauses = 0
        self._pause_lock = threading.Lock()
        self._idle = threading.Event()
        # wake() counts up; the worker declares itself idle only if no wake came during the
        # batch that found nothing (else that batch may have looked before the new work was
        # logged, and wait_idle would return with it pending).
        self._wakes = 0
        self._idle_lock = threading.Lock()
        self._batches = 0  # batches finished (done, found nothing or failed): wait_batch
        self._batch_done = threading.Condition()
        self._thread: threading.Thread | None = None
        # (fact id, key, stored scheme) of entries to rewrite (_convert_batch)
        self._to_convert: list[tuple[int, str, str]] | None = None
        # Bytes the model's entries may take (None: no budget); entries injected within
        # spare_seconds are kept. Facts of imported turns older than encode_recent_days
        # before their conversation's last turn are deferred (None: every fact encoded).
        self.disk_budget = disk_budget
        self.stats.disk_budget = disk_budget
        self.spare_seconds = spare_seconds
        self.encode_recent_days = encode_recent_days
        self._used: dict[str, datetime] = {}  # entry key -> when a reply injected it
        self._used_lock = threading.Lock()

    @property
    def encoding(self) -> str:
        """What the fact log records as this worker's encoding of a fact (beside model and w)."""
        return encoding_version(self.builder.encoder_version, self.w, self.window)

    # ---- control (any thread) ----
    def start(self) -> MemoryWorker:
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="memory-worker", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float | None = 30.0) -> None:
        self._stop.set()
        self._resume.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def wake(self) -> None:
        """New turns were logged: look for work now instead of at the next poll."""
        with self._idle_lock:
            self._wakes += 1
            self._idle.clear()
        self._wake.set()

    def pause(self) -> None:
        """Hold off between batches (e.g. while the engine answers a question). Nests: the
        worker runs again once every pause() has had its resume()."""
        with self._pause_lock:
            self._pauses += 1
            self._resume.clear()
            self.stats.paused = True

    def resume(self) -> None:
        with self._pause_lock:
            self._pauses = max(0, self._pauses - 1)
            if self._pauses == 0:
                self._resume.set()
                self.stats.paused = False

    @property
    def started(self) -> bool:
        """Whether the thread runs (so that what is queued now gets done in this process)."""
        return self._thread is not None and self._thread.is_alive() and not self._stop.is_set()

    def note_used(self, keys: Iterable[str]) -> None:
        """A reply injected these entries (any thread; the worker's thread writes them)."""
        now = datetime.now(UTC)
        with self._used_lock:
            for key in keys:
                self._used[key] = now

    @property
    def batches(self) -> int:
        """How many batches the thread has finished (read it before looking at the log, then
        :meth:`wait_batch` for the next one)."""
        return self._batches

    def wait_batch(self, seen: int, timeout: float) -> bool:
        """Block until a batch after the first ``seen`` finishes (True), or the timeout."""
        with self._batch_done:
            return self._batch_done.wait_for(lambda: self._batches > seen, timeout)

    def _finished_batch(self) -> None:
        with self._batch_done:
            self._batches += 1
            self._batch_done.notify_all()

    def wait_idle(self, timeout: float = 60.0) -> bool:
        """Block until the worker found nothing left to do (True) or the timeout passed."""
        self.wake()
        return self._idle.wait(timeout)

    # ---- the thread ----
    def _run(self) -> None:
        factlog = self.open_log()
        self._retriever = self.make_retriever(factlog) if self.make_retriever else None
        self.stats.running = True
        full_wait = 0.0  # seconds between tries while the disk is full (doubling)
        started = False
        try:
            while not self._stop.is_set():
                if started:  # the batch before is over (whatever its end): tell waiters
                    self._finished_batch()
                    started = False
                self._resume.wait()
                if self._stop.is_set():
                    break
                started = True
                wakes = self._wakes  # before the batch looks at the log
                try:
                    # Every pending turn is extracted (searchable) before facts are encoded:
                    # an import's memories are found, as text, long before all are encoded.
                    did = (
                        self._extract_batch(factlog)
                        or self._read_slots(factlog)
                        or self._encode_batch(factlog)
                    )
                    if not did:  # nothing new: rewrite older entries in today's kv_store_dtype
                        did = self._convert_batch(factlog)
                    self._keep_budget(factlog)
                    self._refresh_counts(factlog)
                    self.stats.disk_full, full_wait = False, 0.0
                except _ChatTurn:  # a chat turn: the batch is redone after it
                    continue
                except StoreFullError as exc:  # said once; retried less and less often
                    if not self.stats.disk_full:
                        self.stats.errors += 1
                        log.error("memory worker: the KV store's disk is full")
                    self.stats.disk_full = True
                    self.stats.last_error = f"{type(exc).__name__}: {exc}"
                    full_wait = min(FULL_DISK_WAIT, 2 * full_wait or self.poll_seconds)
                    self._wake.wait(full_wait)  # a wake (new turn, wait_idle) tries at once
                    self._wake.clear()
                    continue
                except Exception as exc:  # keep the thread alive; report it
                    self.stats.errors += 1
                    self.stats.last_error = f"{type(exc).__name__}: {exc}"  # the user's own view
                    # The log gets where, not the message: it may quote a memory (a server's
                    # log is read by its admin, who must not see a user's memories).
                    where = "".join(traceback.format_tb(exc.__traceback__))
                    log.error("memory worker batch failed: %s\n%s", type(exc).__name__, where)
                    did = 0
                    self._stop.wait(self.poll_seconds)
                if did == 0:
                    with self._idle_lock:
                        if self._wakes == wakes:  # nothing was logged since the batch looked
                            self._idle.set()
                    self._finished_batch()  # now, not after the poll wait
                    started = False
                    self._wake.wait(self.poll_seconds)
                    self._wake.clear()
        finally:
            with contextlib.suppress(Exception):  # a last write of what replies used
                self._flush_used(factlog)
            self.stats.running = False
            factlog.close()
            self._finished_batch()  # waiters see the thread has ended

    def _flush_used(self, factlog: FactLog) -> None:
        """Write which entries replies injected since the last flush (one UPDATE)."""
        with self._used_lock:
            used, self._used = self._used, {}
        if used:
            factlog.note_kv_used(used, max(used.values()))

    def _keep_budget(self, factlog: FactLog) -> None:
        """Over the disk budget: drop the least recently injected entries (after writing which
        were injected lately, so none of those goes)."""
        self._flush_used(factlog)
        self.stats.disk_budget = self.disk_budget
        if self.disk_budget is None:
            return
        evicted = evict_over_budget(factlog, self.store, self.disk_budget, self.spare_seconds)
        self.stats.evicted += len(evicted)
        self.stats.kv_bytes = factlog.kv_bytes(self.builder.fingerprint)

    def _refresh_counts(self, factlog: FactLog) -> None:
        self.stats.deferred = sum(factlog.deferred_kv(self.profile_id).values())
        cursor = factlog.extraction_cursor(self.profile_id)
        self.stats.pending_turns = len(factlog.turns(self.profile_id, after_id=cursor))
        self.stats.pending_facts = len(
            factlog.facts_without_kv(
                self.profile_id, self.builder.fingerprint, self.w, self.encoding
            )
        )
        _, _, elsewhere = factlog.kv_coverage(
            self.profile_id, self.builder.fingerprint, self.w, self.encoding
        )
        self.stats.reencoding = min(elsewhere, self.stats.pending_facts)

    def _convert_batch(self, factlog: FactLog) -> int:
        """Rewrite up to a batch of this profile's entries stored in another scheme than the
        store writes (``kv_store_dtype`` changed, or entries from before compression): one in
        the model's dtype from its own tensors, a compressed one by encoding its fact anew.
        The list is made once per worker (headers only); a stopped conversion goes on where it
        was at the next start, since converted entries are not listed again. Returns how many
        entries the batch took from the list."""
        if self._to_convert is None:
            ids = [fact.id for fact in factlog.active_facts(self.profile_id)]
            keys = factlog.kv_keys_for(ids, self.builder.fingerprint, self.w, self.encoding)
            wanted = self.store.store_dtype
            self._to_convert = []
            for fact_id, key in sorted(keys.items(), key=lambda item: item[1]):
                with contextlib.suppress(EntryMissingError, ValueError):
                    scheme = self.store.stored_scheme(key)
                    if scheme != wanted:
                        self._to_convert.append((fact_id, key, scheme))
            self.stats.to_convert = len(self._to_convert)
        converted, again, taken = 0, [], 0
        sizes: dict[str, int] = {}
        while self._to_convert and taken < self.batch_size:
            if self._pauses:  # a chat turn: the rest waits for the next idle moment
                break
            fact_id, key, scheme = self._to_convert.pop()
            taken += 1
            if scheme != "model":  # compressed: encoded anew (lossy codes are not converted)
                again.append(fact_id)
                continue
            self._to_convert.append((fact_id, key, scheme))  # listed until written: a full disk
            with contextlib.suppress(EntryMissingError):  # forgotten meanwhile
                if self.store.convert(key):
                    converted += 1
                    sizes[key] = self.store.header(key).nbytes
            self._to_convert.pop()
        # still recorded (not forgotten, nor evicted for the budget: no file without a row)
        recorded = factlog.kv_keys_for(again, self.builder.fingerprint, self.w, self.encoding)
        facts = [
            f
            for i in again
            if i in recorded and (f := factlog.get_fact(i)) and f.status == "active"
        ]
        if facts:
            self._step_aside()
            memory = [self._memory_fact(factlog, fact) for fact in facts]
            spaces = [f"{fact.profile_id}/{fact.id}" for fact in facts]
            entries = self.builder.encode_many(memory, spaces, again=True)  # same keys, rewritten
            sizes.update((key, self.store.header(key).nbytes) for key, _ in entries)
            converted += len(facts)
        factlog.resize_kv(sizes)  # the budget counts what they take now
        self.stats.converted += converted
        self.stats.to_convert = len(self._to_convert)
        return taken

    def _extract_batch(self, factlog: FactLog) -> int:
        cursor = factlog.extraction_cursor(self.profile_id)
        turns = factlog.turns(self.profile_id, after_id=cursor, limit=self.batch_size * 4)
        if not turns:
            return 0
        added: list[int] = []
        removed: list[int] = []
        done = 0
        old = self._old_imported_turns(factlog, [turn_id for turn_id, _ in turns])
        for turn_id, turn in turns:
            if self._pauses and not done:  # a chat turn started: it gets the machine
                raise _ChatTurn
            if self._pauses:
                break
            self._step_aside()
            new_added, new_removed = len(added), len(removed)
            # a hybrid search of the turn, half of a turn's extraction time on the CPU
            # (12 of 24 ms at 5,000 facts), only for an extractor that reads its hits
            similar = self._similar_facts(turn.text) if self.extractor.reads_similar else []
            for op in self.extractor.extract(turn, similar):
                if op.op == "add" and self._is_near_duplicate(op.text):
                    continue
                self._apply(factlog, op, turn_id, added, removed)
            if turn_id in old and len(added) > new_added:  # encoded once first retrieved
                factlog.defer_kv(added[new_added:], "import")
            factlog.set_extraction_cursor(self.profile_id, turn_id)
            done += 1
            if self._retriever is not None:  # index (and store embeddings) turn by turn
                for fact_id in removed[new_removed:]:
                    self._retriever.remove(fact_id)
                self._retriever.add_many(
                    [f for f in (factlog.get_fact(i) for i in added[new_added:]) if f is not None]
                )
        self.stats.extracted_facts += len(added)
        if added or removed:
            self.on_change(added, removed)
        return done

    def _read_slots(self, factlog: FactLog) -> int:
        """Close the facts the new ones replaced (:meth:`FactLog.read_slots`); a closed
        fact's old KV goes (its line now says until when it held)."""
        read, keys = factlog.read_slots(self.profile_id, self.batch_size * 4)
        for key in keys:
            self.store.delete(key)
        if keys:
            self.on_change([], [])
        return read

    def _old_imported_turns(self, factlog: FactLog, turn_ids: list[int]) -> set[int]:
        """Those of ``turn_ids`` from an imported conversation, dated more than
        ``encode_recent_days`` before its last dated turn (their facts are deferred). A turn
        of a live conversation (chat, ``ask``, a server's), or without a date, is not."""
        if self.encode_recent_days is None:
            return set()
        old = set()
        limit = timedelta(days=self.encode_recent_days)
        for turn_id, (source, when, last) in factlog.turn_recency(turn_ids).items():
            if source not in IMPORTED_SOURCES or when is None or last is None:
                continue
            if (when.tzinfo is None) != (last.tzinfo is None):  # one zone unknown: as local
                when, last = when.replace(tzinfo=None), last.replace(tzinfo=None)
            if last - when > limit:
                old.add(turn_id)
        return old

    def _step_aside(self) -> None:
        """Wait while a chat turn's prompt is being computed (see ``wait_for_chat``)."""
        if self.wait_for_chat is not None:
            while not self._stop.is_set() and not self.wait_for_chat(self.poll_seconds):
                pass

    def _similar_facts(self, text: str, k: int = 5) -> list[Fact]:
        if self._retriever is None:
            return []
        return [hit.fact for hit in self._retriever.search(self.profile_id, text, k)]

    def _is_near_duplicate(self, text: str) -> bool:
        return self._retriever is not None and (
            self._retriever.similar(self.profile_id, text) is not None
        )

    def _apply(
        self, factlog: FactLog, op: FactOp, turn_id: int, added: list[int], removed: list[int]
    ) -> None:
        cause = f"extracted from turn {turn_id} ({self.extractor.name})"
        refers_to = op.refers_to
        if op.op == "add":
            fact_id, created = factlog.add_fact(
                self.profile_id,
                op.text,
                refers_to=refers_to,
                source_turn_ids=[turn_id],
                cause=cause,
            )
            if created:
                added.append(fact_id)
        elif op.op == "update" and op.target_id is not None:
            try:
                added.append(
                    factlog.update_fact(
                        op.target_id,
                        op.text,
                        cause,
                        refers_to=refers_to,
                        source_turn_ids=[turn_id],
                    )
                )
                removed.append(op.target_id)
            except InactiveFactError:
                pass
        elif op.op == "delete" and op.target_id is not None:
            for key in factlog.delete_fact(op.target_id, cause=cause):
                self.store.delete(key)
            removed.append(op.target_id)

    def _memory_fact(self, factlog: FactLog, fact: Fact) -> MemoryFact:
        context: tuple[str, ...] = ()
        if self.w and fact.source_turn_ids:
            turns = factlog.context_turns(fact.source_turn_ids[0], self.w, self.window)
            context = tuple(context_line(t) for t in turns)
        return MemoryFact(fact.text, fact.refers_to, context, until=fact.valid_until)

    def _encode_batch(self, factlog: FactLog) -> int:
        fingerprint = self.builder.fingerprint
        facts = factlog.facts_without_kv(
            self.profile_id,
            fingerprint,
            self.w,
            self.encoding,
            limit=self.batch_size,
        )
        if not facts:
            return 0
        self._step_aside()
        t0 = time.perf_counter()
        memory = [self._memory_fact(factlog, fact) for fact in facts]
        spaces = [f"{fact.profile_id}/{fact.id}" for fact in facts]
        entries = self.builder.encode_many(memory, spaces)  # durable in the store on return
        ready: list[int] = []
        for fact, (key, ids) in zip(facts, entries, strict=True):
            nbytes = self.store.header(key).nbytes
            try:
                replaced = factlog.record_kv(
                    fact.id,
                    fingerprint,
                    self.w,
                    self.encoding,
                    key,
                    len(ids),
                    nbytes,
                )
            except InactiveFactError:  # forgotten while we encoded it: drop the tensors
                self.store.delete(key)
                continue
            if replaced:
                self.store.delete(replaced)
            ready.append(fact.id)
        self._rate.add(time.perf_counter() - t0, len(facts))
        self.stats.encoded_facts += len(ready)
        self.stats.encode_rate = self._rate.per_second
        return len(facts)
