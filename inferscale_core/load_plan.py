"""Scheduler-side decision for one request: which stored KV to load, where, or refuse.

Pure logic, no vLLM: the connector's scheduler side calls :func:`plan_load` with what vLLM
tells it and turns the answer into a number of external tokens. Anything that cannot be served
exactly as planned is refused (0 external tokens, the engine prefills it): we never rely on
vLLM's load-failure recovery.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from inferscale_core.composer import KV_PARAMS_KEY, KV_PARAMS_VERSION
from inferscale_core.kvstore import EntryHeader, EntryMissingError


class Refused(Exception):
    """The request's KV cannot be injected exactly; ``str(self)`` says why."""


class Piece(NamedTuple):
    """Tokens ``[src_start, src_end)`` of entry ``key``, placed from position ``dst_start``.
    (A named tuple: ~50 are made for every request, 5x faster than a frozen dataclass.)"""

    key: str
    src_start: int
    src_end: int
    dst_start: int


@dataclass(slots=True)
class LoadPlan:
    """Load prompt positions ``[start, end)`` of a request from the store."""

    start: int
    end: int
    pieces: list[Piece]
    entry_keys: list[str]

    @property
    def num_tokens(self) -> int:
        return self.end - self.start

    def truncated(self, num_tokens: int) -> LoadPlan:
        """The same plan limited to its first ``num_tokens`` positions."""
        end = self.start + num_tokens
        pieces = [
            Piece(
                p.key,
                p.src_start,
                p.src_start + min(end, p.dst_start + p.src_end - p.src_start) - p.dst_start,
                p.dst_start,
            )
            for p in self.pieces
            if p.dst_start < end
        ]
        return LoadPlan(self.start, end, pieces, self.entry_keys)


def request_entries(params: Mapping[str, Any] | None) -> list[tuple[str, int, int]] | None:
    """The ``(key, start, end)`` list a composed request carries, or None if it has none."""
    ours = (params or {}).get(KV_PARAMS_KEY)
    if ours is None:
        return None
    if not isinstance(ours, Mapping) or ours.get("v") != KV_PARAMS_VERSION:
        raise Refused(f"unsupported kv_transfer_params version: {ours!r:.80}")
    try:
        return [(str(k), int(s), int(e)) for k, s, e in ours["entries"]]
    except (KeyError, TypeError, ValueError) as exc:
        raise Refused(f"malformed entries in kv_transfer_params: {exc}") from exc


def plan_load(
    params: Mapping[str, Any] | None,
    prompt_ids: Sequence[int],
    num_tokens: int,
    num_computed: int,
    headers: Callable[[Sequence[str]], Sequence[EntryHeader]],
    fingerprint: str,
    prompt_logprobs: bool = False,
) -> LoadPlan | None:
    """Decide the load for a request; None if it asks for none, :class:`Refused` if unservable.

    The load covers ``[num_computed, min(span_end, num_tokens - 1))``: vLLM's prefix cache may
    already hold the leading blocks, and the scheduler needs at least one token to compute.
    ``headers`` gives the entries' headers in order (:meth:`KVStore.header_reader`).
    """
    entries = request_entries(params)
    if entries is None:
        return None
    ours = params[KV_PARAMS_KEY]  # type: ignore[index]
    if ours.get("fingerprint") != fingerprint:
        raise Refused(
            f"model fingerprint {ours.get('fingerprint')!r} does not match the engine's"
            f" {fingerprint!r}"
        )
    if prompt_logprobs:
        raise Refused("prompt logprobs were requested; they need the full prefill")
    expected_start = 0
    for key, start, end in entries:
        if start != expected_start or end <= start:
            raise Refused(f"entry {key} at [{start}, {end}) does not continue at {expected_start}")
        expected_start = end
    span_end = expected_start
    if span_end > len(prompt_ids):
        raise Refused(f"span_end {span_end} is past the prompt ({len(prompt_ids)} tokens)")
    end = min(span_end, num_tokens - 1)
    first = max(num_computed, 0)
    expected_ids: list[int] = []
    pieces = []
    try:
        found = headers([key for key, _, _ in entries])
    except EntryMissingError as exc:
        raise Refused(f"unknown entry {exc.args[0]}") from None
    for (key, s, e), entry in zip(entries, found, strict=True):  # ~50 for every request
        if entry.fingerprint != fingerprint:
            raise Refused(f"entry {key} was encoded by another model ({entry.fingerprint})")
        if len(entry.token_ids) != e - s:
            raise Refused(f"prompt tokens [{s}, {e}) do not match entry {key}")
        expected_ids += entry.token_ids
        lo = s if s > first else first
        hi = e if e < end else end
        if lo < hi:
            pieces.append(Piece(key, lo - s, hi - s, lo))
    if list(prompt_ids[:span_end]) != expected_ids:  # one comparison for the whole span
        for key, s, e in entries:
            if list(prompt_ids[s:e]) != expected_ids[s:e]:
                raise Refused(f"prompt tokens [{s}, {e}) do not match entry {key}")
    return LoadPlan(num_computed, max(num_computed, end), pieces, [k for k, _, _ in entries])


def slot_mapping(block_ids: Sequence[int], block_size: int, start: int, end: int) -> np.ndarray:
    """Cache slot of each position in ``[start, end)``: ``ids[p // bs] * bs + p % bs``.
    int64 [end - start] (vectorised: it runs for every injected token of every request)."""
    positions = np.arange(start, end, dtype=np.int64)  # [tokens]
    blocks = np.asarray(block_ids, dtype=np.int64)
    return blocks[positions // block_size] * block_size + positions % block_size
