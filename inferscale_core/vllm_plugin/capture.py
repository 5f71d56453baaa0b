"""The save side of the connector: copy a computed span's K/V out of the paged cache as an entry.

An encoding request runs through the engine like any prefill; right after the forward that
computes the last token of a span it asked to capture (``wait_for_save``), the worker reads that
span's K and V out of every layer's cache and hands them to a writer thread, which puts them in
the KV store. The keys are kept as the cache holds them, post-RoPE at the span's own positions:
placed back at the same position they are the engine's own bytes.

Reading the cache goes through what the backend itself knows:

* the GPU layouts of ``paged_layouts`` (vLLM 0.26 FLASH_ATTN / FLASHINFER / TRITON_ATTN) by
  plain indexing (:func:`~.paged_layouts.gather_kv`);
* any other layout whose blocks hold a permutation of their tokens' elements (the CPU backend
  packs each block's keys per instruction set) through the permutation the backend's own
  ``do_kv_cache_update`` produces: it writes numbered elements into a one-block scratch cache,
  and the positions they land at are inverted (:class:`ProbedLayout`).

An fp8 cache (``kv_cache_dtype="fp8"``) is read as its bytes and the entry typed as its fp8
format: the engine's own values, scaled as the cache holds them (:mod:`.fp8_cache`).

Graph-safe: the copies are queued on the current stream after the forward (which may have been
a CUDA graph), so they read what it wrote and run before any later step reuses the blocks.
"""

from __future__ import annotations

import logging
import queue
import threading
import zlib
from collections.abc import Sequence
from typing import Any

import torch

from inferscale_core.kvstore import KVStore
from inferscale_core.kvstore.quant import quantize, scheme_for
from inferscale_core.tp_heads import RankHeads
from inferscale_core.types import FactKV
from inferscale_core.vllm_plugin.fp8_cache import exact_integers, scales, typed
from inferscale_core.vllm_plugin.metadata import SaveOp
from inferscale_core.vllm_plugin.paged_layouts import (
    PagedLayout,
    UnknownLayoutError,
    detect_layout,
    gather_kv,
)

log = logging.getLogger(__name__)

# GPU attention backends whose paged cache layouts paged_layouts.py knows (vLLM 0.26).
KNOWN_LAYOUT_BACKENDS = frozenset({"FLASH_ATTN", "FLASHINFER", "TRITON_ATTN"})


