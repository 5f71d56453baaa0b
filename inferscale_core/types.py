"""Plain data shared across the core. Imports nothing from the project."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import date, datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

# How a memory went into a reply (InjectedFact.how; the memory panel, `ask --json`, serve):
INJECTED = "injected"  # its KV, from the store
RECOMPUTED = "recomputed"  # one of the best hits, prefilled after the injected ones
TEXT = "text"  # its KV is not ready (not encoded yet): prefilled likewise
REENCODING = "text (re-encoding)"  # its KV was dropped for the disk budget: prefilled, and
#                                    encoded again in the background
HOWS = (INJECTED, RECOMPUTED, TEXT, REENCODING)


@dataclass(slots=True)
class Turn:
    """One message of a conversation, as imported or typed."""

    speaker: str  # "user", "assistant", or a person's name in imported chats
    text: str
    timestamp: datetime | None = None
    source_id: str | None = None  # id in the source file (e.g. LoCoMo dia_id, ChatGPT node id)


@dataclass(slots=True)
class Conversation:
    """A thread of turns from one source (a live chat or an imported export)."""

    title: str
    turns: list[Turn] = field(default_factory=list)
    source: str = "chat"  # "chat", "chatgpt", "claude", "whatsapp", "jsonl", "markdown", "locomo"
    source_id: str | None = None  # stable id in the source (for idempotent re-import)


@dataclass(slots=True)
class ConversationInfo:
    """A stored conversation as the conversation list shows it (no turns loaded)."""

    id: int
    title: str
    source: str
    created_at: datetime
    turns: int  # how many turns it has
    last_turn_id: int | None  # its newest turn, for "most recent first"


@dataclass(slots=True)
class Fact:
    """One fact of the long-term memory (a row of the fact log's ``facts`` table).

    ``status`` is "active", "superseded" (replaced by a newer fact, or retired) or "forgotten"
    (the user removed it; ``text`` is then "").
    """

    id: int
    profile_id: int
    text: str
    refers_to: date | None  # the day the fact is about, when it has one
    source_turn_ids: list[int]
    status: str
    supersedes: int | None  # id of the fact this one replaced
    created_at: datetime
    # the day it stopped being true, and the later fact that said so (an active fact with an
    # end is true of its time: "I live in Lisbon" until the move to Porto); None: true now
    valid_until: date | None = None
    ended_by: int | None = None


@dataclass(slots=True)
class Hit:
    """One retrieved fact: its similarity to the question and its rank among the hits."""

    fact: Fact
    score: float  # cosine similarity of the fact's and the question's embeddings, in [-1, 1]
    rank: int  # 1 = most similar, whatever order the hits are listed in


@dataclass(slots=True)
class AuditEntry:
    """One change to the fact log: who/what changed which fact, and why."""

    id: int
    profile_id: int
    fact_id: int
    action: str  # "add", "update", "delete", "forget"
    cause: str  # e.g. "extracted from turn 12", "user forgot it in the memory browser"
    old_text: str | None
    new_text: str | None
    at: datetime


@dataclass(frozen=True, slots=True)
class KVQuant:
    """How a compressed entry's codes expand (``inferscale_core.kvstore.quant``): value =
    code * scale (+ minimum, int4), computed in float32, rounded once to ``dtype``."""

    scheme: str  # "fp8" (e4m3, symmetric) | "int4" (asymmetric, two codes a byte)
    dtype: torch.dtype  # what the entry dequantizes to: the dtype it was encoded in
    k_dim: int  # channels of a key head (int4 codes hold half as many bytes)
    v_dim: int
    k_scale: torch.Tensor  # [L, 1, H, D]: per channel, over the entry's tokens
    v_scale: torch.Tensor  # [L, T, H, G]: per token, G groups of a head's channels
    k_zero: torch.Tensor | None = None  # int4: the minimum, shaped as k_scale
    v_zero: torch.Tensor | None = None  # int4: shaped as v_scale
    # int4, the widest key channels in 8 bits: each one's low 4 bits (uint8 [L, T, H, W/2],
    # two a byte as the codes), and each channel's slot among them (uint8 [L, 1, H, D]; 255:
    # a 4-bit channel). Its 4-bit code is then the high half, and its scale 16 steps.
    k_fine: torch.Tensor | None = None
    k_slot: torch.Tensor | None = None

    @property
    def nbytes(self) -> int:
        parts = (self.k_scale, self.v_scale, self.k_zero, self.v_zero, self.k_fine, self.k_slot)
        return sum(t.numel() * t.element_size() for t in parts if t is not None)


@dataclass(slots=True)
class FactKV:
    """The KV of one memory entry (a fact line, or the system prefix), as the model computed it.

    ``token_ids`` are the exact ids the entry occupies in a prompt. ``k`` holds the keys *after*
    rotary embedding at the positions they were computed at, ``origin`` for the first token on:
    placing the entry at position ``p`` rotates them by ``p - origin`` (a rotation by 0 returns
    the engine's own bytes), so the entry can go anywhere.
    """

    key: str  # content-addressed id of the entry in the KV store
    token_ids: list[int]
    k: torch.Tensor  # [layers, tokens, kv_heads, head_dim] post-RoPE at origin..; cache dtype
    v: torch.Tensor  # [layers, tokens, kv_heads, head_dim] same dtype as k
    fingerprint: str  # model fingerprint the tensors belong to
    origin: int = 0  # the position of token 0 when the keys were computed
    # None: k and v are the model's own values. Else they are codes (fp8 [L, T, H, D], int4
    # uint8 [L, T, H, D/2]) and this holds their scales (inferscale_core.kvstore.quant).
    quant: KVQuant | None = None

    def __post_init__(self) -> None:
        if self.k.shape[:3] != self.v.shape[:3]:
            raise ValueError(f"k {tuple(self.k.shape)} and v {tuple(self.v.shape)} disagree")
        if self.k.dim() != 4 or self.k.shape[1] != len(self.token_ids):
            raise ValueError(
                f"k must be [layers, tokens, kv_heads, head_dim] with tokens={len(self.token_ids)},"
                f" got {tuple(self.k.shape)}"
            )

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def nbytes(self) -> int:
        """Bytes the entry takes: K and V (codes, when compressed) and their scales."""
        n = self.k.numel() * self.k.element_size() + self.v.numel() * self.v.element_size()
        return n if self.quant is None else n + self.quant.nbytes


@dataclass(slots=True)
class GenerationResult:
    """One engine request: what came back, how fast, and what memory it used."""

    request_id: str
    prompt_tokens: int = 0
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[dict[int, float]] = field(default_factory=list)  # per generated token
    ttft_s: float | None = None  # submission -> first streamed token
    total_s: float | None = None
    finish_reason: str | None = None
    cached_tokens: int = 0  # prompt tokens not prefilled (prefix cache + injected)
    prefix_cached_tokens: int = 0  # of those, found in vLLM's own prefix cache
    injected_tokens: int = 0  # of those, written by the connector from the KV store
    injected_entries: list[str] = field(default_factory=list)  # entry keys of the request
    entry_tiers: dict[str, str] = field(default_factory=dict)  # entry key -> tier it came from
    refused: str | None = None  # why the connector did not inject, if it did not
    captured: list[str] = field(default_factory=list)  # entry keys an encoding request captured

    @property
    def computed_tokens(self) -> int:
        """Prompt tokens the engine actually prefilled."""
        return self.prompt_tokens - self.cached_tokens


@dataclass(frozen=True, slots=True)
class ReplyMemory:
    """One memory a stored reply used (a row of the fact log's ``reply_memories`` table)."""

    fact_id: int
    text: str  # the fact's text as it went into the prompt; "" once the fact is forgotten
    refers_to: str | None  # YYYY-MM-DD, the day the fact is about, when it has one
    score: float  # the retriever's similarity
    how: str  # "injected" (KV from the store) or "text" (prefilled as prompt text)
    tier: str | None = None  # which store tier served its KV, when injected
    forgotten: bool = False  # the fact was forgotten since: its text is gone


@dataclass(frozen=True, slots=True)
class ReplyDetails:
    """What one assistant turn used and how it went (the fact log's ``reply_details``).

    The figures are None when the engine returned nothing for the reply.
    """

    mode: str  # "inject" (KV injection) or "prompt" (facts as prompt text)
    k: int  # facts asked of the retriever
    memories: tuple[ReplyMemory, ...] = ()  # in the order they went into the prompt
    notes: tuple[str, ...] = ()  # what the user was told about the reply (trimmed, stopped)
    ttft_s: float | None = None
    prompt_tokens: int | None = None
    injected_tokens: int | None = None
    computed_tokens: int | None = None  # prefilled by the engine
    prefix_cached_tokens: int | None = None
    refused: str | None = None  # why the connector did not inject, if it did not

    @classmethod
    def of(
        cls,
        result: GenerationResult | None,
        mode: str,
        k: int,
        memories: Iterable[ReplyMemory],
        notes: Iterable[str] = (),
    ) -> ReplyDetails:
        """The details of a reply whose engine request ended as ``result`` (None: nothing)."""
        figures = {}
        if result is not None:
            figures = {
                "ttft_s": result.ttft_s,
                "prompt_tokens": result.prompt_tokens,
                "injected_tokens": result.injected_tokens,
                "computed_tokens": result.computed_tokens,
                "prefix_cached_tokens": result.prefix_cached_tokens,
                "refused": result.refused,
            }
        return cls(mode, k, tuple(memories), tuple(notes), **figures)
