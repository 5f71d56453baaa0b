"""``bench encode``: memory facts encoded per second, by context size w.

The facts are LoCoMo's observations with their ``w`` preceding turns (see
:mod:`~inferscale_core.bench.locomo_data`), encoded by the product's encoder through the
prompt builder in its batches. Every run encodes under a fresh namespace (nothing is reused
from the store) and deletes what it wrote. With ``limit`` only that many facts are encoded
per w (a seeded sample across all conversations); the time for all of LoCoMo is then an
extrapolation from the measured rate, and the JSON says so.
"""

from __future__ import annotations

import random
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from inferscale_core.bench.locomo_data import LocomoMemory
from inferscale_core.bench.report import figure, footnote, provenance, save_figure
from inferscale_core.factlog import FactLog
from inferscale_core.prompt_builder import PromptBuilder


def run_encode(
    builder: PromptBuilder,
    data: Path,
    ws: Sequence[int],
    *,
    limit: int | None = None,
    seed: int = 0,
    model_name: str = "",
    command: str | None = None,
    on_progress: Callable[[str], None] = lambda message: None,
) -> dict[str, Any]:
    """Measure and return the JSON-ready result (``{"bench": "encode", "rows": [...]}``)."""
    header = provenance("encode", model_name, command)
    with tempfile.TemporaryDirectory() as tmp:
        on_progress("importing LoCoMo into a scratch fact log")
        factlog = FactLog.open(Path(tmp) / "facts.db")
        try:
            memory = LocomoMemory(factlog, data)
            facts = [f for p in memory.profiles.values() for f in factlog.active_facts(p)]
            chosen = (
                facts
                if limit is None
                else random.Random(seed).sample(facts, min(limit, len(facts)))
            )
            builder.ensure_prefix()
            rows = []
            for w in ws:
                memory_facts = [memory.memory_fact(f, w) for f in chosen]
                context_tokens = sum(len(builder.context_ids(m.context)) for m in memory_facts)
                space = f"bench-encode/{uuid.uuid4().hex}"
                on_progress(f"w={w}: encoding {len(chosen)} facts")
                t0 = time.perf_counter()
                entries = builder.encode_many(memory_facts, space)
                seconds = time.perf_counter() - t0
                fact_tokens = sum(len(ids) for _, ids in entries)
                for key, _ in entries:
                    builder.store.delete(key)
                rate = len(chosen) / seconds
                rows.append(
                    {
                        "w": w,
                        "facts": len(chosen),
                        "seconds": seconds,
                        "facts_per_s": rate,
                        "fact_tokens": fact_tokens,
                        "context_tokens": context_tokens,  # prefix + w turns, summed
                        "tokens_per_s": (fact_tokens + context_tokens) / seconds,
                        "all_facts": len(facts),
                        "all_seconds": len(facts) / rate,
                        "all_extrapolated": len(chosen) < len(facts),
                    }
                )
        finally:
            factlog.close()
    return {
        **header,
        "facts": "LoCoMo observations with their w preceding turns (product encoder)",
        "batch_size": builder.batch_size,
        "limit": limit,
        "seed": seed,
        "rows": rows,
    }


def headline(result: dict[str, Any]) -> str:
    parts = []
    for row in result["rows"]:
        how = "extrapolated" if row["all_extrapolated"] else "measured"
        parts.append(
            f"w={row['w']}: {row['facts_per_s']:.1f} facts/s, all {row['all_facts']} in"
            f" {row['all_seconds'] / 60:.1f} min ({how})"
        )
    return "; ".join(parts)


def plot(result: dict[str, Any], path: Path) -> None:
    fig, ax = figure()
    rows = result["rows"]
    ax.bar([f"w={r['w']}" for r in rows], [r["facts_per_s"] for r in rows], color="tab:green")
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
