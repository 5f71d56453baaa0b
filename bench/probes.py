"""Timing the product from outside: wrap methods of live objects for a while.

The connector carries no timing of its own. A bench that needs to know where a request's time
goes wraps the methods that do the work on their instances (the connector's two sides, vLLM's
own objects), records each call's wall time, and puts the methods back afterwards.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any


class MethodClock:
    """Adds the wall time of wrapped methods (us) to ``current[phase]``, call by call.

    ``sync`` runs before and after each call (e.g. ``torch.cuda.synchronize``) so a call's
    time includes the device work it queued. :meth:`restore` puts every method back.
    """

    def __init__(self, sync: Callable[[], None] | None = None) -> None:
        self.current: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self.missing: list[str] = []
        self._sync = sync
        self._undo: list[Callable[[], None]] = []

    def wrap_all(self, root: Any, phases: tuple[tuple[str, str, str], ...]) -> None:
        """Wrap ``(phase, dotted path from root, method)`` each; absent ones go to ``missing``."""
        for phase, path, method in phases:
            obj = root
            for name in filter(None, path.split(".")):
                obj = getattr(obj, name, None)
            if obj is None or getattr(obj, method, None) is None:
                self.missing.append(phase)
                continue
            try:
                self.wrap(obj, method, phase)
            except (AttributeError, TypeError):  # an object without a __dict__
                self.missing.append(phase)

    def wrap(self, obj: Any, method: str, phase: str) -> None:
        original = getattr(obj, method)
        current, calls, sync = self.current, self.calls, self._sync

        def timed(*args: Any, **kwargs: Any) -> Any:
            if sync is not None:
                sync()
            t0 = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                if sync is not None:
                    sync()
                current[phase] = current.get(phase, 0.0) + (time.perf_counter() - t0) * 1e6
                calls[phase] = calls.get(phase, 0) + 1

        own = vars(obj).get(method)  # an instance attribute of that name, to put back
        setattr(obj, method, timed)
        if own is not None:
            self._undo.append(lambda: setattr(obj, method, own))
        else:
            self._undo.append(lambda: delattr(obj, method))

    def take(self) -> dict[str, float]:
        """The times since the last take (us by phase), and start again."""
        out = dict(self.current)
        self.current.clear()
        return out

    def restore(self) -> None:
        while self._undo:
            self._undo.pop()()


@contextlib.contextmanager
def connector_clock(engine: Any, sync: bool = False) -> Iterator[MethodClock]:
    """A clock on the in-process connector of ``engine`` (a ``VllmEngine``): phase
    ``"scheduler_us"`` (deciding the load, then recording the blocks) and ``"load_us"`` (the
    worker's whole load, with a device sync around it when ``sync``)."""
    scheduler, worker = engine.connectors()
    sync_fn = None
    if sync:
        import torch

        if torch.cuda.is_available():
            sync_fn = torch.cuda.synchronize
    clock = MethodClock()  # the scheduler side queues no device work: no sync
    try:
        if scheduler is not None and scheduler.scheduler is not None:
            side = scheduler.scheduler
            clock.wrap(side, "get_num_new_matched_tokens", "scheduler_us")
            clock.wrap(side, "update_state_after_alloc", "scheduler_us")
        if worker is not None and worker.worker is not None:
            # the loads' own clock may sync; the scheduler's never does
            load_clock = MethodClock(sync_fn)
            load_clock.current = clock.current
            load_clock.calls = clock.calls
            load_clock.wrap(worker.worker, "start_load_kv", "load_us")
            clock._undo.extend(load_clock._undo)
        yield clock
    finally:
        clock.restore()
