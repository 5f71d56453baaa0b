"""Token layout of a memory request (docs/DESIGN.md, "Token layout") and its KV load plan.

A request is sent to the engine as token ids, never re-tokenized text::

    prompt_ids = prefix_ids + fact_ids_1 + ... + fact_ids_k + suffix_ids
    prefix_ids : chat-template system header + system prompt + "Memory:" line
    fact_ids_i : "- <date> <fact text>\\n", tokenized alone, stored with the fact's KV
    suffix_ids : end of the system turn + recent turns + user turn + assistant header
    span_end   = len(prefix_ids) + sum(len(fact_ids_i))

The prefix and the suffix come from rendering the model's own chat template with a sentinel
in place of the memory block and splitting on it. Because the span holds the real fact token
ids, a request whose KV cannot be injected is exactly prompt injection when fully prefilled.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import date, datetime
from typing import Any, Protocol

MEMORY_HEADER = "\n\nMemory:\n"
_SENTINEL = "\u2063INFERSCALE_MEMORY\u2063"
KV_PARAMS_KEY = "inferscale"
KV_PARAMS_VERSION = 1
FACT_IDS_CACHE = 1 << 16  # fact lines whose token ids a layout remembers
SUFFIX_IDS_CACHE = 256  # (question, history) suffixes a layout remembers (turns in flight)
SUFFIX_IDS_BUDGET = 1 << 20  # token ids they hold together (4 MiB as int32), oldest go first


class Tokenizer(Protocol):
    """The part of a Hugging Face tokenizer the composer uses."""

    def apply_chat_template(self, conversation: list[dict[str, str]], **kwargs: Any) -> Any: ...

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...


#: The layout of a model without a chat template (a base model, e.g. the Gemma 3 270M test
#: model): its BOS, the system text, then "User:" / "Assistant:" lines.
PLAIN_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m['role'] == 'system' %}{{ m['content'] }}\n\n"
    "{% elif m['role'] == 'user' %}User: {{ m['content'] }}\n"
    "{% else %}Assistant: {{ m['content'] }}\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}Assistant:{% endif %}"
)


def render_chat(tokenizer: Tokenizer, messages: list[dict[str, str]]) -> str:
    """``messages`` as the model's chat template writes them, ready for the reply (the plain
    layout for a model that has no template)."""
    template = None if getattr(tokenizer, "chat_template", None) else PLAIN_CHAT_TEMPLATE
    return tokenizer.apply_chat_template(
        messages, chat_template=template, tokenize=False, add_generation_prompt=True
    )


class TemplateError(ValueError):
    """The chat template cannot be split into prefix / memory / suffix."""


class TurnRejected(ValueError):
    """A user turn that is not sent to the model; the message says why, to the user."""


class EmptyTurn(TurnRejected):
    def __init__(self) -> None:
        super().__init__("the message is empty: nothing to send")


class PromptTooLong(TurnRejected):
    """A turn that does not fit the model's context even with no memories and no history."""

    def __init__(self, tokens: int, limit: int) -> None:
        self.tokens, self.limit = tokens, limit
        super().__init__(
            f"the message is {tokens:,} tokens; the model takes {limit:,} with the system prompt"
            " and room for the reply. Shorten it or split it; it was not sent"
        )


@dataclass(frozen=True, slots=True)
class PlacedEntry:
    """One stored KV entry at its place in a prompt: positions ``[start, end)``."""

    key: str
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class ComposedPrompt:
    """A memory request: its token ids, where each entry sits, and what the KV load covers.

    An encoding request carries ``captures`` instead: spans of its prompt whose K/V the
    connector copies out of the cache, as new entries, once the engine has computed them.
    """

    prompt_ids: list[int]
    entries: list[PlacedEntry]  # the system prefix first, then the facts in prompt order
    fact_keys: list[str] = field(default_factory=list)  # the facts' entry keys, prompt order
    # Keeps injected (approximate) KV apart from prompt-computed KV in vLLM's prefix cache:
    # blocks are shared only between requests whose entries were encoded the same way.
    cache_salt: str | None = None
    captures: list[PlacedEntry] = field(default_factory=list)  # spans to store as entries

    @property
    def span_end(self) -> int:
        return self.entries[-1].end if self.entries else 0

    @property
    def num_memory_tokens(self) -> int:
        return self.span_end - self.entries[0].end if self.entries else 0

    def kv_transfer_params(self, fingerprint: str) -> dict[str, Any]:
        """What the connector reads from ``SamplingParams.extra_args["kv_transfer_params"]``.

        Only msgpack-safe values (str, int, lists), as vLLM ships them between processes.
        """
        ours: dict[str, Any] = {
            "v": KV_PARAMS_VERSION,
            "fingerprint": fingerprint,
            "entries": [[e.key, e.start, e.end] for e in self.entries],
        }
        if self.captures:
            ours["capture"] = [[e.key, e.start, e.end] for e in self.captures]
        return {KV_PARAMS_KEY: ours}


def fact_line(text: str, when: date | datetime | None = None, until: date | None = None) -> str:
    """The text a fact occupies in the memory block: ``- 2023-05-08 text\\n``; a fact that
    stopped being true says until when: ``- 2023-05-08 text (until 2025-03)\\n``."""
    body = " ".join(text.split())
    if until is not None:
        body = f"{body} (until {until.strftime('%Y-%m')})"
    if when is None:
        return f"- {body}\n"
    return f"- {when.strftime('%Y-%m-%d')} {body}\n"


def entry_key(kind: str, fingerprint: str, *parts: object) -> str:
    """Content-addressed key of a KV entry: same model + same context + same ids -> same key."""
    digest = hashlib.sha256(repr((kind, fingerprint, *parts)).encode()).hexdigest()[:40]
    return f"{kind}-{digest}"


