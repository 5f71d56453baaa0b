"""Turns retrieved facts and a question into a composed request whose KV is in the store.

It owns the pieces that must agree with each other: the chat layout (token ids), the encoder
(the KV of those ids, as the engine computes them) and the store (where the connector finds
them). Entries are keyed by content (model fingerprint, encoder version, context, token ids),
so a fact is encoded once per context and every later request reuses it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, datetime
from pathlib import Path

from inferscale_core.composer import ChatLayout, ComposedPrompt, entry_key, fact_line
from inferscale_core.context_window import ANCHORED, encoding_version
from inferscale_core.encoding import EncodeItem, Encoder, EngineEncoder
from inferscale_core.engine import Engine
from inferscale_core.kvstore import KVStore


def default_system_prompt() -> str:
    """The assistant's system prompt, shipped beside this module (``system_prompt.txt``)."""
    return (Path(__file__).with_name("system_prompt.txt")).read_text(encoding="utf-8")


def model_layout(model_dir: Path, system_prompt: str | None = None) -> ChatLayout:
    """The chat layout of a local model folder (its tokenizer; no engine), with
    ``system_prompt`` (None: :func:`default_system_prompt`)."""
    from transformers import AutoTokenizer

    prompt = default_system_prompt() if system_prompt is None else system_prompt
    return ChatLayout(AutoTokenizer.from_pretrained(str(model_dir)), prompt)


@dataclass(frozen=True, slots=True)
class MemoryFact:
    """A fact as it goes into a prompt: its text, the date it refers to, its context turns."""

    text: str
    when: date | datetime | None = None
    context: tuple[str, ...] = ()  # the w turns before it, oldest first (encoding context)
    until: date | None = None  # when it stopped being true (Fact.valid_until)


