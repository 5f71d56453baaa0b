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


def test_pinned_host_regions_cross_to_the_pool_as_one_copy_each_bit_for_bit(tmp_path):
    """Every scheme: host RAM holds each entry as one pinned region laid out as the pool's, a
    prefetch copies it in as ONE asynchronous copy, an eviction copies it back out as one, and
    the pool holds the same bits whether the entry came from host RAM or from its file."""
    from inferscale_core.kvstore.quant import entry_tensors
    from inferscale_core.kvstore.region import region_of

    g = torch.Generator().manual_seed(11)
    k = torch.randn(32, 49, 8, 128, generator=g).to(torch.bfloat16)  # the 8B shape, bf16
    v = torch.randn(32, 49, 8, 128, generator=g).to(torch.bfloat16)
    for scheme in ("model", "fp8", "int4"):
        root = tmp_path / scheme
        writer = KVStore(root, 1 << 30, fingerprint="fp1", store_dtype=scheme)
        for key in "abc":
            writer.put(FactKV(key, list(range(49)), k.cuda(), v.cuda(), "fp1"))
        hosted = writer.get("a")  # written through from the GPU into one pinned region
        region = region_of(hosted)
        assert region is not None and region.is_pinned()
        size = region.numel()
        store = KVStore(root, 1 << 30, gpu_bytes=2 * size, device="cuda", fingerprint="fp1")
        from_disk = store.get("a")  # read from the file straight into a pinned region
        assert region_of(from_disk) is not None and region_of(from_disk).is_pinned()
        store.get("b")
        store.get("c")
        copies = []
        real_copy = torch.Tensor.copy_

        def counted(self, src, non_blocking=False, copies=copies, real_copy=real_copy):
            copies.append((self.device.type, src.device.type, self.numel()))
            return real_copy(self, src, non_blocking)

        torch.Tensor.copy_ = counted
        try:
            store.prefetch(["a", "b"])
            assert copies == [("cuda", "cpu", size)] * 2, (scheme, copies)
            copies.clear()
            store.host_tier.pop("a")  # a lives in the pool only now
            store.prefetch(["c"])  # evicts a: copied out as one region, then c in as one
            assert copies == [("cpu", "cuda", size), ("cuda", "cpu", size)], (scheme, copies)
        finally:
            torch.Tensor.copy_ = real_copy
        demoted = store.get("a")
        assert region_of(demoted) is not None and region_of(demoted).is_pinned()
        for name, t in entry_tensors(hosted).items():
            assert torch.equal(entry_tensors(demoted)[name], t), (scheme, name)
        pooled = store.get("c")  # views of the pool, after the copy in (ordered by get)
        pool_region = region_of(pooled)
        assert pool_region is not None and pool_region.is_cuda
        assert torch.equal(pool_region.cpu(), region_of(store.host_tier.get("c")))
        torch.cuda.synchronize()


def _wave(seed: int, tokens: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """A captured wave as the capture's gather leaves it: K and V of every entry's tokens on the
    GPU, ``[layers, sum(tokens), kv_heads, head_dim]`` bf16 each."""
    g = torch.Generator().manual_seed(seed)
    shape = (32, sum(tokens), 8, 128)
    k = torch.randn(shape, generator=g).to(torch.bfloat16).cuda()
    v = torch.randn(shape, generator=g).to(torch.bfloat16).cuda()
    return k, v


def _views(k, v, tokens: list[int], prefix: str) -> list[FactKV]:
    out, at = [], 0
    for i, n in enumerate(tokens):
        key = f"{prefix}-fact-{i}"
        out.append(FactKV(key, list(range(n)), k[:, at : at + n], v[:, at : at + n], "fp1"))
        at += n
    return out


def test_the_capture_writer_compresses_a_wave_on_the_gpu_as_the_host_would(tmp_path, monkeypatch):
    """int4 store, TP=1: a wave handed over on the GPU is compressed there (each writer on its
    own stream), and what is stored reads back as the host's compression of the same K/V
    reads; the GPU bytes it held are given back. Past DEVICE_QUEUE_BYTES a wave goes through
    host RAM instead, and is stored the same."""
    from inferscale_core.kvstore.quant import dequantize, quantize
    from inferscale_core.tp_heads import RankHeads
    from inferscale_core.vllm_plugin import capture

    store = KVStore(tmp_path, 1 << 30, device="cuda", fingerprint="fp1", store_dtype="int4")
    writer = capture.EntryWriter(store, RankHeads(0, 8, 8))
    tokens = [49, 7, 120, 33, 55, 1]
    k, v = _wave(3, tokens)
    nbytes = k.nbytes + v.nbytes
    assert writer.takes_on_device(nbytes)
    ready = torch.cuda.Event()
    ready.record()
    entries = _views(k, v, tokens, "gpu")
    want = {
        e.key: dequantize(quantize(FactKV(e.key, e.token_ids, e.k.cpu(), e.v.cpu(), "fp1"), "int4"))
        for e in entries
    }
    writer.put(ready, entries, on_device=True)
    del k, v, entries  # the writers' views alone keep the wave alive now
    # past the cap: the next wave goes through host RAM
    monkeypatch.setattr(capture, "DEVICE_QUEUE_BYTES", 1)
    k2, v2 = _wave(4, [20, 30])
    assert not writer.takes_on_device(k2.nbytes + v2.nbytes)
    host = [
        FactKV(e.key, e.token_ids, e.k.cpu(), e.v.cpu(), "fp1")
        for e in _views(k2, v2, [20, 30], "host")
    ]
    want |= {e.key: dequantize(quantize(e, "int4")) for e in host}
    writer.put(None, host)
    writer.close()
    assert writer._device_bytes == 0
    assert sorted(store.keys()) == sorted(want)
    for key, expected in want.items():
        assert store.stored_scheme(key) == "int4"
        got = dequantize(store.get(key))
        assert got.k.device.type == "cpu" and got.k.shape == expected.k.shape
        # the same fit on either device; a code may differ by one step where float32
        # arithmetic on the GPU rounds a tie the other way
        for g_t, w_t in ((got.k, expected.k), (got.v, expected.v)):
            step = (w_t.float().abs().amax() / 7).item()
            assert (g_t.float() - w_t.float()).abs().max().item() <= step
            assert (g_t.float() - w_t.float()).abs().mean().item() < step / 100
