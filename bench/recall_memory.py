"""LoCoMo's conversations as the product remembers them: imported turns, extracted facts.

The recall bench (:mod:`bench.recall`) scores retrieval on the facts the product itself makes, so
that what extraction loses counts. Per LoCoMo sample (one profile each, as a user would keep one
person's chats apart): the product's LoCoMo importer parses the file
(:func:`inferscale_core.importers.locomo.parse`, one conversation per session, a turn's ``dia_id``
kept as its ``source_id``), the fact log stores the turns, and the memory worker's extraction runs
over them in turn order (:meth:`inferscale_core.memory_worker.MemoryWorker._extract_batch`, the
"add" path): the extractor's operations for a turn, each dropped when the retriever already holds
a near-duplicate (:meth:`Retriever.similar`, cosine >= 0.92), else added with that turn as its
source (``Fact.source_turn_ids``), then embedded and indexed (:meth:`Retriever.add_many`);
then, as the worker does before encoding, the facts later ones replaced are closed
(:meth:`FactLog.read_slots`). The
extractor is the default for the embedded model, :class:`DeterministicExtractor`, which ignores
the similar facts the worker passes it (so none are looked up here).

:class:`CachedEmbedder` embeds every text once, in batches: a conversation's candidate facts in one
call before the worker's loop, all questions in one call before the searches; the retriever's
own ``embed`` calls then only look up (the vectors are those the embedder returns for the text).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from inferscale_core.embedder import Embedder
from inferscale_core.extractor import DeterministicExtractor, Extractor, FactOp
from inferscale_core.factlog import FactLog
from inferscale_core.retriever import Retriever


class CachedEmbedder:
    """An :class:`Embedder` that embeds each distinct text once (same ``name`` and ``dim``).

    Args:
        embedder: the real one (MiniLM).
    """

    def __init__(self, embedder: Embedder) -> None:
        self.inner = embedder
        self._vectors: dict[str, torch.Tensor] = {}  # text -> [dim] float32 unit vector
        self.embedded = 0  # texts the inner embedder was asked for

    @property
    def dim(self) -> int:
        return self.inner.dim

    @property
    def name(self) -> str:
        return self.inner.name

    def prime(self, texts: Iterable[str]) -> None:
        """Embed the texts not seen yet, in one call."""
        todo = list(dict.fromkeys(t for t in texts if t not in self._vectors))
        if todo:
            vectors = self.inner.embed(todo)  # [n, dim]
            self._vectors.update(zip(todo, vectors, strict=True))
            self.embedded += len(todo)

    def alias(self, text: str, same_as: str) -> None:
        """Give ``text`` the vector of ``same_as`` (embedded if unseen): for filler facts
        whose vectors' values do not matter (the latency bench)."""
        self.prime([same_as])
        self._vectors[text] = self._vectors[same_as]

    def embed(self, texts: Sequence[str]) -> torch.Tensor:
        """``[n, dim]``: the stored vectors (the unseen texts embedded first, together)."""
        self.prime(texts)
        if not texts:
            return torch.zeros(0, self.dim, dtype=torch.float32)
        return torch.stack([self._vectors[t] for t in texts])  # [n, dim]


@dataclass(slots=True)
class RecallMemory:
    """The fact log after import and extraction; what the recall bench needs of it."""

    log: FactLog
    profiles: dict[str, int]  # LoCoMo sample id -> profile id
    turn_ids: dict[int, dict[str, int]]  # profile id -> {LoCoMo dia_id ("D3:14"): turn id}
    turns: int  # turns imported
    facts: int  # active facts extracted
    skipped_near_duplicates: int  # extracted texts the worker drops (Retriever.similar)


def build_memory(
    factlog: FactLog,
    data: Path | str,
    embedder: CachedEmbedder,
    sample_ids: Sequence[str] | None = None,
    extractor: Extractor | None = None,
) -> RecallMemory:
    """Import the LoCoMo file into ``factlog`` (one profile per sample, named by its id) and
    extract its facts as the memory worker does.

    Args:
        factlog: an empty fact log.
        data: ``locomo10.json`` or a file in its format.
        embedder: embeds the facts (and keys their stored vectors).
        sample_ids: the samples to load (default: all).
        extractor: default :class:`DeterministicExtractor` (the embedded model's).
    """
    from inferscale_core.importers.locomo import parse

    extractor = extractor or DeterministicExtractor()
    wanted = set(sample_ids) if sample_ids is not None else None
    profiles: dict[str, int] = {}
    turns = 0
    for conv in parse(data):  # the product's importer: one conversation per session
        sample_id = (conv.source_id or "").split("/")[0]
        if wanted is None or sample_id in wanted:
            profile = profiles.setdefault(sample_id, factlog.profile(sample_id))
            turns += factlog.add_conversation(profile, conv)[1]
    retriever = Retriever(factlog, embedder)
    skipped = 0
    for profile in profiles.values():
        skipped += extract(factlog, profile, retriever, extractor, embedder)
    turn_ids = {
        profile: {
            turn.source_id: turn_id for turn_id, turn in factlog.turns(profile) if turn.source_id
        }
        for profile in profiles.values()
    }
    facts = sum(factlog.count_facts(p).get("active", 0) for p in profiles.values())
    return RecallMemory(factlog, profiles, turn_ids, turns, facts, skipped)


def extract(
    factlog: FactLog,
    profile_id: int,
    retriever: Retriever,
    extractor: Extractor,
    embedder: CachedEmbedder,
) -> int:
    """The worker's extraction of every turn of the profile not extracted yet (its "add"
    operations; the deterministic extractor makes no others). Returns the number of texts
    dropped as near-duplicates. One transaction for the profile (each write nests in it)."""
    cursor = factlog.extraction_cursor(profile_id)
    pending = factlog.turns(profile_id, after_id=cursor)
    ops: list[tuple[int, list[FactOp]]] = [
        (turn_id, extractor.extract(turn, ())) for turn_id, turn in pending
    ]
    embedder.prime(op.text for _, turn_ops in ops for op in turn_ops)
    skipped = 0
    cause = f"({extractor.name})"
    with factlog.transaction():
        for turn_id, turn_ops in ops:
            added: list[int] = []
            for op in turn_ops:
                if op.op != "add":
                    continue
                if retriever.similar(profile_id, op.text) is not None:
                    skipped += 1
                    continue
                fact_id, created = factlog.add_fact(
                    profile_id,
                    op.text,
                    refers_to=op.refers_to,
                    source_turn_ids=[turn_id],
                    cause=f"extracted from turn {turn_id} {cause}",
                )
                if created:
                    added.append(fact_id)
            factlog.set_extraction_cursor(profile_id, turn_id)
            retriever.add_many([f for f in map(factlog.get_fact, added) if f is not None])
        while factlog.read_slots(profile_id)[0]:  # then, as the worker: what they replaced
            pass
    return skipped
