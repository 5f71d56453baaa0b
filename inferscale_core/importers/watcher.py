"""Watch the inbox folder and import each export file dropped into it.

A watchdog ``Observer`` reports files created, written or moved into the inbox (one level: its
``imported/`` and ``quarantine/`` subfolders and anything deeper are not watched; dotfiles and
partial downloads are ignored, see :func:`~inferscale_core.importers.pipeline.is_candidate`). A file
is imported once its size and modification time have stayed the same for ``stable_seconds`` (a
download or copy in progress keeps changing them). Ready files are imported one at a time, in the
order they arrived, by one worker thread; a file still being written does not hold back those that
arrived after it. On :meth:`InboxWatcher.start` the files already in the inbox are queued too
(oldest first), so nothing dropped while the watcher was down is lost; as a safety net against lost
file-system events the inbox is also listed every ``rescan_seconds``.

The importer is built *in* the worker thread by the ``importer`` factory, because a SQLite
connection belongs to the thread that opened it; the watcher closes its fact log on stop.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from inferscale_core.importers.pipeline import (
    FileResult,
    Importer,
    ProgressEvent,
    is_candidate,
    list_files,
    stat_signature,
)

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class _Pending:
    """A file waiting to become stable."""

    order: int  # arrival order
    signature: tuple[int, int] | None  # (size, mtime_ns) at the last look
    unchanged_since: float  # time.monotonic() of the last change seen


class InboxWatcher:
    """Imports files that appear in ``inbox``; ``start()``/``stop()`` or ``with``.

    Args:
        inbox: the folder to watch (created if missing).
        importer: builds the :class:`Importer` (called once, in the worker thread).
        stable_seconds: how long size and mtime must stay unchanged before a file is imported.
        poll: how often waiting files are looked at, in seconds.
        on_result: called (in the worker thread) with each file's :class:`FileResult`.
        on_error: called (in the worker thread) when an import fails for a reason that is not
            the file's (the file stays in the inbox and is tried again once it changes).
        on_progress: passed to :meth:`Importer.import_path` for each file (in the worker
            thread): "start" tells which file is being imported.
        rescan_seconds: how often the inbox is listed in case an event was lost.
    """

    def __init__(
        self,
        inbox: Path,
        importer: Callable[[], Importer],
        stable_seconds: float = 2.0,
        poll: float = 0.5,
        *,
        on_result: Callable[[FileResult], None] | None = None,
        on_error: Callable[[Path, Exception], None] | None = None,
        on_progress: Callable[[ProgressEvent], None] | None = None,
        rescan_seconds: float = 30.0,
    ) -> None:
        if stable_seconds < 0 or poll <= 0 or rescan_seconds <= 0:
            raise ValueError("stable_seconds must be >= 0, poll and rescan_seconds > 0")
        self.inbox = Path(inbox).expanduser().resolve()
        self.stable_seconds = stable_seconds
        self.poll = poll
        self.rescan_seconds = rescan_seconds
        self._make_importer = importer
        self._on_result = on_result or (lambda result: None)
        self._on_error = on_error or (lambda path, exc: None)
        self._on_progress = on_progress
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._pending: dict[Path, _Pending] = {}
        self._settled: dict[Path, tuple[int, int]] = {}  # handled, still here, unchanged since
        self._arrivals = 0
        self._busy = False
        self._observer = None
        self._worker: threading.Thread | None = None
        self._startup_error: BaseException | None = None
        self._ready = threading.Event()

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        """Start watching, queue what is already waiting, and start the worker thread.

        Raises whatever building the importer raised (in the worker) so a bad database path
        fails here rather than silently, and whatever starting the observer raised (an inbox
        that cannot be created, the inotify limit); nothing is left running then.
        """
        from watchdog.events import FileCreatedEvent, FileModifiedEvent, FileMovedEvent
        from watchdog.observers import Observer

        if self._worker is not None:
            raise RuntimeError("the watcher is already started")
        self.inbox.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._stopping.clear()
        self._ready.clear()
        self._startup_error = None
        self._worker = threading.Thread(target=self._run, name="inbox-import", daemon=True)
        self._worker.start()
        self._ready.wait()
        if self._startup_error is not None:
            self._worker.join()
            self._worker = None
            raise self._startup_error
        observer = Observer()
        try:
            observer.schedule(
                _Handler(self),
                str(self.inbox),
                recursive=False,
                event_filter=[FileCreatedEvent, FileModifiedEvent, FileMovedEvent],
            )
            observer.start()  # fails e.g. when the inotify watch limit is reached
        except BaseException:
            self._stopping.set()  # the worker closes its fact log and ends
            self._wake.set()
            self._worker.join()
            self._worker = None
            raise
        self._observer = observer
        self._rescan()  # after the observer: a file arriving in between is seen by one of them

    def stop(self) -> None:
        """Stop watching; waits for the file being imported (if any) to finish."""
        if self._observer is not None:
            self._observer.stop()
            self._observer.join()
            self._observer = None
        self._stopping.set()
        self._wake.set()
        if self._worker is not None:
            self._worker.join()
            self._worker = None

    def __enter__(self) -> InboxWatcher:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no file is waiting or being imported and the inbox holds nothing new.

        Returns False if that did not happen within ``timeout`` seconds (for tests).
        """
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                idle = not self._pending and not self._busy
                settled = dict(self._settled)
            if idle and all(settled.get(p) == stat_signature(p) for p in list_files(self.inbox)):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)

    # -- events (observer thread) -----------------------------------------------------------

    def notice(self, path: Path) -> None:
        """Queue ``path`` if it is a candidate directly in the inbox (thread-safe)."""
        path = Path(path)
        if path.parent != self.inbox or not is_candidate(path):
            return
        signature = stat_signature(path)
        now = time.monotonic()
        with self._lock:
            entry = self._pending.get(path)
            if entry is None:
                if signature is None or self._settled.get(path) == signature:
                    return
                # a file that has not changed for a while (already waiting at start) counts
                # as unchanged since its mtime; one being written has an mtime of about now
                age = max(0.0, time.time() - signature[1] / 1e9)
                self._arrivals += 1
                self._pending[path] = _Pending(self._arrivals, signature, now - age)
            elif entry.signature != signature:
                entry.signature, entry.unchanged_since = signature, now
        self._wake.set()

    def _rescan(self) -> None:
        for path in list_files(self.inbox):
            self.notice(path)

    # -- worker thread ----------------------------------------------------------------------

    def _run(self) -> None:
        try:
            importer = self._make_importer()
        except BaseException as exc:
            self._startup_error = exc
            self._ready.set()
            return
        self._ready.set()
        last_scan = time.monotonic()
        try:
            while not self._stopping.is_set():
                if time.monotonic() - last_scan >= self.rescan_seconds:
                    self._rescan()
                    last_scan = time.monotonic()
                path = self._take_ready()
                if path is None:
                    self._wake.wait(self.poll)
                    self._wake.clear()
                    continue
                self._import(importer, path)
        finally:
            importer.factlog.close()

    def _take_ready(self) -> Path | None:
        """Pop the earliest-arrived file that has been stable long enough (marks us busy)."""
        now = time.monotonic()
        with self._lock:
            for path, entry in sorted(self._pending.items(), key=lambda item: item[1].order):
                signature = stat_signature(path)
                if signature is None:
                    del self._pending[path]
                elif signature != entry.signature:
                    entry.signature, entry.unchanged_since = signature, now
                elif now - entry.unchanged_since >= self.stable_seconds:
                    del self._pending[path]
                    self._busy = True
                    return path
        return None

    def _import(self, importer: Importer, path: Path) -> None:
        signature = stat_signature(path)
        try:
            try:
                report = importer.import_path(path, on_progress=self._on_progress)
            except Exception as exc:  # not the file's fault: keep it, report, go on
                logger.exception("importing %s failed", path)
                self._on_error(path, exc)
            else:
                for result in report.files:
                    self._on_result(result)
        except Exception:  # a failing callback must not stop the watcher
            logger.exception("the watcher's callback failed for %s", path)
        finally:
            with self._lock:
                # still here and unchanged (a failed move, an unexpected error): don't retake it
                # until it changes; if it changed meanwhile, the events queue it again
                if signature is not None and stat_signature(path) == signature:
                    self._settled[path] = signature
                else:
                    self._settled.pop(path, None)
                self._busy = False


class _Handler:
    """Forwards watchdog events to :meth:`InboxWatcher.notice` (a duck-typed event handler)."""

    def __init__(self, watcher: InboxWatcher) -> None:
        self.watcher = watcher

    def dispatch(self, event) -> None:  # watchdog's FileSystemEventHandler entry point
        if event.is_directory:
            return
        path = event.dest_path if event.event_type == "moved" else event.src_path
        self.watcher.notice(Path(path.decode() if isinstance(path, bytes) else path))
