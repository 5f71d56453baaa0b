"""``bench recall``: evidence recall@k of the product's retriever on LoCoMo, per mode and category.

The memories are the facts the product makes itself (:mod:`bench.recall_memory`): LoCoMo's
conversations imported by the product's importer, one profile per sample, and its default
extractor for the embedded model run as the memory worker runs it, so what extraction loses counts.
Every question of categories 1-4 is asked of :meth:`Retriever.search` in each mode ("hybrid",
"dense", "keyword") at each k, as the chat asks it (its own ``search`` call per k: a hybrid
search takes ``CANDIDATES * k`` of each ranking, so its top 10 is not the head of its top 50).

A question is a hit at k when at least one of its top-k facts was extracted from one of its
evidence turns: a fact's ``source_turn_ids`` are turns of the fact log, each keeping LoCoMo's
``dia_id``. Evidence ids are read leniently ("D8:6; D9:17", "D:11:26", "D30:05" as LoCoMo
writes a few); a question none of whose evidence ids is a turn of its conversation (no evidence,
or ids the file does not have) is left out and counted (``unanswerable``). ``ceiling`` is the
share of questions with at least one fact from an evidence turn at all: recall at k = every fact.

Categories as LoCoMo numbers them (:data:`bench.locomo_data.CATEGORIES`): 1 multi-hop,
2 temporal, 3 open-domain, 4 single-hop.

With ``latency_facts`` the same run also times one hybrid / dense / keyword search at that many
facts on this machine (:mod:`bench.recall_latency`); with ``latency_vs`` (another checkout's
root) it times them against that checkout instead, both at once in alternated blocks
(:mod:`bench.latency_pair`): the figure a "within x% of commit C" target needs.

Command (repository root; ~10 min on 2 idle cores, most of it MiniLM embedding ~5,500 facts)::

    inferscale-assistant bench recall --json docs/results/recall-cpu.json
"""

from __future__ import annotations

import re
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.latency_pair import markdown as pair_markdown
from bench.latency_pair import run_pair
from bench.locomo_data import CATEGORIES, Question
from bench.recall_latency import IDLE_MS as LATENCY_IDLE_MS
from bench.recall_latency import KS as LATENCY_KS
from bench.recall_latency import run_latency
from bench.recall_memory import CachedEmbedder, RecallMemory, build_memory
from bench.report import figure, footnote, provenance, save_figure
from inferscale_core import retriever as retriever_module
from inferscale_core.embedder import Embedder
from inferscale_core.factlog import FactLog, fulltext
from inferscale_core.retriever import MODES, Retriever

KS = (5, 10, 20, 50)
OVERALL = "overall"
_DIA_ID = re.compile(r"D:?(\d+):(\d+)")  # "D3:14", and LoCoMo's few "D:11:26"


def evidence_ids(raw: Sequence[str]) -> set[str]:
    """LoCoMo evidence strings -> normalised dia_ids: ``["D8:6; D9:17", "D30:05"]`` ->
    ``{"D8:6", "D9:17", "D30:5"}`` (anything that names no turn is dropped)."""
    return {f"D{a}:{int(b)}" for item in raw for a, b in _DIA_ID.findall(str(item))}


