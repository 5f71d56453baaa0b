"""Threads that run torch with one OpenMP thread each (inferscale_core/openmp_threads.py), as
the CPU load uses them: the same bytes as one thread writes, in the caller's inference mode,
groups balanced by weight, an error handed back, and the caller's thread count untouched."""

from __future__ import annotations

import ctypes
import threading

import pytest
import torch

from inferscale_core.kvstore.quant import dequantize_into, quantize
from inferscale_core.openmp_threads import SplitThreads, split
from inferscale_core.types import FactKV

HAS_OMP = hasattr(ctypes.CDLL(None), "omp_set_num_threads")


def _entries(count: int) -> list[FactKV]:
    gen = torch.Generator().manual_seed(3)
    out = []
    for i in range(count):
        tokens = 5 + 7 * (i % 4)
        k = torch.randn(3, tokens, 2, 32, generator=gen)
        k[..., 5] *= 20  # an outlier channel
        v = torch.randn(3, tokens, 2, 32, generator=gen)
        plain = FactKV(f"f{i}", list(range(tokens)), k, v, "fp", origin=0)
        out.append(plain if i % 3 == 0 else quantize(plain, "int4" if i % 3 == 1 else "fp8"))
    return out


def _jobs(entries, k_out, v_out):
    """Each entry but its first token into the next slice of the outputs."""
    jobs, at = [], 0
    for entry in entries:
        n = entry.k.shape[1] - 1
        jobs.append((entry, 1, n + 1, k_out[:, at : at + n], v_out[:, at : at + n]))
        at += n
    return jobs


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_threads_write_what_one_thread_writes(threads):
    entries = _entries(11)
    total = sum(e.k.shape[1] - 1 for e in entries)
    expected_k, expected_v = torch.zeros(3, total, 2, 32), torch.zeros(3, total, 2, 32)
    for job in _jobs(entries, expected_k, expected_v):
        dequantize_into(*job)
    split_threads = SplitThreads(threads)
    with torch.inference_mode():  # as vLLM's step runs: its scratch is an inference tensor
        k_out, v_out = torch.full((3, total, 2, 32), 7.0), torch.full((3, total, 2, 32), 7.0)
        jobs = _jobs(entries, k_out, v_out)
        split_threads.map(lambda job: dequantize_into(*job), jobs, [j[2] - j[1] for j in jobs])
    assert torch.equal(k_out, expected_k) and torch.equal(v_out, expected_v)
    split_threads.close()


def test_an_error_in_a_part_reaches_the_caller():
    def part(i: int) -> None:
        if i == 5:
            raise ValueError("part 5")

    with pytest.raises(ValueError, match="part 5"):
        SplitThreads(2).map(part, range(8))


@pytest.mark.skipif(not HAS_OMP, reason="this PyTorch's OpenMP runtime has no visible symbol")
def test_each_thread_runs_one_openmp_thread_and_the_caller_keeps_its_count():
    here = torch.get_num_threads()
    seen: dict[str, int] = {}

    def record(_: int) -> None:
        seen[threading.current_thread().name] = torch.get_num_threads()

    SplitThreads(2).map(record, range(6))
    assert seen and all(name.startswith("inferscale-split") for name in seen)
    assert set(seen.values()) == {1}
    assert torch.get_num_threads() == here


def test_groups_are_balanced_by_weight_and_keep_the_order():
    weights = [9, 1, 4, 4, 7, 2, 3, 8]
    groups = split(list(range(8)), weights, 3)
    assert sorted(i for g in groups for i in g) == list(range(8))
    assert all(g == sorted(g) for g in groups)
    loads = [sum(weights[i] for i in g) for g in groups]
    assert max(loads) - min(loads) <= max(weights)
    assert split([0], [1], 3) == [[0], [], []]
