"""``bench updates``: does the memory know what is true now? Recall on the life set (issue 36).

The memory is the one the product makes of the life set (:mod:`bench.life_set`: two years of
one person's chats, ~20 attributes that change, ~60 dated events, two Alexes): its sessions
imported into one profile by :meth:`FactLog.add_conversation`, extracted by the product's
default :class:`DeterministicExtractor` as the memory worker extracts
(:func:`bench.recall_memory.extract`), embedded and indexed by :class:`Retriever`. Every question
is asked of :meth:`Retriever.search` in each mode at each k, best first, with ``now`` = its
``asked_at`` where the retriever takes ``now`` (``now_passed`` in the result says whether it
did). A fact *comes from* a turn when that turn (its ``source_id``, the set's turn id) is among
the fact's source turns.

Figures, per mode:

* ``recall[mode][category][k]``: R@k, the share of questions with a top-k fact from an evidence
  turn (for ``update`` questions: from a ``current`` turn). ``overall`` is every question.
* ``update_current_first[mode]``: the share of update questions whose best-ranked fact from a
  current turn ranks above every fact from a superseded turn, in the top ``TOP`` (=10): no
  current fact there is a miss, no superseded fact there counts as above. A fact that comes from
  both kinds of turn counts as current.
* ``month_in_interval[mode]``: for month questions, the share of the top ``TOP`` whose date
  (``Fact.refers_to``) lies in the question's interval, over min(``TOP``, the profile's active
  facts dated in it); the mean over the questions (one with no fact dated in it is left out).
* ``hybrid_minus_dense[category][k]``: R@k of hybrid minus that of dense, at k = 5 and 10.
* ``hybrid_vs_dense[category][k]``: the same pairs question by question (McNemar's exact test):
  ``hybrid_only`` and ``dense_only`` (questions only one mode hits), the two-sided ``p`` of a
  split that uneven or more by chance (binomial, 1/2), and ``worse`` = dense hits more and p <
  0.05: hybrid worse "by more than the noise" (issue 36) on that set. With few questions a
  category needs several such questions before it can be: 1 of 11 is p = 1.0.

And of extraction alone: ``ceiling[category]``, the share of questions with any fact from an
evidence turn (R@k at k = every fact); ``extractor_dates``, over the turns with a labelled date,
the share whose facts (active or not) all carry that day as ``refers_to``, with the turns that
made no fact and the wrong dates listed; ``evidence_without_fact``, evidence turns no fact came
from.

Command (repository root; ~8 s on 2 cores, half of it loading MiniLM and dateparser)::

    inferscale-assistant bench updates --json /tmp/updates.json
"""

from __future__ import annotations

import inspect
import math
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

from bench.life_set import CATEGORIES, LifeSet, Question
from bench.recall import settings
from bench.recall_memory import CachedEmbedder, extract
from bench.report import figure, footnote, provenance, save_figure
from inferscale_core.embedder import Embedder
from inferscale_core.extractor import DeterministicExtractor, Extractor
from inferscale_core.factlog import FactLog
from inferscale_core.retriever import MODES, Retriever
from inferscale_core.types import Fact, Hit

KS = (1, 5, 10)
TOP = 10  # the ranking the order and date figures read
OVERALL = "overall"
DIFF_KS = (5, 10)  # hybrid_minus_dense is reported at these k


@dataclass(slots=True)
class LifeMemory:
    """The fact log after import and extraction; what the scoring needs of it."""

    log: FactLog
    profile: int
    source_of: dict[int, str]  # fact-log turn id -> the set's turn id ("S12:3")
    turns: int  # turns imported
    skipped_near_duplicates: int  # extracted texts the worker drops (Retriever.similar)

    def sources(self, fact: Fact) -> set[str]:
        """The set's ids of the turns ``fact`` came from."""
        return {self.source_of[t] for t in fact.source_turn_ids if t in self.source_of}

    def facts(self) -> list[Fact]:
        """Every fact extracted, active or not (not the forgotten: none is forgotten here)."""
        return self.log.search_facts(self.profile, statuses=("active", "superseded"), limit=None)


