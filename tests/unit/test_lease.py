"""The per-user write lease: exclusive across objects, threads and processes, free after kill -9.

Real processes (spawned), real files, real flock; no mocks. Child entry points are module
functions so ``spawn`` can import them.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import signal
import stat
import threading
import time
from pathlib import Path

import pytest

from app.serve.lease import LeaseBusy, Leases, lock_name

UID = "alice@example.com"
SPAWN = mp.get_context("spawn")


def _fds_on(path: Path) -> int:
    """How many of this process's fds are open on ``path``."""
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own fd is gone by now
            n += os.readlink(f"/proc/self/fd/{fd}") == str(path)
    return n


# ---- child processes ----


def _try_once(folder: Path, barrier, results) -> None:
    """Wait for all racers, then one non-blocking try; report (pid, won)."""
    leases = Leases(folder, f"racer {os.getpid()}")
    barrier.wait()
    try:
        leases.acquire(UID, timeout_s=0)
        won = True
    except LeaseBusy:
        won = False
    results.put((os.getpid(), won))
    barrier.wait()  # hold until everyone has tried: a quick release would let a second win


def _enter_exit(folder: Path, log: Path, rounds: int, barrier, done) -> None:
    """``rounds`` times: take the lease, log enter, ~5 ms inside, log exit, release."""
    leases = Leases(folder, f"worker {os.getpid()}", poll_s=0.002)
    barrier.wait()
    for _ in range(rounds):
        leases.acquire(UID, timeout_s=30)
        with open(log, "a") as f:
            f.write(f"enter {os.getpid()}\n")
        time.sleep(0.005)
        with open(log, "a") as f:
            f.write(f"exit {os.getpid()}\n")
        leases.release(UID)
    done.put(os.getpid())


def _hold_forever(folder: Path, ready) -> None:
    Leases(folder, f"sleeper {os.getpid()}").acquire(UID, timeout_s=0)
    ready.put(os.getpid())
    time.sleep(60)


def _hold_and_fork(folder: Path, ready) -> None:
    """Take the lease; a forked child releases and closes (must not free ours); a second
    forked child sleeps on (must not keep the lease once we die). Reports that child's pid."""
    leases = Leases(folder, f"forker {os.getpid()}")
    leases.acquire(UID, timeout_s=0)
    pid = os.fork()
    if pid == 0:
        leases.release(UID)
        leases.close()
        os._exit(0 if not leases.holds(UID) else 1)
    os.waitpid(pid, 0)
    sleeper = os.fork()
    if sleeper == 0:
        time.sleep(60)
        os._exit(0)
    ready.put(sleeper)
    time.sleep(60)


# ---- tests ----


def test_acquire_release_holds_held(tmp_path: Path) -> None:
    leases = Leases(tmp_path / "leases", "replica a")
    assert not leases.holds(UID) and leases.held() == frozenset()
    leases.acquire(UID, timeout_s=0)
    leases.acquire(UID, timeout_s=0)  # already ours: a no-op, not a self-conflict
    leases.acquire("bob", timeout_s=0)
    assert leases.holds(UID) and leases.held() == {UID, "bob"}
    assert _fds_on(tmp_path / "leases" / lock_name(UID)) == 1
    leases.release(UID)
    leases.release(UID)  # not held: a no-op
    leases.release("never taken")
    assert not leases.holds(UID) and leases.held() == {"bob"}
    leases.close()
    assert leases.held() == frozenset()
    assert _fds_on(tmp_path / "leases" / lock_name(UID)) == 0


def test_two_objects_in_one_process_exclude(tmp_path: Path) -> None:
    a = Leases(tmp_path, "host-a 111 replica a")
    b = Leases(tmp_path, "host-b 222 replica b")
    a.acquire(UID, timeout_s=0)
    with pytest.raises(LeaseBusy) as busy:
        b.acquire(UID, timeout_s=0)
    assert busy.value.user_id == UID
    assert "host-a 111 replica a" in busy.value.holder
    assert UID in str(busy.value) and "host-a 111 replica a" in str(busy.value)
    assert isinstance(busy.value, TimeoutError)
    assert not b.holds(UID)
    a.release(UID)
    b.acquire(UID, timeout_s=0)
    assert b.holds(UID) and "replica b" in a.holder(UID)


def test_holder_description(tmp_path: Path) -> None:
    leases = Leases(tmp_path, "host 1234 replica abc")
    assert leases.holder(UID) is None  # never taken: and no file created by asking
    assert list(tmp_path.iterdir()) == []
    leases.acquire(UID, timeout_s=0)
    text = leases.holder(UID)
    assert text.startswith("host 1234 replica abc since ") and "+00:00" in text
    assert Leases(tmp_path, "other").holder(UID) == text  # read through a second fd...
    assert leases.holds(UID)
    with pytest.raises(LeaseBusy):  # ...whose close left the flock in place
        Leases(tmp_path, "other").acquire(UID, timeout_s=0)
    leases.release(UID)
    assert leases.holder(UID) == text  # the last holder's, after release


def test_acquire_waits_for_release(tmp_path: Path) -> None:
    a, b = Leases(tmp_path, "a"), Leases(tmp_path, "b", poll_s=0.01)
    a.acquire(UID, timeout_s=0)
    releasing = threading.Event()

    def release_later() -> None:
        time.sleep(0.3)
        releasing.set()
        a.release(UID)

    threading.Thread(target=release_later).start()
    b.acquire(UID, timeout_s=5)
    assert releasing.is_set()  # it returned only after a started releasing
    assert b.holds(UID)