class ProbedLayout:
    """Where each (token, dim) of one head sits in a block, as the backend's own cache write
    puts it, for a cache of ``[blocks, heads, block_size, 2 * head_dim]`` holding keys in the
    first ``block_size`` rows of ``[blocks, heads, 2 * block_size, head_dim]`` and values in the
    rest (the CPU backend's layout)."""

    def __init__(
        self,
        layer: Any,
        like: torch.Tensor,
        block_size: int,
        fp8: torch.dtype | None = None,  # an fp8 cache's format (like is then its uint8 bytes)
        key_dtype: torch.dtype | None = None,  # what the backend's update takes (fp8: the model's)
    ) -> None:
        if like.dim() != 4 or like.shape[2] != block_size or like.shape[3] % 2:
            shape = tuple(like.shape)
            raise UnknownLayoutError(f"a cache of shape {shape} is not [blocks, heads, bs, 2d]")
        self.block_size, self.heads, self.head_dim = block_size, like.shape[1], like.shape[3] // 2
        self.device = like.device
        key_at, value_at = self._probe(layer, like.dtype, fp8, key_dtype or like.dtype)
        self.key_at, self.value_at = (
            key_at.to(self.device),
            value_at.to(self.device),
        )  # int64 [bs*d]

    def _probe(
        self, layer: Any, dtype: torch.dtype, fp8: torch.dtype | None, key_dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        bs, heads, dim = self.block_size, self.heads, self.head_dim
        n = bs * dim  # elements of one head's block tile
        # Numbered elements, written in digits of a base the stored type holds exactly (one
        # digit in fp32, base 256 in bf16, 16 in fp8 e4m3); an fp8 cache's update divides by
        # the layer's scales, so the numbers are multiplied by them first.
        base = exact_integers(fp8 or dtype)
        digits = 1
        while base**digits < n:
            digits += 1
        k_scale, v_scale = scales(layer) if fp8 is not None else (1.0, 1.0)
        ids = torch.arange(n, dtype=torch.int64)
        found_k = torch.zeros(n, dtype=torch.int64)
        found_v = torch.zeros(n, dtype=torch.int64)
        slots = torch.arange(bs, dtype=torch.int64, device=self.device)
        for d in range(digits):
            place = base**d
            digit = (ids // place) % base
            value = (digit + 1).to(torch.float32).view(bs, 1, dim).expand(bs, heads, dim)
            scratch = torch.zeros(1, heads, bs, 2 * dim, dtype=dtype, device=self.device)
            key = (value * k_scale).to(device=self.device, dtype=key_dtype).contiguous()
            neg = (value * -v_scale).to(device=self.device, dtype=key_dtype).contiguous()
            layer.impl.do_kv_cache_update(layer, key, neg, scratch, slots)
            both = typed(scratch, fp8).view(1, heads, 2 * bs, dim).cpu()
            for found, part, sign in (
                (found_k, both[0, :, :bs], 1),
                (found_v, both[0, :, bs:], -1),
            ):
                got = (sign * part.float()).reshape(heads, n).round().to(torch.int64) - 1
                if not (got == got[:1]).all():  # every head's tile is laid out alike
                    raise UnknownLayoutError("the backend lays out heads differently")
                found += got[0] * place
        out = []
        for found in (found_k, found_v):  # found[p] = the element written to flat place p
            if not torch.equal(torch.sort(found).values, ids):
                raise UnknownLayoutError("the backend's block layout is not a permutation")
            where = torch.empty(n, dtype=torch.int64)
            where[found] = torch.arange(n)
            out.append(where)  # where[t * d + j] = the flat place of (token t, dim j)
        return out[0], out[1]

    def read(self, cache: torch.Tensor, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V at ``slots``: each [tokens, heads, head_dim], in the cache's dtype."""
        bs, heads, dim = self.block_size, self.heads, self.head_dim
        tiles = cache.view(-1, heads, 2 * bs * dim)  # [blocks, heads, (K tile, V tile)]
        blocks, offsets = slots // bs, slots % bs
        cols = offsets[:, None] * dim + torch.arange(dim, device=slots.device)  # [tokens, dim]
        rows = blocks[:, None, None]  # [tokens, 1, 1]
        head = torch.arange(heads, device=slots.device)[None, :, None]  # [1, heads, 1]
        k = tiles[rows, head, self.key_at[cols][:, None, :]]  # [tokens, heads, dim]
        v = tiles[rows, head, self.value_at[cols][:, None, :] + bs * dim]
        return k, v


class CacheReader:
    """Reads spans of K/V out of every layer's paged cache, for the layers of one engine."""

    def __init__(
        self,
        layers: Sequence[tuple[str, Any]],
        block_size: int,
        fp8: torch.dtype | None = None,  # an fp8 cache's format (fp8_cache.fp8_format)
        key_dtype: torch.dtype
        | None = None,  # the model's dtype (what an fp8 cache's update takes)
    ) -> None:
        self.block_size = block_size
        self.fp8 = fp8
        _, first = layers[0]
        cache = _layer_cache(first)
        backend = getattr(getattr(first, "attn_backend", None), "get_name", lambda: "")()
        self._layout: PagedLayout | None = None
        self._probed: ProbedLayout | None = None
        if backend in KNOWN_LAYOUT_BACKENDS:
            self._layout = detect_layout(cache, block_size, first.num_kv_heads, first.head_size)
        else:
            self._probed = ProbedLayout(first, cache, block_size, fp8, key_dtype)
        self.layers = list(layers)

    def read(self, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of ``slots`` (int64 [tokens] on the cache's device) in every layer: each
        [layers, tokens, heads, head_dim], in the cache's dtype (an fp8 cache's: its fp8
        format, gathered as bytes) and on its device."""
        ks, vs = [], []
        for _, layer in self.layers:
            cache = _layer_cache(layer)
            if self._layout is not None:
                k, v = gather_kv(cache, self._layout, slots, self.block_size)
            else:
                k, v = self._probed.read(cache, slots)  # type: ignore[union-attr]
            ks.append(k)
            vs.append(v)
        k, v = torch.stack(ks), torch.stack(vs)
        return (typed(k, self.fp8), typed(v, self.fp8)) if self.fp8 is not None else (k, v)


DEVICE_QUEUE_BYTES = 128 * 2**20
"""The most captured K/V (bytes, the model's dtype) that waits on the GPU for the writers to
compress it (:class:`EntryWriter`): two waves of a 512-token step of an 8B model (64 MiB
each). The writers compress an entry in milliseconds, so the queue is short; a wave past it
goes through host RAM. Kept small: with it and the compression's work, torch's reserved peak of
the 8B app path (``bench/app_path.py``, an H100) grew 0.17 GiB, past 24 GiB with the 1.5 GiB
margin that had fit with 50 MB to spare."""


class EntryWriter:
    """Puts captured entries into the store on threads of their own, once their copy to the host
    is done, so the engine's step never waits on a file write.

    A wave's entries go to ``threads`` writers by key (one key always to the same writer, so two
    captures of one key land in order): each entry's write ends in two fsyncs, which overlap
    across writers; one writer held a 2,541-fact LoCoMo encode at ~7 ms a fact on the H200.

    The entries hold the KV heads ``heads`` of this rank (all of them at TP=1): under tensor
    parallelism each rank writes its part and the store joins them (:meth:`KVStore.put_heads`).

    On CUDA, when the store compresses (int4, fp8) and this rank holds every head, a wave may
    stay on the GPU (:meth:`takes_on_device`): each writer compresses its entries there, on a
    stream of its own, and only the codes and scales cross to host RAM. Compressing an 8B
    entry on the host took 30-60 ms of CPU (a 2-core box: 61 ms on one thread), so four
    writers held an H100's import of the 8B shape at 44 facts/s (82.7 compressed on the GPU;
    the encoding bench stores LoCoMo in bf16 at 89.8 on the H200). At most
    :data:`DEVICE_QUEUE_BYTES` of captured K/V wait on the GPU; a wave beyond that goes
    through host RAM as before.
    """

    def __init__(self, store: KVStore, heads: RankHeads, threads: int = 4) -> None:
        self.store = store
        self.heads = heads
        self._on_device = heads.full and store.store_dtype in ("int4", "fp8")
        self._device_bytes = 0  # captured K/V of waves queued on the GPU
        self._device_lock = threading.Lock()
        self._queues: list[queue.SimpleQueue[tuple[Any, list[FactKV], bool] | None]] = [
            queue.SimpleQueue() for _ in range(threads)
        ]
        self._threads = [
            threading.Thread(
                target=self._run, args=(q,), name=f"kv-capture-writer-{i}", daemon=True
            )
            for i, q in enumerate(self._queues)
        ]
        for thread in self._threads:
            thread.start()

    def takes_on_device(self, nbytes: int) -> bool:
        """Whether a wave of ``nbytes`` of captured K/V may be handed over on the GPU (then
        :meth:`put` it ``on_device``; its entries give the bytes back as they are written):
        the store compresses, this rank holds every head, and the waves already queued there
        leave room for it."""
        if not self._on_device:
            return False
        with self._device_lock:
            if self._device_bytes + nbytes > DEVICE_QUEUE_BYTES:
                return False
            self._device_bytes += nbytes
            return True

    def put(self, ready: Any, entries: list[FactKV], on_device: bool = False) -> None:
        """Write ``entries`` once ``ready`` (a CUDA event, or None) has completed;
        ``on_device``: they are views of a wave on the GPU that :meth:`takes_on_device`
        accepted (their bytes are the wave's: the entries cover all of its tokens)."""
        shards: dict[int, list[FactKV]] = {}
        for entry in entries:
            shards.setdefault(zlib.crc32(entry.key.encode()) % len(self._queues), []).append(entry)
        for shard, part in shards.items():
            self._queues[shard].put((ready, part, on_device))

    def _run(self, jobs: queue.SimpleQueue[tuple[Any, list[FactKV], bool] | None]) -> None:
        pin = self.store.host_tier.pin  # the host tier keeps what is put: copy straight to it
        stream = None  # this writer's CUDA stream, for waves left on the GPU
        while (item := jobs.get()) is not None:
            ready, entries, on_device = item
            try:
                if on_device:
                    if stream is None:
                        stream = torch.cuda.Stream(entries[0].k.device)
                    self._put_on_device(stream, ready, entries)
                    continue
                if ready is not None:
                    ready.synchronize()
                for entry in entries:  # own copies: the captured views share one buffer
                    k, v = _owned(entry.k, pin), _owned(entry.v, pin)
                    self.store.put_heads(
                        FactKV(entry.key, entry.token_ids, k, v, entry.fingerprint, entry.origin),
                        self.heads.start,
                        self.heads.total,
                    )
            except Exception:  # one bad write must not stop the others
                log.exception("writing captured KV entries failed")
            finally:
                if on_device:  # this part of the wave no longer waits on the GPU
                    with self._device_lock:
                        self._device_bytes -= sum(e.nbytes for e in entries)

    def _put_on_device(self, stream: Any, ready: Any, entries: list[FactKV]) -> None:
        """Compress ``entries`` (views of a wave on the GPU) on ``stream`` once ``ready``,
        then put them: the store copies the codes and scales to host RAM and writes them."""
        with torch.cuda.stream(stream):
            stream.wait_event(ready)
            for entry in entries:
                # the wave was allocated on the engine's stream: keep its memory from being
                # reused there before this stream's reads of it are done
                entry.k.record_stream(stream)
                entry.v.record_stream(stream)
                scheme = scheme_for(entry.key, self.store.store_dtype)
                self.store.put(quantize(entry, scheme))

    def close(self) -> None:
        for jobs in self._queues:
            jobs.put(None)
        for thread in self._threads:
            thread.join(timeout=30)


def _owned(view: torch.Tensor, pin: bool) -> torch.Tensor:
    """A contiguous copy of ``view`` in host memory, pinned if ``pin``."""
    out = torch.empty(view.shape, dtype=view.dtype, pin_memory=pin)
    out.copy_(view)
    return out


def capture(
    reader: CacheReader, writer: EntryWriter, saves: Sequence[SaveOp], fingerprint: str
) -> None:
    """Copy the spans of ``saves`` out of the cache (one gather per layer for all of them),
    to host memory, and queue them for the store."""
    if not saves:
        return
    device = _layer_cache(reader.layers[0][1]).device
    slots = torch.cat([torch.as_tensor(op.slots(reader.block_size)) for op in saves]).to(
        device
    )  # int64 [tokens of all saves]
    k, v = reader.read(slots)  # [layers, tokens, heads, dim] each
    ready = None
    on_device = device.type == "cuda" and writer.takes_on_device(k.nbytes + v.nbytes)
    if on_device:
        ready = torch.cuda.Event()  # the writers compress on the GPU after the gather
        ready.record()
    elif device.type == "cuda":
        k_host = torch.empty(k.shape, dtype=k.dtype, pin_memory=True)
        v_host = torch.empty(v.shape, dtype=v.dtype, pin_memory=True)
        k_host.copy_(k, non_blocking=True)
        v_host.copy_(v, non_blocking=True)
        ready = torch.cuda.Event()
        ready.record()
        k, v = k_host, v_host
    entries, at = [], 0
    for op in saves:
        n = op.end - op.start
        entries.append(
            FactKV(
                op.key,
                list(op.token_ids),
                k[:, at : at + n],  # views; the store writes and caches its own copies
                v[:, at : at + n],
                fingerprint,
                origin=op.start,
            )
        )
        at += n
    writer.put(ready, entries, on_device)


def _layer_cache(layer: Any) -> torch.Tensor:
    """The layer's paged KV cache (a tensor in vLLM 0.32; older versions keep a list per engine)."""
    cache = layer.kv_cache
    return cache[0] if isinstance(cache, (list, tuple)) else cache