def build_memory(
    factlog: FactLog, life: LifeSet, embedder: CachedEmbedder, extractor: Extractor | None = None
) -> LifeMemory:
    """Import ``life`` into ``factlog`` (one profile, named as the set) and extract its facts as
    the memory worker does (:func:`bench.recall_memory.extract`)."""
    profile = factlog.profile(life.name)
    turns = sum(factlog.add_conversation(profile, conv)[1] for conv in life.to_conversations())
    retriever = Retriever(factlog, embedder)
    skipped = extract(factlog, profile, retriever, extractor or DeterministicExtractor(), embedder)
    source_of = {tid: t.source_id for tid, t in factlog.turns(profile) if t.source_id}
    return LifeMemory(factlog, profile, source_of, turns, skipped)


def run_updates(
    life: LifeSet,
    embedder: Embedder,
    *,
    ks: Sequence[int] = KS,
    modes: Sequence[str] = MODES,
    command: str | None = None,
    on_progress: Callable[[str], None] = lambda message: None,
) -> dict[str, Any]:
    """Import, extract, retrieve and score (see the module docstring); everything lives in a
    temporary folder for the call.

    Returns the provenance, the memory's size, the retriever's settings, the timings, the
    figures of :func:`score` and ``extractor_dates`` (:func:`extractor_dates`).
    """
    start = time.perf_counter()
    cached = CachedEmbedder(embedder)
    with (
        tempfile.TemporaryDirectory(prefix="inferscale-updates-") as tmp,
        FactLog.open(Path(tmp) / "life.db") as factlog,
    ):
        on_progress("importing and extracting the life set (the product's extractor)…")
        memory = build_memory(factlog, life, cached)
        build_s = time.perf_counter() - start
        on_progress(f"retrieving for {len(life.questions)} questions…")
        searched = time.perf_counter()
        scored = score(memory, Retriever(factlog, cached), life, ks, modes, cached)
        search_s = time.perf_counter() - searched
        dates = extractor_dates(memory, life)
        counts = factlog.count_facts(memory.profile)
    return {
        **provenance("updates", cached.name, command),
        "data": str(life.path) if life.path else None,
        "extractor": "deterministic",
        "sessions": len(life.sessions),
        "turns": memory.turns,
        "user_turns": sum(t.speaker == "user" for t in life.turns.values()),
        "facts": counts.get("active", 0),
        "facts_superseded": counts.get("superseded", 0),
        "skipped_near_duplicates": memory.skipped_near_duplicates,
        "retriever": settings(),
        "now_passed": takes_now(),
        "ks": sorted(set(ks)),
        "top": TOP,
        "modes": list(modes),
        "build_s": round(build_s, 1),
        "search_s": round(search_s, 1),
        "wall_s": round(time.perf_counter() - start, 1),
        **scored,
        "extractor_dates": dates,
    }


def takes_now() -> bool:
    """Whether :meth:`Retriever.search` reads the question's time words against ``now``."""
    return "now" in inspect.signature(Retriever.search).parameters


def search(
    retriever: Retriever, profile: int, q: Question, k: int, mode: str, now: bool
) -> list[Hit]:
    """The question's top ``k``, best first, as the chat asks (``now`` = when it was asked)."""
    extra = {"now": q.asked_at} if now else {}
    return retriever.search(profile, q.question, k, "best_first", mode, **extra)  # type: ignore[arg-type]


