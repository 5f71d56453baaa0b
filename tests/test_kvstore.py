"""The durable per-entry KV files the connector reads."""

import os

import pytest
import torch

from inferscale_core.kvstore import EntryMissingError, KVStore, stack_entries
from inferscale_core.types import FactKV


def _entry(key: str, n: int = 3, layers: int = 2) -> FactKV:
    g = torch.Generator().manual_seed(len(key) + n)
    k = torch.randn(layers, n, 2, 8, generator=g)  # [layers, tokens, kv_heads, head_dim]
    return FactKV(key, list(range(100, 100 + n)), k, -k, "fp1")


def test_put_get_round_trip(tmp_path):
    store = KVStore(tmp_path)
    entry = _entry("f-abc")
    store.put(entry)
    fresh = KVStore(tmp_path)  # another process opening the same folder
    header = fresh.header("f-abc")
    assert header.token_ids == (100, 101, 102)
    assert header.fingerprint == "fp1"
    assert header.shape == (2, 3, 2, 8)
    got = fresh.get("f-abc")
    assert torch.equal(got.k, entry.k) and torch.equal(got.v, entry.v)


def test_missing_entry(tmp_path):
    with pytest.raises(EntryMissingError):
        KVStore(tmp_path).header("nope")


def test_delete_removes_file_and_caches(tmp_path):
    store = KVStore(tmp_path)
    store.put(_entry("f-x"))
    store.get("f-x")
    assert store.delete("f-x")
    assert not store.has("f-x")
    with pytest.raises(EntryMissingError):
        store.get("f-x")
    assert store.keys() == []


def test_no_temporary_files_left_and_bad_keys_refused(tmp_path):
    store = KVStore(tmp_path)
    store.put(_entry("f-y"))
    assert os.listdir(tmp_path) == ["f-y.safetensors"]
    with pytest.raises(ValueError):
        store.path("../evil")


def test_memory_cache_is_bounded(tmp_path):
    one = _entry("f-1", n=4)
    store = KVStore(tmp_path, cache_bytes=one.nbytes + 1)
    store.put(one)
    store.put(_entry("f-2", n=4))
    store.get("f-1")
    store.get("f-2")
    assert store._cached_bytes <= one.nbytes + 1


def test_stack_entries_concatenates_tokens():
    k, v = stack_entries([_entry("a", 2), _entry("b", 3)])
    assert k.shape == (2, 5, 2, 8) and v.shape == (2, 5, 2, 8)
