"""``bench throughput``: N concurrent users, each with its own k retrieved memories.

For each N, every run gives each user a fresh random set of k facts in a fresh order and a
question of its own, submits all N requests to the engine at once (``generate_batch``: the
scheduler batches them as a server would) and steps until all finish. The same N requests are
sent once with KV injection and once with prompt injection. Requests/s is N over the wall time
of the batch; TTFT counts from the batch's submission, so it includes queueing behind the
other users' prefills. Output length is fixed (``ignore_eos``) so both modes decode the same.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.prompts import PromptSource
from bench.report import figure, footnote, percentile, provenance, save_figure

MODES = ("inject", "prompt")
LABELS = {"inject": "KV injection", "prompt": "prompt injection"}


@dataclass(slots=True)
class ThroughputRow:
    users: int
    mode: str
    runs: int
    requests_per_s: float  # median over runs of users / batch wall time
    ttft_s_p50: float  # over every request of every run
    ttft_s_p90: float
    output_tokens_per_s: float  # median over runs
    wall_s: list[float] = field(default_factory=list)  # one per run
    ttft_s: list[float] = field(default_factory=list)  # every request, run after run
    prompt_tokens: int = 0  # median per request
    computed_tokens: int = 0  # median per request


def run_throughput(
    source: PromptSource,
    engine: Any,  # VllmEngine: generate_batch()
    users: Sequence[int],
    k: int,
    runs: int,
    *,
    max_tokens: int = 16,
    warmup: int = 1,
    seed: int = 0,
    model_name: str = "",
    command: str | None = None,
    on_progress: Callable[[str], None] = lambda message: None,
) -> dict[str, Any]:
    """Measure and return the JSON-ready result (``{"bench": "throughput", "rows": [...]}``)."""
    if k > source.pool_size:
        raise ValueError(f"k={k} needs a pool of at least that many facts")
    rng = random.Random(seed)
    header = provenance("throughput", model_name, command)

    def batch(n: int, tag: str) -> list[tuple[Any, list[int]]]:
        return [
            source.pair(rng.sample(range(source.pool_size), k), f"{tag} user {u}") for u in range(n)
        ]

    def send(mode: str, pairs: list[tuple[Any, list[int]]]) -> tuple[float, list[Any]]:
        prompts = [composed if mode == "inject" else ids for composed, ids in pairs]
        results = engine.generate_batch(prompts, max_tokens=max_tokens, ignore_eos=True)
        refused = [r.refused for r in results if mode == "inject" and r.refused]
        if refused:
            raise RuntimeError(f"injection refused during the benchmark: {refused[0]}")
        return max(r.total_s for r in results), results

    for i in range(warmup):
        on_progress(f"warm-up {i + 1}/{warmup}")
        pairs = batch(min(users), f"warm-up {i}")
        for mode in MODES:
            send(mode, pairs)

    rows = []
    for n in users:
        walls: dict[str, list[float]] = {mode: [] for mode in MODES}
        done: dict[str, list[Any]] = {mode: [] for mode in MODES}
        for r in range(runs):
            on_progress(f"{n} users, run {r + 1}/{runs}")
            pairs = batch(n, f"run {r}")
            for mode in MODES:
                wall, results = send(mode, pairs)
                walls[mode].append(wall)
                done[mode].extend(results)
        for mode in MODES:
            ttfts = [res.ttft_s for res in done[mode]]
            per_run = [done[mode][i * n : (i + 1) * n] for i in range(runs)]
            tokens = [sum(len(res.token_ids) for res in results) for results in per_run]
            rows.append(
                ThroughputRow(
                    users=n,
                    mode=mode,
                    runs=runs,
                    requests_per_s=statistics.median(n / w for w in walls[mode]),
                    ttft_s_p50=percentile(ttfts, 0.5),
                    ttft_s_p90=percentile(ttfts, 0.9),
                    output_tokens_per_s=statistics.median(
                        t / w for t, w in zip(tokens, walls[mode], strict=True)
                    ),
                    wall_s=walls[mode],
                    ttft_s=ttfts,
                    prompt_tokens=int(statistics.median(res.prompt_tokens for res in done[mode])),
                    computed_tokens=int(
                        statistics.median(res.computed_tokens for res in done[mode])
                    ),
                )
            )
    return {
        **header,
        "facts": source.description,
        "k": k,
        "max_tokens": max_tokens,
        "warmup": warmup,
        "seed": seed,
        "rows": [asdict(row) for row in rows],
        "ratios": ratios(rows),
    }


def ratios(rows: Sequence[ThroughputRow]) -> dict[str, float]:
    """Per N: requests/s of injection over prompt injection, and prompt/inject TTFT p50."""
    by = {(row.users, row.mode): row for row in rows}
    out = {}
    for n, mode in by:
        if mode == "inject" and (n, "prompt") in by:
            inject, prompt = by[(n, "inject")], by[(n, "prompt")]
            out[f"inject_over_prompt_rps_u{n}"] = inject.requests_per_s / prompt.requests_per_s
            out[f"prompt_over_inject_ttft_p50_u{n}"] = prompt.ttft_s_p50 / inject.ttft_s_p50
    return out


def headline(result: dict[str, Any]) -> str:
    n = max(row["users"] for row in result["rows"])
    by = {row["mode"]: row for row in result["rows"] if row["users"] == n}
    inject, prompt = by["inject"], by["prompt"]
    return (
        f"{n} users, k={result['k']}: {inject['requests_per_s']:.2f} vs"
        f" {prompt['requests_per_s']:.2f} req/s"
        f" ({inject['requests_per_s'] / prompt['requests_per_s']:.1f}×); TTFT p50"
        f" {inject['ttft_s_p50'] * 1e3:.0f} vs {prompt['ttft_s_p50'] * 1e3:.0f} ms"
    )


def plot(result: dict[str, Any], path: Path) -> None:
    """Requests/s and TTFT p50 against concurrent users, both modes."""
    fig, (left, right) = figure(10, 4.2, ncols=2)
    for mode in MODES:
        rows = sorted((r for r in result["rows"] if r["mode"] == mode), key=lambda r: r["users"])
        users = [r["users"] for r in rows]
        left.plot(users, [r["requests_per_s"] for r in rows], marker="o", label=LABELS[mode])
        p50 = [r["ttft_s_p50"] * 1e3 for r in rows]
        p90 = [r["ttft_s_p90"] * 1e3 - m for r, m in zip(rows, p50, strict=True)]
        right.errorbar(
            users, p50, yerr=[[0] * len(p50), p90], marker="o", capsize=3, label=LABELS[mode]
        )
    for ax in (left, right):
        ax.set_xticks(sorted({r["users"] for r in result["rows"]}))
    left.set_xlabel("concurrent users")
    left.set_ylabel("requests / s (median of runs)")
    left.set_title(f"Throughput, k={result['k']}, {result['max_tokens']} output tokens")
    right.set_xlabel("concurrent users")
    right.set_ylabel("TTFT, ms (p50; whisker: p90)")
    right.set_yscale("log")
    right.set_title("Time to first token under load")
    for ax in (left, right):
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.text(0.01, 0.005, footnote(result), fontsize=6, alpha=0.7)
    save_figure(fig, path)
