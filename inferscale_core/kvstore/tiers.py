"""The memory tiers of the KV store: a device pool and host RAM, each an LRU with a byte budget.

Pure bookkeeping and copies, no files and no locks: :class:`inferscale_core.kvstore.KVStore`
owns the lock and the disk tier, and calls these with it held.

The device tier is ONE preallocated byte buffer carved into per-entry regions by a first-fit
extent allocator. It takes its device as a parameter, so its logic runs on CPU in the tests
(``device="cpu"``); on CUDA its copies go on a side stream and readers wait on an event.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import chain
from operator import attrgetter
from typing import Any

import numpy as np
import torch

from inferscale_core.kvstore.quant import entry_tensors
from inferscale_core.kvstore.region import entry_layout, pack, region_of, views
from inferscale_core.types import FactKV


@dataclass(frozen=True, slots=True)
class TierStats:
    entries: int
    bytes: int  # device: reserved regions; host: tensor bytes; disk: file sizes
    budget: int | None  # None: unbounded (disk)
    hits: int  # get() calls served by this tier


@dataclass(frozen=True, slots=True)
class StoreStats:
    tiers: dict[str, TierStats]  # "device" (when present), "host", "disk"; fastest first
    misses: int  # get() calls for an entry that does not exist
    tokens: int  # tokens of all entries on disk
    bytes_per_token: float  # K+V bytes one token takes (layers * 2 * kv_heads * head_dim * dtype)
    mean_bytes_per_fact: float  # mean K+V bytes of an entry


@dataclass(slots=True)
class PrefetchReport:
    tier: str  # the fastest tier, where the entries were moved
    moved: dict[str, int] = field(default_factory=dict)  # bytes copied in, by source tier
    already: int = 0  # entries that were in the fastest tier already
    missing: list[str] = field(default_factory=list)  # no such entry
    skipped: list[str] = field(default_factory=list)  # could not fit the fastest tier


def to_host(entry: FactKV, pin: bool, copy: bool = False) -> FactKV:
    """``entry`` in host RAM as one region laid out as the pool's
    (:mod:`~inferscale_core.kvstore.region`): pinned if ``pin`` (that needs CUDA: the caller
    guards), a fresh copy if ``copy``. An entry that already is such a region in host RAM
    (pinned, if ``pin``) is returned as it is."""
    if not copy:
        source = region_of(entry)
        if source is not None and source.device.type == "cpu" and (not pin or source.is_pinned()):
            return entry
    return pack(entry, pin)


class HostTier:
    """A byte-budgeted LRU of entries in host RAM, each one region (:func:`to_host`), so that
    it crosses to the GPU pool as one copy. Eviction drops (the disk copy is durable)."""

    def __init__(self, budget: int, pin: bool) -> None:
        self.budget = budget
        self.pin = pin
        self.used = 0  # sum of the held entries' nbytes
        self._entries: OrderedDict[str, FactKV] = OrderedDict()  # LRU first

    def __contains__(self, key: str) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def keys(self) -> list[str]:
        """Held keys, least recently used first."""
        return list(self._entries)

    def get(self, key: str) -> FactKV | None:
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
        return entry

    def put(self, entry: FactKV) -> list[str]:
        """Hold ``entry`` (already in host RAM, see :func:`to_host`); returns the evicted keys."""
        self.pop(entry.key)
        if entry.nbytes > self.budget:
            return []  # bigger than the tier: served from the next one
        self._entries[entry.key] = entry
        self.used += entry.nbytes
        evicted = []
        while self.used > self.budget:
            key, old = self._entries.popitem(last=False)
            self.used -= old.nbytes
            evicted.append(key)
        return evicted

    def pop(self, key: str) -> FactKV | None:
        old = self._entries.pop(key, None)
        if old is not None:
            self.used -= old.nbytes
        return old


class ExtentAllocator:
    """First-fit allocation of aligned byte ranges in ``[0, capacity)``; frees coalesce."""

    def __init__(self, capacity: int, align: int = 256) -> None:
        self.align = align
        self.capacity = capacity - capacity % align
        self._starts: list[int] = [0] if self.capacity else []  # free extents, sorted
        self._sizes: list[int] = [self.capacity] if self.capacity else []

    def round(self, nbytes: int) -> int:
        return max(self.align, -(-nbytes // self.align) * self.align)

    @property
    def free_bytes(self) -> int:
        return sum(self._sizes)

    def alloc(self, nbytes: int) -> int | None:
        """Offset of a free region of ``round(nbytes)`` bytes, or None if none is big enough."""
        size = self.round(nbytes)
        for i, free in enumerate(self._sizes):
            if free >= size:
                offset = self._starts[i]
                if free == size:
                    del self._starts[i], self._sizes[i]
                else:
                    self._starts[i] += size
                    self._sizes[i] -= size
                return offset
        return None

    def free(self, offset: int, nbytes: int) -> None:
        size = self.round(nbytes)
        i = bisect.bisect_left(self._starts, offset)
        prev_end = self._starts[i - 1] + self._sizes[i - 1] if i > 0 else None
        next_start = self._starts[i] if i < len(self._starts) else None
        if (prev_end is not None and prev_end > offset) or (
            next_start is not None and offset + size > next_start
        ):
            raise ValueError(f"double free or overlap at [{offset}, {offset + size})")
        if prev_end == offset:  # merge with the extent before
            i -= 1
            self._sizes[i] += size
        else:
            self._starts.insert(i, offset)
            self._sizes.insert(i, size)
        nxt = i + 1
        if nxt < len(self._starts) and self._starts[i] + self._sizes[i] == self._starts[nxt]:
            self._sizes[i] += self._sizes[nxt]
            del self._starts[nxt], self._sizes[nxt]


# What a kernel needs to know to read an entry in place: (dtype, layers, kv_heads, head_dim).
EntryLayout = tuple[torch.dtype, int, int, int]
# ... and a compressed one: (scheme, code dtype, scale dtype, layers, kv_heads, head_dim,
# value scale groups per head, key channels in 8 bits per head (int4; else 0)).
PackedLayout = tuple[str, torch.dtype, torch.dtype, int, int, int, int, int]


@dataclass(frozen=True, slots=True)
class MixedSpans:
    """Where a request's entries sit in the pool when some are compressed (one scheme) and
    the others plain (one layout): what :mod:`~inferscale_core.vllm_plugin.fused_compressed`'s
    kernel reads in place, described by numbers only."""

    pool: torch.Tensor  # uint8 [bytes]
    rows: np.ndarray  # int64 [keys, 10]: K, V byte offsets, tokens, compressed (1) or not (0),
    #                   then byte offsets of the key scale, key minimum, value scale, value
    #                   minimum (compressed rows: the minimums repeat the scales under fp8;
    #                   plain rows: 0), of the 8-bit key channels' low bits and slots (-1: none)
    plain: EntryLayout | None  # the plain entries' layout (None: there are none)
    packed: PackedLayout  # the compressed entries' layout


@dataclass(slots=True)
class _Resident:
    entry: FactKV  # k, v are views into the pool
    offset: int  # byte offset of K in the pool
    size: int  # bytes reserved, aligned
    v_offset: int  # byte offset of V in the pool
    tokens: int  # kept as a number: spans() reads it for every entry of every request
    layout: EntryLayout | None  # None: compressed, or K and V differ in shape or dtype
    packed: PackedLayout | None  # a compressed entry's layout (else None)
    mixed_row: tuple[int, ...]  # its row of MixedSpans.rows
    ready: Any = None  # torch.cuda.Event while the copy into the pool may be in flight


Demote = Callable[[str, FactKV], None]
_LAYOUT = attrgetter("layout")
_FINGERPRINT = attrgetter("entry.fingerprint")
_SPAN_ROW = attrgetter("offset", "v_offset", "tokens")
_PACKED = attrgetter("packed")
_MIXED_ROW = attrgetter("mixed_row")


def _resident(
    resident: FactKV, entry: FactKV, offset: int, size: int, offsets: dict[str, int]
) -> _Resident:
    """The record of ``entry`` placed at ``offset`` (``resident``: its views in the pool;
    ``offsets``: its tensors' byte offsets in the region)."""
    v_offset = offset + offsets["v"]
    layers, tokens, heads, dim = entry.k.shape
    layout: EntryLayout | None = (entry.k.dtype, layers, heads, dim)
    packed: PackedLayout | None = None
    row: tuple[int, ...] = (offset, v_offset, tokens, 0, 0, 0, 0, 0, -1, -1)
    if (quant := entry.quant) is not None:
        layout = None  # read in place by the mixed kernel (mixed_spans) only
        if quant.k_dim == quant.v_dim:
            ks, vs = offset + offsets["k_scale"], offset + offsets["v_scale"]
            kz = offset + offsets["k_zero"] if "k_zero" in offsets else ks
            vz = offset + offsets["v_zero"] if "v_zero" in offsets else vs
            kf = offset + offsets["k_fine"] if "k_fine" in offsets else -1
            kl = offset + offsets["k_slot"] if "k_slot" in offsets else -1
            groups = quant.v_scale.shape[-1]
            scale_dtype = quant.k_scale.dtype
            wide = 0 if quant.k_fine is None else 2 * quant.k_fine.shape[-1]
            packed = (quant.scheme, entry.k.dtype, scale_dtype, layers, heads, quant.k_dim,
                      groups, wide)  # fmt: skip
            row = (offset, v_offset, tokens, 1, ks, kz, vs, vz, kf, kl)
    elif (entry.v.shape, entry.v.dtype) != (entry.k.shape, entry.k.dtype):
        layout = None  # not readable in place as one kind of entry; views still are
    return _Resident(resident, offset, size, v_offset, tokens, layout, packed, row)


class DeviceTier:
    """Entries in one preallocated ``budget``-byte buffer on ``device``, LRU-evicted.

    The buffer is allocated on first placement, so a process that only reads headers (vLLM's
    scheduler) never holds device memory. Each entry gets one region: K then V, each aligned.
    Returned tensors are views into the pool: valid until the entry leaves the tier (eviction
    in a later :meth:`place`, or removal). Readers on the current stream are safe, because
    copies into the pool first wait for the current stream.
    """

    def __init__(self, budget: int, device: torch.device | str, align: int = 256) -> None:
        self.device = torch.device(device)
        self.allocator = ExtentAllocator(budget, align)
        self.budget = self.allocator.capacity
        self.used = 0  # bytes reserved by resident entries
        self._pool: torch.Tensor | None = None  # [budget] uint8
        self._stream: Any = None  # torch.cuda.Stream for copies in, on CUDA
        self._entries: OrderedDict[str, _Resident] = OrderedDict()  # LRU first
        self._copying: set[str] = set()  # keys whose copy in may still be running

    def __contains__(self, key: str) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def keys(self) -> list[str]:
        """Held keys, least recently used first."""
        return list(self._entries)

    def holds_all(self, keys: Sequence[str]) -> bool:
        """Whether every key is resident (in C: the scheduler asks for every request)."""
        return all(map(self._entries.__contains__, keys))

    def region_size(self, entry: FactKV) -> int:
        return entry_layout(entry, self.allocator.align)[1]

    def get(self, key: str) -> FactKV | None:
        """The entry's views, ordered after its copy in on the current stream."""
        res = self._entries.get(key)
        if res is None:
            return None
        self._use(key, res)
        return res.entry

    def _use(self, key: str, res: _Resident) -> None:
        """Mark ``key`` recently used, and order its copy in before the current stream's next
        work."""
        self._entries.move_to_end(key)
        if res.ready is not None:
            self._order_copy(key, res)

    def _order_copy(self, key: str, res: _Resident) -> None:
        """Make the current stream's next work wait for ``key``'s copy in, unless it is done."""
        if res.ready.query():
            res.ready = None
            self._copying.discard(key)
        else:
            torch.cuda.current_stream(self.device).wait_event(res.ready)

    def spans(
        self, keys: Sequence[str], fingerprint: str | None = None
    ) -> tuple[torch.Tensor, np.ndarray, EntryLayout] | None:
        """Where the entries sit in the pool, for a kernel that reads them in place: the pool,
        int64 [len(keys), 3] rows ``(K byte offset, V byte offset, tokens)`` and the layout
        they share. Marks them recently used and orders their copies in before the current
        stream's next work. None unless every key is resident with one layout (and
        ``fingerprint``, if given): then read the views with :meth:`get`.

        This runs for every request, ~50 keys, inside vLLM's step: every pass over the keys is
        a C-level ``map`` (a Python loop over them cost ~2 us a key there)."""
        entries = self._entries
        found = list(map(entries.get, keys))
        if self._pool is None or not found or not all(found):  # a _Resident is always true
            return None
        layout = found[0].layout
        if layout is None or list(map(_LAYOUT, found)).count(layout) != len(found):
            return None
        if fingerprint is not None and (
            list(map(_FINGERPRINT, found)).count(fingerprint) != len(found)
        ):
            return None
        self._used(keys)
        rows = np.fromiter(chain.from_iterable(map(_SPAN_ROW, found)), np.int64, 3 * len(found))
        return self._pool, rows.reshape(len(found), 3), layout

    def mixed_spans(self, keys: Sequence[str], fingerprint: str | None = None) -> MixedSpans | None:
        """:meth:`spans` for a request with compressed entries: None unless every key is
        resident (with ``fingerprint``, if given), the compressed ones share one
        :data:`PackedLayout`, the plain ones one layout of the same shape, and at least one is
        compressed. C-level passes over the keys, as in :meth:`spans`."""
        entries = self._entries
        found = list(map(entries.get, keys))
        if self._pool is None or not found or not all(found):
            return None
        packs = list(map(_PACKED, found))  # None for the plain ones
        plain = packs.count(None)
        packed = next(filter(None, packs), None)
        if packed is None or packs.count(packed) != len(packs) - plain:
            return None  # none compressed, or compressed in two layouts
        layouts = list(map(_LAYOUT, found))  # None for the compressed ones
        layout = next(filter(None, layouts), None)
        if plain and (layout is None or layouts.count(layout) != plain):
            return None  # plain entries of two layouts, or one not readable in place
        if layout is not None and layout[1:] != packed[3:6]:  # layers, heads, head_dim
            return None
        if fingerprint is not None and (
            list(map(_FINGERPRINT, found)).count(fingerprint) != len(found)
        ):
            return None
        self._used(keys)
        rows = np.fromiter(chain.from_iterable(map(_MIXED_ROW, found)), np.int64, 10 * len(found))
        return MixedSpans(self._pool, rows.reshape(len(found), 10), layout, packed)

    def _used(self, keys: Sequence[str]) -> None:
        """Mark resident ``keys`` most recently used, in order, and order their copies in
        before the current stream's next work."""
        entries = self._entries
        deque(map(entries.move_to_end, keys), maxlen=0)
        if self._copying:
            for key in self._copying.intersection(keys):
                self._order_copy(key, entries[key])

    def touch(self, key: str) -> None:
        self._entries.move_to_end(key)

    def place(self, entry: FactKV, keep: set[str], demote: Demote) -> bool:
        """Copy ``entry`` in, evicting least recently used entries not in ``keep``.

        Each victim goes to ``demote(key, views)`` before its region is reused. False if the
        entry cannot fit (bigger than the tier, or the tier is full of ``keep``).
        """
        return self.place_many([entry], keep, demote)[0]

    def place_many(self, entries: Sequence[FactKV], keep: set[str], demote: Demote) -> list[bool]:
        """:meth:`place` for each of ``entries`` in turn (one placed is kept while the next are
        placed), their copies issued together: on CUDA one wait for the current
        stream, one switch to the side stream and one event for all, not one each (a prefetch
        of 50 entries from host RAM is CPU time on the request's path)."""
        align = self.allocator.align
        keep = set(keep)  # the caller's set stays as it was
        kept = sum(self._entries[k].size for k in keep if k in self._entries)
        copies: list[tuple[torch.Tensor, torch.Tensor]] = []
        placed_keys: list[str] = []
        done: list[bool] = []
        for entry in entries:
            placed = entry_layout(entry, align)  # offsets in the region, its size
            size = placed[1]
            if (old := self._entries.get(entry.key)) is not None:
                kept -= old.size if entry.key in keep else 0
                self.remove(entry.key)
            offset = self._allocate(size, kept, keep, demote)
            if offset is None:
                done.append(False)
                continue
            pool = self._ensure_pool()
            region = pool[offset : offset + size]
            source = region_of(entry, align, placed)
            resident = views(region, entry, align, placed)
            if source is not None:  # K, V and any scales in one region: one copy
                copies.append((region, source))
            else:
                targets = entry_tensors(resident).values()
                copies.extend(zip(targets, entry_tensors(entry).values(), strict=True))
            self._entries[entry.key] = _resident(resident, entry, offset, size, placed[0])
            self.used += size
            keep.add(entry.key)
            kept += size
            placed_keys.append(entry.key)
            done.append(True)
        if not copies:
            return done
        if self._stream is None:
            for dst, src in copies:
                dst.copy_(src)
            return done
        # the regions' last readers ran on the current stream: copy in after them
        self._stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self._stream):
            for dst, src in copies:
                dst.copy_(src, non_blocking=True)
        ready = torch.cuda.Event()
        ready.record(self._stream)
        for key in placed_keys:
            self._entries[key].ready = ready
        self._copying.update(placed_keys)
        return done

    def _allocate(self, size: int, kept: int, keep: set[str], demote: Demote) -> int | None:
        """An offset for ``size`` bytes, evicting least recently used entries not in ``keep``
        (``kept``: the bytes those hold); None if they cannot make room."""
        if size > self.allocator.free_bytes + self.used - kept:  # used - kept: evictable
            return None
        while (offset := self.allocator.alloc(size)) is None:
            victim = next((k for k in self._entries if k not in keep), None)
            if victim is None:  # fragmented by the kept regions
                return None
            res = self._entries[victim]
            if res.ready is not None:
                res.ready.synchronize()
            demote(victim, res.entry)
            self.remove(victim)
        return offset

    def remove(self, key: str) -> bool:
        res = self._entries.pop(key, None)
        if res is None:
            return False
        self._copying.discard(key)
        self.allocator.free(res.offset, res.size)
        self.used -= res.size
        return True

    def _ensure_pool(self) -> torch.Tensor:
        if self._pool is None:
            if self.device.type == "cuda":
                if self.device.index is None:
                    self.device = torch.device("cuda", torch.cuda.current_device())
                self._stream = torch.cuda.Stream(device=self.device)
            # A normal tensor even when the first entry comes from inside vLLM's inference
            # mode (the worker's load): an inference tensor refuses the in-place copies of a
            # prefetch from the session's thread (seen on the H200: "Inplace update to
            # inference tensor outside InferenceMode").
            with torch.inference_mode(False):
                self._pool = torch.empty(self.budget, dtype=torch.uint8, device=self.device)
        return self._pool


def device_tier(gpu_bytes: int, device: torch.device | str | None) -> DeviceTier | None:
    """The device pool of ``gpu_bytes`` on ``device`` (None: CUDA if present), or None for
    none (0 bytes, or no CUDA when none was named)."""
    if gpu_bytes <= 0:
        return None
    if device is None:
        if not torch.cuda.is_available():
            return None  # on CPU the device tier is simply absent
        device = "cuda"
    if torch.device(device).type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} asked for the KV pool, but CUDA is not available")
    return DeviceTier(gpu_bytes, device)
