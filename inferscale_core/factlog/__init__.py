"""The fact log: the assistant's long-term memory as one SQLite file per user.

Every conversation turn is logged; facts extracted from turns are kept with their provenance
and an audit trail; ``kv_entries`` records the key under which each fact's encoded KV tensors
are stored (the tensors themselves live in a KV store). Nothing crosses profiles: every method
that takes a ``profile_id`` filters by it, and composite foreign keys make a turn, an audit row
or a superseding fact of one profile unable to point at a row of another.

All SQL on the fact log's tables lives in this package, one module per table (or pair of
tables), each a mixin of :class:`FactLog` over the shared connection of
:class:`~inferscale_core.factlog._base.FactLogBase`:

* ``_base``: opening the file, the transaction helper (:meth:`FactLog.transaction`), helpers;
* ``conversations``: ``profiles``, ``conversations``, ``turns``;
* ``facts``: ``facts`` (each change writes its ``audit`` row); ``audit``: reading the trail;
* ``validity``: a fact's end in time (``valid_until``, ``ended_by``) and ``fact_slots``;
* ``kv_index``: ``kv_entries``; ``embeddings``: ``fact_embeddings``;
* ``fulltext``: ``facts_fts_p<id>``, each profile's BM25 keyword index of its active facts
  (kept by triggers);
* ``imports``: ``imports``; ``extraction``: ``extraction_cursor``;
* ``replies``: ``reply_details`` and ``reply_memories`` (what each assistant turn used);
* ``migrations``: the schema.

Decisions:

* Timestamps are ISO 8601 text. Our own clock (``created_at``, ``updated_at``, ``at``) is UTC,
  ``2025-01-02T03:04:05.000006+00:00`` (fixed width, so it sorts). ``turns.timestamp`` is the
  source's ``datetime.isoformat()`` verbatim: an aware time keeps its original offset (the
  user's local day matters for dates facts refer to), a naive one stays naive (zone unknown).
  Turns are ordered by ``idx``, never by timestamp. ``facts.refers_to`` is ``YYYY-MM-DD``.
* Forgetting: a forgotten fact's ``text`` (and ``search_context``) becomes "", its
  ``kv_entries`` and ``fact_embeddings`` rows are deleted, its keyword index entry too (by
  trigger), and its text is blanked in the stored details of the replies that used it
  (``reply_memories``), in the same transaction (the caller deletes the tensors under the
  returned keys). It is never
  returned by :meth:`FactLog.active_facts`, :meth:`FactLog.facts_without_kv`,
  :meth:`FactLog.embeddings` or :meth:`FactLog.keyword_search`, and :meth:`FactLog.record_kv`
  and :meth:`FactLog.store_embedding` refuse it. Trade-off: the text survives in the audit trail
  (``old_text`` of the 'forget' row and ``new_text`` of the earlier 'add'/'update' rows), in
  superseded earlier versions, and in the turns it was extracted from (or that quote it,
  replies included), so the memory browser
  can show what was forgotten and why; it is not an erasure (FTS5 also records a deletion as
  a marker, so its words linger in the index's older segments until they are merged). The
  ``text_hash`` is kept as a tombstone so that re-running extraction over the old turns does
  not bring the fact back (:meth:`FactLog.add_fact` returns the forgotten id with
  ``created=False`` unless ``allow_forgotten=True``). ``PRAGMA secure_delete`` is on for files,
  so overwritten text is zeroed in the database pages, though copies can linger in the WAL
  until a checkpoint.
* The file is created 0600 (and tightened with a warning if it was looser), WAL mode,
  ``synchronous=NORMAL`` (a committed transaction survives a process crash; only an OS crash
  or power loss may lose the last ones), foreign keys on.
* Every write is one ``BEGIN IMMEDIATE`` transaction (:meth:`FactLog.transaction`); callers
  that need several calls to be atomic wrap them in it, and the calls nest as savepoints.
* One ``FactLog`` (one sqlite3 connection) per thread; several processes may share the file.
  Nothing but SQLite opens an existing log: closing another descriptor of it would drop the
  POSIX locks that tell other processes this one still uses the WAL.
"""

from __future__ import annotations

from inferscale_core.factlog._base import (
    BUSY_TIMEOUT_MS,
    InactiveFactError,
    fact_text_hash,
    normalize_fact_text,
)
from inferscale_core.factlog.audit import AuditMixin
from inferscale_core.factlog.conversations import ConversationsMixin
from inferscale_core.factlog.embeddings import EmbeddingsMixin
from inferscale_core.factlog.extraction import ExtractionCursorMixin
from inferscale_core.factlog.facts import FactsMixin
from inferscale_core.factlog.fulltext import FullTextMixin
from inferscale_core.factlog.imports import ImportsMixin
from inferscale_core.factlog.kv_index import KVIndexMixin
from inferscale_core.factlog.replies import ReplyDetailsMixin

__all__ = [
    "BUSY_TIMEOUT_MS",
    "FactLog",
    "InactiveFactError",
    "fact_text_hash",
    "normalize_fact_text",
]


class FactLog(
    ConversationsMixin,
    FactsMixin,
    AuditMixin,
    KVIndexMixin,
    EmbeddingsMixin,
    FullTextMixin,
    ExtractionCursorMixin,
    ImportsMixin,
    ReplyDetailsMixin,
):
    """The fact log over a ``sqlite_utils.Database`` (``FactLog(Database(memory=True))`` in tests).

    Open a file with :meth:`FactLog.open`; constructing one applies pending migrations.
    Methods returning rows return plain dataclasses. The methods come from one mixin per
    table (see the package docstring).
    """
