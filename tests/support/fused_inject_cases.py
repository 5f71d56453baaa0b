"""Cases for the fused injection kernel, run on any device: ``python
tests/support/fused_inject_cases.py cpu`` (with ``TRITON_INTERPRET=1``) or ``cuda``. Prints one JSON
object: per case, how far the kernel's cache contents are from the reference path (``shift`` +
``scatter_kv``).

Each case: 3 layers with caches allocated separately, entries carved out of one byte pool as the
GPU tier does (so the kernel addresses them by offsets across allocations), pieces that start
mid-entry and are listed out of request order, slots spread over non-consecutive blocks, and
stored keys moved by a positive, a zero and a negative shift (the zero one must come back as
the stored bytes).
"""

from __future__ import annotations

import json
import math
import sys

import numpy as np
import torch

from inferscale_core.load_plan import Piece, slot_mapping
from inferscale_core.rope import RopeSpec, shift
from inferscale_core.vllm_plugin.fused_inject import FusedInjector, SourcePiece
from inferscale_core.vllm_plugin.paged_layouts import PagedLayout
from tests.support.paged_reference import gather_kv, scatter_kv

LAYERS, HEADS, DIM, BLOCK_SIZE, BLOCKS = 3, 2, 16, 4, 12
BLOCK_IDS = [3, 0, 7, 5, 9, 2]  # the request's blocks, in order


def _spec(is_neox: bool, rotary_dim: int, scaling: float = 1.0) -> RopeSpec:
    inv_freq = 1.0 / (10000 ** (torch.arange(0, rotary_dim, 2).float() / rotary_dim))
    return RopeSpec(DIM, rotary_dim, tuple(inv_freq.tolist()), scaling, is_neox, "default")


def _cache(layout: PagedLayout, dtype: torch.dtype, device: str) -> torch.Tensor:
    if layout is PagedLayout.FUSED_HEADS:  # memory order as vLLM 0.26 FA3 on the H200
        storage = torch.zeros(BLOCKS, BLOCK_SIZE, HEADS, 2 * DIM, dtype=dtype, device=device)
        return storage.permute(0, 2, 1, 3)
    if layout is PagedLayout.KV_FIRST:
        return torch.zeros(2, BLOCKS, BLOCK_SIZE, HEADS, DIM, dtype=dtype, device=device)
    return torch.zeros(BLOCKS, 2, BLOCK_SIZE, HEADS, DIM, dtype=dtype, device=device)