def run_recall(
    data: Path | str,
    embedder: Embedder,
    *,
    ks: Sequence[int] = KS,
    modes: Sequence[str] = MODES,
    sample_ids: Sequence[str] | None = None,
    latency_facts: int = 0,
    latency_queries: int = 200,
    latency_ks: Sequence[int] = LATENCY_KS,
    latency_idle_ms: float = LATENCY_IDLE_MS,
    latency_vs: Path | str | None = None,
    latency_blocks: int = 38,
    seed: int = 0,
    command: str | None = None,
    on_progress: Callable[[str], None] = lambda message: None,
) -> dict[str, Any]:
    """Import, extract, retrieve and score (see the module docstring).

    Returns the provenance, the memory's size, the retriever's settings, :func:`score`'s keys
    (``recall[mode][category][str(k)]`` = R@k) and ``latency`` (None without
    ``latency_facts``). Everything lives in a temporary folder for the call.
    """
    from bench.locomo_data import load, questions

    cached = CachedEmbedder(embedder)
    wanted = None if sample_ids is None else set(sample_ids)
    chosen = [q for q in questions(load(data)) if wanted is None or q.sample_id in wanted]
    latency = pair = None
    with tempfile.TemporaryDirectory(prefix="inferscale-recall-") as tmp:
        with FactLog.open(Path(tmp) / "recall.db") as factlog:
            on_progress("importing and extracting facts (the product's extractor)…")
            start = time.perf_counter()
            memory = build_memory(factlog, data, cached, sample_ids)
            build_s = time.perf_counter() - start
            on_progress(f"retrieving for {len(chosen)} questions…")
            start = time.perf_counter()
            scored = score(memory, Retriever(factlog, cached), chosen, ks, modes, cached)
            search_s = time.perf_counter() - start
        if latency_facts > 0 and latency_vs is not None:
            pair = run_pair(
                data,
                latency_vs,
                facts=latency_facts,
                queries=latency_queries,
                ks=latency_ks,
                blocks=latency_blocks,
                seed=seed,
                on_progress=on_progress,
            )
        elif latency_facts > 0:
            with FactLog.open(Path(tmp) / "latency.db") as factlog:
                latency = run_latency(
                    factlog,
                    data,
                    cached,
                    n=latency_facts,
                    queries=latency_queries,
                    ks=latency_ks,
                    seed=seed,
                    idle_ms=latency_idle_ms,
                    on_progress=on_progress,
                )
    return {
        **provenance("recall", cached.name, command),
        "data": str(data),
        "extractor": "deterministic",
        "samples": len(memory.profiles),
        "turns": memory.turns,
        "facts": memory.facts,
        "skipped_near_duplicates": memory.skipped_near_duplicates,
        "retriever": settings(),
        "ks": list(ks),
        "modes": list(modes),
        "build_s": round(build_s, 1),
        "search_s": round(search_s, 1),
        **scored,
        "latency": latency,
        "latency_pair": pair,
    }


def settings() -> dict[str, Any]:
    """The retriever's and the keyword index's tunables this run measured."""
    names = ("RRF_K", "KEYWORD_WEIGHT", "PEOPLE_WEIGHT", "CANDIDATES", "RECENCY_WEIGHT", "FACETED")
    found = {name: getattr(retriever_module, name) for name in names}
    found.update(CONTEXT_TURNS=fulltext.CONTEXT_TURNS, CONTEXT_WEIGHT=fulltext.CONTEXT_WEIGHT)
    return found


def score(
    memory: RecallMemory,
    retriever: Retriever,
    chosen: Sequence[Question],
    ks: Sequence[int],
    modes: Sequence[str],
    embedder: CachedEmbedder | None = None,
) -> dict[str, Any]:
    """R@k per mode and category over the questions with an evidence turn in the fact log.

    Returns ``{"questions": {category: n}, "unanswerable": n, "ceiling": {category: share},
    "recall": {mode: {category: {str(k): R@k}}}}``; categories are ``"overall"`` and the
    names of :data:`CATEGORIES` (a share is None for a category without questions).
    """
    if embedder is not None:
        embedder.prime(q.question for q in chosen)  # one batch; the searches only look up
    asked: list[tuple[Question, set[int]]] = []  # (question, its evidence turn ids)
    for q in chosen:
        turn_of = memory.turn_ids[memory.profiles[q.sample_id]]
        turns = {turn_of[d] for d in evidence_ids(q.evidence) if d in turn_of}
        if turns:
            asked.append((q, turns))
    names = [OVERALL, *CATEGORIES.values()]
    counts = dict.fromkeys(names, 0)
    reachable = dict.fromkeys(names, 0)
    hits = {mode: {name: dict.fromkeys(ks, 0) for name in names} for mode in modes}
    sources = {  # profile id -> [source turn ids of each active fact]
        profile: [set(f.source_turn_ids) for f in memory.log.active_facts(profile)]
        for profile in memory.profiles.values()
    }
    for q, turns in asked:
        profile = memory.profiles[q.sample_id]
        cats = (OVERALL, CATEGORIES[q.category])
        has_fact = any(turns & fact_turns for fact_turns in sources[profile])
        for name in cats:
            counts[name] += 1
            reachable[name] += has_fact
        for mode in modes:
            for k in ks:
                found = retriever.search(profile, q.question, k, "best_first", mode)  # type: ignore[arg-type]
                if any(turns.intersection(h.fact.source_turn_ids) for h in found):
                    for name in cats:
                        hits[mode][name][k] += 1
    return {
        "questions": counts,
        "unanswerable": len(chosen) - len(asked),
        "ceiling": {n: _share(reachable[n], counts[n]) for n in names},
        "recall": {
            mode: {n: {str(k): _share(hits[mode][n][k], counts[n]) for k in ks} for n in names}
            for mode in modes
        },
    }


