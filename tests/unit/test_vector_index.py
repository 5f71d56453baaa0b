"""Vector indexes against brute force: upserts, removes, k beyond the size, empty indexes.

ExactIndex runs here (and on CUDA when there is one). The real CagraIndex needs CUDA and cuVS
and is marked ``gpu``; its bookkeeping (append-only rows, the deletion bitset, extend and
rebuild) is also checked here against a brute-force stand-in for ``cuvs.neighbors.cagra``.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from inferscale_core import vector_index
from inferscale_core.cpu_features import native_bfloat16
from inferscale_core.vector_index import (
    CagraIndex,
    ExactIndex,
    IndexUnavailableError,
    VectorIndex,
    make_index,
)

DIM = 16
HAS_CUDA = torch.cuda.is_available()
DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=[pytest.mark.gpu, pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")],
    ),
]


def unit(n: int, dim: int = DIM, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    v = torch.randn(n, dim, generator=g)  # [n, dim]
    return v / v.norm(dim=1, keepdim=True)


def brute(stored: dict[int, torch.Tensor], queries: torch.Tensor, k: int):
    """Per query, the k best (id, score) of ``stored`` by inner product."""
    out = []
    for q in queries:
        scored = sorted(((float(v @ q), fid) for fid, v in stored.items()), reverse=True)
        out.append([(fid, s) for s, fid in scored[:k]])
    return out


def assert_same(got, want) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert [fid for fid, _ in g] == [fid for fid, _ in w]
        assert [s for _, s in g] == pytest.approx([s for _, s in w], abs=1e-5)


def assert_rows(index: VectorIndex, stored: dict[int, torch.Tensor]) -> None:
    """``index.vectors`` gives the stored rows of the ids it holds, in the order asked."""
    ids = [12345, *reversed(list(stored)[:6]), 3, 5]
    found, rows = index.vectors(ids)
    assert found == [fid for fid in ids if fid in stored]
    assert rows.dtype == torch.float32 and rows.device.type == "cpu"
    assert rows.shape == (len(found), DIM)
    for fid, row in zip(found, rows, strict=True):
        assert torch.equal(row, stored[fid].cpu())


def churn(index: VectorIndex, check) -> None:
    """Adds in batches (with repeats), upserts, removes (with unknown and repeated ids), and
    ``check(stored)`` after every step."""
    stored: dict[int, torch.Tensor] = {}
    vectors = unit(300, seed=1)

    def add(ids, rows):
        index.add(ids, vectors[rows])
        for fid, r in zip(ids, rows, strict=True):
            stored[fid] = vectors[r]
        check(stored)

    def remove(ids):
        index.remove(ids)
        for fid in ids:
            stored.pop(fid, None)
        check(stored)

    add(list(range(100)), list(range(100)))
    add([5, 7, 5], [200, 201, 202])  # upserts; within a batch the last one wins
    remove([3, 4, 99, 12345, 3])  # unknown and repeated ids are ignored
    add(list(range(100, 180)), list(range(100, 180)))
    remove(list(range(0, 60, 2)))
    add([0, 2, 4], [210, 211, 212])  # removed ids come back with new vectors
    for fid in range(150, 180):  # one by one, as the retriever adds facts
        add([fid + 1000], [fid + 100])
    remove(list(stored)[: len(stored) - 7])
    remove(list(stored))
    add([1, 2], [0, 1])


@pytest.mark.parametrize("device", DEVICES)
def test_exact_index_matches_brute_force(device):
    queries = unit(12, seed=2)
    index = ExactIndex(DIM, device, capacity=4)  # small, so it grows several times

    def check(stored):
        assert len(index) == len(stored)
        assert all(fid in index for fid in stored) and -1 not in index
        for k in (1, 5, len(stored) + 10):
            assert_same(index.search(queries, k), brute(stored, queries, k))
        assert_rows(index, stored)

    churn(index, check)


def test_a_bfloat16_scan_returns_float32s_result():
    """The scan's bound proves a result, else the float32 rows are scanned: either way the
    ids and float32 scores of brute force, through adds, upserts and removes."""
    queries = unit(12, seed=2)
    index = ExactIndex(DIM, "cpu", capacity=4, scan_dtype=torch.bfloat16)

    def check(stored):
        for k in (1, 5, len(stored) + 10):
            assert_same(index.search(queries, k), brute(stored, queries, k))

    churn(index, check)
    assert index.full_scans < 12 * 20  # most searches were proven from the scan


def test_near_ties_fall_back_to_the_float32_scan():
    """Rows whose scores differ below bfloat16's rounding (~1e-4 apart, eps 0.016): the bound
    cannot prove the scan's order, so the float32 rows decide."""
    dim, n, k = 384, 400, 5
    query = unit(1, dim, seed=3)  # [1, dim]
    rows = query + 0.05 * unit(n, dim, seed=4)  # [n, dim]: scores within ~1e-3 of each other
    rows = rows / rows.norm(dim=1, keepdim=True)
    spread = unit(2, dim, seed=5)  # and a query the rows are far from
    index = ExactIndex(dim, "cpu", scan_dtype=torch.bfloat16)
    index.add(list(range(n)), rows)
    stored = dict(enumerate(rows))
    assert_same(index.search(query, k), brute(stored, query, k))
    assert index.full_scans == 1
    other = unit(100, dim, seed=6)
    index.add(list(range(n, n + 100)), other)
    stored.update(zip(range(n, n + 100), other, strict=True))
    for q in (spread, other[:3] + 0.05 * unit(3, dim, seed=7)):
        assert_same(index.search(q, k), brute(stored, q, k))


