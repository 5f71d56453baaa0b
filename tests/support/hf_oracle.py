"""Hugging Face forward fed a given KV: the oracle for what vLLM computes after injection."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from inferscale_core.composer import ComposedPrompt
from inferscale_core.kvstore import KVStore
from inferscale_core.model_spec import ModelSpec
from inferscale_core.rope import RopeSpec, shift
from inferscale_core.types import FactKV


def stack_entries(entries: Sequence[FactKV]) -> tuple[torch.Tensor, torch.Tensor]:
    """Concatenate entries along tokens: k, v each [layers, sum(tokens), kv_heads, head_dim]."""
    return torch.cat([e.k for e in entries], dim=1), torch.cat([e.v for e in entries], dim=1)


def injected_kv(
    store: KVStore, composed: ComposedPrompt, spec: RopeSpec | ModelSpec
) -> tuple[torch.Tensor, torch.Tensor]:
    """What injection puts in the cache for ``composed``'s span, computed plainly: each entry's
    stored keys moved from their origin to their place (``rope.shift``, fp32, with each layer's
    own RoPE when ``spec`` is a model's), and its values.
    k, v: [layers, span, kv_heads, head_dim] fp32, positions 0..span-1."""
    ks, vs = [], []
    for placed in composed.entries:
        entry = store.get(placed.key)
        by = placed.start - entry.origin
        k = entry.k.float()  # [layers, tokens, kv_heads, head_dim]
        if isinstance(spec, ModelSpec):
            ks.append(torch.stack([shift(k[i], by, spec.rope(i)) for i in range(k.shape[0])]))
        else:
            ks.append(shift(k, by, spec))
        vs.append(entry.v.float())
    return torch.cat(ks, dim=1), torch.cat(vs, dim=1)


@torch.inference_mode()
def logprobs_after_injected_kv(
    model: torch.nn.Module,
    k_post: torch.Tensor,  # [layers, span, kv_heads, head_dim] post-RoPE at 0..span-1
    v: torch.Tensor,  # [layers, span, kv_heads, head_dim]
    rest_ids: Sequence[int],  # the prompt after the span, then any generated tokens to score
    steps: int,
) -> list[torch.Tensor]:
    """Log-probabilities ([vocab]) at the last ``steps`` positions of ``rest_ids``.

    The cache holds exactly the injected KV (see :func:`injected_kv`), so every token after
    the span attends to it as vLLM's would.
    """
    from transformers import DynamicCache

    span = k_post.shape[1]
    weight = next(model.parameters())  # the model's device and dtype (bf16 on a GPU)
    cache = DynamicCache(config=model.config)
    for layer in range(k_post.shape[0]):
        cache.update(
            k_post[layer].transpose(0, 1).unsqueeze(0).to(weight),  # [1, kv_heads, span, dim]
            v[layer].transpose(0, 1).unsqueeze(0).to(weight),
            layer,
        )
    ids = torch.tensor([list(rest_ids)], device=weight.device)
    positions = torch.arange(span, span + len(rest_ids), device=weight.device).unsqueeze(0)
    logits = model(input_ids=ids, position_ids=positions, past_key_values=cache).logits[0]
    logprobs = torch.log_softmax(logits.float(), dim=-1).cpu()  # [len(rest_ids), vocab]
    return [logprobs[i] for i in range(len(rest_ids) - steps, len(rest_ids))]


def max_logprob_delta(
    a: Sequence[dict[int, float]],
    b: Sequence[dict[int, float]],
    tokens_a: Sequence[int] | None = None,
    tokens_b: Sequence[int] | None = None,
) -> float:
    """Largest |Δ logprob| over the tokens both sides report, step by step.

    With the tokens each side generated, the comparison stops after the first step where they
    differ: from there on the two sides continue different texts, and their distributions
    no longer describe the same position (a bf16 rounding can flip a near-tie greedy choice).
    """
    delta = 0.0
    for step, (step_a, step_b) in enumerate(zip(a, b, strict=True)):
        shared = set(step_a) & set(step_b)
        assert shared, f"no token in common at step {step}"
        delta = max(delta, max(abs(step_a[t] - step_b[t]) for t in shared))
        if tokens_a is not None and tokens_b is not None and tokens_a[step] != tokens_b[step]:
            break
    return delta


def steps_in_common(tokens_a: Sequence[int], tokens_b: Sequence[int]) -> int:
    """How many leading tokens two generations share."""
    n = 0
    while n < min(len(tokens_a), len(tokens_b)) and tokens_a[n] == tokens_b[n]:
        n += 1
    return n
