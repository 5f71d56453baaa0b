"""Scheduler-side decision for one request: which stored KV to load, where, or refuse.

Pure logic, no vLLM: the connector's scheduler side calls :func:`plan_load` with what vLLM
tells it and turns the answer into a number of external tokens. Anything that cannot be served
exactly as planned is refused (0 external tokens, the engine prefills it): we never rely on
vLLM's load-failure recovery.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from itertools import chain, repeat
from operator import attrgetter, sub
from typing import Any, NamedTuple

import numpy as np

from inferscale_core.composer import KV_PARAMS_KEY, KV_PARAMS_VERSION
from inferscale_core.kvstore import EntryHeader, EntryMissingError


class Refused(Exception):
    """The request's KV cannot be injected exactly; ``str(self)`` says why."""


class Piece(NamedTuple):
    """Tokens ``[src_start, src_end)`` of entry ``key``, placed from position ``dst_start``;
    their stored keys are rotated by ``shift`` positions (the entry's place in this prompt
    minus the position it was computed at). (A named tuple: ~50 are made for every request,
    5x faster than a frozen dataclass.)"""

    key: str
    src_start: int
    src_end: int
    dst_start: int
    shift: int = 0


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
                p.shift,
            )
            for p in self.pieces
            if p.dst_start < end
        ]
        return LoadPlan(self.start, end, pieces, self.entry_keys)


def _entry_columns(
    params: Mapping[str, Any] | None,
) -> tuple[list[str], list[int], list[int]] | None:
    """Keys, starts and ends of the entries a composed request carries, or None if it has
    none. Column-wise with ``map``: this runs for every request, ~50 entries each."""
    ours = (params or {}).get(KV_PARAMS_KEY)
    if ours is None:
        return None
    if not isinstance(ours, Mapping) or ours.get("v") != KV_PARAMS_VERSION:
        raise Refused(f"unsupported kv_transfer_params version: {ours!r:.80}")
    try:
        entries = ours["entries"]
        if set(map(len, entries)) - {3}:
            raise ValueError("each entry is [key, start, end]")
        keys, starts, ends = zip(*entries, strict=True) if entries else ((), (), ())
        return list(map(str, keys)), list(map(int, starts)), list(map(int, ends))
    except (KeyError, TypeError, ValueError) as exc:
        raise Refused(f"malformed entries in kv_transfer_params: {exc}") from exc


def request_captures(
    params: Mapping[str, Any] | None, num_prompt_tokens: int, fingerprint: str
) -> list[tuple[str, int, int]]:
    """The ``(key, start, end)`` spans an encoding request asks to capture (none: ``[]``).

    Raises :class:`Refused` for another model's request, a malformed list, or a span outside
    the prompt; the request is then served without capturing anything."""
    ours = (params or {}).get(KV_PARAMS_KEY)
    if not isinstance(ours, Mapping) or "capture" not in ours:
        return []
    if ours.get("v") != KV_PARAMS_VERSION:
        raise Refused(f"unsupported kv_transfer_params version: {ours!r:.80}")
    if ours.get("fingerprint") != fingerprint:
        raise Refused(
            f"model fingerprint {ours.get('fingerprint')!r} does not match the engine's"
            f" {fingerprint!r}: nothing is captured"
        )
    try:
        spans = [(str(key), int(start), int(end)) for key, start, end in ours["capture"]]
    except (TypeError, ValueError) as exc:
        raise Refused(f"malformed capture in kv_transfer_params: {exc}") from exc
    for key, start, end in spans:
        if not key or "/" in key or key[0] == "." or not 0 <= start < end <= num_prompt_tokens:
            raise Refused(f"capture {key!r} at [{start}, {end}) is not a span of the prompt")
    return spans


def request_entries(params: Mapping[str, Any] | None) -> list[tuple[str, int, int]] | None:
    """The ``(key, start, end)`` list a composed request carries, or None if it has none."""
    columns = _entry_columns(params)
    return None if columns is None else list(zip(*columns, strict=True))