def score(
    memory: LifeMemory,
    retriever: Retriever,
    life: LifeSet,
    ks: Sequence[int] = KS,
    modes: Sequence[str] = MODES,
    embedder: CachedEmbedder | None = None,
) -> dict[str, Any]:
    """The figures of the module docstring over ``life.questions``.

    Returns ``{"questions": {category: n}, "ceiling": {category: share}, "recall": {mode:
    {category: {str(k): R@k}}}, "update_current_first": {mode: share}, "month_in_interval":
    {mode: mean}, "month_scored": n, "hybrid_minus_dense": {category: {str(k): difference}},
    "evidence_without_fact": [turn ids], "per_question": {mode: {question id: {...}}}}``;
    categories are ``"overall"`` and :data:`CATEGORIES` (a share is None where there are no
    questions; ``hybrid_minus_dense`` is empty unless both modes ran).
    """
    if embedder is not None:
        embedder.prime(q.question for q in life.questions)  # one batch; searches only look up
    ks = sorted(set(ks))
    depths = sorted({*ks, TOP})
    names = [OVERALL, *CATEGORIES]
    active = memory.log.active_facts(memory.profile)
    produced = {tid for fact in memory.facts() for tid in memory.sources(fact)}
    counts = dict.fromkeys(names, 0)
    reachable = dict.fromkeys(names, 0)
    for q in life.questions:
        has_fact = bool(produced & set(q.evidence))
        for name in (OVERALL, q.category):
            counts[name] += 1
            reachable[name] += has_fact
    now = takes_now()
    hits = {mode: {name: dict.fromkeys(ks, 0) for name in names} for mode in modes}
    current_first = dict.fromkeys(modes, 0)
    in_interval: dict[str, list[float]] = {mode: [] for mode in modes}
    per_question: dict[str, dict[str, Any]] = {mode: {} for mode in modes}
    hit_at: dict[str, dict[str, set[int]]] = {mode: {} for mode in modes}  # question -> ks hit
    for q in life.questions:
        evidence = set(q.evidence)
        dated_in = _dated_in(active, q.interval) if q.interval else 0
        for mode in modes:
            ranked: dict[int, list[set[str]]] = {}  # k -> sources of each hit, best first
            top: list[Hit] = []
            for k in depths:
                found = search(retriever, memory.profile, q, k, mode, now)
                ranked[k] = [memory.sources(h.fact) for h in found]
                if k == TOP:
                    top = found
            hit_at[mode][q.id] = set()
            for k in ks:
                if any(evidence & sources for sources in ranked[k]):
                    hit_at[mode][q.id].add(k)
                    for name in (OVERALL, q.category):
                        hits[mode][name][k] += 1
            row: dict[str, Any] = {"rank": _first(ranked[TOP], evidence)}
            if q.category == "update":
                row["superseded_rank"] = _first(ranked[TOP], set(q.superseded), not_in=evidence)
                row["current_first"] = _current_first(ranked[TOP], evidence, set(q.superseded))
                current_first[mode] += row["current_first"]
            if q.category == "month" and q.interval is not None and dated_in:
                start, end = q.interval
                inside = sum(1 for h in top if _within(h.fact.refers_to, start, end))
                row["in_interval"] = round(inside / min(TOP, dated_in), 4)
                in_interval[mode].append(row["in_interval"])
            per_question[mode][q.id] = row
    recall = {
        mode: {n: {str(k): _share(hits[mode][n][k], counts[n]) for k in ks} for n in names}
        for mode in modes
    }
    diff: dict[str, dict[str, float | None]] = {}
    paired: dict[str, dict[str, dict[str, Any]]] = {}
    if "hybrid" in modes and "dense" in modes:
        for n in names:
            diff[n] = {
                str(k): _minus(recall["hybrid"][n][str(k)], recall["dense"][n][str(k)])
                for k in DIFF_KS
                if k in ks
            }
            asked = [q.id for q in life.questions if n in (OVERALL, q.category)]
            paired[n] = {
                str(k): mcnemar(
                    sum(k in hit_at["hybrid"][i] and k not in hit_at["dense"][i] for i in asked),
                    sum(k in hit_at["dense"][i] and k not in hit_at["hybrid"][i] for i in asked),
                )
                for k in DIFF_KS
                if k in ks
            }
    months = [q for q in life.questions if q.category == "month"]
    return {
        "questions": counts,
        "ceiling": {n: _share(reachable[n], counts[n]) for n in names},
        "recall": recall,
        "update_current_first": {
            mode: _share(current_first[mode], counts["update"]) for mode in modes
        },
        "month_in_interval": {
            mode: round(sum(v) / len(v), 4) if v else None for mode, v in in_interval.items()
        },
        "month_scored": len(in_interval[modes[0]]) if modes else 0,
        "month_questions": len(months),
        "hybrid_minus_dense": diff,
        "hybrid_vs_dense": paired,
        "evidence_without_fact": sorted(
            {tid for q in life.questions for tid in q.evidence if tid not in produced},
            key=_turn_order,
        ),
        "per_question": per_question,
    }


