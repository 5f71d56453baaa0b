"""LoCoMo for the benches: questions, facts with their context turns, retrieval.

Facts are LoCoMo's own ``observation`` lists (short facts, each citing the turn(s) it was drawn
from: 2,541 in ``locomo10.json``), dated with their session's date — the facts LoCoMo's own
"observation" RAG baseline retrieves. The conversation itself goes through the product's path: the
LoCoMo importer parses it, the fact log stores its turns, the observations are added as facts with
their source turns, the retriever (MiniLM, one index per conversation) finds the top-k, and a fact's
``w`` context turns are the turns before its source turn in its session, exactly as the memory
worker encodes an extracted fact (:func:`~inferscale_core.memory_worker.context_line`).

Why not the product's extractor on the raw turns: that makes 5,882 longer facts, which (at
``w=20``, ~800 tokens of context per fact) would take hours to encode on a CPU; and the
question here is injection against prompt injection on the *same* facts, which the
extractor's quality does not change.

The data: ``locomo10.json`` (CC BY-NC 4.0) is not shipped with the repository. The full-data
benches find it with :func:`require`: ``--data PATH``, else ``$INFERSCALE_LOCOMO``, else
``../shared/data/locomo/locomo10.json`` beside the checkout (:func:`default_path`). Every count
(questions, facts) is computed from the file given; the tests run on a small fixture of our own
in LoCoMo's format (``tests/fixtures/locomo/locomo_fixture.json``).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

from inferscale_core.context_window import SLIDING
from inferscale_core.factlog import FactLog
from inferscale_core.memory_worker import context_line
from inferscale_core.prompt_builder import MemoryFact
from inferscale_core.types import Fact, Hit

#: The environment variable that names the LoCoMo file (when ``--data`` is not given).
DATA_ENV = "INFERSCALE_LOCOMO"
#: The checkout: the folder above ``bench/``.
CHECKOUT = Path(__file__).resolve().parents[1]
#: LoCoMo's category ids as its own evaluation code names them (see the data's README).
CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}


class LocomoDataMissingError(FileNotFoundError):
    """The LoCoMo file is not where a full-data bench looked; the message says what to do."""


def default_path() -> Path:
    """``$INFERSCALE_LOCOMO`` if set, else ``<checkout>/../shared/data/locomo/locomo10.json``."""
    named = os.environ.get(DATA_ENV)
    if named:
        return Path(named).expanduser()
    return CHECKOUT.parent / "shared" / "data" / "locomo" / "locomo10.json"


def require(path: Path | str | None = None) -> Path:
    """``path`` (or :func:`default_path` when None) if it is a file.

    Raises LocomoDataMissingError, saying where it looked and how to point at the file.
    """
    found = Path(path) if path is not None else default_path()
    if not found.is_file():
        raise LocomoDataMissingError(
            f"LoCoMo data not found at {found}: the full-data benches need locomo10.json"
            f" (CC BY-NC 4.0, not shipped); pass --data PATH or set {DATA_ENV}"
        )
    return found


@dataclass(frozen=True, slots=True)
class Question:
    sample_id: str
    index: int  # position in the sample's ``qa`` list
    category: int
    question: str
    answer: str
    evidence: tuple[str, ...]

    @property
    def id(self) -> str:
        return f"{self.sample_id}/qa{self.index}"


@dataclass(frozen=True, slots=True)
class Observation:
    sample_id: str
    text: str
    dia_ids: tuple[str, ...]  # the turns it was drawn from
    when: date | None  # its session's date


def load(path: Path | str) -> list[dict[str, Any]]:
    """The samples of a LoCoMo file (LocomoDataMissingError when it is not there)."""
    return json.loads(require(path).read_text())


def questions(samples: Sequence[dict[str, Any]]) -> list[Question]:
    """Every question of categories 1-4 (category 5, adversarial, is excluded; 1,540 in
    ``locomo10.json``)."""
    out = []
    for sample in samples:
        for index, qa in enumerate(sample["qa"]):
            if qa["category"] == 5:
                continue
            out.append(
                Question(
                    sample["sample_id"],
                    index,
                    int(qa["category"]),
                    qa["question"],
                    str(qa["answer"]),  # a few answers are ints
                    tuple(qa.get("evidence") or ()),
                )
            )
    return out


def sample_questions(all_questions: Sequence[Question], n: int | None, seed: int) -> list[Question]:
    """``n`` questions drawn with ``random.Random(seed)``, in file order; all if ``n`` is None."""
    if n is None or n >= len(all_questions):
        return list(all_questions)
    order = {q.id: i for i, q in enumerate(all_questions)}
    return sorted(random.Random(seed).sample(list(all_questions), n), key=lambda q: order[q.id])


def _dia_ids(value: Any) -> tuple[str, ...]:
    items = value if isinstance(value, list) else [value]
    return tuple(part.strip() for item in items for part in str(item).split(",") if part.strip())


def observations(sample: dict[str, Any]) -> list[Observation]:
    """The sample's observation facts in session order, dated with their session."""
    from inferscale_core.importers.locomo import parse_date_time

    conv = sample["conversation"]
    out = []
    keys = sorted(sample["observation"], key=lambda k: int(k.split("_")[1]))
    for key in keys:
        session = key.removesuffix("_observation")
        stamp = conv.get(f"{session}_date_time")
        when = parse_date_time(stamp).date() if stamp else None
        for facts in sample["observation"][key].values():
            for text, source in facts:
                out.append(Observation(sample["sample_id"], text.strip(), _dia_ids(source), when))
    return out