class PromptBuilder:
    def __init__(
        self,
        layout: ChatLayout,
        encoder: Encoder,
        store: KVStore,
        batch_size: int = 16,
        salt_scope: str = "",
    ) -> None:
        self.layout = layout
        # In every cache salt this builder makes: a server gives each user a secret scope, so
        # vLLM's prefix cache never shares a block between two users (serving).
        self.salt_scope = salt_scope
        self.batch_size = batch_size
        self.encoder = encoder
        self.store = store
        if store.fingerprint is None:
            raise ValueError("the prompt builder's store must know its model's fingerprint")
        self.fingerprint: str = store.fingerprint
        self.prefix_key = layout.prefix_key(self.fingerprint, encoder.version)

    @classmethod
    def for_model(
        cls, model_dir: Path, store: KVStore, system_prompt: str, engine: Engine
    ) -> PromptBuilder:
        """The builder of a local model folder: its chat layout, encoding through ``engine``
        into ``store``."""
        layout = model_layout(model_dir, system_prompt)
        salt = f"inferscale-encode/{EngineEncoder.version}/{store.fingerprint}"
        return cls(layout, EngineEncoder(engine, store, salt), store)

    def scoped(self, scope: str) -> PromptBuilder:
        """This builder for one user of a server: the same layout, store and engine, with
        ``scope`` (a per-user secret) in the cache salt of its requests and encodings."""
        encoder = self.encoder
        if isinstance(encoder, EngineEncoder):
            encoder = EngineEncoder(
                encoder.engine, encoder.store, f"{encoder.cache_salt}/{scope}", encoder.timeout_s
            )
        return PromptBuilder(self.layout, encoder, self.store, self.batch_size, scope)

    @property
    def encoder_version(self) -> str:
        """What the fact log records as encoding a fact (entries of another are stale)."""
        return self.encoder.version

    def cache_salt(self, w: int, window: str = ANCHORED, recompute: int = 0) -> str:
        """Keeps this encoding's KV apart from any other in vLLM's prefix cache, and a request
        whose last ``recompute`` facts are prefilled apart from one that injects them (same
        token ids, other KV: without it the cache would serve one for the other)."""
        encoding = encoding_version(self.encoder.version, w, window)
        salt = f"inferscale/{encoding}/{self.fingerprint}/w{w}"
        if self.store.store_dtype != "model":  # compressed entries: other KV, other blocks
            salt = f"{salt}/{self.store.store_dtype}"
        salt = f"{salt}/r{recompute}" if recompute else salt
        return f"{salt}/{self.salt_scope}" if self.salt_scope else salt

    def ensure_prefix(self) -> str:
        """Encode the system prefix once (it is exact: nothing precedes it)."""
        if not self.store.has(self.prefix_key):
            self.encoder.encode([EncodeItem(self.prefix_key, [], self.layout.prefix_ids)])
        return self.prefix_key

    def context_ids(self, context: Sequence[str]) -> list[int]:
        """Encoding context of a fact: the prefix, then its context turns as plain lines."""
        ids = list(self.layout.prefix_ids)
        for turn in context:
            ids.extend(self.layout.fact_ids(fact_line(turn)))
        return ids

    def fact_entry(self, fact: MemoryFact, namespace: str = "") -> tuple[str, list[int]]:
        """The fact's entry key and token ids, encoding it after its context if it is new."""
        return self.encode_many([fact], namespace)[0]

    def encode_many(
        self,
        facts: Sequence[MemoryFact],
        namespace: str | Sequence[str] = "",
        again: bool = False,
    ) -> list[tuple[str, list[int]]]:
        """Keys and token ids of ``facts``; the ones not in the store are encoded in batches
        (``again``: all of them, replacing what is stored, e.g. in another store dtype).

        ``namespace`` (one for all, or one per fact) goes into the key, so that two profiles'
        identical facts never share a file that forgetting one of them would delete.
        """
        spaces = [namespace] * len(facts) if isinstance(namespace, str) else list(namespace)
        planned = []
        for fact, space in zip(facts, spaces, strict=True):
            ids = self.layout.fact_ids(fact_line(fact.text, fact.when, fact.until))
            context = self.context_ids(fact.context)
            material = (self.encoder.version, space, tuple(context), tuple(ids))
            planned.append((entry_key("fact", self.fingerprint, *material), context, ids))
        # In the order given: consecutive facts of a conversation share context turns, which
        # the engine's prefix cache then computes once for the whole wave.
        missing = list(
            {item[0]: item for item in planned if again or not self.store.has(item[0])}.values()
        )
        for start in range(0, len(missing), self.batch_size):
            batch = missing[start : start + self.batch_size]
            self.encoder.encode([EncodeItem(key, ctx, ids) for key, ctx, ids in batch])
        return [(key, ids) for key, _, ids in planned]

    def build(
        self,
        facts: Sequence[MemoryFact],
        question: str,
        history: Sequence[tuple[str, str]] = (),
        w: int = 0,
        window: str = ANCHORED,
        recompute: int = 0,
    ) -> ComposedPrompt:
        """A request with ``facts`` in prompt order (best hit last, nearest the question);
        ``w`` and ``window`` name the encoding of their context (for the prefix cache). The
        last ``recompute`` facts are not injected but prefilled with the question, after the
        injected span: they attend to every fact before them (``recompute=len(facts)`` is
        prompt injection)."""
        split = len(facts) - min(max(recompute, 0), len(facts))
        entries = self.encode_many(facts[:split])
        lines = [fact_line(f.text, f.when, f.until) for f in facts[split:]]
        return self.compose(entries, question, history, w, lines, window, len(lines))

    def compose(
        self,
        entries: Sequence[tuple[str, Sequence[int]]],
        question: str,
        history: Sequence[tuple[str, str]] = (),
        w: int = 0,
        pending_lines: Sequence[str] = (),
        window: str = ANCHORED,
        recompute: int = 0,
    ) -> ComposedPrompt:
        """A request over already-stored entries; ``pending_lines`` (facts whose KV is not
        ready yet, and the ``recompute`` best ones) follow the span as plain text and are
        prefilled like the question."""
        salt = self.cache_salt(w, window, recompute)
        composed = self.layout.compose(self.ensure_prefix(), entries, question, history, salt)
        if not pending_lines:
            return composed
        extra = [t for line in pending_lines for t in self.layout.fact_ids(line)]
        end = composed.span_end
        ids = composed.prompt_ids[:end] + extra + composed.prompt_ids[end:]
        return ComposedPrompt(ids, composed.entries, composed.fact_keys, composed.cache_salt)

    def prompt_injection_ids(
        self, facts: Sequence[MemoryFact], question: str, history: Sequence[tuple[str, str]] = ()
    ) -> list[int]:
        """The same request as plain text (the baseline, and what a full prefill computes)."""
        lines = [fact_line(f.text, f.when, f.until) for f in facts]
        return self.layout.prompt_text_ids(lines, question, history)
