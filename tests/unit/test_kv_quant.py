"""Compressed KV entries (inferscale_core/kvstore/quant.py) and their files: sizes, error
bounds, the store writing and reading them through every tier, and damaged files refused."""

from __future__ import annotations

import json
import struct

import pytest
import torch
from safetensors.torch import save_file

from inferscale_core.kvstore import EntryCorruptError, EntryMissingError, KVStore
from inferscale_core.kvstore.entry_file import read_entry, read_header
from inferscale_core.kvstore.quant import (
    dequantize,
    dequantize_into,
    int4_fit,
    quantize,
    scheme_of,
    stored_nbytes,
)
from inferscale_core.types import FactKV

FP = "model-fp"


def _entry(
    key: str = "fact-a",
    layers: int = 4,
    tokens: int = 9,
    heads: int = 3,
    dim: int = 64,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
) -> FactKV:
    gen = torch.Generator().manual_seed(seed)
    k = torch.randn(layers, tokens, heads, dim, generator=gen)
    k[:, :, :, 3] *= 30  # an outlier channel, as real keys have
    v = torch.randn(layers, tokens, heads, dim, generator=gen)
    ids = list(range(100, 100 + tokens))
    return FactKV(key, ids, k.to(dtype), v.to(dtype), FP, origin=7)


def _inside(packed: torch.Tensor) -> torch.Tensor:
    """Which elements of a packed int4 tensor have a code strictly inside 0..15."""
    codes = torch.cat([packed & 15, packed >> 4], dim=-1)
    return (codes > 0) & (codes < 15)