def test_timeout_raises_busy(tmp_path: Path) -> None:
    a, b = Leases(tmp_path, "a"), Leases(tmp_path, "b", poll_s=0.01)
    a.acquire(UID, timeout_s=0)
    start = time.monotonic()
    with pytest.raises(LeaseBusy):
        b.acquire(UID, timeout_s=0.2)
    assert time.monotonic() - start >= 0.2
    assert _fds_on(tmp_path / lock_name(UID)) == 1  # b's failed try left no fd behind


def test_threads_of_one_object(tmp_path: Path) -> None:
    """Same user from 8 threads: all return, one fd holds it. Different users: no queueing
    behind another user's wait."""
    other = Leases(tmp_path, "other")
    leases = Leases(tmp_path, "mine", poll_s=0.01)
    other.acquire(UID, timeout_s=0)
    errors: list[BaseException] = []

    def take(uid: str, timeout_s: float) -> None:
        try:
            leases.acquire(uid, timeout_s)
        except BaseException as e:  # reported to the main thread
            errors.append(e)

    waiters = [threading.Thread(target=take, args=(UID, 5)) for _ in range(8)]
    for t in waiters:
        t.start()
    time.sleep(0.1)  # all 8 are now waiting on UID
    take("bob", 0)  # a one-try acquire of another user is not stuck behind them
    assert leases.holds("bob") and not leases.holds(UID)
    other.release(UID)
    for t in waiters:
        t.join(5)
    assert errors == []
    assert leases.held() == {UID, "bob"}
    assert _fds_on(tmp_path / lock_name(UID)) == 1
    leases.release(UID)
    other.acquire(UID, timeout_s=0)  # no stray fd of ours still holds it


def test_race_across_processes_one_wins(tmp_path: Path) -> None:
    n = 8
    barrier, results = SPAWN.Barrier(n), SPAWN.Queue()
    procs = [SPAWN.Process(target=_try_once, args=(tmp_path, barrier, results)) for _ in range(n)]
    for p in procs:
        p.start()
    outcome = [results.get(timeout=60) for _ in range(n)]
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    assert sum(won for _, won in outcome) == 1
    winner = next(pid for pid, won in outcome if won)
    assert Leases(tmp_path, "reader").holder(UID).startswith(f"racer {winner} ")


def test_mutual_exclusion_under_contention(tmp_path: Path) -> None:
    n, rounds = 4, 10
    log = tmp_path / "log"
    log.touch()
    barrier, done = SPAWN.Barrier(n), SPAWN.Queue()
    folder = tmp_path / "leases"
    procs = [
        SPAWN.Process(target=_enter_exit, args=(folder, log, rounds, barrier, done))
        for _ in range(n)
    ]
    for p in procs:
        p.start()
    for _ in range(n):
        done.get(timeout=60)
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    lines = log.read_text().splitlines()
    assert len(lines) == 2 * n * rounds
    inside = None  # pid between its enter and exit
    for line in lines:
        event, pid = line.split()
        if event == "enter":
            assert inside is None, f"{pid} entered while {inside} was inside"
            inside = pid
        else:
            assert inside == pid
            inside = None
    assert len({line.split()[1] for line in lines}) == n


def test_kill_9_frees_the_lease(tmp_path: Path) -> None:
    ready = SPAWN.Queue()
    child = SPAWN.Process(target=_hold_forever, args=(tmp_path, ready))
    child.start()
    try:
        pid = ready.get(timeout=60)
        leases = Leases(tmp_path, "survivor")
        with pytest.raises(LeaseBusy) as busy:
            leases.acquire(UID, timeout_s=0)
        assert f"sleeper {pid}" in busy.value.holder
        os.kill(pid, signal.SIGKILL)
        child.join(30)
        leases.acquire(UID, timeout_s=5)
        assert leases.holds(UID)
    finally:
        child.kill()


def test_forked_child_neither_frees_nor_keeps(tmp_path: Path) -> None:
    """A fork's release/close leaves the parent's lease; the fork's inherited fd does not keep
    the lease alive after the parent is killed."""
    ready = SPAWN.Queue()
    parent = SPAWN.Process(target=_hold_and_fork, args=(tmp_path, ready))
    parent.start()
    sleeper = None
    try:
        sleeper = ready.get(timeout=60)
        leases = Leases(tmp_path, "survivor")
        with pytest.raises(LeaseBusy):
            leases.acquire(UID, timeout_s=0)
        os.kill(parent.pid, signal.SIGKILL)
        while parent.is_alive():  # not join(): the fork holds join's sentinel pipe open
            time.sleep(0.01)
        os.kill(sleeper, 0)  # the forked child still lives...
        leases.acquire(UID, timeout_s=5)  # ...and does not hold the lease
    finally:
        parent.kill()
        if sleeper is not None:
            os.kill(sleeper, signal.SIGKILL)


def test_permissions_and_names(tmp_path: Path) -> None:
    folder = tmp_path / "leases"
    folder.mkdir(mode=0o755)
    os.chmod(folder, 0o755)
    leases = Leases(folder, "replica")
    uid = "../../etc/passwd"
    leases.acquire(uid, timeout_s=0)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700  # an existing folder is tightened
    assert [p.relative_to(tmp_path) for p in tmp_path.rglob("*")] == [
        Path("leases"),
        Path("leases") / lock_name(uid),
    ]
    lock = folder / lock_name(uid)
    assert stat.S_IMODE(lock.stat().st_mode) == 0o600
    assert "passwd" not in lock.name and "/" not in lock_name(uid) and ".." not in lock.name
    fresh = tmp_path / "new" / "leases"
    Leases(fresh, "replica")
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o700
