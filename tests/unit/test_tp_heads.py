"""Tensor parallelism: which KV heads each rank holds (checked against vLLM's own
QKVParallelLinear), and entries stored with all heads serving and captured by any TP size:
a store written at TP=1 read at TP=2, a capture at TP=2 joined into one entry, and the
worker's load and capture for one rank of two on fake CPU layers."""

from __future__ import annotations

import zlib
from types import SimpleNamespace

import pytest
import torch

from inferscale_core.kvstore import KVStore, head_shards
from inferscale_core.load_plan import Piece
from inferscale_core.model_spec import ModelSpec
from inferscale_core.rope import shift
from inferscale_core.tp_heads import HeadShardingError, entry_heads, rank_heads, slice_heads
from inferscale_core.types import FactKV
from inferscale_core.vllm_plugin.paged_layouts import PagedLayout
from tests.support.paged_reference import gather_kv, scatter_kv

LAYERS, HEADS, DIM, BS = 2, 4, 16, 4


def _entry(key: str, n: int = 5, heads: int = HEADS, origin: int = 0) -> FactKV:
    g = torch.Generator().manual_seed(zlib.crc32(key.encode()))
    k = torch.randn(LAYERS, n, heads, DIM, generator=g)  # [layers, tokens, kv_heads, head_dim]
    v = torch.randn(LAYERS, n, heads, DIM, generator=g)
    return FactKV(key, list(range(100, 100 + n)), k, v, "fp1", origin)


# ---- which heads each rank holds ----
@pytest.mark.parametrize(
    ("size", "expected"),
    [
        (1, [(0, 8)]),
        (2, [(0, 4), (4, 8)]),
        (4, [(0, 2), (2, 4), (4, 6), (6, 8)]),
        (8, [(h, h + 1) for h in range(8)]),
    ],
)
def test_eight_heads_split_evenly(size, expected):
    got = [rank_heads(8, rank, size) for rank in range(size)]
    assert [(h.start, h.stop) for h in got] == expected
    assert all(h.replicas == 1 and h.writes for h in got)
    assert [h.full for h in got] == [size == 1] * size


def test_fewer_heads_than_ranks_are_replicated():
    got = [rank_heads(2, rank, 4) for rank in range(4)]
    assert [(h.start, h.stop) for h in got] == [(0, 1), (0, 1), (1, 2), (1, 2)]
    assert {h.replicas for h in got} == {2}
    assert [h.writes for h in got] == [True, False, True, False]  # each head captured once


@pytest.mark.parametrize(("heads", "size"), [(3, 2), (2, 3), (6, 4)])
def test_uneven_splits_are_refused(heads, size):
    with pytest.raises(HeadShardingError, match="evenly"):
        rank_heads(heads, 0, size)


def test_rank_outside_the_group_is_refused():
    with pytest.raises(HeadShardingError, match="rank 2 of tensor parallel size 2"):
        rank_heads(8, 2, 2)


def test_rule_is_vllms_qkv_parallel_linear(monkeypatch):
    """Load a checkpoint K projection whose rows say which head they belong to through
    vLLM's own QKVParallelLinear weight loader, as each rank would, and read the heads back."""
    import vllm.distributed.parallel_state as parallel_state  # noqa: TID251 - the oracle
    from vllm.config import VllmConfig, set_current_vllm_config  # noqa: TID251
    from vllm.model_executor.layers.linear import QKVParallelLinear  # noqa: TID251

    config = VllmConfig()
    head = 2
    for total, size in [(8, 2), (8, 4), (2, 4), (4, 4)]:
        for rank in range(size):
            group = SimpleNamespace(rank_in_group=rank, world_size=size)
            monkeypatch.setattr(parallel_state, "_TP", group)
            with set_current_vllm_config(config):
                layer = QKVParallelLinear(
                    4, head, max(total, size), total, bias=False, params_dtype=torch.float32
                )
            labels = torch.arange(total).repeat_interleave(head).float()  # [total * head]
            checkpoint = labels[:, None].expand(-1, 4).contiguous()  # k_proj [out, in]
            layer.weight.weight_loader(layer.weight, checkpoint, "k")
            at = layer.num_heads * head  # q rows come first in the fused weight
            loaded = layer.weight.data[at : at + layer.num_kv_heads * head, 0][::head]
            ours = rank_heads(total, rank, size)
            assert loaded.long().tolist() == list(range(ours.start, ours.stop)), (total, rank)
            assert layer.num_kv_head_replicas == ours.replicas


