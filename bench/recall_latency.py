"""Retrieval latency at N facts on this machine: one :meth:`Retriever.search` per question.

One profile holds every LoCoMo conversation (all sessions of all samples, imported by the
product's importer) and the facts the product's extractor makes of them (~5,500, see
:mod:`bench.recall_memory`); copies of those facts (the text with `` (copy <i>)`` appended,
the same date and source turn) fill it up to N. A copy's stored vector is its original's: a
search's cost does not depend on the vectors' values, and MiniLM need not embed N texts.

Then each question (a seeded sample of LoCoMo's, categories 1-4) is asked once per mode, at
each of :data:`KS`, with a fresh question embedding (the real embedder, no cache): the time of
the whole ``search(profile, question, k, mode=...)`` call, i.e. embed + dense search + BM25 +
fusion + reading the facts, plus ``embed`` alone for scale (on the retrieval thread, where a
search embeds its question: :mod:`inferscale_core.retrieval_thread`). After ``warmup`` untimed
questions (the first search builds the profile's vector index from the stored vectors).

The calls run back to back (``idle_ms=0``, the default). With ``idle_ms`` each starts after
that much sleep instead, as a chat turn's search starts after the user typed: on a 2-vCPU
virtual machine the first call after idle pays for waking cores (measured: MiniLM's forward
2.9 ms back to back, 3.4 ms after 10 ms of sleep, 11.9 ms after 100 ms).
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.recall_memory import CachedEmbedder, extract
from bench.report import percentile
from inferscale_core.config import AppConfig
from inferscale_core.embedder import Embedder
from inferscale_core.extractor import DeterministicExtractor
from inferscale_core.factlog import FactLog
from inferscale_core.retriever import MODES, Retriever

PROFILE = "latency"
IDLE_MS = 0.0
"""Sleep before each timed call (module docstring): none, the calls run back to back."""
KS = (10, AppConfig().k)
"""The k timed: the one the latency target was first set at, and the product's default."""


def fill_profile(factlog: FactLog, data: Path | str, embedder: CachedEmbedder, n: int) -> int:
    """The profile of the module docstring with ``n`` active facts; returns its id."""
    from inferscale_core.importers.locomo import parse

    profile = factlog.profile(PROFILE)
    for conv in parse(data):
        factlog.add_conversation(profile, conv)
    retriever = Retriever(factlog, embedder)
    extract(factlog, profile, retriever, DeterministicExtractor(), embedder)
    originals = factlog.active_facts(profile)
    copies = []
    with factlog.transaction():
        for i in range(max(0, n - len(originals))):
            fact = originals[i % len(originals)]
            text = f"{fact.text} (copy {i // len(originals) + 1})"
            embedder.alias(text, fact.text)
            fid, _ = factlog.add_fact(profile, text, fact.refers_to, fact.source_turn_ids)
            copies.append(fid)
        retriever.add_many([f for f in map(factlog.get_fact, copies) if f is not None])
    return profile


def time_searches(
    factlog: FactLog,
    profile: int,
    embedder: Embedder,
    questions: Sequence[str],
    *,
    k: int = 10,
    modes: Sequence[str] = MODES,
    warmup: int = 10,
    idle_ms: float = IDLE_MS,
) -> dict[str, Any]:
    """``{mode: {"p50_ms", "p90_ms", "mean_ms"}}`` over ``questions`` (and ``"embed"``: the
    embedder alone), each timed once per mode, after ``idle_ms`` of sleep; the modes
    interleave question by question."""
    retriever = Retriever(factlog, embedder)
    for question in questions[:warmup]:
        for mode in modes:
            retriever.search(profile, question, k, mode=mode)  # type: ignore[arg-type]
    seconds: dict[str, list[float]] = {mode: [] for mode in (*modes, "embed")}
    for question in questions[warmup:]:
        _idle(idle_ms)
        start = time.perf_counter()
        retriever.thread.submit(embedder.embed, [question]).result()  # where a search runs it
        seconds["embed"].append(time.perf_counter() - start)
        for mode in modes:
            _idle(idle_ms)
            start = time.perf_counter()
            retriever.search(profile, question, k, mode=mode)  # type: ignore[arg-type]
            seconds[mode].append(time.perf_counter() - start)
    return {
        mode: {
            "p50_ms": round(statistics.median(values) * 1e3, 2),
            "p90_ms": round(percentile(values, 0.9) * 1e3, 2),
            "mean_ms": round(statistics.fmean(values) * 1e3, 2),
        }
        for mode, values in seconds.items()
    }


def _idle(ms: float) -> None:
    if ms > 0:  # time.sleep(0) still yields the thread
        time.sleep(ms / 1e3)


def run_latency(
    factlog: FactLog,
    data: Path | str,
    embedder: Embedder,
    *,
    n: int,
    ks: Sequence[int] = KS,
    queries: int = 200,
    seed: int = 0,
    idle_ms: float = IDLE_MS,
    on_progress: Callable[[str], None] = lambda message: None,
) -> dict[str, Any]:
    """Fill a profile of ``factlog`` to ``n`` facts, then time ``queries`` searches per mode
    at each k, each after ``idle_ms`` of sleep: ``ms[str(k)][mode]``."""
    from bench.locomo_data import load, questions

    on_progress(f"filling a profile with {n:,} facts…")
    cached = embedder if isinstance(embedder, CachedEmbedder) else CachedEmbedder(embedder)
    profile = fill_profile(factlog, data, cached, n)
    asked = [q.question for q in questions(load(data))]
    chosen = random.Random(seed).sample(asked, min(queries, len(asked)))
    on_progress(f"timing {len(chosen)} searches per mode at {n:,} facts…")
    inner = cached.inner
    return {
        "facts": factlog.count_facts(profile).get("active", 0),
        "k": list(ks),
        "queries": len(chosen),
        "seed": seed,
        "idle_ms": idle_ms,
        "ms": {
            str(k): time_searches(factlog, profile, inner, chosen, k=k, idle_ms=idle_ms) for k in ks
        },
    }
