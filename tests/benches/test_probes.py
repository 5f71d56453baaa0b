"""Timing from outside: methods wrapped on their instances, timed, and put back."""

from __future__ import annotations

import time

from bench.probes import MethodClock


class _Worker:
    def __init__(self) -> None:
        self.calls = 0

    def load(self, seconds: float) -> str:
        self.calls += 1
        time.sleep(seconds)
        return "done"


def test_wrapped_calls_are_timed_per_phase_and_the_methods_put_back():
    worker, syncs = _Worker(), []
    clock = MethodClock(sync=lambda: syncs.append(1))
    clock.wrap(worker, "load", "load_us")
    clock.wrap_all(worker, (("missing", "", "nothing_here"), ("also", "nowhere", "load")))
    assert worker.load(0.01) == "done" and worker.load(0.0) == "done"
    times = clock.take()
    assert times["load_us"] >= 10_000 and clock.calls["load_us"] == 2
    assert len(syncs) == 4  # before and after each call
    assert clock.take() == {}  # taken
    assert clock.missing == ["missing", "also"]
    clock.restore()
    assert "load" not in vars(worker)  # the class's method again
    worker.load(0.0)
    assert clock.take() == {} and worker.calls == 3
