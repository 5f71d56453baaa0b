"""The tiered KV store: device pool (run on CPU here) → host RAM → durable per-entry files."""

import contextlib
import os
import random
import shutil
import threading
import time
import zlib

import pytest
import torch

from inferscale_core.kvstore import (
    EntryMissingError,
    FingerprintMismatchError,
    KVStore,
)
from inferscale_core.kvstore.quant import quantize
from inferscale_core.kvstore.tiers import DeviceTier, ExtentAllocator
from inferscale_core.types import FactKV
from tests.support.hf_oracle import stack_entries


def _entry(
    key: str, n: int = 3, layers: int = 2, dtype: torch.dtype = torch.float32, fp: str = "fp1"
) -> FactKV:
    g = torch.Generator().manual_seed(zlib.crc32(f"{key}/{n}".encode()))
    k = torch.randn(layers, n, 2, 8, generator=g).to(dtype)  # [layers, tokens, kv_heads, head_dim]
    return FactKV(key, list(range(100, 100 + n)), k, -k, fp)


def _same(a: FactKV, b: FactKV) -> bool:
    return torch.equal(a.k, b.k) and torch.equal(a.v, b.v) and a.token_ids == b.token_ids


def _tiered(tmp_path, host_entries: int, device_entries: int, n: int = 3) -> KVStore:
    """A store whose host tier holds ``host_entries`` and device pool ``device_entries``
    entries of ``n`` tokens (the device tier runs on CPU: same logic, no GPU)."""
    one = _entry("x", n)
    region = DeviceTier(0, "cpu").region_size(one)  # K and V, each aligned
    return KVStore(
        tmp_path, host_entries * one.nbytes, gpu_bytes=device_entries * region, device="cpu"
    )


# ---- the file tier ----
def test_put_get_round_trip(tmp_path):
    store = KVStore(tmp_path)
    entry = _entry("f-abc")
    store.put(entry)
    fresh = KVStore(tmp_path)  # another process opening the same folder
    header = fresh.header("f-abc")
    assert header.token_ids == (100, 101, 102)
    assert header.fingerprint == "fp1"
    assert header.shape == (2, 3, 2, 8)
    assert header.nbytes == entry.nbytes
    got = fresh.get("f-abc")
    assert torch.equal(got.k, entry.k) and torch.equal(got.v, entry.v)


def test_missing_entry(tmp_path):
    with pytest.raises(EntryMissingError):
        KVStore(tmp_path).header("nope")
    store = KVStore(tmp_path)
    with pytest.raises(EntryMissingError):
        store.get("nope")
    assert store.stats().misses == 1


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


def test_crashed_writers_temporary_files_are_swept(tmp_path):
    old, fresh = tmp_path / ".tmp-old.safetensors", tmp_path / ".tmp-new.safetensors"
    old.write_bytes(b"half")
    fresh.write_bytes(b"being written")
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    store = KVStore(tmp_path)
    assert not old.exists() and fresh.exists()  # a live writer's file stays
    assert store.keys() == []


def test_memory_cache_is_bounded(tmp_path):
    one = _entry("f-1", n=4)
    store = KVStore(tmp_path, host_bytes=one.nbytes + 1)
    store.put(one)
    store.put(_entry("f-2", n=4))
    store.get("f-1")
    store.get("f-2")
    assert store.stats().tiers["host"].bytes <= one.nbytes + 1


def test_stack_entries_concatenates_tokens():
    k, v = stack_entries([_entry("a", 2), _entry("b", 3)])
    assert k.shape == (2, 5, 2, 8) and v.shape == (2, 5, 2, 8)


# ---- tiers: LRU, budgets, promotion, demotion ----
def test_host_tier_lru_order_budget_and_promotion_on_get(tmp_path):
    store = _tiered(tmp_path, host_entries=2, device_entries=0)
    assert store.device_tier is None  # a zero-byte pool is no tier
    a, b, c = _entry("a"), _entry("b"), _entry("c")
    store.put(a)
    store.put(b)
    assert store.host_tier.keys() == ["a", "b"]  # least recently used first
    assert _same(store.get("a"), a)  # a becomes the most recent
    store.put(c)
    assert store.host_tier.keys() == ["a", "c"]  # b was the LRU, evicted (its file stays)
    assert store.host_tier.used == 2 * a.nbytes <= store.host_tier.budget
    assert store.where("b") == ["disk"]
    assert _same(store.get("b"), b)  # from disk, promoted to host RAM
    assert store.where("b") == ["host", "disk"]
    assert store.host_tier.keys() == ["c", "b"]
    hits = store.stats().tiers
    assert (hits["host"].hits, hits["disk"].hits) == (1, 1)


