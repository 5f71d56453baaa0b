"""``VllmEngine.generate_batch``: requests submitted together come back in order, each as it
would alone (the session engine; fp32 and greedy on the CPU)."""

from __future__ import annotations

from datetime import date

import pytest

from inferscale_core.prompt_builder import MemoryFact

pytestmark = pytest.mark.engine

FACTS = [
    MemoryFact("Nadia bakes sourdough with a starter called Bubbles.", date(2023, 3, 3)),
    MemoryFact("Tomas adopted Pepper, a beagle mix, from the shelter.", date(2023, 3, 17)),
    MemoryFact(
        "Priya ran the city half marathon in two hours and four minutes.", date(2023, 10, 22)
    ),
    MemoryFact("Leo makes forty small bowls for his brother's wedding.", date(2023, 9, 2)),
]


def test_generate_batch_runs_requests_together_in_order(runtime):
    composed = [
        runtime.builder.build(FACTS[i : i + 2], f"Who is it? (batch {i})") for i in range(3)
    ]
    results = runtime.engine.generate_batch(composed, max_tokens=3, ignore_eos=True)
    assert [r.prompt_tokens for r in results] == [len(c.prompt_ids) for c in composed]
    for result in results:
        assert len(result.token_ids) == 3 and result.injected_tokens > 0
        assert 0 < result.ttft_s <= result.total_s
    one = runtime.engine.generate(composed[1], max_tokens=3, ignore_eos=True)
    assert one.token_ids == results[1].token_ids  # batching changes nothing (fp32, greedy)