def extractor_dates(memory: LifeMemory, life: LifeSet) -> dict[str, Any]:
    """How the extractor dates the labelled turns: a turn is right when it made a fact and all
    its facts carry its labelled day as ``refers_to``."""
    by_turn: dict[str, list[Fact]] = {}
    for fact in memory.facts():
        for tid in memory.sources(fact):
            by_turn.setdefault(tid, []).append(fact)
    labelled = life.labelled()
    right = 0
    wrong: list[dict[str, Any]] = []
    no_fact: list[str] = []
    for turn in labelled:
        facts = by_turn.get(turn.id, [])
        got = sorted({f.refers_to.isoformat() if f.refers_to else "none" for f in facts})
        if not facts:
            no_fact.append(turn.id)
        elif all(f.refers_to == turn.date for f in facts):
            right += 1
        else:
            label = turn.date.isoformat() if turn.date else None
            said = turn.at.date().isoformat()
            wrong.append(
                {"turn": turn.id, "text": turn.text, "said": said, "label": label, "got": got}
            )
    with_fact = len(labelled) - len(no_fact)
    return {
        "labelled": len(labelled),
        "with_fact": with_fact,
        "right": right,
        "share": _share(right, with_fact),
        "share_of_labelled": _share(right, len(labelled)),
        "no_fact": len(no_fact),
        "no_fact_turns": no_fact,
        "wrong": wrong,
    }


# ---- helpers --------------------------------------------------------------------------------


def _first(
    ranked: list[set[str]], turns: AbstractSet[str], not_in: AbstractSet[str] = frozenset()
) -> int | None:
    """The rank (from 1) of the first hit from one of ``turns`` (and from none of ``not_in``)."""
    return next(
        (r for r, sources in enumerate(ranked, 1) if sources & turns and not sources & not_in),
        None,
    )


def _current_first(ranked: list[set[str]], current: set[str], superseded: set[str]) -> bool:
    best = _first(ranked, current)
    old = _first(ranked, superseded, not_in=current)
    return best is not None and (old is None or best < old)


def _dated_in(facts: Iterable[Fact], interval: tuple[date, date]) -> int:
    start, end = interval
    return sum(1 for f in facts if _within(f.refers_to, start, end))


def _within(day: date | None, start: date, end: date) -> bool:
    return day is not None and start <= day < end


def _share(part: int, whole: int) -> float | None:
    return round(part / whole, 4) if whole else None


def mcnemar(hybrid_only: int, dense_only: int) -> dict[str, Any]:
    """McNemar's exact test of paired hits: ``{"hybrid_only", "dense_only", "p", "worse"}``,
    ``p`` the two-sided chance of a split at least this uneven when either mode is as likely to
    be the one that hits (binomial, 1/2), ``worse`` when dense hits more and p < 0.05."""
    n = hybrid_only + dense_only
    tail = sum(math.comb(n, i) for i in range(min(hybrid_only, dense_only) + 1)) / 2**n
    p = min(1.0, 2 * tail)
    return {
        "hybrid_only": hybrid_only,
        "dense_only": dense_only,
        "p": round(p, 4),
        "worse": dense_only > hybrid_only and p < 0.05,
    }