# ---- slicing an entry for a rank ----
def test_slice_is_a_view_and_all_heads_at_tp1():
    entry = _entry("f-a")
    assert entry_heads(entry, rank_heads(HEADS, 0, 1)) is entry
    half = slice_heads(entry.k, rank_heads(HEADS, 1, 2))
    assert half.shape == (LAYERS, 5, 2, DIM)
    assert half.data_ptr() == entry.k[:, :, 2].data_ptr()  # no copy
    with pytest.raises(HeadShardingError, match="not the 8 heads"):
        slice_heads(entry.k, rank_heads(8, 0, 2))


def test_store_written_at_tp1_read_at_tp2(tmp_path):
    entry = _entry("f-a")
    KVStore(tmp_path).put(entry)  # all heads, as an encode at TP=1 writes it
    stored = KVStore(tmp_path).get("f-a")  # another process: one rank's worker
    parts = [entry_heads(stored, rank_heads(HEADS, rank, 2)) for rank in range(2)]
    assert torch.equal(torch.cat([p.k for p in parts], dim=2), entry.k)
    assert torch.equal(torch.cat([p.v for p in parts], dim=2), entry.v)
    assert [p.nbytes for p in parts] == [entry.nbytes // 2] * 2
    assert [p.k.contiguous().nbytes for p in parts] == [entry.k.nbytes // 2] * 2  # a copy moves


def test_capture_at_tp2_is_one_entry_once_both_parts_are_in(tmp_path):
    entry = _entry("f-a", origin=7)
    ranks = [KVStore(tmp_path, fingerprint="fp1") for _ in range(2)]  # one per process
    first = entry_heads(entry, rank_heads(HEADS, 1, 2))
    assert ranks[1].put_heads(first, 2, HEADS) is None
    assert not ranks[0].has("f-a") and ranks[0].keys() == []  # a part is not an entry
    assert ranks[0].put_heads(entry_heads(entry, rank_heads(HEADS, 0, 2)), 0, HEADS)
    got = KVStore(tmp_path).get("f-a")
    assert torch.equal(got.k, entry.k) and torch.equal(got.v, entry.v) and got.origin == 7
    assert list(tmp_path.glob(f"{head_shards.PREFIX}*")) == []  # parts removed once joined
    assert KVStore(tmp_path).stats().tiers["disk"].entries == 1


def test_parts_of_one_key_do_not_mix_with_a_longer_key(tmp_path):
    store = KVStore(tmp_path)
    store.put_heads(entry_heads(_entry("f-a.b"), rank_heads(HEADS, 0, 2)), 0, HEADS)
    store.put_heads(entry_heads(_entry("f-a"), rank_heads(HEADS, 1, 2)), 2, HEADS)
    assert store.keys() == []


# ---- the worker, as rank 1 of 2, on fake CPU layers ----
class _FakeLayer:
    """One attention layer as the worker reads it: a paged cache of this rank's heads in the
    FLASH_ATTN layout, written by the plain-indexing reference (its ``do_kv_cache_update``)."""

    attn_backend = SimpleNamespace(get_name=lambda: "FLASH_ATTN")
    layout = PagedLayout.FUSED_HEADS

    def __init__(self, heads: int, blocks: int = 3) -> None:
        self.num_kv_heads, self.head_size = heads, DIM
        self.kv_cache = torch.zeros(blocks, heads, BS, 2 * DIM)  # FUSED_HEADS layout
        self.impl = self

    def do_kv_cache_update(self, layer, k, v, cache, slots) -> None:
        scatter_kv(cache, self.layout, k, v, slots, BS)

    def read(self, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return gather_kv(self.kv_cache, self.layout, slots, BS)  # [tokens, heads, dim] each


def _worker(monkeypatch, store: KVStore, rank: int, layer_heads: int = 2):
    pytest.importorskip("vllm")
    transformers = pytest.importorskip("transformers")
    from inferscale_core.vllm_plugin import worker_side

    config = transformers.LlamaConfig(
        vocab_size=97,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=HEADS,
        head_dim=DIM,
        rope_parameters={"rope_type": "default", "rope_theta": 1e4},
    )
    spec = ModelSpec.from_hf_config(config)
    layers = [(f"model.layers.{i}.self_attn.attn", _FakeLayer(layer_heads)) for i in range(2)]
    monkeypatch.setattr(worker_side, "attention_layers", lambda _: layers)
    vllm_config = SimpleNamespace(  # the fields of vLLM's config the worker reads
        cache_config=SimpleNamespace(block_size=BS, cache_dtype="auto"),
        model_config=SimpleNamespace(max_model_len=64, dtype=torch.float32),
    )
    worker = worker_side.InjectionWorker(vllm_config, store, spec, "auto", rank, 2)
    return worker, [layer for _, layer in layers], spec


def test_worker_rank1_of_2_loads_its_heads(tmp_path, monkeypatch):
    from inferscale_core.vllm_plugin.metadata import InjectionMetadata, LoadOp

    store = KVStore(tmp_path, fingerprint="fp1")
    entry = _entry("f-a", n=6)
    store.put(entry)
    worker, layers, spec = _worker(monkeypatch, store, rank=1)
    op = LoadOp("r", 0, 6, [Piece("f-a", 0, 6, 0, shift=3)], block_ids=[2, 0])
    worker.start_load_kv(InjectionMetadata(loads=[op]))
    assert worker.kv_write == "backend"  # the one-kernel writer reads every head
    slots = torch.as_tensor(op.slots(BS))
    for index, layer in enumerate(layers):
        k, v = layer.read(slots)
        expected_k = shift(entry.k[index, :, 2:4], 3, spec.rope(index))  # rank 1: heads 2, 3
        torch.testing.assert_close(k, expected_k, rtol=0, atol=1e-6)
        assert torch.equal(v, entry.v[index, :, 2:4])
    assert worker.stats.loads == 1 and worker.stats.tokens == 6


def test_worker_refuses_a_layer_that_is_not_its_share(tmp_path, monkeypatch):
    worker, _, _ = _worker(monkeypatch, KVStore(tmp_path), rank=1, layer_heads=HEADS)
    with pytest.raises(RuntimeError, match="holds 4 KV heads, but rank 1 of tensor parallel"):
        _ = worker.layers


def test_workers_of_tp2_capture_one_entry(tmp_path, monkeypatch):
    from inferscale_core.vllm_plugin.metadata import InjectionMetadata, SaveOp

    full = _entry("prompt", n=8)  # what the model computed, all heads, positions 0..7
    slots = torch.arange(8)  # blocks 0 and 1
    save = SaveOp("r", "f-cap", 2, 7, list(range(5)), block_ids=[0, 1])
    workers = []
    for rank in range(2):
        store = KVStore(tmp_path, fingerprint="fp1")  # each rank's process opens its own
        worker, layers, _ = _worker(monkeypatch, store, rank)
        for index, layer in enumerate(layers):
            mine = slice(2 * rank, 2 * rank + 2)
            scatter_kv(
                layer.kv_cache,
                layer.layout,
                full.k[index, :, mine],
                full.v[index, :, mine],
                slots,
                BS,
            )
        worker.save(InjectionMetadata(saves=[save]))
        workers.append(worker)
    reader = KVStore(tmp_path)
    assert reader.wait_for(["f-cap"], timeout=30) == []
    for worker in workers:
        worker._writer.close()
        assert worker.stats.captured == 1 and worker.stats.capture_errors == 0
    got = reader.get("f-cap")
    assert torch.equal(got.k, full.k[:, 2:7]) and torch.equal(got.v, full.v[:, 2:7])
    assert got.origin == 2 and got.token_ids == list(range(5))
    assert list(tmp_path.glob(f"{head_shards.PREFIX}*")) == []
