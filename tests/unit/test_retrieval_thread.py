"""The retrieval thread: one per process, one OpenMP thread there and nowhere else, and a
forked child gets a thread of its own instead of waiting on the parent's."""

from __future__ import annotations

import ctypes
import multiprocessing
import threading

import pytest
import torch

from inferscale_core.retrieval_thread import submit

HAS_OMP = hasattr(ctypes.CDLL(None), "omp_set_num_threads")


def test_one_thread_for_the_process_and_no_deadlock_on_it():
    first = submit(threading.current_thread).result()
    assert first is not threading.current_thread()
    assert first.name.startswith("inferscale-retrieval")
    assert submit(threading.current_thread).result() is first
    # work that submits more work from the thread runs it there at once
    nested = submit(lambda: submit(threading.current_thread).result(timeout=5)).result(10)
    assert nested is first
    with pytest.raises(ZeroDivisionError):
        submit(lambda: submit(lambda: 1 / 0).result()).result(10)


@pytest.mark.skipif(not HAS_OMP, reason="this PyTorch's OpenMP runtime has no visible symbol")
def test_torch_runs_one_openmp_thread_there_only():
    here = torch.get_num_threads()
    assert submit(torch.get_num_threads).result() == 1
    assert torch.get_num_threads() == here  # this thread keeps its count
    later: list[int] = []  # and a thread started afterwards gets PyTorch's default
    thread = threading.Thread(target=lambda: later.append(torch.get_num_threads()))
    thread.start()
    thread.join()
    assert later == [here]


def _child(queue) -> None:
    queue.put(submit(lambda: 41 + 1).result(timeout=30))


def test_a_forked_child_starts_its_own_thread():
    submit(lambda: None).result()  # the parent's thread exists
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_child, args=(queue,))
    child.start()
    child.join(60)
    assert child.exitcode == 0
    assert queue.get(timeout=5) == 42