def _share(part: int, whole: int) -> float | None:
    return round(part / whole, 4) if whole else None


# ---- reporting ------------------------------------------------------------------------------


def markdown(result: dict[str, Any]) -> str:
    """The result as Markdown: R@k per mode and category, then the latency if measured."""
    ks = result["ks"]
    lines = [
        f"LoCoMo evidence recall@k, {result['questions'][OVERALL]:,} questions,"
        f" {result['facts']:,} facts of the product's extractor ({result['extractor']});"
        f" ceiling {_fmt(result['ceiling'][OVERALL])}, {result['unanswerable']} left out"
        " (no evidence turn)",
        "",
        "| mode | category | questions | " + " | ".join(f"R@{k}" for k in ks) + " |",
        "| --- | --- | ---: | " + " | ".join("---:" for _ in ks) + " |",
    ]
    for mode, by_category in result["recall"].items():
        for name, row in by_category.items():
            values = " | ".join(_fmt(row[str(k)], bold=name == OVERALL) for k in ks)
            lines.append(f"| {mode} | {name} | {result['questions'][name]:,} | {values} |")
    latency = result.get("latency")
    if latency:
        lines += [
            "",
            f"Search latency at {latency['facts']:,} facts, {latency['queries']} questions"
            f" (whole `Retriever.search` call, each after {latency.get('idle_ms', 0):g} ms idle;"
            " embed = the question's embedding alone):",
            "",
            "| k | mode | p50 | p90 | mean |",
            "| ---: | --- | ---: | ---: | ---: |",
        ]
        lines += [
            f"| {k} | {mode} | {ms['p50_ms']:.1f} ms | {ms['p90_ms']:.1f} ms"
            f" | {ms['mean_ms']:.1f} ms |"
            for k, by_mode in latency["ms"].items()
            for mode, ms in by_mode.items()
        ]
    if result.get("latency_pair"):
        lines += ["", pair_markdown(result["latency_pair"])]
    return "\n".join(lines)


def _fmt(value: float | None, bold: bool = False) -> str:
    if value is None:
        return "—"
    return f"**{value:.3f}**" if bold else f"{value:.3f}"


def headline(result: dict[str, Any]) -> str:
    parts = []
    for mode, by_category in result["recall"].items():
        row = by_category[OVERALL]
        parts.append(f"{mode} " + " / ".join(_fmt(row[str(k)]) for k in result["ks"]))
    text = (
        f"LoCoMo recall@{','.join(map(str, result['ks']))} over"
        f" {result['questions'][OVERALL]:,} questions, {result['facts']:,} extracted facts: "
        + "; ".join(parts)
    )
    latency = result.get("latency")
    if latency:
        text += f"; at {latency['facts']:,} facts p50 " + ", ".join(
            f"{mode} {ms['p50_ms']:.1f} ms (k={k})"
            for k, by_mode in latency["ms"].items()
            for mode, ms in by_mode.items()
            if mode in ("hybrid", "embed")
        )
    pair = result.get("latency_pair")
    if pair:
        vs = pair["vs"]["git_commit"] or pair["vs"]["tree"]
        text += f"; hybrid p50 against {vs} at {pair['facts']:,} facts " + ", ".join(
            f"x{pair['ms'][str(k)]['hybrid']['ratio_p50']:.3f} (k={k})" for k in pair["k"]
        )
    return text


def plot(result: dict[str, Any], path: Path) -> None:
    """R@k against k, one line per mode: overall (solid) and temporal (dotted)."""
    fig, ax = figure()
    ks = result["ks"]
    for mode, by_category in result["recall"].items():
        (line,) = ax.plot(ks, [by_category[OVERALL][str(k)] for k in ks], marker="o", label=mode)
        temporal = [by_category["temporal"][str(k)] for k in ks]
        if None not in temporal:
            ax.plot(ks, temporal, ls=":", color=line.get_color(), label=f"{mode}, temporal")
    ax.set_xscale("log")
    ax.minorticks_off()
    ax.set_xticks(ks, [str(k) for k in ks])
    ax.set_xlabel("k (facts retrieved)")
    ax.set_ylabel("evidence recall@k")
    ax.set_ylim(0, 1)
    ax.set_title(f"LoCoMo evidence recall, {result['facts']:,} extracted facts")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    fig.text(0.01, 0.005, footnote(result), fontsize=6, alpha=0.7)
    save_figure(fig, path)
