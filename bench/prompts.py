"""Where the latency benches get their requests: k memories → (injected request, prompt ids).

A :class:`PromptSource` holds a pool of memory facts whose KV is already in the store and
builds, for any subset of the pool, the same request twice: as a composed memory request (KV
injection) and as plain token ids (prompt injection, the baseline). :class:`FactPrompts` uses
the real model (synthetic dated facts through the product's prompt builder and encoder);
:class:`bench.dummy.DummyPrompts` uses random token ids and random KV for a
config-only model with dummy weights (latency does not depend on the weights).

Both build the tail-recompute hybrid too (``recompute=r``): the last r facts of the request
are not injected but prefilled with the question, at the same positions and with the same
token ids (:meth:`~inferscale_core.prompt_builder.PromptBuilder.build`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Protocol

from bench.synthetic import synthetic_facts
from inferscale_core.composer import ComposedPrompt, fact_line
from inferscale_core.prompt_builder import PromptBuilder


class PromptSource(Protocol):
    """A pool of stored memories and the two ways of sending a subset of them."""

    pool_size: int
    fact_tokens: int  # target length of one fact, in tokens
    encode_s: float  # time it took to encode the pool (0 when nothing was encoded)
    description: str

    def pair(
        self, indices: Sequence[int], tag: str, recompute: int = 0
    ) -> tuple[ComposedPrompt, list[int]]:
        """The facts ``indices`` (prompt order) and a question made distinct by ``tag``:
        ``(composed request for injection, prompt-injection token ids)``; the composed
        request's last ``recompute`` facts are prefilled, not injected."""
        ...


def recompute_salted(composed: ComposedPrompt, recompute: int) -> ComposedPrompt:
    """``composed`` with a prefix-cache salt of its own when it recomputes a tail.

    For requests laid out here (``bench.dummy``), as ``PromptBuilder.cache_salt`` does for the
    product's: a hybrid has the same token ids as the plain injected request, so vLLM's prefix
    cache would serve its tail blocks from one that injected them (or the reverse). Only the
    salt changes, i.e. only prefix caching.
    """
    if recompute <= 0:
        return composed
    salt = f"{composed.cache_salt or ''}/recompute{recompute}"
    return dataclasses.replace(composed, cache_salt=salt)


def pool_size_for(ks: Sequence[int]) -> int:
    """Enough facts that every run draws a fresh set in a fresh order."""
    return max(10, 2 * max(ks, default=0))


class FactPrompts:
    """Synthetic dated facts of ~``fact_tokens`` tokens, encoded once with the real model."""

    def __init__(
        self, builder: PromptBuilder, pool_size: int, fact_tokens: int = 50, seed: int = 0
    ) -> None:
        self.builder = builder
        self.pool_size = pool_size
        self.fact_tokens = fact_tokens
        self.description = f"synthetic dated facts of ~{fact_tokens} tokens (real model)"

        def count(text: str) -> int:
            return len(builder.layout.fact_ids(fact_line(text)))

        self.pool = synthetic_facts(pool_size, count, target_tokens=fact_tokens, seed=seed)
        t0 = time.perf_counter()
        builder.ensure_prefix()
        builder.encode_many(self.pool)
        self.encode_s = time.perf_counter() - t0

    def pair(
        self, indices: Sequence[int], tag: str, recompute: int = 0
    ) -> tuple[ComposedPrompt, list[int]]:
        facts = [self.pool[i] for i in indices]
        name = facts[-1].text.split()[0] if facts else "Ana"
        question = f"What did {name} plan? ({tag})"
        return (  # the builder salts a hybrid apart from plain injection
            self.builder.build(facts, question, recompute=recompute),
            self.builder.prompt_injection_ids(facts, question),
        )
