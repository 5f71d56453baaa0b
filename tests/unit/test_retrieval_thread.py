"""The retrieval thread: one per runtime, shared by the retrievers it makes, one OpenMP thread
there and nowhere else, and a forked child gets a thread of its own instead of waiting on the
parent's."""

from __future__ import annotations

import ctypes
import multiprocessing
import threading

import pytest
import torch

from inferscale_core.retrieval_thread import RetrievalThread

HAS_OMP = hasattr(ctypes.CDLL(None), "omp_set_num_threads")


def test_one_thread_per_owner_and_no_deadlock_on_it():
    retrieval = RetrievalThread()
    first = retrieval.submit(threading.current_thread).result()
    assert first is not threading.current_thread()
    assert first.name.startswith("inferscale-retrieval")
    assert retrieval.submit(threading.current_thread).result() is first
    # work that submits more work from the thread runs it there at once
    nested = retrieval.submit(
        lambda: retrieval.submit(threading.current_thread).result(timeout=5)
    ).result(10)
    assert nested is first
    with pytest.raises(ZeroDivisionError):
        retrieval.submit(lambda: retrieval.submit(lambda: 1 / 0).result()).result(10)
    # another owner has a thread of its own; closing one lets its thread end
    other = RetrievalThread()
    second = other.submit(threading.current_thread).result()
    assert second is not first
    retrieval.close()
    first.join(10)
    assert not first.is_alive()
    assert other.submit(threading.current_thread).result() is second
    assert retrieval.submit(threading.current_thread).result() is not first  # starts anew
    other.close()
    retrieval.close()


@pytest.mark.skipif(not HAS_OMP, reason="this PyTorch's OpenMP runtime has no visible symbol")
def test_torch_runs_one_openmp_thread_there_only():
    retrieval = RetrievalThread()
    here = torch.get_num_threads()
    assert retrieval.submit(torch.get_num_threads).result() == 1
    assert torch.get_num_threads() == here  # this thread keeps its count
    later: list[int] = []  # and a thread started afterwards gets PyTorch's default
    thread = threading.Thread(target=lambda: later.append(torch.get_num_threads()))
    thread.start()
    thread.join()
    assert later == [here]
    retrieval.close()


def _child(retrieval: RetrievalThread, queue) -> None:
    queue.put(retrieval.submit(lambda: 41 + 1).result(timeout=30))


def test_a_forked_child_starts_its_own_thread():
    retrieval = RetrievalThread()
    retrieval.submit(lambda: None).result()  # the parent's thread exists
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_child, args=(retrieval, queue))
    child.start()
    child.join(60)
    assert child.exitcode == 0
    assert queue.get(timeout=5) == 42
    retrieval.close()