# Column helpers that run in C: a Piece from one (key, src_start, src_end, dst_start, shift)
# tuple without the named tuple's Python-level __new__, and three header fields.
_new_piece = partial(tuple.__new__, Piece)
_TOKEN_IDS = attrgetter("token_ids")
_FINGERPRINT = attrgetter("fingerprint")
_ORIGIN = attrgetter("origin")


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
    ``headers`` gives the entries' headers in order (:meth:`KVStore.header_reader`). The
    checks run over whole columns (``map``, list comparisons); a failed one looks for the
    entry to name.
    """
    columns = _entry_columns(params)
    if columns is None:
        return None
    ours = params[KV_PARAMS_KEY]  # type: ignore[index]
    if ours.get("fingerprint") != fingerprint:
        raise Refused(
            f"model fingerprint {ours.get('fingerprint')!r} does not match the engine's"
            f" {fingerprint!r}"
        )
    if prompt_logprobs:
        raise Refused("prompt logprobs were requested; they need the full prefill")
    keys, starts, ends = columns
    lengths = list(map(sub, ends, starts))
    if keys and (starts[0] != 0 or starts[1:] != ends[:-1] or min(lengths) <= 0):
        expected_start = 0
        for key, start, end in zip(keys, starts, ends, strict=True):
            if start != expected_start or end <= start:
                raise Refused(
                    f"entry {key} at [{start}, {end}) does not continue at {expected_start}"
                )
            expected_start = end
    span_end = ends[-1] if keys else 0
    if span_end > len(prompt_ids):
        raise Refused(f"span_end {span_end} is past the prompt ({len(prompt_ids)} tokens)")
    try:
        found = headers(keys)
    except EntryMissingError as exc:
        raise Refused(f"unknown entry {exc.args[0]}") from None
    token_ids = list(map(_TOKEN_IDS, found))
    if set(map(_FINGERPRINT, found)) - {fingerprint} or list(map(len, token_ids)) != lengths:
        for key, start, end, entry in zip(keys, starts, ends, found, strict=True):
            if entry.fingerprint != fingerprint:
                raise Refused(f"entry {key} was encoded by another model ({entry.fingerprint})")
            if len(entry.token_ids) != end - start:
                raise Refused(f"prompt tokens [{start}, {end}) do not match entry {key}")
    expected_ids = list(chain.from_iterable(token_ids))
    if not isinstance(prompt_ids, list):
        prompt_ids = list(prompt_ids)
    if prompt_ids[:span_end] != expected_ids:  # one comparison for the whole span
        for key, start, end in zip(keys, starts, ends, strict=True):
            if prompt_ids[start:end] != expected_ids[start:end]:
                raise Refused(f"prompt tokens [{start}, {end}) do not match entry {key}")
    end = min(span_end, num_tokens - 1)
    first = max(num_computed, 0)
    lo, hi = bisect_right(ends, first), bisect_left(starts, end)  # entries reaching into it
    if first >= end:
        hi = lo  # nothing to load
    shifts = list(map(sub, starts[lo:hi], map(_ORIGIN, found[lo:hi])))  # place - origin
    pieces: list[Piece] = list(
        map(_new_piece, zip(keys[lo:hi], repeat(0), lengths[lo:hi], starts[lo:hi], shifts))
    )
    if pieces and starts[lo] < first:  # the first one starts before the load: cut its head
        key, _, length, start, shift = pieces[0]
        pieces[0] = Piece(key, first - start, length, first, shift)
    if pieces and ends[hi - 1] > end:  # the last one ends after it: cut its tail
        key, src_start, _, dst_start, shift = pieces[-1]
        pieces[-1] = Piece(key, src_start, end - starts[hi - 1], dst_start, shift)
    return LoadPlan(num_computed, max(num_computed, end), pieces, keys)


def slot_mapping(block_ids: Sequence[int], block_size: int, start: int, end: int) -> np.ndarray:
    """Cache slot of each position in ``[start, end)``: ``ids[p // bs] * bs + p % bs``.
    int64 [end - start] (vectorised: it runs for every injected token of every request)."""
    positions = np.arange(start, end, dtype=np.int64)  # [tokens]
    blocks = np.asarray(block_ids, dtype=np.int64)
    return blocks[positions // block_size] * block_size + positions % block_size
