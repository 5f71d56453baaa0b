"""Exactness of injection on one model, in its own process (a pytest session may hold one
vLLM engine, the SmolLM2 one); the scripts ``tiny_llama_check.py`` and ``gemma_check.py`` call
:func:`run_checks` and print its report as one JSON line.

* k=1, the fact placed where it was encoded (right after the system prefix): against the full
  prefill of the same prompt; the injected keys are the engine's own bytes;
* the same fact stored pre-RoPE instead (un-rotated in fp32 with each layer's RoPE, rounded to
  the cache dtype, rotated back on load): the alternative stored form, for the design's choice;
* k=5, facts 2-5 placed after the ones before them (moved from where they were encoded): against
  a Hugging Face forward fed the same injected KV;
* optionally k=1 behind a long system prompt (past a sliding window).
"""

from __future__ import annotations

import os
from datetime import date
from pathlib import Path

import torch

STEPS = 4


def run_checks(
    model_dir: Path,
    workdir: Path,
    dtype: str = "auto",
    rope_type: str = "default",
    long_prefix_tokens: int = 0,
    weights: str = "auto",
) -> dict:
    """Encode facts through the engine on ``model_dir``, inject them, and measure (see the
    module docstring); ``long_prefix_tokens`` > 0 adds k=1 behind a system prompt that long.
    ``model_dir`` may be a GGUF file (the oracle reads the folder the wiring made of it), and
    ``weights`` is the ``weights`` setting (fp8: quantized as vLLM loads them)."""
    from inferscale_core import wiring
    from inferscale_core.config import AppConfig
    from inferscale_core.model_spec import ModelSpec
    from inferscale_core.prompt_builder import MemoryFact
    from inferscale_core.rope import rotate
    from inferscale_core.types import FactKV
    from tests.support.hf_oracle import (
        injected_kv,
        logprobs_after_injected_kv,
        max_logprob_delta,
        steps_in_common,
    )
    from tests.support.rope_inverse import unrotate

    cudagraph_mode = os.environ.get("TINY_CUDAGRAPH_MODE", "")  # e.g. FULL; "" = vLLM's default
    extra = {"compilation_config": {"cudagraph_mode": cudagraph_mode}} if cudagraph_mode else {}
    kv_write = os.environ.get("TINY_KV_WRITE", "auto")  # "backend": the unfused load
    kv_cache_dtype = os.environ.get("TINY_KV_CACHE_DTYPE", "auto")  # "fp8": vLLM's fp8 cache
    # On a GPU the store gets its device pool, so the fused load reads entries in place.
    pool_gib = 0.25 if torch.cuda.is_available() else 0
    runtime = wiring.build(
        # the model's own dtype: exactness is checked against a full prefill
        AppConfig(
            model=str(model_dir),
            gpu_pool_gib=pool_gib,
            kv_store_dtype="model",
            kv_cache_dtype=kv_cache_dtype,
            weights=weights,
        ),
        store_root=workdir / "kv",
        system_prompt="You are a test model. Memory:",
        max_model_len=2048,
        dtype=dtype,
        extra=extra,
        kv_write=kv_write,
        block_size=int(os.environ["TINY_BLOCK_SIZE"])
        if os.environ.get("TINY_BLOCK_SIZE")
        else None,
    )
    builder, engine = runtime.builder, runtime.engine
    facts = [
        MemoryFact(f"Fact number {i}: the {word} is kept in drawer {i * 7}.", date(2024, 1, i + 1))
        for i, word in enumerate(["key", "map", "pen", "coin", "ring"])
    ]
    question = "Where is the coin?"

    composed1 = builder.build(facts[:1], question)
    full = engine.generate(
        builder.prompt_injection_ids(facts[:1], question),
        max_tokens=STEPS,
        logprobs=5,
        cache_salt="tiny-full",
    )
    inj1 = engine.generate(composed1, max_tokens=STEPS, logprobs=5)
    full_again = engine.generate(
        builder.prompt_injection_ids(facts[:1], question),
        max_tokens=STEPS,
        logprobs=5,
        cache_salt="tiny-full-again",
    )
    full_cached = engine.generate(  # ``full``'s prompt again: a prefix-cache hit, no injection
        builder.prompt_injection_ids(facts[:1], question),
        max_tokens=STEPS,
        logprobs=5,
        cache_salt="tiny-full",
    )

    composed5 = builder.build(facts, question)
    # In the GPU pool before the request, as the session's prefetch leaves them: the worker
    # reads them where they sit without a prefetch of its own (k=1 above took the other path).
    runtime.store.prefetch([e.key for e in composed5.entries])
    in_place_before = engine.load_stats.in_place
    inj5 = engine.generate(composed5, max_tokens=STEPS, logprobs=5)
    stats = engine.load_stats
    from transformers import AutoModelForCausalLM

    hf_dtype = torch.bfloat16 if torch.cuda.is_available() else torch.float32
    hf = AutoModelForCausalLM.from_pretrained(str(runtime.model_dir), dtype=hf_dtype).to(
        "cuda" if torch.cuda.is_available() else "cpu"
    )
    spec = ModelSpec.from_hf_config(hf.config)
    k_post, v = injected_kv(runtime.store, composed5, spec)
    rest = composed5.prompt_ids[composed5.span_end :] + inj5.token_ids[:-1]
    oracle = logprobs_after_injected_kv(hf, k_post, v, rest, steps=len(inj5.token_ids))

    # The other stored form, pre-RoPE: the captured fact un-rotated in fp32 and rounded to the
    # cache dtype, as a store of pre-RoPE keys would hold it, then rotated back when loaded.
    fact_key = composed1.fact_keys[0]
    captured = runtime.store.get(fact_key)
    positions = torch.arange(captured.origin, captured.origin + len(captured.token_ids))
    back = torch.stack(  # layer by layer: each layer's own RoPE
        [
            rotate(
                unrotate(k.float(), positions, spec.rope(i)).to(k.dtype).float(),
                positions,
                spec.rope(i),
            ).to(k.dtype)
            for i, k in enumerate(captured.k)
        ]
    )
    alt_key = fact_key + "-prerope"
    runtime.store.put(
        FactKV(alt_key, captured.token_ids, back, captured.v, captured.fingerprint, captured.origin)
    )
    alt = builder.compose([(alt_key, captured.token_ids)], question)
    inj1_pre = engine.generate(alt, max_tokens=STEPS, logprobs=5, cache_salt="tiny-prerope")
    delta5 = max(
        abs(value - float(expected[token]))
        for step, expected in zip(inj5.logprobs, oracle, strict=True)
        for token, value in step.items()
    )
    report = {
        "cudagraph_mode": cudagraph_mode or "default",
        "block_size": engine.block_size,
        "fused_kernel": stats.fused > 0,
        # the last load (k=5) read its entries where they sit in the GPU pool
        "in_place": stats.in_place > in_place_before,
        "rope_type": rope_type,
        "model_type": spec.model_type,
        "layer_ropes": len(set(spec.layer_rope)),
        "dtype": dtype,
        "kv_cache_dtype": kv_cache_dtype,
        "entry_dtype": str(runtime.store.get(composed1.fact_keys[0]).k.dtype),
        # Compared up to the first step where the greedy tokens differ (see max_logprob_delta).
        "k1_delta": max_logprob_delta(full.logprobs, inj1.logprobs, full.token_ids, inj1.token_ids),
        "k1_shift": runtime.store.header(fact_key).origin - composed1.entries[1].start,
        "k1_prerope_delta": max_logprob_delta(
            full.logprobs, inj1_pre.logprobs, full.token_ids, inj1_pre.token_ids
        ),
        "prerope_keys_changed": float((back != captured.k).float().mean()),  # share of elements
        "k5_shifts": [e.start - runtime.store.header(e.key).origin for e in composed5.entries[1:]],
        "k1_first_step_delta": max_logprob_delta(full.logprobs[:1], inj1.logprobs[:1]),
        "k1_steps_before_divergence": steps_in_common(full.token_ids, inj1.token_ids),
        "k1_steps": len(full.token_ids),
        "two_full_prefills_delta": max_logprob_delta(
            full.logprobs, full_again.logprobs, full.token_ids, full_again.token_ids
        ),
        # The same prompt served from vLLM's prefix cache: what a cached context alone costs.
        "prefix_cached_delta": max_logprob_delta(
            full.logprobs, full_cached.logprobs, full.token_ids, full_cached.token_ids
        ),
        "prefix_cached_tokens": full_cached.cached_tokens,  # vLLM's num_cached_tokens
        "model_runner": "v2"
        if getattr(engine.llm.llm_engine.vllm_config, "use_v2_model_runner", False)
        else "v1",
        "k1_same_tokens": full.token_ids == inj1.token_ids,
        "k1_injected": inj1.injected_tokens,
        "k1_span_end": composed1.span_end,
        "k5_delta_vs_hf": delta5,
        "k5_injected": inj5.injected_tokens,
        "k5_prefix_cached": inj5.prefix_cached_tokens,
        "k5_span_end": composed5.span_end,
        "k5_refused": inj5.refused,
        "weights": weights,
        "model_dir": str(runtime.model_dir),
        # the weights as vLLM holds them: the bytes of the model's parameters and buffers
        "weights_bytes": sum(engine.llm.apply_model(_module_bytes)),
    }
    if long_prefix_tokens:
        report.update(_long_prefix(runtime, hf, facts[:1], question, long_prefix_tokens))
    return report