def test_prefetch_moves_entries_to_the_device_tier(tmp_path):
    store = _tiered(tmp_path, host_entries=4, device_entries=2)
    a, b = _entry("a"), _entry("b")
    store.put(a)
    store.put(b)
    report = store.prefetch(["a", "b", "a"])
    assert report.tier == "device" and report.moved == {"host": 2 * a.nbytes}
    assert store.device_tier.keys() == ["a", "b"]
    assert store.where("a") == ["device", "host", "disk"]
    got = store.get("a")
    assert _same(got, a)
    assert got.k.untyped_storage().data_ptr() == store.device_tier._pool.data_ptr()  # pool view
    again = store.prefetch(["b"])
    assert again.moved == {} and again.already == 1
    store.put(_entry("c"))  # not prefetched: not in the device pool
    tiers = store.fastest_tiers(["a", "c", "gone"])
    assert tiers["a"] == "device" and tiers["gone"] == "disk"
    assert tiers["c"] == store.where("c")[0] != "device"
    assert store.stats().tiers["device"].hits == 1

    cold = _tiered(tmp_path, host_entries=4, device_entries=2)  # another process: files only
    report = cold.prefetch(["b", "gone"])
    assert report.moved == {"disk": b.nbytes} and report.missing == ["gone"]
    assert cold.where("b") == ["device", "host", "disk"]


def test_device_lru_eviction_order_follows_get(tmp_path):
    store = _tiered(tmp_path, host_entries=8, device_entries=2)
    for key in "abc":
        store.put(_entry(key))
    store.prefetch(["a"])
    store.prefetch(["b"])
    store.get("a")  # a is now the most recent in the device tier
    store.prefetch(["c"])
    assert store.device_tier.keys() == ["a", "c"]  # b was evicted
    assert store.where("b") == ["host", "disk"]


def test_device_eviction_demotes_to_host_intact(tmp_path):
    store = _tiered(tmp_path, host_entries=2, device_entries=2)
    a, b, c, d = (_entry(key) for key in "abcd")
    store.put(a)
    store.put(b)
    store.prefetch(["a", "b"])
    store.put(c)
    store.put(d)  # host RAM now holds c, d only: a and b live in the pool (and on disk)
    assert store.where("a") == ["device", "disk"]
    store.prefetch(["c"])  # evicts a from the pool: demoted to host, copied out first
    assert store.where("a") == ["host", "disk"]
    assert store.device_tier.keys() == ["b", "c"]
    assert _same(store.get("a"), a)  # not overwritten by c, which reused a's region
    assert _same(store.get("c"), c)
    assert store.stats().tiers["disk"].hits == 0  # nothing was lost to disk


def test_prefetched_set_never_evicts_itself(tmp_path):
    store = _tiered(tmp_path, host_entries=8, device_entries=2)
    for key in "abc":
        store.put(_entry(key))
    report = store.prefetch(["a", "b", "c"])
    assert report.skipped == ["c"] and store.device_tier.keys() == ["a", "b"]
    assert store.where("c") == ["host", "disk"]  # still served, from host RAM
    assert all(_same(store.get(key), _entry(key)) for key in "abc")


def test_entry_bigger_than_a_tier_is_served_from_the_next(tmp_path):
    small, big = _entry("small", n=2), _entry("big", n=8)
    store = KVStore(tmp_path, host_bytes=small.nbytes, gpu_bytes=1 << 20, device="cpu")
    store.put(small)
    store.put(big)
    assert store.where("big") == ["disk"]  # too big for host RAM
    assert _same(store.get("big"), big) and _same(store.get("big"), big)
    assert store.stats().tiers["disk"].hits == 2
    report = store.prefetch(["big"])  # straight from disk to the pool, skipping host RAM
    assert report.moved == {"disk": big.nbytes}
    assert store.where("big") == ["device", "disk"]

    pool_too_small = KVStore(tmp_path, gpu_bytes=small.nbytes, device="cpu")
    report = pool_too_small.prefetch(["big", "small"])
    assert report.skipped == ["big"] and pool_too_small.where("big") == ["host", "disk"]
    assert _same(pool_too_small.get("big"), big)
    assert pool_too_small.stats().tiers["host"].hits == 1


