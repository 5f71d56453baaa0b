"""``bench ttft``: time to first token with k memories, KV injection vs prompt injection.

One engine, one run, the same facts and question for all modes in each repetition:

* ``inject`` — (a) KV injection: the facts' stored KV is written into the cache;
* ``prompt`` — (b) prompt injection: the facts are prefilled as prompt text;
* ``prompt_warm`` — (c) prompt injection of the prompt (b) just sent, identical to the token:
  prefix caching's best case, which a real turn never gets (retrieval changes the set);
* ``inject_r<r>`` (with ``recompute``) — the tail-recompute hybrid: (a) with its last r facts
  prefilled as text with the question instead of injected (r < k; r = k is (b)), in a
  prefix-cache salt of its own so that it cannot reuse (a)'s blocks of the same facts.

Every repetition draws a fresh random set of k facts in a fresh order, as retrieval does turn
by turn, so prefix caching (on, as in the paper's baseline) can reuse only the system prefix
in (a) and (b). Facts are encoded before timing starts; encoding speed is reported separately.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.prompts import PromptSource
from bench.report import (
    figure,
    footnote,
    percentile,
    provenance,
    save_figure,
)

MODES = ("inject", "prompt", "prompt_warm")
LABELS = {
    "inject": "(a) KV injection",
    "prompt": "(b) prompt injection",
    "prompt_warm": "(c) prompt injection, warm identical prompt",
}


@dataclass(slots=True)
class TtftRow:
    k: int
    mode: str  # "inject", "prompt" (facts as prompt text), "prompt_warm" (the same, repeated)
    # or "inject_r<r>" (the last r facts prefilled, not injected)
    runs: int
    ttft_s_median: float
    ttft_s_p90: float
    samples: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    computed_tokens: int = 0  # tokens the engine prefilled (median)
    injected_tokens: int = 0  # tokens written by the connector (median)


def _p90(values: Sequence[float]) -> float:
    return percentile(values, 0.9)


def run_ttft(
    source: PromptSource,
    engine: Any,  # VllmEngine: generate() over composed prompts or token ids
    ks: Sequence[int],
    runs: int,
    *,
    warmup: int = 2,
    seed: int = 0,
    recompute: Sequence[int] = (0,),
    model_name: str = "",
    command: str | None = None,
    on_progress: Callable[[str], None] = lambda message: None,
) -> dict[str, Any]:
    """Measure and return the JSON-ready result (``{"bench": "ttft", "rows": [...], ...}``);
    ``recompute`` adds an ``inject_r<r>`` row per r in 0 < r < k."""
    rng = random.Random(seed)
    if max(ks, default=0) > source.pool_size:
        raise ValueError(f"k={max(ks)} needs a pool of at least that many facts")
    header = provenance("ttft", model_name, command)
    tails = sorted({r for r in recompute if r > 0})

    def modes_at(k: int) -> list[str]:
        """In the order they run: the hybrids between (a) and (b), (c) right after (b)."""
        return ["inject", *(f"inject_r{r}" for r in tails if r < k), "prompt", "prompt_warm"]

    def once(mode: str, indices: list[int], tag: str) -> Any:
        r = int(mode.removeprefix("inject_r")) if mode.startswith("inject_r") else 0
        composed, ids = source.pair(indices, tag, recompute=r)
        injected = mode.startswith("inject")
        result = engine.generate(composed if injected else ids, max_tokens=1)
        if injected and result.refused:
            raise RuntimeError(f"injection refused during the benchmark: {result.refused}")
        return result

    warm_k = min((k for k in ks if k > 0), default=0)
    for i in range(warmup):
        on_progress(f"warm-up {i + 1}/{warmup}")
        indices = rng.sample(range(source.pool_size), warm_k)
        for mode in modes_at(max(ks, default=0)):  # every hybrid too: each has its own salt
            once(mode, indices, f"warm-up {i}")

    rows: list[TtftRow] = []
    for k in ks:
        samples: dict[str, list[Any]] = {mode: [] for mode in modes_at(k)}
        for r in range(runs):
            on_progress(f"k={k} run {r + 1}/{runs}")
            indices = rng.sample(range(source.pool_size), k)
            for mode in samples:  # the same facts and question in every mode
                samples[mode].append(once(mode, indices, f"run {r}"))
        for mode in samples:
            results = samples[mode]
            ttfts = [res.ttft_s for res in results]
            rows.append(
                TtftRow(
                    k=k,
                    mode=mode,
                    runs=runs,
                    ttft_s_median=statistics.median(ttfts),
                    ttft_s_p90=_p90(ttfts),
                    samples=ttfts,
                    prompt_tokens=int(statistics.median(res.prompt_tokens for res in results)),
                    computed_tokens=int(statistics.median(res.computed_tokens for res in results)),
                    injected_tokens=int(statistics.median(res.injected_tokens for res in results)),
                )
            )
    return {
        **header,
        "facts": source.description,
        "fact_tokens_target": source.fact_tokens,
        "warmup": warmup,
        "seed": seed,
        "recompute": tails,
        "modes": {**LABELS, **{f"inject_r{r}": _label(f"inject_r{r}") for r in tails}},
        "encode": {"facts": source.pool_size, "seconds": source.encode_s},
        "rows": [asdict(row) for row in rows],
        "ratios": ratios(rows),
    }


def _label(mode: str) -> str:
    if mode in LABELS:
        return LABELS[mode]
    r = int(mode.removeprefix("inject_r"))
    return f"(a) with its last {r} fact{'s' if r > 1 else ''} prefilled"


def ratios(rows: Sequence[TtftRow]) -> dict[str, float]:
    """prompt/inject and warm-prompt/inject median TTFT per k, the flatness of injection
    (k=max over k=5), and each hybrid over plain injection."""
    by = {(row.k, row.mode): row.ttft_s_median for row in rows}
    out = {
        f"{mode}_over_inject_k{k}": value / by[(k, "inject")]
        for (k, mode), value in by.items()
        if mode.startswith("inject_r") and (k, "inject") in by
    }
    for baseline in ("prompt", "prompt_warm"):
        out.update(
            {
                f"{baseline}_over_inject_k{k}": by[(k, baseline)] / by[(k, "inject")]
                for k, mode in by
                if mode == "inject" and (k, baseline) in by
            }
        )
    if (5, "inject") in by:
        for k in sorted(k for k, mode in by if mode == "inject" and k > 5):
            out[f"inject_k{k}_over_k5"] = by[(k, "inject")] / by[(5, "inject")]
    return out


def headline(result: dict[str, Any]) -> str:
    """One line for the run log: the largest k's three medians and the ratios."""
    rows = result["rows"]
    k = max(row["k"] for row in rows)
    ms = {row["mode"]: row["ttft_s_median"] * 1e3 for row in rows if row["k"] == k}
    text = (
        f"k={k}: inject {ms['inject']:.0f} ms, prompt {ms['prompt']:.0f} ms"
        f" ({ms['prompt'] / ms['inject']:.1f}×), warm prompt {ms['prompt_warm']:.0f} ms"
    )
    for flat_k in sorted({50, k}):
        flat = result["ratios"].get(f"inject_k{flat_k}_over_k5")
        if flat is not None:
            text += f"; inject k{flat_k}/k5 {flat:.2f}"
    tails = sorted(
        (int(row["mode"].removeprefix("inject_r")), row["ttft_s_median"] * 1e3)
        for row in rows
        if row["k"] == k and row["mode"].startswith("inject_r")
    )
    if tails:
        text += "; " + ", ".join(f"inject r={r} {ms:.0f} ms" for r, ms in tails)
    if k != 50 and 50 in {row["k"] for row in rows}:
        ms50 = {row["mode"]: row["ttft_s_median"] * 1e3 for row in rows if row["k"] == 50}
        text = (
            f"k=50: inject {ms50['inject']:.0f} ms, prompt {ms50['prompt']:.0f} ms"
            f" ({ms50['prompt'] / ms50['inject']:.1f}×); " + text
        )
    return text


def plot(result: dict[str, Any], path: Path) -> None:
    """TTFT (median, p90 whiskers) against k for the three modes, log scale."""
    fig, ax = figure()
    tails = [f"inject_r{r}" for r in result.get("recompute", [])]
    for mode in [*MODES, *tails]:
        rows = sorted((r for r in result["rows"] if r["mode"] == mode), key=lambda r: r["k"])
        if not rows:
            continue
        ks = [r["k"] for r in rows]
        med = [r["ttft_s_median"] * 1e3 for r in rows]
        p90 = [max(0.0, r["ttft_s_p90"] * 1e3 - m) for r, m in zip(rows, med, strict=True)]
        label = _label(mode)
        ax.errorbar(ks, med, yerr=[[0] * len(med), p90], marker="o", capsize=3, label=label)
    ax.set_yscale("log")
    ax.set_xticks(sorted({r["k"] for r in result["rows"]}))
    ax.set_xlabel("memories per request (k)")
    ax.set_ylabel("time to first token, ms (median; whisker: p90)")
    ax.set_title(f"TTFT vs k — {result['model']}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.text(0.01, 0.005, footnote(result), fontsize=6, alpha=0.7)
    save_figure(fig, path)
