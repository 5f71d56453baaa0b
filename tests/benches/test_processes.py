"""What /proc says of a process tree: names, CPU between two reads (bench/processes.py, which
the serve benches use to say which of the server's processes spends the time)."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time

from bench.processes import cpu_between, process_cpu, process_tree

# Sleeps, burns 0.8 s of CPU, sleeps: read before and after the burn.
BURN = (
    "import time\ntime.sleep(0.5)\nt = time.process_time()\n"
    "while time.process_time() - t < 0.8: pass\ntime.sleep(60)"
)


def child(title: str, code: str) -> subprocess.Popen[bytes]:
    """A Python child whose argv[0] is ``title`` (as setproctitle leaves it)."""
    command = f"exec -a {shlex.quote(title)} {shlex.quote(sys.executable)} -c {shlex.quote(code)}"
    return subprocess.Popen(["bash", "-c", command])


def test_the_busy_process_is_charged_its_cpu_by_title_and_the_idle_one_nothing():
    busy = child("bench::busy", BURN)
    idle = child("bench::idle", "import time; time.sleep(60)")
    try:
        time.sleep(0.3)
        before = process_cpu(os.getpid())
        time.sleep(1.8)  # the burn: 0.5 s from the start, 0.8 s long
        after = process_cpu(os.getpid())
        tree = process_tree(os.getpid())
    finally:
        for p in (busy, idle):
            p.kill()
            p.wait()
    assert tree[busy.pid] == "bench::busy" and tree[idle.pid] == "bench::idle"
    spent = cpu_between(before, after, os.getpid())
    assert 0.6 <= spent["bench::busy"] <= 1.2, spent
    assert spent.get("bench::idle", 0.0) < 0.05, spent
    assert list(spent.values()) == sorted(spent.values(), reverse=True)


def test_processes_that_share_a_name_are_told_apart_by_pid():
    first, second = (child("bench::twin", BURN) for _ in range(2))
    try:
        time.sleep(0.3)
        before = process_cpu(os.getpid())
        time.sleep(1.8)
        spent = cpu_between(before, process_cpu(os.getpid()), os.getpid())
    finally:
        for p in (first, second):
            p.kill()
            p.wait()
    assert {f"bench::twin:{first.pid}", f"bench::twin:{second.pid}"} <= set(spent), spent