def test_the_scan_dtype_is_checked():
    with pytest.raises(ValueError, match="scan_dtype"):
        ExactIndex(DIM, "cpu", scan_dtype=torch.int8)


@pytest.mark.parametrize("device", DEVICES)
def test_empty_index_and_bad_input(device):
    index = make_index(DIM, device)
    assert isinstance(index, ExactIndex) and isinstance(index, VectorIndex)
    assert len(index) == 0 and 1 not in index
    assert index.search(unit(3), 5) == [[], [], []]
    index.add([], torch.zeros(0, DIM))
    index.remove([1, 2])
    index.add([1], unit(1))
    assert index.search(unit(2), 0) == [[], []]
    with pytest.raises(ValueError):
        index.search(unit(1), -1)
    with pytest.raises(ValueError):
        index.search(unit(1)[0], 1)  # [dim], not [q, dim]
    with pytest.raises(ValueError):
        index.add([1, 2], unit(1))
    with pytest.raises(ValueError):
        index.add([1], torch.zeros(1, DIM + 1))


def test_make_index_is_exact_on_the_cpu_whatever_the_size():
    index = make_index(DIM, "cpu", size_hint=10**7)
    assert isinstance(index, ExactIndex)
    assert index.scan_dtype == (torch.bfloat16 if native_bfloat16() else None)
    with pytest.raises(IndexUnavailableError, match="CUDA"):
        CagraIndex(DIM, "cpu")


# -- CagraIndex ----------------------------------------------------------------------------


class _FakeGraph:
    def __init__(self, data: torch.Tensor) -> None:
        self.data = data.clone()  # [rows, dim]


class _BruteCagra:
    """Exact stand-in for ``cuvs.neighbors.cagra`` (same calls, same output conventions)."""

    SENTINEL = 2**32 - 1  # what CAGRA leaves in unfilled neighbor slots

    def __init__(self) -> None:
        self.builds = self.extends = 0

    IndexParams = SearchParams = ExtendParams = staticmethod(lambda **kw: kw)

    def build(self, params, dataset):
        assert params["metric"] == "inner_product"
        self.builds += 1
        return _FakeGraph(dataset)

    def extend(self, params, index, extended_dataset, new_start_row):
        # cuVS 26.10: the caller passes old + new rows; new ones start at the index's size.
        assert new_start_row == index.data.shape[0]
        self.extends += 1
        index.data = extended_dataset
        return index

    def search(self, params, index, queries, k, filter=None):
        scores = queries @ index.data.T  # [q, rows]
        if filter is not None:
            allowed = np.unpackbits(filter.view(np.uint8), bitorder="little")
            scores[:, ~torch.from_numpy(allowed[: scores.shape[1]].astype(bool))] = -math.inf
        values, rows = scores.topk(min(k, scores.shape[1]), dim=1)
        neighbors = np.full((queries.shape[0], k), self.SENTINEL, dtype=np.uint32)
        distances = np.full((queries.shape[0], k), np.inf, dtype=np.float32)
        for q in range(queries.shape[0]):
            ok = torch.isfinite(values[q])
            neighbors[q, : int(ok.sum())] = rows[q][ok].numpy()
            distances[q, : int(ok.sum())] = values[q][ok].numpy()
        return distances, neighbors


def test_cagra_bookkeeping_against_a_brute_force_stand_in(monkeypatch):
    cagra = _BruteCagra()
    fake = SimpleNamespace(
        cagra=cagra, filters=SimpleNamespace(from_bitset=lambda b: b), device_ndarray=lambda a: a
    )
    monkeypatch.setattr(vector_index, "_load_cuvs", lambda device: fake)
    index = CagraIndex(
        DIM, "cpu", rebuild_every=0.3, min_graph_rows=40, intermediate_graph_degree=8
    )
    queries = unit(12, seed=2)

    def check(stored):
        assert len(index) == len(stored)
        assert all(fid in index for fid in stored)
        if index._graph is not None:  # graph row r is our row r
            assert torch.equal(index._graph.data, index._data[: len(index._ids)])
        for k in (1, 5, len(stored) + 10):
            assert_same(index.search(queries, k), brute(stored, queries, k))
        assert_rows(index, stored)

    churn(index, check)
    assert cagra.builds >= 3 and cagra.extends >= 10
