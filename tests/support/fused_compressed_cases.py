"""Cases for the compressed-entry injection kernel, on any device: ``python
tests/support/fused_compressed_cases.py cpu`` (with ``TRITON_INTERPRET=1``) or ``cuda``. Prints
one JSON object: per case, how far the kernel's cache contents are from the reference path
(``dequantize`` each entry, ``shift``, ``scatter_kv``).

Each case: a plain entry (the system prefix) and two compressed ones in one request, pieces
that start mid-entry and are listed out of order, the compressed ones' codes and scales carved
out of one byte pool as the GPU tier holds them, shifts positive, zero and negative; then the
same request read in place from a real ``DeviceTier`` (``in_place_*``: ``mixed_spans``).
"""

from __future__ import annotations

import json
import sys

import torch

from inferscale_core.kvstore.quant import dequantize, entry_tensors, quantize, with_tensors
from inferscale_core.kvstore.tiers import DeviceTier
from inferscale_core.load_plan import Piece, slot_mapping
from inferscale_core.rope import shift
from inferscale_core.types import FactKV
from inferscale_core.vllm_plugin.fused_compressed import (
    StoredPiece,
    inject_mixed,
    inject_mixed_in_place,
)
from inferscale_core.vllm_plugin.fused_inject import FusedInjector
from inferscale_core.vllm_plugin.paged_layouts import PagedLayout
from tests.support.fused_inject_cases import (
    BLOCK_IDS,
    BLOCK_SIZE,
    CASES,
    DIM,
    HEADS,
    LAYERS,
    _cache,
    _error_in_ulps,
    _spec,
)
from tests.support.paged_reference import gather_kv, scatter_kv


def _in_pool(entry: FactKV, device: str) -> FactKV:
    """The entry's tensors as views into one uint8 pool at 256-byte aligned offsets."""
    tensors = entry_tensors(entry)
    sizes = [t.numel() * t.element_size() for t in tensors.values()]
    pool = torch.zeros(sum((s + 255) // 256 * 256 for s in sizes) + 256, dtype=torch.uint8)
    pool = pool.to(device)
    views, at = {}, 256
    for (name, t), size in zip(tensors.items(), sizes, strict=True):
        views[name] = pool[at : at + size].view(t.dtype).view(t.shape)
        views[name].copy_(t)
        at += (size + 255) // 256 * 256
    return with_tensors(entry, views)


def run_case(layout: PagedLayout, spec, dtype: torch.dtype, scheme: str, device: str) -> dict:
    gen = torch.Generator().manual_seed(1)

    def entry(key: str, tokens: int) -> FactKV:
        shape = (LAYERS, tokens, HEADS, DIM)
        k = (torch.randn(shape, generator=gen) * 2).to(dtype)
        v = torch.randn(shape, generator=gen).to(dtype)
        return FactKV(key, list(range(tokens)), k, v, "fp")

    prefix = entry("prefix-p", 4)
    facts = [quantize(entry(f"fact-{i}", n), scheme) for i, n in enumerate((7, 5))]
    on_device = [
        with_tensors(prefix, {n: t.to(device) for n, t in entry_tensors(prefix).items()}),
        *(_in_pool(f, device) for f in facts),
    ]
    start = 5
    # (entry, src_start, src_end, dst_start): prefix tokens 1..3, fact 0 whole, fact 1 1..4
    spans = [(0, 1, 4, start), (1, 0, 7, start + 3), (2, 1, 5, start + 10)]
    shifts = [2, 0, -9]
    order = [2, 0, 1]
    pieces = [StoredPiece(on_device[spans[i][0]], *spans[i][1:], shifts[i]) for i in order]
    tokens = 14
    fused = [_cache(layout, dtype, device) for _ in range(LAYERS)]
    reference = [_cache(layout, dtype, device) for _ in range(LAYERS)]
    injector = FusedInjector(fused, layout, BLOCK_SIZE, HEADS, DIM, spec)
    inject_mixed(injector, pieces, start, tokens, BLOCK_IDS)
    # the same pieces read where the GPU tier holds them, described by numbers
    in_place = [_cache(layout, dtype, device) for _ in range(LAYERS)]
    tier = DeviceTier(1 << 20, device)
    for e in (prefix, *facts):
        assert tier.place(e, set(), lambda key, views: None)
    keys = [on_device[spans[i][0]].key for i in order]
    found = tier.mixed_spans(keys)
    assert found is not None and tier.spans(keys) is None
    pool_injector = FusedInjector(in_place, layout, BLOCK_SIZE, HEADS, DIM, spec)
    numbered = [Piece(keys[j], *spans[i][1:], shifts[i]) for j, i in enumerate(order)]
    inject_mixed_in_place(pool_injector, found, numbered, start, tokens, BLOCK_IDS)

    # the reference: expand each entry in fp32, rotate in fp32, round once (as the kernel)
    plain = [dequantize(e, torch.float32, torch.device(device)) for e in on_device]
    moved = [
        shift(plain[e].k[:, a:b], by, spec) for (e, a, b, _), by in zip(spans, shifts, strict=True)
    ]
    k_post = torch.cat(moved, dim=1).to(dtype)
    v_all = torch.cat([plain[e].v[:, a:b] for e, a, b, _ in spans], dim=1).to(dtype)
    slots = torch.tensor(slot_mapping(BLOCK_IDS, BLOCK_SIZE, start, start + tokens), device=device)
    for layer in range(LAYERS):
        scatter_kv(reference[layer], layout, k_post[layer], v_all[layer], slots, BLOCK_SIZE)
    out = {}
    for name, caches in (("", fused), ("in_place_", in_place)):
        k_ulps = v_ulps = 0.0
        untouched = True
        for got, want in zip(caches, reference, strict=True):
            k_got, v_got = gather_kv(got, layout, slots, BLOCK_SIZE)
            k_want, v_want = gather_kv(want, layout, slots, BLOCK_SIZE)
            k_ulps = max(k_ulps, _error_in_ulps(k_got, k_want))
            v_ulps = max(v_ulps, _error_in_ulps(v_got, v_want))
            cleared = got.clone()
            scatter_kv(cleared, layout, k_got * 0, v_got * 0, slots, BLOCK_SIZE)
            untouched = untouched and not cleared.any()
        out[f"{name}k_error_ulps"] = k_ulps
        out[f"{name}v_error_ulps"] = v_ulps
        out[f"{name}only_slots_written"] = untouched
    return out


def run_all(device: str) -> dict:
    results = {}
    for layout in PagedLayout:
        for name, (neox, rotary_dim, scaling) in CASES.items():
            for dtype in (torch.float32, torch.bfloat16):
                for scheme in ("int4", "fp8"):
                    key = f"{layout.value}/{name}/{str(dtype).removeprefix('torch.')}/{scheme}"
                    spec = _spec(neox, rotary_dim, scaling)
                    results[key] = run_case(layout, spec, dtype, scheme, device)
    return results


if __name__ == "__main__":
    print(json.dumps(run_all(sys.argv[1] if len(sys.argv) > 1 else "cpu")))