# ---- forget, fingerprints, stats ----
def test_delete_removes_from_every_tier_at_once(tmp_path):
    store = _tiered(tmp_path, host_entries=4, device_entries=2)
    store.put(_entry("a"))
    store.put(_entry("b"))
    store.prefetch(["a"])
    assert store.where("a") == ["device", "host", "disk"]
    assert store.delete("a")
    assert store.where("a") == [] and not (tmp_path / "a.safetensors").exists()
    with pytest.raises(EntryMissingError):
        store.get("a")
    with pytest.raises(EntryMissingError):
        store.header("a")
    stats = store.stats()
    assert stats.tiers["device"].entries == 0 and stats.tiers["device"].bytes == 0
    assert store.device_tier.allocator.free_bytes == store.device_tier.budget
    assert stats.tiers["host"].entries == stats.tiers["disk"].entries == 1
    assert not store.delete("a")


def test_forget_in_another_process_is_seen_by_the_scheduler(tmp_path):
    engine_side, app_side = KVStore(tmp_path), KVStore(tmp_path)
    app_side.put(_entry("a"))
    assert engine_side.header("a").fingerprint == "fp1"  # cached now
    app_side.delete("a")
    with pytest.raises(EntryMissingError):
        engine_side.header("a")  # so the scheduler refuses, instead of injecting it
    assert engine_side.where("a") == []


def _age_folder(path, seconds: float = 10.0) -> None:
    """Set the folder's mtime into the past, as it is between a store's writes."""
    then = time.time() - seconds
    os.utime(path, (then, then))


def test_header_reader_sees_a_forget_in_another_process(tmp_path):
    engine_side, app_side = KVStore(tmp_path), KVStore(tmp_path)
    app_side.put(_entry("a"))
    app_side.put(_entry("b"))
    _age_folder(tmp_path)
    read = engine_side.header_reader()
    a, b = read(["a", "b"])
    assert a.token_ids == b.token_ids == (100, 101, 102)
    app_side.delete("a")  # the folder's mtime moves on
    read = engine_side.header_reader()
    with pytest.raises(EntryMissingError, match="'a'"):
        read(["b", "a"])
    assert read(["b"])[0].fingerprint == "fp1"


def test_header_reader_trusts_an_unchanged_folder_and_never_a_racy_one(tmp_path, monkeypatch):
    store = KVStore(tmp_path)
    store.put(_entry("a"))
    _age_folder(tmp_path)
    store.header_reader()(["a"])  # seen: the file existed after the folder was statted
    checked = []  # the entry files statted (the folder's own stat is not counted)
    real_stat = os.stat

    def stat(path, *args, **kwargs):
        if str(path).endswith(".safetensors"):
            checked.append(path)
        return real_stat(path, *args, **kwargs)

    monkeypatch.setattr(os, "stat", stat)
    read = store.header_reader()
    assert read(["a"])[0].key == "a" and checked == []  # one folder stat, no file check
    os.utime(tmp_path)  # an mtime of now: a change in this tick could hide behind it
    read = store.header_reader()
    assert read(["a"])[0].key == "a" and len(checked) == 1


def test_header_reader_refuses_when_the_whole_folder_is_gone(tmp_path):
    store = KVStore(tmp_path / "kv")
    store.put(_entry("a"))
    store.header("a")  # cached
    shutil.rmtree(tmp_path / "kv")  # the user wiped the data folder under a running engine
    with pytest.raises(EntryMissingError):
        store.header_reader()(["a"])  # a refusal for the scheduler, not a crash


def test_get_many_is_get_for_each_key_in_order(tmp_path):
    store = _tiered(tmp_path, host_entries=1, device_entries=1)
    for key in ("a", "b", "c"):
        store.put(_entry(key))
    store.prefetch(["a"])  # a: device (and host, which held c); b, c: disk only
    got = store.get_many(["b", "a", "c", "a"])
    assert [e.key for e in got] == ["b", "a", "c", "a"]
    assert all(_same(e, _entry(e.key)) for e in got)
    tiers = store.stats().tiers
    assert (tiers["device"].hits, tiers["host"].hits, tiers["disk"].hits) == (2, 0, 2)
    with pytest.raises(FingerprintMismatchError):
        store.get_many(["a"], fingerprint="fp2")
    with pytest.raises(EntryMissingError):
        store.get_many(["a", "nope"])


