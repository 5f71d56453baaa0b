"""A per-user write lease on a shared folder: one replica at a time writes a user's memory.

Ray Serve runs N replicas (processes, maybe on several hosts sharing one folder); a user's
SQLite profile, index and background encoder must be written by exactly one of them. A replica
takes the user's lease before it opens that memory and releases it when it unloads the user.

The lease is ``fcntl.flock(LOCK_EX | LOCK_NB)`` on ``<folder>/<sha256(user_id)[:32]>.lock``:

- A flock belongs to the open file description, so the kernel drops it when the last fd on
  that description closes, which a dead holder (even ``kill -9``) does: nothing to clean up,
  no stale-lease timeout to tune. Two ``open()`` calls in one process conflict like two
  processes, so two ``Leases`` in one process contend (the tests rely on it).
- Lock files are never deleted: deleting a locked file lets the next opener create and lock a
  new inode while the old holder still holds the old one, i.e. two holders.
- User ids are arbitrary strings, so only their hash names a file.
- After locking, the holder writes its description and the UTC time into the file, so a
  refused replica can say who holds the user (``holder``, ``LeaseBusy``).
- A forked child would share the description and keep the lease alive after its parent dies,
  and its ``LOCK_UN`` would free the parent's lease: after ``fork`` the child forgets (closes
  without unlocking) every lease it inherited. Exec'd children never see the fds (``os.open``
  makes them non-inheritable).

NFS (untested): Linux NFS clients emulate flock with whole-file POSIX locks on the server,
owned per open file, so this works across hosts on NFSv4 (NFSv3 needs a working lockd). The
server reclaims a dead client's locks when its lease (NFSv4, ~90 s) expires, not at once.
Clients without that emulation owning locks per process would let two ``Leases`` of one process
both hold a user, and closing any fd on the file would drop the lease; hence one fd per held
user and a per-user in-process lock so no second fd is opened while this object holds it.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import fcntl
import hashlib
import os
import threading
import time
import weakref
from pathlib import Path

NAME_HEX = 32  # chars of sha256(user_id) in a lock file's name: 128 bits, no collisions
HOLDER_MAX = 4096  # bytes of a holder description read back


class LeaseBusy(TimeoutError):
    """Another holder had ``user_id``'s lease for the whole wait; ``holder`` says who (None
    when the file gave no description, e.g. read while the holder was writing it)."""

    def __init__(self, user_id: str, holder: str | None) -> None:
        self.user_id = user_id
        self.holder = holder
        super().__init__(f"user {user_id!r} is busy: its lease is held by {holder or 'unknown'}")


def lock_name(user_id: str) -> str:
    """The lock file's name for ``user_id``: a hash, so no id can reach outside the folder."""
    return hashlib.sha256(user_id.encode()).hexdigest()[:NAME_HEX] + ".lock"


class Leases:
    """This process's leases in ``folder``, taken in ``holder``'s name (e.g. "host pid replica").

    Thread-safe. ``_lock`` guards ``_fds`` only and is never held while waiting; a per-user
    lock serializes this object's acquires of one user, so one thread waits on another's
    acquire instead of opening a second fd on the same file."""

    def __init__(self, folder: Path, holder: str, poll_s: float = 0.05) -> None:
        self.folder = Path(folder)
        self.description = holder
        self.poll_s = poll_s
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.folder, 0o700)  # mkdir's mode is masked by umask, and skipped if it exists
        self._lock = threading.Lock()
        self._fds: dict[str, int] = {}  # user id -> fd holding its flock
        self._acquiring: dict[str, threading.Lock] = {}  # user id -> lock around its acquire
        _LIVE.add(self)

    def _path(self, user_id: str) -> Path:
        return self.folder / lock_name(user_id)

    def acquire(self, user_id: str, timeout_s: float) -> None:
        """Take ``user_id``'s lease, trying every ``poll_s`` for up to ``timeout_s`` seconds
        (0: one try). Returns at once if this object holds it; raises LeaseBusy."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            if user_id in self._fds:
                return
            gate = self._acquiring.setdefault(user_id, threading.Lock())
        got = gate.acquire(timeout=timeout_s) if timeout_s > 0 else gate.acquire(blocking=False)
        if not got:
            raise LeaseBusy(user_id, self.holder(user_id))
        try:
            with self._lock:
                if user_id in self._fds:  # another thread of ours took it while we waited
                    return
            fd = self._take(user_id, deadline)
            with self._lock:
                self._fds[user_id] = fd
        finally:
            gate.release()

    def _take(self, user_id: str, deadline: float) -> int:
        """Open the lock file and flock it by ``deadline`` (monotonic s); the locked fd."""
        fd = os.open(self._path(user_id), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError as e:
                    if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                        raise
                left = deadline - time.monotonic()
                if left <= 0:
                    raise LeaseBusy(user_id, _read(fd)) from None
                time.sleep(min(self.poll_s, left))
            now = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{self.description} since {now}\n".encode(), 0)
            return fd
        except BaseException:
            os.close(fd)  # unlocks too, if the flock was taken before the failure
            raise

    def release(self, user_id: str) -> None:
        """Free ``user_id``'s lease (unlock, close); a no-op if this object does not hold it."""
        with self._lock:
            fd = self._fds.pop(user_id, None)
        if fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)  # explicit: a copy forked outside os.fork keeps it
            os.close(fd)

    def holds(self, user_id: str) -> bool:
        with self._lock:
            return user_id in self._fds

    def held(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._fds)

    def holder(self, user_id: str) -> str | None:
        """The description the current or last holder wrote; None if never taken."""
        with self._lock:
            fd = self._fds.get(user_id)
            if fd is not None:  # under the lock: release must not close it mid-read
                return _read(fd)
        # Closing this second fd leaves any flock on the file alone (flock is per open file
        # description); with lockf/fcntl locks it would drop every lock this process holds.
        try:
            fd = os.open(self._path(user_id), os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            return _read(fd)
        finally:
            os.close(fd)

    def close(self) -> None:
        """Release every lease this object holds."""
        for user_id in self.held():
            self.release(user_id)

    def _forget(self) -> None:
        """In a forked child: close the inherited fds without unlocking (the parent's leases)."""
        self._lock = threading.Lock()  # another thread may have held it at the fork
        self._acquiring = {}
        fds, self._fds = self._fds, {}
        for fd in fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)


def _read(fd: int) -> str | None:
    """The holder description in the lock file open at ``fd``; None if it is empty."""
    text = os.pread(fd, HOLDER_MAX, 0).decode(errors="replace").strip()
    return text or None


_LIVE: weakref.WeakSet[Leases] = weakref.WeakSet()  # every Leases, for the after-fork hook


def _after_fork_in_child() -> None:
    for leases in list(_LIVE):
        leases._forget()


os.register_at_fork(after_in_child=_after_fork_in_child)
