"""Encoding a memory entry: its K/V as the serving engine computes them, captured in place.

An entry (a fact line, or the system prefix) is encoded by one prefill-only request through the
same engine that answers the chat: ``[context ids + entry ids]``, where the context is the
system prefix and the fact's w preceding turns. The request asks the connector to *capture* the
entry's span; right after the forward that computes it, the connector copies its K/V out of the
paged cache into the KV store (``vllm_plugin/capture.py``), keys post-RoPE at the positions
they were computed at. One copy of the model serves both, the entry is exactly what the engine
computes, and placed back at the same position it is the engine's own bytes.

Encoding requests run at a lower priority than chat turns (vLLM's priority scheduling) and
step aside while a chat prompt is computed (``vllm_plugin/driver.py``); they batch with each
other and with the chat through continuous batching. The Hugging Face copy of the model is
only the tests' oracle.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from inferscale_core.composer import ComposedPrompt, PlacedEntry
from inferscale_core.engine import ENCODE_PRIORITY, Engine
from inferscale_core.kvstore import KVStore

#: Goes into every entry's key and the fact log's record of what encodes a fact: entries of
#: another version (the earlier Hugging Face encoder's pre-RoPE ones) are never injected, and
#: the memory worker re-encodes their facts in the background.
ENCODER_VERSION = "engine-capture/1"


@dataclass(frozen=True, slots=True)
class EncodeItem:
    """One entry to encode: its key, and its token ids after their context's."""

    key: str
    context_ids: Sequence[int]  # the system prefix and the context turns, before the entry
    entry_ids: Sequence[int]  # the entry's own tokens (what is stored and injected)


class Encoder(Protocol):
    version: str  # what the entries' keys and the fact log record

    def encode(self, items: Sequence[EncodeItem]) -> None:
        """Encode ``items`` into the store; every entry is there when this returns."""
        ...


class EncodeError(RuntimeError):
    """The engine did not produce an entry (it refused the request, or it never arrived)."""


class EngineEncoder:
    """Encodes entries through the serving engine (see the module's docstring).

    Args:
        engine: the chat's engine, with the connector.
        store: the KV store the connector writes the captured entries to.
        cache_salt: keeps the encoding requests' prefix-cache blocks (exact, computed KV) apart
            from the chat's (which may hold injected KV); shared by all encodings of one model,
            so the system prefix and shared context turns are computed once.
        timeout_s: how long to wait for the captured entries to be written.
    """

    version = ENCODER_VERSION

    def __init__(
        self, engine: Engine, store: KVStore, cache_salt: str, timeout_s: float = 120.0
    ) -> None:
        self.engine = engine
        self.store = store
        self.cache_salt = cache_salt
        self.timeout_s = timeout_s
        self.prefilled_tokens = 0  # prompt tokens the engine computed for encodings (a count)

    def encode(self, items: Sequence[EncodeItem]) -> None:
        if not items:
            return
        prompts = []
        for item in items:
            if not item.entry_ids:
                raise ValueError(f"entry {item.key} needs at least one token")
            start = len(item.context_ids)
            span = PlacedEntry(item.key, start, start + len(item.entry_ids))
            ids = [*item.context_ids, *item.entry_ids]
            prompts.append(ComposedPrompt(ids, [], [], self.cache_salt, captures=[span]))
        results = self.engine.generate_batch(prompts, max_tokens=1, priority=ENCODE_PRIORITY)
        self.prefilled_tokens += sum(result.computed_tokens for result in results)
        for item, result in zip(items, results, strict=True):
            if item.key not in result.captured:
                why = result.refused or "the engine did not capture it"
                raise EncodeError(f"entry {item.key} was not encoded: {why}")
        missing = self.store.wait_for([item.key for item in items], self.timeout_s)
        if missing:
            raise EncodeError(
                f"{len(missing)} captured entries were not written within {self.timeout_s:.0f} s"
                f" (first: {missing[0]}); see the engine log"
            )