def _minus(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else round(a - b, 4)


def _turn_order(tid: str) -> tuple[int, int]:
    session, position = tid[1:].split(":")
    return int(session), int(position)


# ---- reporting ------------------------------------------------------------------------------


def markdown(result: dict[str, Any]) -> str:
    """The result as Markdown: R@k per mode and category, then the time and date figures."""
    ks = result["ks"]
    dates = result["extractor_dates"]
    lines = [
        f"Life set recall@k, {result['questions'][OVERALL]} questions, {result['facts']} facts"
        f" of the product's extractor ({result['extractor']}) from {result['turns']} turns;"
        f" now passed: {'yes' if result['now_passed'] else 'no'}",
        "",
        "| mode | category | questions | ceiling | " + " | ".join(f"R@{k}" for k in ks) + " |",
        "| --- | --- | ---: | ---: | " + " | ".join("---:" for _ in ks) + " |",
    ]
    for mode, by_category in result["recall"].items():
        for name, row in by_category.items():
            values = " | ".join(_fmt(row[str(k)], bold=name == OVERALL) for k in ks)
            lines.append(
                f"| {mode} | {name} | {result['questions'][name]} |"
                f" {_fmt(result['ceiling'][name])} | {values} |"
            )
    lines += [
        "",
        f"| mode | update current first (top {result['top']}) | month in interval"
        f" ({result['month_scored']} of {result['month_questions']}) |",
        "| --- | ---: | ---: |",
    ]
    lines += [
        f"| {mode} | {_fmt(result['update_current_first'][mode])}"
        f" | {_fmt(result['month_in_interval'][mode])} |"
        for mode in result["modes"]
    ]
    diff = result["hybrid_minus_dense"]
    if diff:
        dks = list(next(iter(diff.values())))
        lines += [
            "",
            "hybrid − dense: "
            + "; ".join(
                f"{name} " + " / ".join(_signed(row[k]) for k in dks) for name, row in diff.items()
            )
            + f" (R@{', R@'.join(dks)})",
        ]
        paired = result.get("hybrid_vs_dense") or {}
        worse = [
            f"{name} at R@{k} ({row['dense_only']} vs {row['hybrid_only']}, p {row['p']:.3f})"
            for name, by_k in paired.items()
            for k, row in by_k.items()
            if row["worse"]
        ]
        uneven = [
            f"{name} R@{k} {row['hybrid_only']}:{row['dense_only']} (p {row['p']:.2f})"
            for name, by_k in paired.items()
            if name != OVERALL
            for k, row in by_k.items()
            if row["dense_only"] > row["hybrid_only"]
        ]
        lines += [
            "",
            "Paired (McNemar, questions only one mode hits, hybrid:dense): hybrid worse beyond"
            " the noise (p < 0.05) in "
            + ("; ".join(worse) if worse else "no category")
            + (f"; dense ahead in {'; '.join(uneven)}" if uneven else "")
            + ".",
        ]
    lines += [
        "",
        f"Extractor dates: {dates['right']} of {dates['with_fact']} labelled turns with a fact"
        f" carry their day ({_fmt(dates['share'])}); {dates['no_fact']} of {dates['labelled']}"
        f" made no fact. Evidence turns without a fact: {len(result['evidence_without_fact'])}."
        f" Build {result['build_s']} s, search {result['search_s']} s, wall {result['wall_s']} s.",
    ]
    return "\n".join(lines)


def _fmt(value: float | None, bold: bool = False) -> str:
    if value is None:
        return "—"
    return f"**{value:.3f}**" if bold else f"{value:.3f}"


def _signed(value: float | None) -> str:
    return "—" if value is None else f"{value:+.3f}"


def headline(result: dict[str, Any]) -> str:
    ks = result["ks"]
    parts = [
        f"{mode} "
        + " / ".join(_fmt(by_category[OVERALL][str(k)]) for k in ks)
        + f", update {_fmt(by_category['update'][str(ks[-1])])} at {ks[-1]},"
        f" current first {_fmt(result['update_current_first'][mode])},"
        f" month in interval {_fmt(result['month_in_interval'][mode])}"
        for mode, by_category in result["recall"].items()
    ]
    dates = result["extractor_dates"]
    return (
        f"Life set recall@{','.join(map(str, ks))} over {result['questions'][OVERALL]} questions,"
        f" {result['facts']} extracted facts: "
        + "; ".join(parts)
        + f"; extractor dates {dates['right']}/{dates['with_fact']} ({dates['no_fact']} no fact)"
    )


def plot(result: dict[str, Any], path: Path) -> None:
    """R@k (the largest k) per category, one bar per mode."""
    fig, ax = figure(width=7.2)
    k = str(result["ks"][-1])
    names = [OVERALL, *CATEGORIES]
    modes = list(result["recall"])
    width = 0.8 / max(1, len(modes))
    for i, mode in enumerate(modes):
        values = [result["recall"][mode][n][k] or 0.0 for n in names]
        ax.bar([x + i * width for x in range(len(names))], values, width, label=mode)
    ax.set_xticks([x + width * (len(modes) - 1) / 2 for x in range(len(names))], names)
    ax.set_ylabel(f"evidence recall@{k}")
    ax.set_ylim(0, 1)
    ax.set_title(f"Life set, {result['facts']} extracted facts")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=7)
    fig.text(0.01, 0.005, footnote(result), fontsize=6, alpha=0.7)
    save_figure(fig, path)