class LocomoMemory:
    """The conversations in a fact log (one profile per sample), observations as facts.

    Args:
        factlog: an empty fact log (its thread is this object's thread).
        path: a LoCoMo file (``locomo10.json``).
        sample_ids: the samples to load (default: all).
    """

    def __init__(
        self, factlog: FactLog, path: Path | str, sample_ids: Sequence[str] | None = None
    ) -> None:
        from inferscale_core.importers.locomo import parse

        self.log = factlog
        self.samples = {s["sample_id"]: s for s in load(path)}
        wanted = set(sample_ids or self.samples)
        self.profiles: dict[str, int] = {}
        for conv in parse(path):  # the product's importer: one conversation per session
            sample_id = (conv.source_id or "").split("/")[0]
            if sample_id in wanted:
                profile = self.profiles.setdefault(sample_id, factlog.profile(sample_id))
                factlog.add_conversation(profile, conv)
        self.facts = 0
        for sample_id, profile in self.profiles.items():
            turn_ids = {turn.source_id: tid for tid, turn in factlog.turns(profile)}
            for obs in observations(self.samples[sample_id]):
                sources = [turn_ids[d] for d in obs.dia_ids if d in turn_ids]
                _, created = factlog.add_fact(profile, obs.text, obs.when, sources)
                self.facts += created

    def memory_fact(self, fact: Fact, w: int, window: str = SLIDING) -> MemoryFact:
        """The fact as the memory worker encodes it: after its context turns (``w`` of them,
        chosen as ``window`` says: :mod:`inferscale_core.context_window`)."""
        context: tuple[str, ...] = ()
        if w and fact.source_turn_ids:
            turns = self.log.context_turns(min(fact.source_turn_ids), w, window)
            context = tuple(context_line(turn) for turn in turns)
        return MemoryFact(fact.text, fact.refers_to, context)


@contextlib.contextmanager
def temporary_memory(data: Path | str, chosen: Sequence[Question]) -> Iterator[LocomoMemory]:
    """The conversations of the chosen questions in a fact log that lives as long as the
    ``with`` block (a temporary folder)."""
    with tempfile.TemporaryDirectory() as tmp:
        factlog = FactLog.open(Path(tmp) / "facts.db")
        try:
            yield LocomoMemory(factlog, data, sorted({q.sample_id for q in chosen}))
        finally:
            factlog.close()


# --------------------------------------------------------------------------- retrieval files
#: Version of the ``--export-retrieval`` file; a reader refuses any other.
RETRIEVAL_FORMAT = 1


def default_embedder() -> Any:
    """MiniLM, as the product retrieves with it."""
    from inferscale_core.embedder import SentenceTransformerEmbedder

    return SentenceTransformerEmbedder()


def retrieve(memory: LocomoMemory, embedder: Any, chosen: Sequence[Question], k: int) -> dict:
    """``{question id: top-k hits, best last}`` through the product's retriever."""
    from inferscale_core.retriever import Retriever

    retriever = Retriever(memory.log, embedder)
    return {q.id: retriever.search(memory.profiles[q.sample_id], q.question, k) for q in chosen}


def save_retrieval(path: Path, hits: dict[str, list[Hit]], meta: dict[str, Any]) -> None:
    """Write the hits so that another machine answers on exactly these facts.

    Facts are named by their text (unique in a profile: the fact log merges duplicates), not
    by id, so the file holds whatever subset of the conversations the reading run imports.
    """
    from bench.report import write_json

    k = min((len(h) for h in hits.values()), default=0)
    questions = {q: [[h.fact.text, round(h.score, 6)] for h in rows] for q, rows in hits.items()}
    write_json({"format": RETRIEVAL_FORMAT, **meta, "k": k, "questions": questions}, path)


def load_retrieval(
    path: Path, memory: LocomoMemory, chosen: Sequence[Question], k: int
) -> dict[str, list[Hit]]:
    """The top ``k`` hits (best last) of every chosen question from a ``save_retrieval`` file.

    ValueError, saying what to do, when the file is of another format, holds fewer than ``k``
    hits, lacks a question, or names a fact this run's fact log does not have (other data).
    """
    saved = json.loads(Path(path).read_text())
    if saved.get("format") != RETRIEVAL_FORMAT:
        raise ValueError(f"{path} is not a retrieval file of format {RETRIEVAL_FORMAT}")
    if saved["k"] < k:
        raise ValueError(f"{path} holds the top {saved['k']} facts; this run needs {k}")
    missing = [q.id for q in chosen if q.id not in saved["questions"]]
    if missing:
        raise ValueError(
            f"{path} lacks {len(missing)} of the {len(chosen)} questions (first: {missing[0]});"
            " export it with the same --sample and --seed, or for all questions"
        )
    by_text = {
        sample_id: {fact.text: fact for fact in memory.log.active_facts(profile)}
        for sample_id, profile in memory.profiles.items()
    }
    hits = {}
    for q in chosen:
        rows = saved["questions"][q.id][-k:]  # best last: the last k are the best k
        facts = by_text[q.sample_id]
        unknown = [text for text, _ in rows if text not in facts]
        if unknown:
            raise ValueError(
                f"{path}: {q.id} names a fact this LoCoMo file does not have ({unknown[0]!r});"
                " the file was exported from other data"
            )
        hits[q.id] = [
            Hit(facts[text], score, len(rows) - i) for i, (text, score) in enumerate(rows)
        ]
    return hits
