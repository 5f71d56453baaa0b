"""Every prompt fits: a turn's share of the model's context.

A request is ``prefix + memories + suffix(history, question)`` (:mod:`.composer`) and must
leave room for the reply. The history is first held to its own token budget (a pasted page
two turns ago must not crowd out everything else); then, while the prompt is over the
context, the oldest turns go, and after them the least relevant memories. A turn that does
not fit by itself is refused (:class:`~.composer.PromptTooLong`), before it is logged, so the
conversation goes on.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass

from inferscale_core.composer import ChatLayout, EmptyTurn, PromptTooLong

History = Sequence[tuple[str, str]]  # (role, text), oldest first
_LIBC = ctypes.CDLL(None)  # this process's C library (for malloc_trim, where it is glibc)


@dataclass(frozen=True, slots=True)
class Fit:
    """What of a turn's material goes into its prompt."""

    history: list[tuple[str, str]]  # the turns kept, oldest first
    memories: int  # the first this many memories (most relevant first) are kept
    dropped_turns: int  # of the history offered
    dropped_memories: int
    prompt_tokens: int  # of the prompt as fitted

    @property
    def trimmed(self) -> bool:
        return bool(self.dropped_turns or self.dropped_memories)

    def describe(self) -> str:
        """``"left out to fit the context: 2 older turns, 12 memories"``, or ``""``."""
        parts = []
        if self.dropped_turns:
            parts.append(f"{self.dropped_turns} older turn{'s' * (self.dropped_turns != 1)}")
        if self.dropped_memories:
            parts.append(
                f"{self.dropped_memories} memor{'ies' if self.dropped_memories != 1 else 'y'}"
            )
        return f"left out to fit the context: {', '.join(parts)}" if parts else ""


def fit_turn(
    layout: ChatLayout,
    question: str,
    history: History,
    memory_tokens: Sequence[int],
    *,
    context: int,
    reply_tokens: int,
    history_tokens: int | None = None,
) -> Fit:
    """Fit ``question``, ``history`` and memories of ``memory_tokens`` tokens each (most
    relevant first) into ``context - reply_tokens`` tokens; ``history_tokens`` bounds the
    history's own text. Raises :class:`EmptyTurn` or :class:`PromptTooLong`."""
    if not question.strip():
        raise EmptyTurn()
    limit = context - reply_tokens
    prefix = len(layout.prefix_ids)
    # a suffix over the room is not remembered (a refused turn leaves nothing in the layout)
    alone = prefix + len(layout.suffix_ids(question, fits=limit - prefix))
    if alone > limit:
        own = len(layout.tokenizer.encode(question, add_special_tokens=False))
        release_freed_memory()
        raise PromptTooLong(own, max(0, limit - (alone - own)))
    kept = _within(layout, list(history), history_tokens)
    memories = sum(memory_tokens)
    suffix = len(layout.suffix_ids(question, kept, fits=limit - prefix))
    while kept and prefix + memories + suffix > limit:
        kept = kept[1:]  # the oldest turn first
        suffix = len(layout.suffix_ids(question, kept, fits=limit - prefix))
    room, used, count = limit - prefix - suffix, 0, 0
    for tokens in memory_tokens:
        if used + tokens > room:
            break
        used, count = used + tokens, count + 1
    return Fit(
        kept,
        count,
        len(history) - len(kept),
        len(memory_tokens) - count,
        prefix + used + suffix,
    )


def release_freed_memory() -> None:
    """Give the C heap's free pages back to the system (glibc's ``malloc_trim``; a no-op
    elsewhere). Called when a turn is refused as too long: tokenizing a question of ~1M
    tokens peaks at ~200 MB (the Rust tokenizer's buffers, the ids), freed at once, but glibc
    keeps it in the thread's arena for good, another arena each time a request lands on
    another thread (20 refused 1 MiB questions left a server +127 MiB; trimmed, +0)."""
    trim = getattr(_LIBC, "malloc_trim", None)
    if trim is not None:
        trim(0)


def _within(layout: ChatLayout, history: list[tuple[str, str]], budget: int | None) -> list:
    """The most recent turns whose texts come to at most ``budget`` tokens together."""
    if budget is None:
        return history
    kept: list[tuple[str, str]] = []
    total = 0
    for role, text in reversed(history):
        total += len(layout.tokenizer.encode(text, add_special_tokens=False))
        if total > budget:
            break
        kept.append((role, text))
    return kept[::-1]