def _pool_entries(
    lengths: list[int], dtype: torch.dtype, device: str, gen: torch.Generator
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Entries as views into one uint8 pool at 256-byte aligned offsets (like DeviceTier)."""
    sizes = [LAYERS * n * HEADS * DIM * torch.finfo(dtype).bits // 8 for n in lengths]
    aligned = [(s + 255) // 256 * 256 for s in sizes]
    pool = torch.zeros(2 * sum(aligned) + 256, dtype=torch.uint8, device=device)
    entries, at = [], 256  # start off the pool's first byte: offsets are not all zero
    for n, size, step in zip(lengths, sizes, aligned, strict=True):
        shape = (LAYERS, n, HEADS, DIM)  # [layers, tokens, heads, dim]
        k = pool[at : at + size].view(dtype).view(shape)
        v = pool[at + step : at + step + size].view(dtype).view(shape)
        k.copy_(torch.randn(shape, generator=gen).to(dtype))
        v.copy_(torch.randn(shape, generator=gen).to(dtype))
        entries.append((k, v))
        at += 2 * step
    return entries  # views: they keep the pool alive


def _span(pool: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[int, int, int]:
    """(K byte offset, V byte offset, tokens) of an entry in ``pool``, as DeviceTier.spans."""
    return (k.data_ptr() - pool.data_ptr(), v.data_ptr() - pool.data_ptr(), k.shape[1])


def _error_in_ulps(got: torch.Tensor, want: torch.Tensor) -> float:
    """Largest |got - want| in units in the last place of ``want``'s largest magnitude (a
    rounding-level error is at most ~1; where the rotation cancels, the result's own ulp would
    overstate a difference that is rounding-level for its operands)."""
    mantissa_bits = {torch.float32: 23, torch.bfloat16: 7, torch.float16: 10}[want.dtype]
    biggest = want.float().abs().max().item()
    ulp = 2.0 ** (math.floor(math.log2(biggest)) - mantissa_bits)
    return (got.float() - want.float()).abs().max().item() / ulp


def run_case(layout: PagedLayout, spec: RopeSpec, dtype: torch.dtype, device: str) -> dict:
    gen = torch.Generator().manual_seed(0)
    entries = _pool_entries([5, 7, 3], dtype, device, gen)
    start = 6
    # Request positions [6, 6 + 4 + 7 + 2): entry 0 tokens 1..4, entry 1 whole, entry 2 tokens 0..1,
    # listed out of order.
    spans = [(0, 1, 5, start), (1, 0, 7, start + 4), (2, 0, 2, start + 11)]
    origins = [3, start + 4, 40]  # where each entry's keys were computed
    # shift = where the entry's token 0 lands - its origin: 2, 0 and -23
    shifts = [dst - src - origins[e] for e, src, _, dst in spans]
    order = [2, 0, 1]
    pieces = [
        SourcePiece(entries[spans[i][0]][0], entries[spans[i][0]][1], *spans[i][1:], shifts[i])
        for i in order
    ]
    tokens = 13
    slots = slot_mapping(BLOCK_IDS, BLOCK_SIZE, start, start + tokens)
    fused = [_cache(layout, dtype, device) for _ in range(LAYERS)]
    reference = [_cache(layout, dtype, device) for _ in range(LAYERS)]
    injector = FusedInjector(fused, layout, BLOCK_SIZE, HEADS, DIM, spec)
    for _ in range(2):  # on CUDA the second load is launched by the injector itself
        for cache in fused:
            cache.zero_()
        injector.inject(pieces, start, tokens, BLOCK_IDS)
    # The same load described by numbers: offsets in the entries' one pool (the GPU tier's path).
    # Its injector first serves another load (one piece, other start and length): on CUDA the
    # kernel compiled for that one is then launched directly for this one.
    in_place = [_cache(layout, dtype, device) for _ in range(LAYERS)]
    pool = entries[0][0]._base  # the uint8 buffer every entry is a view of
    pool_spans = np.array([_span(pool, *entries[spans[i][0]]) for i in order], dtype=np.int64)
    layout_of_entries = (dtype, LAYERS, HEADS, DIM)
    in_place_injector = FusedInjector(in_place, layout, BLOCK_SIZE, HEADS, DIM, spec)
    in_place_injector.inject_in_place(
        pool, pool_spans[2:], layout_of_entries, [Piece("", 0, 7, 0)], 0, 7, BLOCK_IDS
    )
    for cache in in_place:
        cache.zero_()
    in_place_injector.inject_in_place(
        pool,
        pool_spans,
        layout_of_entries,
        [Piece("", *spans[i][1:], shifts[i]) for i in order],
        start,
        tokens,
        BLOCK_IDS,
    )
    direct = bool(injector._compiled) and bool(in_place_injector._compiled)
    in_place_equal = all(torch.equal(a, b) for a, b in zip(in_place, fused, strict=True))

    moved = [
        shift(entries[e][0][:, a:b], by, spec)
        for (e, a, b, _), by in zip(spans, shifts, strict=True)
    ]
    k_post = torch.cat(moved, dim=1)  # [layers, tokens, heads, dim] each piece by its shift
    v_all = torch.cat([entries[e][1][:, a:b] for e, a, b, _ in spans], dim=1)
    slot_tensor = torch.tensor(slots, device=device)
    for layer in range(LAYERS):
        scatter_kv(reference[layer], layout, k_post[layer], v_all[layer], slot_tensor, BLOCK_SIZE)
    k_ulps, v_equal, untouched, zero_shift_exact = 0.0, True, True, True
    unshifted = slot_tensor[4:11]  # entry 1, shift 0: the stored bytes, exactly
    for layer, (got, want) in enumerate(zip(fused, reference, strict=True)):
        k_kept, _ = gather_kv(got, layout, unshifted, BLOCK_SIZE)
        zero_shift_exact = zero_shift_exact and torch.equal(k_kept, entries[1][0][layer])
        k_got, v_got = gather_kv(got, layout, slot_tensor, BLOCK_SIZE)
        k_want, v_want = gather_kv(want, layout, slot_tensor, BLOCK_SIZE)
        k_ulps = max(k_ulps, _error_in_ulps(k_got, k_want))
        v_equal = v_equal and torch.equal(v_got, v_want)
        # Everything but the written slots must still be zero: clear those, nothing may be left.
        cleared = got.clone()
        scatter_kv(cleared, layout, k_got * 0, v_got * 0, slot_tensor, BLOCK_SIZE)
        untouched = untouched and not cleared.any()
    return {
        "k_error_ulps": k_ulps,
        "v_equal": v_equal,
        "only_slots_written": untouched,
        "in_place_equal": in_place_equal,
        "zero_shift_exact": zero_shift_exact,
        "direct_launch": direct,  # the second loads went through the compiled kernel's launcher
    }


CASES = {
    "neox": (True, DIM, 1.0),
    "gptj": (False, DIM, 1.0),
    "neox_partial_rotary": (True, DIM // 2, 1.0),
    "gptj_partial_rotary": (False, DIM // 2, 1.0),
    "neox_scaled": (True, DIM, 1.25),  # yarn-style attention_scaling on cos and sin
}


def run_all(device: str) -> dict:
    results = {}
    for layout in PagedLayout:
        for name, (neox, rotary_dim, scaling) in CASES.items():
            for dtype in (torch.float32, torch.bfloat16):
                key = f"{layout.value}/{name}/{str(dtype).removeprefix('torch.')}"
                results[key] = run_case(layout, _spec(neox, rotary_dim, scaling), dtype, device)
    return results


if __name__ == "__main__":
    print(json.dumps(run_all(sys.argv[1] if len(sys.argv) > 1 else "cpu")))