@pytest.mark.parametrize("scheme", ["fp8", "int4"])
def test_codes_expand_within_their_step(scheme):
    entry = _entry()
    packed = quantize(entry, scheme)
    assert scheme_of(packed) == scheme and packed.origin == 7
    back = dequantize(packed)
    assert back.k.dtype == torch.float32 and back.k.shape == entry.k.shape
    q = packed.quant
    if scheme == "int4":
        # asymmetric 4-bit: a code inside the range is off by at most half a step (+ float16
        # rounding of scale and min); one at an end may be a clipped outlier
        k_step = q.k_scale.float()
        inside = _inside(packed.k)
        k_err = (back.k - entry.k).abs()
        assert (k_err <= 0.5 * k_step + 1e-3 * entry.k.abs().amax())[inside].all()
        v_step = q.v_scale.float().repeat_interleave(64 // q.v_scale.shape[-1], dim=-1)
        v_err = (back.v - entry.v).abs()
        assert (v_err <= 0.5 * v_step + 2e-3 * entry.v.abs().amax())[_inside(packed.v)].all()
    else:
        # e4m3: 3 mantissa bits, relative error <= 2^-4 above the subnormals
        scale = q.k_scale.float() * 448
        assert ((back.k - entry.k).abs() <= entry.k.abs() / 16 + scale * 2**-9).all()
    # the outlier channel does not swamp the others: per-channel key scales
    plain = entry.k[..., :3]
    assert ((back.k[..., :3] - plain).norm() / plain.norm()) < (0.1 if scheme == "int4" else 0.05)


def test_int4_fits_each_slice_no_worse_than_its_min_max_range():
    """The fitted ranges (clipped, refitted) leave each key channel and each value group at most
    min-max's squared error, and less over the entry."""
    entry = _entry(tokens=40)
    entry.k[0, 5, 0, 7] = 25.0  # one outlier token in a channel: clipping it pays
    back = dequantize(quantize(entry, "int4"))
    minmax = int4_fit(entry.k, dim=1, clips=(), refits=0)
    k_ref = (minmax[0].float() * minmax[1].float() + minmax[2].float() - entry.k).square()
    k_err = (back.k - entry.k).square()
    assert (k_err.sum(dim=1) <= k_ref.sum(dim=1) * (1 + 1e-5) + 1e-9).all()
    assert k_err.sum() < 0.95 * k_ref.sum()
    values = entry.v.reshape(4, 40, 3, 1, 64)
    minmax = int4_fit(values, dim=-1, clips=(), refits=0)
    v_ref = (minmax[0].float() * minmax[1].float() + minmax[2].float() - values).square()
    v_err = (back.v.reshape(values.shape) - values).square()
    assert (v_err.sum(dim=-1) <= v_ref.sum(dim=-1) * (1 + 1e-5) + 1e-9).all()
    assert v_err.sum() < 0.95 * v_ref.sum()


@pytest.mark.parametrize("scheme", ["fp8", "int4"])
def test_a_slice_expands_into_a_buffer_as_the_whole_entry_does(scheme):
    packed = quantize(_entry(tokens=11), scheme)
    whole = dequantize(packed)
    k_out = torch.full((4, 20, 3, 64), float("nan"))
    v_out = torch.full((4, 20, 3, 64), float("nan"))
    dequantize_into(packed, 2, 9, k_out[:, 5:12], v_out[:, 5:12])
    assert torch.equal(k_out[:, 5:12], whole.k[:, 2:9])
    assert torch.equal(v_out[:, 5:12], whole.v[:, 2:9])
    assert k_out[:, :5].isnan().all() and v_out[:, 12:].isnan().all()  # nothing else written


def test_bytes_per_fact_for_the_two_shapes_that_matter():
    # SmolLM2-135M in fp32 (the CPU): 30 layers, 3 KV heads of 64; a 49-token fact
    smol = [stored_nbytes(s, 30, 49, 3, 64, 64, 4) for s in ("model", "fp8", "int4")]
    assert smol[0] / smol[2] >= 6.0  # the ">= 6x smaller than fp32 on the CPU"
    assert smol[0] / smol[1] >= 3.5
    # Llama-3.1-8B in bf16 (the GPU): 32 layers, 8 KV heads of 128
    llama = [stored_nbytes(s, 32, 49, 8, 128, 128, 2) for s in ("model", "fp8", "int4")]
    assert llama[0] == 49 * 128 * 1024  # 128 KiB a token
    # the "<= 2.0 MB per 8B fact": 1.84 MB, 3.5x (the scales are 8% of it)
    assert llama[2] <= 2.0e6 and llama[0] / llama[2] >= 3.45
    entry = quantize(_entry(layers=30, tokens=49, heads=3), "int4")
    assert entry.nbytes == smol[2]


def test_the_store_writes_compressed_entries_and_reads_them_back(tmp_path):
    store = KVStore(tmp_path / "kv", fingerprint=FP, store_dtype="int4")
    entry = _entry()
    store.put(entry)
    assert store.header("fact-a").scheme == "int4"
    assert store.header("fact-a").shape == (4, 9, 3, 64)
    expected = dequantize(quantize(entry, "int4"))
    # another process: only the file
    other = KVStore(tmp_path / "kv", fingerprint=FP)
    read = other.get("fact-a")
    assert read.quant is not None and read.quant.dtype == torch.float32
    assert torch.equal(dequantize(read).k, expected.k) and torch.equal(
        dequantize(read).v, expected.v
    )
    # 9 tokens: the per-channel key scales weigh more than in a 49-token fact (7x)
    assert other.header("fact-a").nbytes == read.nbytes < entry.nbytes / 5


def test_the_system_prefix_is_never_compressed(tmp_path):
    store = KVStore(tmp_path / "kv", fingerprint=FP, store_dtype="int4")
    prefix = _entry("prefix-p")
    store.put(prefix)
    assert store.header("prefix-p").scheme == "model"
    assert torch.equal(KVStore(tmp_path / "kv", fingerprint=FP).get("prefix-p").k, prefix.k)


def test_the_device_tier_holds_compressed_entries_and_more_of_them(tmp_path):
    plain = KVStore(tmp_path / "a", fingerprint=FP, gpu_bytes=256 << 10, device="cpu")
    small = KVStore(
        tmp_path / "b", fingerprint=FP, gpu_bytes=256 << 10, device="cpu", store_dtype="int4"
    )
    keys = [f"fact-{i}" for i in range(40)]
    for i, key in enumerate(keys):
        entry = _entry(key, seed=i)
        plain.put(entry)
        small.put(entry)
    plain.prefetch(keys)
    small.prefetch(keys)
    held_plain, held_small = len(plain.device_tier), len(small.device_tier)
    assert held_small >= 5 * held_plain > 0  # 9-token entries: 5.3x smaller
    views = small.get(keys[-1])
    assert views.quant is not None
    expected = dequantize(quantize(_entry(keys[-1], seed=39), "int4"))
    assert torch.equal(dequantize(views).k, expected.k)
    assert small.device_spans(keys[-1:]) is None  # no in-place read of codes: staged instead


def test_an_entry_converts_to_another_scheme_under_its_key(tmp_path):
    store = KVStore(tmp_path / "kv", fingerprint=FP)
    entry = _entry()
    store.put(entry)
    assert store.header("fact-a").scheme == "model"
    store.put(store.get("fact-a"), scheme="fp8")
    again = KVStore(tmp_path / "kv", fingerprint=FP)
    assert again.header("fact-a").scheme == "fp8"
    assert torch.allclose(dequantize(again.get("fact-a")).k, entry.k, rtol=0.07, atol=0.05)


def test_format_2_files_are_still_read(tmp_path):
    root = tmp_path / "kv"
    root.mkdir()
    entry = _entry()
    meta = {
        "format": "inferscale-kv/2",
        "fingerprint": FP,
        "token_ids": json.dumps(entry.token_ids),
        "origin": "7",
    }
    save_file({"k": entry.k, "v": entry.v}, str(root / "fact-a.safetensors"), metadata=meta)
    store = KVStore(root, fingerprint=FP)
    header = store.header("fact-a")
    assert (header.scheme, header.dtype, header.crc32) == ("model", "float32", None)
    assert torch.equal(store.get("fact-a").k, entry.k)


def test_an_entry_of_an_older_version_is_stale_not_damaged(tmp_path):
    root = tmp_path / "kv"
    root.mkdir()
    entry = _entry()
    meta = {"format": "inferscale-kv/1", "fingerprint": FP, "token_ids": "[1]"}
    save_file({"k": entry.k, "v": entry.v}, str(root / "fact-a.safetensors"), metadata=meta)
    store = KVStore(root, fingerprint=FP)
    with pytest.raises(ValueError, match="is not an inferscale-kv/3 entry") as err:
        store.header("fact-a")
    assert not isinstance(err.value, EntryCorruptError)
    assert (root / "fact-a.safetensors").exists() and store.lost() == []  # left as it is


def _damage(path, how: str) -> None:
    data = bytearray(path.read_bytes())
    size = struct.unpack("<Q", data[:8])[0]
    if how == "truncated":
        data = data[: len(data) - 100]
    elif how == "payload bit":
        data[8 + size + 1000] ^= 0x10
    elif how == "header byte":  # the JSON's first brace: the header cannot parse
        data[8] = ord("}")
    elif how == "format byte":  # safetensors orders the metadata as it likes: find the value
        data[data.index(b'"inferscale-kv/') + 5] = ord("}")
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("scheme", ["model", "fp8", "int4"])
@pytest.mark.parametrize("how", ["truncated", "payload bit", "header byte", "format byte"])
def test_a_damaged_entry_is_refused_deleted_and_reported_lost(tmp_path, scheme, how):
    KVStore(tmp_path / "kv", fingerprint=FP, store_dtype=scheme).put(_entry())
    path = tmp_path / "kv" / "fact-a.safetensors"
    _damage(path, how)
    store = KVStore(tmp_path / "kv", fingerprint=FP)  # a fresh process: nothing cached
    with pytest.raises(EntryCorruptError) as err:
        store.header("fact-a")  # the scheduler's question: refused before any load
    assert isinstance(err.value, EntryMissingError)
    assert "damaged" in str(err.value)
    assert not path.exists()
    assert store.lost() == ["fact-a"] and store.lost() == []
    with pytest.raises(EntryMissingError):
        store.get("fact-a")


def test_a_checksum_mismatch_is_caught_by_read_entry(tmp_path):
    store = KVStore(tmp_path / "kv", fingerprint=FP, store_dtype="int4")
    store.put(_entry())
    path = store.path("fact-a")
    header = read_header("fact-a", path)
    _damage(path, "payload bit")
    with pytest.raises(EntryCorruptError, match="checksum"):
        read_entry(header, path)
