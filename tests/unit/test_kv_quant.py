"""Compressed KV entries (inferscale_core/kvstore/quant.py) and their files: sizes, error
bounds, the store writing and reading them through every tier, and damaged files refused."""

from __future__ import annotations

import json
import struct
from dataclasses import replace

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
    """Fitted ranges (refitted, and clipped where asked) leave each slice at most min-max's
    squared error, and less over the tensor; the entry's values use the default fit."""
    entry = _entry(tokens=40)
    keys = entry.k.clone()
    keys[0, 5, 0, 7] = 25.0  # one outlier token in a channel: clipping it pays

    def error(fit):
        return (fit[0].float() * fit[1].float() + fit[2].float() - keys).square().sum(dim=1)

    minmax = error(int4_fit(keys, dim=1, clips=(), refits=0))
    for clips, refits in (((), 1), ((0.9, 0.8), 2)):
        fitted = error(int4_fit(keys, dim=1, clips=clips, refits=refits))
        assert (fitted <= minmax * (1 + 1e-5) + 1e-9).all()
        assert fitted.sum() < (0.97 if not clips else 0.9) * minmax.sum()
    back = dequantize(quantize(entry, "int4"))
    values = entry.v.reshape(4, 40, 3, 1, 64)
    minmax = int4_fit(values, dim=-1, clips=(), refits=0)
    v_ref = (minmax[0].float() * minmax[1].float() + minmax[2].float() - values).square()
    v_err = (back.v.reshape(values.shape) - values).square()
    assert (v_err.sum(dim=-1) <= v_ref.sum(dim=-1) * (1 + 1e-5) + 1e-9).all()
    assert v_err.sum() < 0.97 * v_ref.sum()


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
    # the "<= 2.0 MB per 8B fact": 1.97 MB, 3.26x (scales 8%, the 8-bit key
    # channels' low bits and slots 7%)
    assert llama[2] <= 2.0e6 and llama[0] / llama[2] >= 3.25
    entry = quantize(_entry(layers=30, tokens=49, heads=3), "int4")
    assert entry.nbytes == smol[2]
    assert entry.quant.k_fine.shape == (30, 49, 3, 4) and entry.quant.k_slot.shape == (30, 1, 3, 64)


def test_the_widest_key_channels_keep_8_bits():
    """The widest eighth of each head's key channels (here the outlier channel 3 among them)
    expand to within half an 8-bit step; the others to within half a 4-bit step."""
    entry = _entry(tokens=30)
    packed = quantize(entry, "int4")
    q = packed.quant
    slot = q.k_slot[:, 0].long()  # [L, H, D]
    wide = slot < 255
    assert (wide.sum(dim=-1) == 8).all() and wide[..., 3].all()
    assert (slot[wide].reshape(4, 3, 8) == torch.arange(8)).all()  # slots in channel order
    back = dequantize(packed)
    err = (back.k - entry.k).abs()  # [L, T, H, D]
    fine_step = q.k_scale.float() / 16
    assert (err <= 0.5 * fine_step + 1e-4 * entry.k.abs().amax())[
        wide[:, None].expand_as(err)
    ].all()
    # without the low bits the outlier channel would be off by up to 16 of its steps
    plain = dequantize(replace(packed, quant=replace(q, k_fine=None, k_slot=None)))
    assert (plain.k - entry.k)[..., 3].abs().max() > 2 * err[..., 3].max()


def test_int4_files_without_8_bit_key_channels_are_still_read(tmp_path):
    store = KVStore(tmp_path / "kv", fingerprint=FP)
    packed = quantize(_entry(), "int4")
    old = replace(packed, quant=replace(packed.quant, k_fine=None, k_slot=None))
    store.put(old, scheme="int4")
    store.host_tier.pop("fact-a")
    back = store.get("fact-a")
    assert back.quant.k_fine is None
    assert torch.equal(dequantize(back).k, dequantize(old).k)


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
    # 9 tokens: the per-channel key scales and slots weigh more than in a 49-token fact
    assert other.header("fact-a").nbytes == read.nbytes < entry.nbytes / 4.5


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
