"""``bench encode``: memory facts encoded per second, by context window.

The facts are LoCoMo's observations after their context turns (see :mod:`~bench.locomo_data`):
``20`` the 20 turns before (sliding), ``20a`` the anchored window of w=20
(:mod:`inferscale_core.context_window`), encoded by the product's encoder through the prompt
builder in its batches, in the fact log's order (consecutive facts of a conversation together,
so an anchored window's shared turns come from vLLM's prefix cache). ``prefilled_tokens``
counts the prompt tokens the engine computed, ``context_tokens`` the context it was given.
Every run encodes under a fresh namespace (nothing is reused from the store) and deletes what
it wrote. With ``limit`` only that many facts are encoded per window (consecutive ones from a
seeded start); the time for all of LoCoMo is then an extrapolation from the measured
rate, and the JSON says so.
"""

from __future__ import annotations

import random
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.arguments import window_of
from bench.locomo_data import LocomoMemory
from bench.report import figure, footnote, provenance, save_figure
from inferscale_core.factlog import FactLog
from inferscale_core.prompt_builder import PromptBuilder
from inferscale_core.types import Fact


def run_encode(
    builder: PromptBuilder,
    data: Path,
    ws: Sequence[int | str],
    *,
    limit: int | None = None,
    seed: int = 0,
    model_name: str = "",
    command: str | None = None,
    on_progress: Callable[[str], None] = lambda message: None,
) -> dict[str, Any]:
    """Measure and return the JSON-ready result (``{"bench": "encode", "rows": [...]}``)."""
    header = provenance("encode", model_name, command)
    with locomo_facts(data, on_progress) as (memory, facts):
        chosen = sample_facts(facts, limit, seed)
        rows = encode_rows(builder, memory, chosen, len(facts), ws, on_progress=on_progress)
    return {
        **header,
        "facts": "LoCoMo observations after their context window (product encoder)",
        "batch_size": builder.batch_size,
        "limit": limit,
        "seed": seed,
        "rows": rows,
    }


@contextmanager
def locomo_facts(
    data: Path, on_progress: Callable[[str], None] = lambda message: None
) -> Iterator[tuple[LocomoMemory, list[Fact]]]:
    """LoCoMo imported into a scratch fact log: the memory and every active fact (as many as
    the file has: 2,541 in ``locomo10.json``)."""
    with tempfile.TemporaryDirectory() as tmp:
        on_progress("importing LoCoMo into a scratch fact log")
        factlog = FactLog.open(Path(tmp) / "facts.db")
        try:
            memory = LocomoMemory(factlog, data)
            yield memory, [f for p in memory.profiles.values() for f in factlog.active_facts(p)]
        finally:
            factlog.close()


def sample_facts(facts: Sequence[Fact], limit: int | None, seed: int) -> list[Fact]:
    """All facts, or ``limit`` consecutive ones (in the fact log's order, from a seeded start):
    the memory worker encodes a conversation's facts in order, and consecutive facts share
    context turns, which a scattered sample would not show."""
    if limit is None or limit >= len(facts):
        return list(facts)
    start = random.Random(seed).randrange(len(facts))
    return [facts[(start + i) % len(facts)] for i in range(limit)]


def encode_rows(
    builder: PromptBuilder,
    memory: LocomoMemory,
    chosen: Sequence[Fact],
    all_facts: int,
    ws: Sequence[int | str],
    *,
    warmup: int = 0,
    on_progress: Callable[[str], None] = lambda message: None,
) -> list[dict[str, Any]]:
    """One row per window (``20``, ``20a``: :func:`bench.arguments.window_of`): ``chosen``
    encoded through ``builder`` under a fresh namespace, timed (after ``warmup`` facts encoded
    untimed, e.g. a GPU's first kernels), then deleted."""
    builder.ensure_prefix()
    rows = []
    for spec in ws:
        w, window = window_of(spec)
        memory_facts = [memory.memory_fact(f, w, window) for f in chosen]
        context_tokens = sum(len(builder.context_ids(m.context)) for m in memory_facts)
        if warmup:
            warm = builder.encode_many(memory_facts[:warmup], f"bench-warmup/{uuid.uuid4().hex}")
            for key, _ in warm:
                builder.store.delete(key)
        space = f"bench-encode/{uuid.uuid4().hex}"
        on_progress(f"w={spec}: encoding {len(chosen)} facts")
        prefilled = getattr(builder.encoder, "prefilled_tokens", None)
        t0 = time.perf_counter()
        entries = builder.encode_many(memory_facts, space)  # written to the store on return
        seconds = time.perf_counter() - t0
        if prefilled is not None:
            prefilled = builder.encoder.prefilled_tokens - prefilled  # type: ignore[attr-defined]
        fact_tokens = sum(len(ids) for _, ids in entries)
        for key, _ in entries:
            builder.store.delete(key)
        rate = len(chosen) / seconds
        on_progress(f"w={spec}: {rate:.1f} facts/s ({seconds:.1f} s for {len(chosen)})")
        rows.append(
            {
                "w": w,
                "window": window,
                "spec": str(spec),
                "facts": len(chosen),
                "seconds": seconds,
                "facts_per_s": rate,
                "fact_tokens": fact_tokens,
                "context_tokens": context_tokens,  # prefix + context turns, summed
                "prefilled_tokens": prefilled,  # what the engine computed (None: not known)
                "tokens_per_s": (fact_tokens + context_tokens) / seconds,
                "all_facts": all_facts,
                "all_seconds": all_facts / rate,
                "all_extrapolated": len(chosen) < all_facts,
            }
        )
    return rows


def headline(result: dict[str, Any]) -> str:
    parts = []
    for row in result["rows"]:
        how = "extrapolated" if row["all_extrapolated"] else "measured"
        parts.append(
            f"w={row.get('spec', row['w'])}: {row['facts_per_s']:.1f} facts/s,"
            f" all {row['all_facts']} in"
            f" {row['all_seconds'] / 60:.1f} min ({how})"
        )
    return "; ".join(parts)


def plot(result: dict[str, Any], path: Path) -> None:
    fig, ax = figure()
    rows = result["rows"]
    ax.bar(
        [f"w={r.get('spec', r['w'])}" for r in rows],
        [r["facts_per_s"] for r in rows],
        color="tab:green",
    )
    for i, r in enumerate(rows):
        how = "extrapolated" if r["all_extrapolated"] else "measured"
        ax.annotate(
            f"all {r['all_facts']}: {r['all_seconds'] / 60:.1f} min\n({how})",
            (i, r["facts_per_s"]),
            ha="center",
            va="bottom",
            fontsize=7,
        )
    ax.set_ylabel("facts encoded per second")
    ax.set_title(f"Encoding LoCoMo facts (batch {result['batch_size']}) — {result['model']}")
    ax.grid(True, axis="y", alpha=0.3)
    fig.text(0.01, 0.005, footnote(result), fontsize=6, alpha=0.7)
    save_figure(fig, path)
