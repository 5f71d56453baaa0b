"""The process's one thread for a search's torch work: the question's embedding and the vector
search, run beside the keyword search (SQLite) on the caller's thread.

It runs its torch ops with one OpenMP thread. PyTorch's OpenMP (libgomp) keeps one team of
threads per thread that calls it, and once a process's OpenMP threads outnumber its cores it
stops spinning between parallel regions and sleeps instead: then every one of MiniLM's ~100
small ops pays a wake-up. Measured on the 2-vCPU AMD EPYC, one question in int8: 2.4 ms from
one thread; 7.3-8.0 ms from either thread once a second thread had used a team of two. One
OpenMP thread here adds no team (2.5-3.4 ms a question, on a core of its own while SQLite runs
on the other).

The thread count is set with ``omp_set_num_threads`` on this thread only (PyTorch's
``set_num_threads`` would also change the default of every thread started later); where the
OpenMP runtime's symbol is not found, the thread keeps PyTorch's default.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

import torch

logger = logging.getLogger(__name__)
T = TypeVar("T")

_pool: ThreadPoolExecutor | None = None
_lock = threading.Lock()
_local = threading.local()  # .is_it: True on the retrieval thread


def submit(fn: Callable[..., T], /, *args: Any) -> Future[T]:
    """Run ``fn(*args)`` on the retrieval thread (started on first use; one for the process:
    searches take turns on it). Called from that thread, it runs at once (no deadlock)."""
    if getattr(_local, "is_it", False):
        done: Future[T] = Future()
        try:
            done.set_result(fn(*args))
        except BaseException as e:  # handed to the caller, as the pool does
            done.set_exception(e)
        return done
    return _thread().submit(fn, *args)


def _thread() -> ThreadPoolExecutor:
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(
                1, thread_name_prefix="inferscale-retrieval", initializer=_one_openmp_thread
            )
        return _pool


def _one_openmp_thread() -> None:
    _local.is_it = True
    torch.get_num_threads()  # PyTorch's per-thread setup first: it would undo what follows
    set_threads = getattr(ctypes.CDLL(None), "omp_set_num_threads", None)
    if set_threads is None:
        logger.info(
            "no omp_set_num_threads in this process: the retrieval thread keeps %d",
            torch.get_num_threads(),
        )
        return
    set_threads(1)


def _forget() -> None:
    """In a forked child: the parent's thread is not there; the next search starts one."""
    global _pool, _lock
    _pool, _lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget)
