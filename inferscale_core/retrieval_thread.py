"""The thread for a search's torch work: the question's embedding and the vector search, run
beside the keyword search (SQLite) on the caller's thread.

It runs its torch ops with one OpenMP thread. PyTorch's OpenMP (libgomp) keeps one team of
threads per thread that calls it, and once a process's OpenMP threads outnumber its cores it
stops spinning between parallel regions and sleeps instead: then every one of MiniLM's ~100
small ops pays a wake-up. Measured on the 2-vCPU AMD EPYC, one question in int8: 2.4 ms from
one thread; 7.3-8.0 ms from either thread once a second thread had used a team of two. One
OpenMP thread here adds no team (2.5-3.4 ms a question, on a core of its own while SQLite runs
on the other).

The thread count is set on this thread only (:mod:`inferscale_core.openmp_threads`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from inferscale_core.openmp_threads import OpenMPPool, one_openmp_thread

T = TypeVar("T")

_local = threading.local()  # .is_it: True on a retrieval thread


class RetrievalThread:
    """One thread for searches' torch work, started on first use; the searches that share it
    take turns on it. The runtime that holds an engine owns one (``wiring.Assistant``) and
    hands it to every retriever it makes; a retriever made alone gets its own."""

    def __init__(self) -> None:
        self._pool = OpenMPPool("inferscale-retrieval", _one_openmp_thread)

    def submit(self, fn: Callable[..., T], /, *args: Any) -> Future[T]:
        """Run ``fn(*args)`` on the thread. Called from a retrieval thread, it runs at once
        (no deadlock)."""
        if getattr(_local, "is_it", False):
            done: Future[T] = Future()
            try:
                done.set_result(fn(*args))
            except BaseException as e:  # handed to the caller, as the pool does
                done.set_exception(e)
            return done
        return self._pool.get(1).submit(fn, *args)

    def close(self) -> None:
        """Let the thread end once its queued work is done (a later submit starts a new one)."""
        self._pool.close()


def _one_openmp_thread() -> None:
    _local.is_it = True
    one_openmp_thread()
