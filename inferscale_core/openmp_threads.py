"""Threads that run torch with one OpenMP thread each.

PyTorch's OpenMP (libgomp) keeps one team of threads per thread that calls it, and once a
process's OpenMP threads outnumber its cores it stops spinning between parallel regions and
sleeps instead: then every op that runs a parallel region pays a wake-up. A thread that runs
many small ops runs them with one OpenMP thread instead (:func:`one_openmp_thread`: the
retrieval thread does), and work that splits into independent parts runs them on
:class:`SplitThreads`, one part a thread, every core busy and no parallel region.

Measured on a 2-core Xeon inside vLLM's CPU engine (SmolLM2 fp32, k=50 int4 entries, `bench
tiers --tiers host`): expanding the 50 entries into the load's scratch (~20 torch ops an entry,
each over ~200k elements) took 115-145 ms with the engine's team of two, 91-102 ms on one
thread, and 50 ms for the same work in a process of its own with two.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import torch

log = logging.getLogger(__name__)
T = TypeVar("T")


def one_openmp_thread() -> bool:
    """Make the calling thread run torch ops with one OpenMP thread (``omp_set_num_threads``
    on this thread only; PyTorch's ``set_num_threads`` would change the default of every thread
    started later). False where the OpenMP runtime's symbol is not found: the thread keeps
    PyTorch's default."""
    torch.get_num_threads()  # PyTorch's per-thread setup first: it would undo what follows
    set_threads = getattr(ctypes.CDLL(None), "omp_set_num_threads", None)
    if set_threads is None:
        log.info("no omp_set_num_threads in this process: threads keep %d", torch.get_num_threads())
        return False
    set_threads(1)
    return True


class OpenMPPool:
    """A thread pool whose threads run torch with one OpenMP thread each (``initializer``,
    default :func:`one_openmp_thread`, runs on each), started on first :meth:`get`; a forked
    child starts its own (the parent's threads are not there, and its lock may be held)."""

    def __init__(self, name: str, initializer: Callable[[], object] = one_openmp_thread) -> None:
        self._name = name
        self._initializer = initializer
        self._pool: ThreadPoolExecutor | None = None
        self._pid = 0  # the process that started the threads
        self._lock = threading.Lock()

    def get(self, count: int) -> ThreadPoolExecutor:
        """The pool, started with ``count`` threads if it is not running."""
        pid = os.getpid()
        if self._pool is not None and self._pid != pid:
            self._lock, self._pool = threading.Lock(), None
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(
                    count, thread_name_prefix=self._name, initializer=self._initializer
                )
                self._pid = pid
            return self._pool

    def close(self) -> None:
        """Let the threads end once their queued work is done (a later get starts anew)."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None and self._pid == os.getpid():
            pool.shutdown(wait=False)


class SplitThreads:
    """``map(fn, items)``: ``fn`` over ``items`` split into as many groups as there are
    threads (PyTorch's thread count when first used, unless given), each group on a thread of
    its own with one OpenMP thread, in the caller's inference mode (it is per thread, and a
    tensor made in it can be written only in it). The caller waits; a count of 1 runs inline.
    The parts must not write the same memory."""

    def __init__(self, threads: int | None = None) -> None:
        self._threads = threads
        self._pool = OpenMPPool("inferscale-split")

    def map(
        self,
        fn: Callable[[T], object],
        items: Sequence[T],
        weights: Sequence[int] | None = None,
    ) -> None:
        """``fn(item)`` for every item, groups balanced by ``weights`` (default: equal);
        returns when all are done and re-raises the first error."""
        count = self.count
        if count <= 1 or len(items) <= 1:
            for item in items:
                fn(item)
            return
        groups = split(items, weights or [1] * len(items), count)
        pool = self._pool.get(count)
        inference = torch.is_inference_mode_enabled()
        futures = [pool.submit(_run, fn, group, inference) for group in groups if group]
        for future in futures:
            future.result()

    @property
    def count(self) -> int:
        if self._threads is None:
            self._threads = torch.get_num_threads()
        return self._threads

    def close(self) -> None:
        self._pool.close()


def split(items: Sequence[T], weights: Sequence[int], count: int) -> list[list[T]]:
    """``items`` in ``count`` groups of about equal weight (heaviest first, each to the
    lightest group), each group in the items' order."""
    groups: list[list[int]] = [[] for _ in range(count)]
    loads = [0] * count
    for index in sorted(range(len(items)), key=lambda i: weights[i], reverse=True):
        lightest = loads.index(min(loads))
        groups[lightest].append(index)
        loads[lightest] += weights[index]
    return [[items[i] for i in sorted(group)] for group in groups]


def _run(fn: Callable[[T], object], group: Sequence[T], inference: bool) -> None:
    with torch.inference_mode(inference):
        for item in group:
            fn(item)
