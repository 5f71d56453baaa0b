"""Entries as one byte region (inferscale_core/kvstore/region.py): host RAM holds each entry laid
out as the GPU pool's, files are read straight into such a region, and an entry crosses between
the tiers as one copy, bit for bit, whatever its scheme (the pool runs on CPU here)."""

from __future__ import annotations

import pytest
import torch

from inferscale_core.kvstore import EntryCorruptError, KVStore
from inferscale_core.kvstore.entry_file import read_entry, read_header
from inferscale_core.kvstore.quant import entry_tensors
from inferscale_core.kvstore.region import ALIGN, entry_layout, pack, region_of
from inferscale_core.kvstore.tiers import DeviceTier, to_host
from inferscale_core.types import FactKV

FP = "fp1"
SCHEMES = ["model", "fp8", "int4"]


def _entry(key: str = "fact-a", tokens: int = 9, dtype: torch.dtype = torch.bfloat16) -> FactKV:
    g = torch.Generator().manual_seed(tokens)
    k = torch.randn(3, tokens, 2, 64, generator=g)  # [layers, tokens, kv_heads, head_dim]
    v = torch.randn(3, tokens, 2, 64, generator=g)
    return FactKV(key, list(range(tokens)), k.to(dtype), v.to(dtype), FP, origin=4)


def _bytes(entry: FactKV) -> dict[str, bytes]:
    return {
        name: t.contiguous().view(torch.uint8).numpy().tobytes()
        for name, t in entry_tensors(entry).items()
    }


def _store(path, scheme: str = "model", **kw) -> KVStore:
    return KVStore(path, fingerprint=FP, store_dtype=scheme, gpu_bytes=1 << 22, device="cpu", **kw)


def test_layout_is_the_pools_k_then_v_then_scales_each_aligned():
    from inferscale_core.kvstore.quant import quantize

    entry = quantize(_entry(), "int4")
    offsets, size = entry_layout(entry)
    assert list(offsets) == ["k", "v", "k_scale", "v_scale", "k_zero", "v_zero", "k_fine", "k_slot"]
    assert all(at % ALIGN == 0 for at in offsets.values())
    assert size == DeviceTier(1 << 20, "cpu").region_size(entry)
    assert region_of(entry) is None  # separate tensors: not a region
    packed = pack(entry, pin=False)
    region = region_of(packed)
    assert region is not None and region.dtype == torch.uint8 and region.numel() == size
    assert _bytes(packed) == _bytes(entry)
    for name, t in entry_tensors(packed).items():  # each tensor where the layout puts it
        assert t.data_ptr() - region.data_ptr() == offsets[name]
    assert to_host(packed, pin=False) is packed  # a host region already: no copy
    assert to_host(packed, pin=False, copy=True).k.data_ptr() != packed.k.data_ptr()


@pytest.mark.parametrize("scheme", SCHEMES)
def test_every_host_copy_is_one_region_and_every_tier_holds_the_same_bits(tmp_path, scheme):
    store = _store(tmp_path, scheme)
    store.put(_entry())
    written = store.get("fact-a")  # write-through: host RAM
    assert store.where("fact-a") == ["host", "disk"]
    assert region_of(written) is not None
    fresh = _store(tmp_path)  # another process: from the file, read into a region
    from_disk = fresh.get("fact-a")
    assert region_of(from_disk) is not None
    assert _bytes(from_disk) == _bytes(written)
    fresh.prefetch(["fact-a"])
    assert fresh.where("fact-a")[0] == "device"
    pooled = fresh.get("fact-a")
    assert _bytes(pooled) == _bytes(written)
    # the pool's region holds the host region's bytes as they are: same layout
    pool_region = region_of(pooled)
    assert pool_region is not None
    assert torch.equal(pool_region, region_of(from_disk))
    fresh.demote(["fact-a"], "disk")
    fresh.prefetch(["fact-a"])  # straight from the file into the pool
    assert _bytes(fresh.get("fact-a")) == _bytes(written)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_an_entry_crosses_to_the_pool_and_back_as_one_copy(tmp_path, scheme, monkeypatch):
    one = _store(tmp_path / "probe", scheme)
    one.put(_entry("x"))
    region = one.device_tier.region_size(one.get("x"))
    store = KVStore(
        tmp_path / "kv", fingerprint=FP, store_dtype=scheme, gpu_bytes=2 * region, device="cpu"
    )
    for key in "abc":
        store.put(_entry(key))
    copies: list[tuple[int, ...]] = []
    real_copy = torch.Tensor.copy_

    def counted(self, src, non_blocking=False):
        copies.append(tuple(self.shape))
        return real_copy(self, src, non_blocking)

    monkeypatch.setattr(torch.Tensor, "copy_", counted)
    store.prefetch(["a", "b"])  # host RAM -> pool: one copy an entry, whatever the scheme
    assert copies == [(region,), (region,)]
    copies.clear()
    store.host_tier.pop("a")  # a lives in the pool only (and on disk)
    store.prefetch(["c"])  # evicts a: pool -> host RAM, one copy; then c in, one copy
    assert copies == [(region,), (region,)]
    assert store.where("a") == ["host", "disk"]
    monkeypatch.undo()
    assert region_of(store.get("a")) is not None
    assert _bytes(store.get("a")) == _bytes(_store(tmp_path / "kv").get("a"))


def test_the_kernels_rows_point_into_the_same_layout(tmp_path):
    store = _store(tmp_path, "int4")
    store.put(_entry("fact-a"))
    store.prefetch(["fact-a"])
    spans = store.device_spans(["fact-a"])
    k_at, v_at, tokens, quant, ks, kz, vs, vz, kf, kl = spans.rows[0].tolist()
    offsets, _ = entry_layout(store.get("fact-a"))
    assert (tokens, quant) == (9, 1)
    assert [k_at, v_at, ks, vs, kz, vz, kf, kl] == [k_at + offsets[n] for n in offsets]


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("cut", [1, 100, "tail"])
def test_a_file_cut_short_is_refused_by_the_region_read(tmp_path, scheme, cut):
    store = _store(tmp_path, scheme)
    store.put(_entry())
    path = store.path("fact-a")
    header = read_header("fact-a", path)
    data = path.read_bytes()
    if cut == "tail":  # the table still parses; the bytes stop short
        path.write_bytes(data[: len(data) // 2])
    else:
        path.write_bytes(data[:cut])
    with pytest.raises(EntryCorruptError):
        read_entry(header, path)


def test_a_table_that_lies_about_a_tensor_is_refused(tmp_path):
    store = _store(tmp_path, "int4")
    store.put(_entry())
    path = store.path("fact-a")
    header = read_header("fact-a", path)
    data = bytearray(path.read_bytes())
    at = data.index(b'"U8"')
    data[at : at + 4] = b'"F4"'  # a dtype no entry has
    path.write_bytes(bytes(data))
    with pytest.raises(EntryCorruptError, match="do not load"):
        read_entry(header, path)
