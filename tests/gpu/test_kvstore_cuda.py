"""The KV store's GPU pool on CUDA: copies in on a side stream, ordered before readers."""

from __future__ import annotations

import zlib

import torch

from inferscale_core.kvstore import KVStore
from inferscale_core.types import FactKV


def test_device_spans_order_copies_in_before_the_reader_on_cuda(tmp_path):
    # Big entries, so the side stream's copies are still running when the spans are asked for.
    store = KVStore(tmp_path, 4 << 30, gpu_bytes=2 << 30, device="cuda", fingerprint="fp1")
    keys = [f"big{i}" for i in range(4)]
    stored = {}
    for key in keys:
        g = torch.Generator().manual_seed(zlib.crc32(key.encode()))
        k = torch.randn(32, 512, 8, 128, generator=g)  # [layers, tokens, kv_heads, head_dim]
        store.put(FactKV(key, list(range(512)), k, -k, "fp1"))
        stored[key] = k
    store.prefetch(keys)
    tier = store.device_tier
    assert tier._copying == set(keys)  # issued on the side stream, not yet known done
    pool, spans, _ = store.device_spans(keys)  # right after the copies were issued
    # What a kernel on the current stream reads: the entries' bytes, not the pool's old ones.
    for (k_at, _, tokens), key in zip(spans.tolist(), keys, strict=True):
        read = pool[k_at : k_at + 32 * tokens * 8 * 128 * 4].view(torch.float32)
        assert torch.equal(read.cpu().view(32, tokens, 8, 128), stored[key])
    torch.cuda.synchronize()
    store.device_spans(keys)  # the copies are done: nothing is left to wait for
    assert not tier._copying


def test_compressed_entries_cross_to_the_pool_as_codes_and_expand_there(tmp_path):
    from inferscale_core.kvstore.quant import dequantize

    store = KVStore(tmp_path, 1 << 30, gpu_bytes=1 << 28, device="cuda", fingerprint="fp1")
    g = torch.Generator().manual_seed(7)
    k = torch.randn(32, 49, 8, 128, generator=g).to(torch.bfloat16)  # the 8B shape, bf16
    v = torch.randn(32, 49, 8, 128, generator=g).to(torch.bfloat16)
    for scheme in ("fp8", "int4"):
        key = f"fact-{scheme}"
        store.put(FactKV(key, list(range(49)), k, v, "fp1"), scheme=scheme)
        on_cpu = dequantize(store.get(key))
        store.prefetch([key])
        assert store.where(key)[0] == "device"
        views = store.get(key)
        assert views.k.is_cuda and views.quant.k_scale.is_cuda  # codes and scales in the pool
        on_gpu = dequantize(views, torch.bfloat16, torch.device("cuda"))
        assert on_gpu.k.dtype == torch.bfloat16
        # the same float32 arithmetic on either device (FMA or not), one rounding to bf16
        for got, want in ((on_gpu.k.cpu(), on_cpu.k), (on_gpu.v.cpu(), on_cpu.v)):
            torch.testing.assert_close(got, want, rtol=2**-7, atol=1e-6)