def _module_bytes(module: torch.nn.Module) -> int:
    tensors = [*module.parameters(), *module.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors)


def _long_prefix(runtime, hf, facts, question: str, tokens: int) -> dict:
    """k=1 behind a system prompt of about ``tokens`` tokens: with a sliding window shorter than
    that, the windowed layers must hide the same early tokens from the injected prompt as from
    the full prefill; and the full prefill must match Hugging Face's (which applies the window)."""
    from inferscale_core.prompt_builder import PromptBuilder
    from tests.support.hf_oracle import max_logprob_delta

    sentence = "The archive keeps every letter in numbered boxes on the shelves. "
    per = len(runtime.builder.layout.tokenizer.encode(sentence, add_special_tokens=False))
    system = "You are a test model. " + sentence * (tokens // per + 1) + "Memory:"
    builder = PromptBuilder.for_model(runtime.model_dir, runtime.store, system, runtime.engine)
    engine = runtime.engine
    composed = builder.build(facts, question)
    full_ids = builder.prompt_injection_ids(facts, question)
    full = engine.generate(full_ids, max_tokens=STEPS, logprobs=5, cache_salt="long-full")
    inj = engine.generate(composed, max_tokens=STEPS, logprobs=5)
    ids = full_ids + full.token_ids[:-1]
    with torch.inference_mode():
        weight = next(hf.parameters())
        logits = hf(input_ids=torch.tensor([ids], device=weight.device)).logits[0]
    hf_logprobs = torch.log_softmax(logits.float(), dim=-1).cpu()[len(full_ids) - 1 :]
    return {
        "long_prompt_tokens": len(composed.prompt_ids),
        "long_k1_injected": inj.injected_tokens,
        "long_k1_delta": max_logprob_delta(
            full.logprobs, inj.logprobs, full.token_ids, inj.token_ids
        ),
        "long_full_vs_hf_delta": max(
            abs(value - float(hf_logprobs[step][token]))
            for step, lp in enumerate(full.logprobs)
            for token, value in lp.items()
        ),
    }