def test_device_spans_locate_resident_entries_in_the_pool(tmp_path):
    store = _tiered(tmp_path, host_entries=4, device_entries=3)
    for key, n in (("a", 3), ("b", 5), ("c", 3)):
        store.put(_entry(key, n))
    assert store.device_spans(["a"]) is None  # nothing in the pool yet
    store.prefetch(["a", "b"])
    pool, spans, layout = store.device_spans(["b", "a"])
    assert layout == (torch.float32, 2, 2, 8)  # (dtype, layers, kv_heads, head_dim)
    for (k_at, v_at, tokens), key in zip(spans.tolist(), ["b", "a"], strict=True):
        views = store.get(key)
        assert k_at == views.k.data_ptr() - pool.data_ptr()
        assert v_at == views.v.data_ptr() - pool.data_ptr()
        assert tokens == views.k.shape[1]
        stored = pool[k_at : k_at + views.k.numel() * 4].view(torch.float32).view(views.k.shape)
        assert torch.equal(stored, _entry(key, tokens).k)  # the bytes a kernel would read
    assert store.device_tier.keys()[-1] == "a"  # marked recently used, in order
    assert store.device_spans(["a", "c"]) is None  # c is not resident: read it with get
    assert store.stats().tiers["device"].hits == 4  # two spans + the two gets above


def test_device_spans_refuse_mixed_layouts_and_other_models(tmp_path):
    store = _tiered(tmp_path, host_entries=4, device_entries=3)
    store.put(_entry("a"))
    store.put(_entry("h", dtype=torch.bfloat16))
    store.prefetch(["a", "h"])
    assert store.device_spans(["a", "h"]) is None  # one kernel reads one dtype
    assert store.device_spans(["h"])[2][0] is torch.bfloat16
    other = KVStore(tmp_path / "other", gpu_bytes=1 << 20, device="cpu", fingerprint="fp2")
    other.device_tier.place(_entry("x"), set(), lambda key, views: None)  # fp1 in an fp2 store
    assert other.device_spans(["x"]) is None  # so the load goes through get, which raises


def test_mixed_spans_locate_codes_and_scales_of_compressed_entries():
    tier = DeviceTier(1 << 20, "cpu")
    keep: set[str] = set()
    prefix = _entry("prefix-p", 4)
    facts = {key: quantize(_entry(key, n), "int4") for key, n in (("a", 3), ("b", 5))}
    for entry in (prefix, *facts.values()):
        assert tier.place(entry, keep, lambda key, views: None)
    keys = ["b", "prefix-p", "a"]
    assert tier.spans(keys) is None  # the plain kernel reads no codes
    found = tier.mixed_spans(keys)
    assert found.plain == (torch.float32, 2, 2, 8)
    assert found.packed == ("int4", torch.uint8, torch.float16, 2, 2, 8, 1, 0)  # 8 channels:
    pool = found.pool  # none in 8 bits (test_kv_quant: the widest eighth of 16 and more)
    for row, key in zip(found.rows.tolist(), keys, strict=True):
        k_at, v_at, tokens, compressed, ks, kz, vs, vz, kf, kl = row
        assert (kf, kl) == (-1, -1)
        views = tier.get(key)
        base = pool.data_ptr()
        assert (k_at, v_at) == (views.k.data_ptr() - base, views.v.data_ptr() - base)
        assert tokens == views.k.shape[1] and compressed == (key != "prefix-p")
        if compressed:  # the bytes the kernel reads are the entry's codes and scales
            q = views.quant
            scales = (q.k_scale, q.k_zero, q.v_scale, q.v_zero)
            assert (ks, kz, vs, vz) == tuple(t.data_ptr() - base for t in scales)
            codes = pool[k_at : k_at + views.k.numel()].view(views.k.shape)
            assert torch.equal(codes, facts[key].k)
        else:
            assert (ks, kz, vs, vz) == (0, 0, 0, 0)
    assert tier.keys()[-3:] == keys  # marked recently used, in order
    assert tier.mixed_spans(["prefix-p"]) is None  # nothing compressed: spans() reads it
    assert tier.place(quantize(_entry("c"), "fp8"), keep, lambda key, views: None)
    assert tier.mixed_spans(["a", "c"]) is None  # one scheme a launch
    assert tier.mixed_spans(["a", "nope"]) is None  # not resident: staged through get
    assert tier.mixed_spans(["a"], fingerprint="fp2") is None