class ChatLayout:
    """Splits a model's chat template around the memory block, for one system prompt."""

    def __init__(self, tokenizer: Tokenizer, system_prompt: str) -> None:
        self.tokenizer = tokenizer
        self._fact_ids: dict[str, tuple[int, ...]] = {}  # line -> its ids (fact_ids)
        # digest of (question, history) -> the suffix's ids (suffix_ids), least recent first
        self._suffix_ids: dict[bytes, array[int]] = {}
        self._suffix_tokens = 0  # the ids held in _suffix_ids
        self.system_prompt = system_prompt.strip()
        prefix_text, _ = self._split(question="?")
        self.prefix_ids: list[int] = tokenizer.encode(prefix_text, add_special_tokens=False)
        self._check_round_trip()

    def _render(self, memory: str, question: str, history: Sequence[tuple[str, str]] = ()) -> str:
        messages = [{"role": "system", "content": self.system_prompt + MEMORY_HEADER + memory}]
        messages += [{"role": role, "content": text} for role, text in history]
        messages.append({"role": "user", "content": question})
        return render_chat(self.tokenizer, messages)

    def _split(self, question: str, history: Sequence[tuple[str, str]] = ()) -> tuple[str, str]:
        text = self._render(_SENTINEL, question, history)
        if text.count(_SENTINEL) != 1:
            raise TemplateError(
                "the chat template does not render the system message verbatim exactly once;"
                " memory injection needs a template that keeps the system prompt as given"
            )
        prefix, suffix = text.split(_SENTINEL)
        return prefix, suffix

    def _check_round_trip(self) -> None:
        memory = fact_line("probe fact", date(2020, 1, 2))
        question = "probe question"
        prefix, suffix = self._split(question)
        if prefix + memory + suffix != self._render(memory, question):
            raise TemplateError(
                "the chat template changes the memory block's text when rendering;"
                " the prefix/memory/suffix split would not match the real prompt"
            )

    def suffix_ids(
        self,
        question: str,
        history: Sequence[tuple[str, str]] = (),
        fits: int = SUFFIX_IDS_BUDGET // 8,
    ) -> list[int]:
        """End of the system turn, recent turns, the user's question, the assistant header.

        Remembered: a turn asks for the same suffix up to three times (its budget with and
        without history, then the layout), each a chat-template render and a tokenizer call
        (0.22 ms apiece for SmolLM2 on the CPU, a third of preparing a k=50 turn). Only a
        suffix of at most ``fits`` tokens is (the caller's room: a turn refused as too long
        leaves nothing behind), keyed by a digest of its text (not the text), the least
        recently used going first past :data:`SUFFIX_IDS_CACHE` suffixes or
        :data:`SUFFIX_IDS_BUDGET` ids: a client sending long questions cannot make the
        server keep more (issue 35: 11 MB per refused question, up to 2.8 GB, before).
        """
        key = hashlib.blake2b(repr((question, tuple(history))).encode(), digest_size=16).digest()
        ids = self._suffix_ids.pop(key, None)
        if ids is None:
            _, suffix = self._split(question, history)
            ids = array("i", self.tokenizer.encode(suffix, add_special_tokens=False))
            if len(ids) > min(fits, SUFFIX_IDS_BUDGET // 8):
                return ids.tolist()
            self._suffix_tokens += len(ids)
        while self._suffix_ids and (
            len(self._suffix_ids) >= SUFFIX_IDS_CACHE or self._suffix_tokens > SUFFIX_IDS_BUDGET
        ):
            self._suffix_tokens -= len(self._suffix_ids.pop(next(iter(self._suffix_ids))))
        self._suffix_ids[key] = ids  # the most recent last
        return ids.tolist()

    def fact_ids(self, line: str) -> list[int]:
        """Token ids of one fact line, tokenized alone (as stored with its KV). Remembered:
        every turn measures each hit's line (50 tokenizer calls were 62% of preparing a
        k=50 turn)."""
        ids = self._fact_ids.get(line)
        if ids is None:
            if len(self._fact_ids) >= FACT_IDS_CACHE:
                self._fact_ids.clear()
            ids = tuple(self.tokenizer.encode(line, add_special_tokens=False))
            self._fact_ids[line] = ids
        return list(ids)

    def prefix_key(self, fingerprint: str, encoder_version: str) -> str:
        return entry_key("prefix", fingerprint, encoder_version, tuple(self.prefix_ids))

    def compose(
        self,
        prefix_key: str,
        facts: Sequence[tuple[str, Sequence[int]]],
        question: str,
        history: Sequence[tuple[str, str]] = (),
        cache_salt: str | None = None,
    ) -> ComposedPrompt:
        """Lay out prefix + facts (``(entry key, token ids)``, in prompt order) + suffix."""
        prompt_ids = list(self.prefix_ids)
        entries = [PlacedEntry(prefix_key, 0, len(prompt_ids))]
        for key, ids in facts:
            if not ids:
                raise ValueError(f"fact {key} has no tokens")
            start = len(prompt_ids)
            prompt_ids.extend(ids)
            entries.append(PlacedEntry(key, start, len(prompt_ids)))
        prompt_ids.extend(self.suffix_ids(question, history))
        return ComposedPrompt(prompt_ids, entries, [key for key, _ in facts], cache_salt)

    def prompt_text_ids(
        self, fact_lines: Sequence[str], question: str, history: Sequence[tuple[str, str]] = ()
    ) -> list[int]:
        """Prompt injection: the same layout, ids only (the baseline and the fallback)."""
        ids = list(self.prefix_ids)
        for line in fact_lines:
            ids.extend(self.fact_ids(line))
        ids.extend(self.suffix_ids(question, history))
        return ids
