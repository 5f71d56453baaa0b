"""The vector indexes on a CUDA GPU: CAGRA against brute force, and the exact fallback."""

from __future__ import annotations

import logging

import pytest
import torch

from inferscale_core import vector_index
from inferscale_core.vector_index import CagraIndex, ExactIndex, IndexUnavailableError, make_index
from tests.unit.test_vector_index import DIM, unit


def test_cagra_index_on_the_gpu():
    pytest.importorskip("cuvs.neighbors.cagra", reason="CAGRA needs cuVS (cuvs-cu12/cuvs-cu13)")
    n, dim, k = 30_000, 64, 10
    # Clustered, like real embeddings: uniform random vectors are every graph index's worst case
    # (recall 0.87 at itopk 64 here, where brute force is exact).
    g = torch.Generator().manual_seed(3)
    centers = torch.randn(300, dim, generator=g)  # [300, dim]
    data = centers[torch.randint(0, 300, (n,), generator=g)] + 0.3 * torch.randn(
        n, dim, generator=g
    )
    data = data / data.norm(dim=1, keepdim=True)  # [n, dim]
    index = make_index(dim, "cuda", size_hint=n, cagra_threshold=n)
    assert isinstance(index, CagraIndex)
    index.add(list(range(n)), data)
    assert index._graph is not None
    queries = (data[:200] + 0.05 * unit(200, dim, seed=4)).cuda()
    queries = queries / queries.norm(dim=1, keepdim=True)  # [200, dim]

    def recall(stored_ids: set[int]) -> float:
        ids = torch.tensor(sorted(stored_ids))
        exact = ExactIndex(dim, "cuda")
        exact.add(ids.tolist(), data[ids])
        got, want = index.search(queries, k), exact.search(queries, k)
        for g in got:  # scores best first, never a removed id
            assert [s for _, s in g] == sorted((s for _, s in g), reverse=True)
            assert {fid for fid, _ in g} <= stored_ids
        hits = sum(
            len({f for f, _ in g} & {f for f, _ in w}) for g, w in zip(got, want, strict=True)
        )
        return hits / (k * len(queries))

    alive = set(range(n))
    assert recall(alive) > 0.9
    gone = set(range(0, n, 3))  # a third removed: filtered by the bitset, then rebuilt
    index.remove(sorted(gone))
    alive -= gone
    assert recall(alive) > 0.9
    assert all(fid not in index for fid in gone)
    index.add([n + i for i in range(500)], unit(500, dim, seed=5))  # cagra.extend
    assert len(index) == len(alive) + 500


def test_make_index_on_cuda_falls_back_to_exact_without_cuvs(monkeypatch, caplog):
    def missing(device):
        raise IndexUnavailableError("no cuVS here")

    monkeypatch.setattr(vector_index, "_load_cuvs", missing)
    assert isinstance(make_index(DIM, "cuda", size_hint=100), ExactIndex)  # below threshold
    with caplog.at_level(logging.WARNING, logger="inferscale_core.vector_index"):
        index = make_index(DIM, "cuda", size_hint=10**6)
    assert isinstance(index, ExactIndex) and index.device.type == "cuda"
    assert "no cuVS here" in caplog.text