def test_fingerprint_mismatch_raises_from_every_tier(tmp_path):
    store = _tiered(tmp_path, host_entries=4, device_entries=2)
    store.put(_entry("a"))
    store.put(_entry("b"))
    store.prefetch(["a"])
    for key in ("a", "b"):  # device tier, host tier
        with pytest.raises(FingerprintMismatchError, match="another|belongs to model 'fp1'"):
            store.get(key, fingerprint="fp2")
        assert store.get(key, fingerprint="fp1").fingerprint == "fp1"
    guarded = KVStore(tmp_path, fingerprint="fp2")  # disk tier, store-wide expectation
    with pytest.raises(FingerprintMismatchError) as info:
        guarded.get("a")
    assert (info.value.found, info.value.expected) == ("fp1", "fp2")
    with pytest.raises(FingerprintMismatchError):
        guarded.put(_entry("c"))  # another model's KV is not written either
    assert not guarded.has("c")


def test_stats_bytes_per_token_and_per_tier(tmp_path):
    layers, n = 3, 5
    store = KVStore(tmp_path, gpu_bytes=1 << 20, device="cpu")
    entries = [_entry(key, n=n, layers=layers, dtype=torch.bfloat16) for key in ("a", "b")]
    for entry in entries:
        store.put(entry)
    store.prefetch(["a"])
    store.get("a")
    stats = store.stats()
    per_token = layers * 2 * 2 * 8 * 2  # layers * (K+V) * kv_heads * head_dim * bf16 bytes
    assert stats.bytes_per_token == per_token == 192
    assert stats.mean_bytes_per_fact == n * per_token == entries[0].nbytes
    assert stats.tokens == 2 * n
    assert list(stats.tiers) == ["device", "host", "disk"]
    device, host, disk = stats.tiers.values()
    assert (device.entries, device.hits, device.budget) == (1, 1, 1 << 20)
    assert device.bytes == store.device_tier.region_size(entries[0]) >= entries[0].nbytes
    assert (host.entries, host.bytes) == (2, 2 * entries[0].nbytes)
    assert disk.entries == 2 and disk.budget is None
    assert disk.bytes == sum(p.stat().st_size for p in tmp_path.glob("*.safetensors"))


# ---- the device pool's allocator, shared stores, CPU defaults ----
def test_extent_allocator_first_fit_and_coalescing():
    alloc = ExtentAllocator(1024 + 100, align=256)
    assert alloc.capacity == 1024
    offsets = [alloc.alloc(200) for _ in range(4)]
    assert offsets == [0, 256, 512, 768] and alloc.alloc(1) is None
    alloc.free(256, 200)
    alloc.free(768, 256)
    assert alloc.alloc(300) is None  # 512 free, but in two pieces
    alloc.free(512, 1)  # merges with both neighbours
    assert alloc.free_bytes == 768 and alloc.alloc(700) == 256
    alloc.free(0, 10)
    with pytest.raises(ValueError, match="double free"):
        alloc.free(0, 10)


def test_no_device_tier_without_cuda(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("CUDA is available: the default device tier is the GPU pool")
    assert KVStore(tmp_path, gpu_bytes=1 << 20).device_tier is None
    with pytest.raises(ValueError, match="CUDA"):
        KVStore(tmp_path, gpu_bytes=1 << 20, device="cuda")


def test_entry_files_are_private_and_temp_files_of_a_crashed_writer_are_swept(tmp_path):
    store = KVStore(tmp_path)
    path = store.put(_entry("a"))
    assert path.stat().st_mode & 0o777 == 0o600
    stale = tmp_path / ".tmp-crashed.safetensors"
    stale.write_bytes(b"half")
    old = time.time() - 7200
    os.utime(stale, (old, old))
    fresh = tmp_path / ".tmp-writing.safetensors"
    fresh.write_bytes(b"in progress")
    KVStore(tmp_path)  # opening sweeps what a crashed writer left, not what is being written
    assert not stale.exists() and fresh.exists()
    assert KVStore(tmp_path).keys() == ["a"]


# ---- threads: the encoder puts while the engine reads ----
def test_concurrent_put_and_get_keep_data_and_accounting(tmp_path):
    keys = [f"k{i}" for i in range(10)]
    truth = {key: _entry(key, n=2 + i % 4) for i, key in enumerate(keys)}
    store = KVStore(tmp_path, host_bytes=4 * truth["k0"].nbytes, gpu_bytes=8 << 10, device="cpu")
    errors: list[BaseException] = []
    stop = time.monotonic() + 1.0
    counts = {"put": 0, "get": 0}

    def encoder() -> None:
        rng = random.Random(1)
        while time.monotonic() < stop:
            key = rng.choice(keys)
            if rng.random() < 0.2:
                store.delete(key)
            else:
                store.put(truth[key])
                counts["put"] += 1

    def engine() -> None:
        rng = random.Random(2)
        while time.monotonic() < stop:
            wanted = rng.sample(keys, 3)
            store.prefetch(wanted)
            for key in wanted:
                try:
                    got = store.get(key, fingerprint="fp1")
                except EntryMissingError:
                    continue
                if not _same(got, truth[key]):
                    raise AssertionError(f"{key} came back corrupted")
                counts["get"] += 1
            with contextlib.suppress(EntryMissingError):
                store.header(rng.choice(keys))

    def guarded(fn):
        def run() -> None:
            try:
                fn()
            except BaseException as exc:  # reported below
                errors.append(exc)

        return run

    threads = [threading.Thread(target=guarded(fn)) for fn in (encoder, engine)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    assert counts["put"] > 5 and counts["get"] > 5, counts
    host, device = store.host_tier, store.device_tier
    in_host, in_device = host.keys(), device.keys()
    assert host.used == sum(host.get(k).nbytes for k in in_host) <= host.budget
    assert device.used == sum(device._entries[k].size for k in in_device) <= device.budget
    assert device.allocator.free_bytes == device.budget - device.used
    on_disk = set(store.keys())
    assert set(in_host) <= on_disk and set(in_device) <= on_disk
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".tmp-")]
    for key in on_disk:
        assert _same(store.get(key), truth[key])


def test_demote_leaves_entries_on_the_asked_tier_only(tmp_path):
    store = _tiered(tmp_path, host_entries=4, device_entries=2)
    a, b = _entry("a"), _entry("b")
    store.put(a)
    store.put(b)
    store.prefetch(["a", "b"])
    assert store.demote(["a", "b"], "disk") == a.nbytes + b.nbytes
    assert store.where("a") == store.where("b") == ["disk"]
    assert store.demote(["a"], "host") == a.nbytes
    assert store.where("a") == ["host", "disk"]
    assert _same(store.get("a"), a)
    with pytest.raises(ValueError, match="demote to"):
        store.demote(["a"], "device")


def test_prefetch_reads_cold_files_together_and_reports_the_bad_ones(tmp_path):
    writer = KVStore(tmp_path)
    for i in range(6):
        writer.put(_entry(f"k{i}", n=4 + i))
    (tmp_path / "k2.safetensors").unlink()  # deleted under the reader
    damaged = tmp_path / "k4.safetensors"
    data = bytearray(damaged.read_bytes())
    data[-3] ^= 0xFF  # one flipped byte in the last tensor
    damaged.write_bytes(bytes(data))
    store = KVStore(tmp_path, host_bytes=1 << 20)  # a fresh process: nothing read yet
    report = store.prefetch([f"k{i}" for i in range(6)])  # five files read at once
    assert sorted(report.missing) == ["k2", "k4"] and report.moved["disk"] > 0
    assert store.lost() == ["k4"] and not damaged.exists()  # set aside, to be encoded again
    for i in (0, 1, 3, 5):
        assert store.where(f"k{i}") == ["host", "disk"]
        assert _same(store.get(f"k{i}"), _entry(f"k{i}", n=4 + i))


def test_a_pool_first_filled_inside_inference_mode_takes_copies_outside_it(tmp_path):
    """The worker's first load runs inside vLLM's inference mode and makes the pool; the
    session's prefetch then copies in from a plain thread (an inference tensor refuses that:
    seen on the H200)."""
    store = _tiered(tmp_path, host_entries=4, device_entries=3)
    for key in ("in-worker", "prefetched"):
        store.put(_entry(key))
    with torch.inference_mode():
        store.prefetch(["in-worker"])
    store.prefetch(["prefetched"])  # from the host tier: one region, one copy into the pool
    assert _same(store.get("prefetched"), _entry("prefetched"))
    assert store.device_spans(["in-worker", "prefetched"]) is not None
