"""Tiered store of KV entries: device pool → host RAM → disk (one file each).

The files (:mod:`~inferscale_core.kvstore.entry_file`) are the durable copy and the contract
between processes: the vLLM connector opens a store from a plain path in each process it runs
in. In one process (the desktop app) the app hands its own store to the connector, so both share
the memory tiers; the store itself is always passed in, never looked up.

Memory tiers (:mod:`inferscale_core.kvstore.tiers`) are LRU caches with byte budgets: host RAM
(pinned when CUDA is present) and, when a device is given, one preallocated device pool.
``get`` serves from the fastest tier holding an entry; ``prefetch`` moves a set of entries to the
fastest tier before an injection. One lock guards the bookkeeping; file I/O happens outside it,
and a per-key version keeps a read that raced a ``put``/``delete`` from caching stale data.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from inferscale_core.files import TEMP_PREFIX, fsync_dir
from inferscale_core.kvstore import head_shards
from inferscale_core.kvstore.entry_file import (
    SUFFIX,
    EntryCorruptError,
    EntryHeader,
    EntryMissingError,
    FingerprintMismatchError,
    read_entry,
    read_header,
    scan,
    sweep_temp_files,
    write_entry,
)
from inferscale_core.kvstore.quant import check_scheme, quantize, scheme_for
from inferscale_core.kvstore.tiers import (
    EntryLayout,
    HostTier,
    MixedSpans,
    PrefetchReport,
    StoreStats,
    TierStats,
    device_tier,
    to_host,
)
from inferscale_core.types import FactKV

log = logging.getLogger(__name__)

# Files a prefetch reads at once: one a core, at least 8. On the H200's host (16 cores), cold
# k=50 of 8B-shaped entries: int4 72-78 ms with 8, 59-73 ms with 16 (bf16 203-225 / 193-243);
# on 2 cores more than 8 only adds contention for the GIL.
READ_THREADS = max(8, os.cpu_count() or 1)
_RACY_NS = 200_000_000  # a folder mtime this recent may not show a change made in its tick


class KVStore:
    """Entries in ``root/<key>.safetensors``, cached in host RAM and an optional device pool.

    Args:
        root: folder of the entry files (created if needed).
        host_bytes: byte budget of the host-RAM tier.
        gpu_bytes: size of the device pool; 0 means no device tier.
        device: where the pool lives. None picks ``"cuda"`` when CUDA is available and leaves the
            tier out otherwise; tests pass ``"cpu"`` to run the device tier's logic on CPU.
        fingerprint: model fingerprint every read is checked against (and every write).
        pin_host: pin host-tier tensors; None pins when CUDA is available.
        store_dtype: how entries are written (:data:`~inferscale_core.kvstore.quant.SCHEMES`):
            ``"model"`` keeps the model's dtype, ``"fp8"`` / ``"int4"`` compress every entry
            but the system prefix's (:func:`~inferscale_core.kvstore.quant.scheme_for`).
            Entries of any scheme are read; the tiers hold them as stored.
    """

    def __init__(
        self,
        root: Path | str,
        host_bytes: int = 1 << 30,
        *,
        gpu_bytes: int = 0,
        device: torch.device | str | None = None,
        fingerprint: str | None = None,
        pin_host: bool | None = None,
        store_dtype: str = "model",
    ) -> None:
        self.store_dtype = check_scheme(store_dtype)
        self.root = Path(root)
        self._root_str = str(self.root)
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.fingerprint = fingerprint
        pin = torch.cuda.is_available() if pin_host is None else pin_host
        self.host_tier = HostTier(host_bytes, pin)
        self.device_tier = device_tier(gpu_bytes, device)
        self._headers: dict[str, EntryHeader] = {}
        self._seen_at: dict[str, int] = {}  # key -> folder mtime when its file was last seen
        self._stamps: dict[str, tuple[int, int]] = {}  # key -> (size, mtime) when checked
        self._versions: dict[str, int] = {}  # bumped by every put/delete of the key
        self._clock = itertools.count(1)
        self._hits: Counter[str] = Counter()
        self._misses = 0
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None  # _readers()
        self._written = threading.Condition()  # notified after every put (see wait_for)
        self._writing: set[str] = set()  # keys a put of this process is writing
        self._failed: dict[str, OSError] = {}  # keys whose last put failed to write (wait_for)
        self._lost: set[str] = set()  # damaged entries deleted, not yet reported (lost())
        sweep_temp_files(self.root)
        head_shards.sweep_parts(self.root)

    def path(self, key: str) -> Path:
        return Path(self._file(key))

    def _file(self, key: str) -> str:
        """The entry's file as a string (the scheduler checks ~50 per request: no pathlib)."""
        if not key or "/" in key or "\\" in key or key[0] == ".":
            raise ValueError(f"invalid entry key {key!r}")
        return f"{self._root_str}/{key}{SUFFIX}"

    # ---- writes ----
    def put(self, entry: FactKV, scheme: str | None = None) -> Path:
        """Write an entry durably and keep it in host RAM; replaces an entry with the same key.
        It is stored as ``scheme`` (default: the store's ``store_dtype``; the system prefix
        always as the model computed it)."""
        target = self.path(entry.key)
        if self.fingerprint is not None and entry.fingerprint != self.fingerprint:
            raise FingerprintMismatchError(entry.key, entry.fingerprint, self.fingerprint)
        # compressed where it is (on a GPU, there), then in host RAM, written from there
        entry = quantize(entry, scheme_for(entry.key, scheme or self.store_dtype))
        with self._lock:
            version = self._invalidate(entry.key)
            self._writing.add(entry.key)
            self._failed.pop(entry.key, None)
        try:
            hosted = to_host(entry, self.host_tier.pin)  # write-through: the injection after
            header = write_entry(target, hosted)
        except BaseException as exc:
            with self._lock:
                self._writing.discard(entry.key)
                if isinstance(exc, OSError):  # e.g. StoreFullError: wait_for says so at once
                    self._failed[entry.key] = exc
            with self._written:
                self._written.notify_all()
            raise
        with self._lock:
            if self._versions.get(entry.key) == version:  # no put/delete of it since
                self._headers[entry.key] = header
                with contextlib.suppress(FileNotFoundError):
                    self._stamps[entry.key] = _stamp(self._file(entry.key))
                self.host_tier.put(hosted)
            self._writing.discard(entry.key)
        with self._written:
            self._written.notify_all()
        return target

    def convert(self, key: str, scheme: str | None = None) -> bool:
        """Rewrite an entry stored in the model's dtype as ``scheme`` (default: the store's
        ``store_dtype``; the system prefix stays as it is) under the same key, from its stored
        tensors: no re-encoding. False if it is in that scheme already, if it is compressed
        (a compressed entry is never compressed again, nor expanded: its fact is encoded
        anew), or if it was deleted or replaced meanwhile (a forgotten fact's entry is never
        brought back). Raises :class:`EntryMissingError` if it does not exist (or is
        damaged)."""
        target_scheme = scheme_for(key, check_scheme(scheme or self.store_dtype))
        with self._lock:
            version = self._versions.get(key, 0)
        if self.stored_scheme(key) in (target_scheme, "fp8", "int4"):
            return False
        entry = quantize(self._read(key), target_scheme)
        target = self.path(key)
        staged = self.root / f"{TEMP_PREFIX}convert-{key}{SUFFIX}"
        header = write_entry(staged, entry)
        with self._lock:
            if self._versions.get(key, 0) != version or not target.exists():
                staged.unlink(missing_ok=True)
                return False
            os.replace(staged, target)  # under the lock: a delete comes wholly before or after
            self._invalidate(key)
            self._headers[key] = header
            self._stamps[key] = _stamp(self._file(key))
            self.host_tier.put(to_host(entry, self.host_tier.pin))
        fsync_dir(self.root)
        return True

    def stored_scheme(self, key: str) -> str:
        """How the entry is stored (its header alone is read; the file is not checked)."""
        with self._lock:
            cached = self._headers.get(key)
        return (cached or read_header(key, self.path(key))).scheme

    def put_heads(self, part: FactKV, start: int, total: int) -> Path | None:
        """Write KV heads ``[start, start + part's heads)`` of an entry of ``total`` heads (one
        tensor-parallel rank's share of a capture); the whole entry is put once every head is
        in, by whichever process completes it (:mod:`~inferscale_core.kvstore.head_shards`).
        Returns the entry's path if this call completed it, else None. All heads at once is
        :meth:`put`."""
        if start == 0 and part.k.shape[2] == total:
            return self.put(part)
        if self.fingerprint is not None and part.fingerprint != self.fingerprint:
            raise FingerprintMismatchError(part.key, part.fingerprint, self.fingerprint)
        self.path(part.key)  # validates the key
        head_shards.write_part(self.root, part, start, total)
        parts = head_shards.complete_parts(self.root, part.key, total)
        if parts is None:
            return None  # another rank's part is still to come: it will complete the entry
        try:
            entry = head_shards.join_parts(part.key, parts)
        except (FileNotFoundError, EntryMissingError):
            return None  # another rank joined them first and removed them
        path = self.put(entry)
        head_shards.remove_parts(parts)
        return path

    def wait_for(self, keys: Sequence[str], timeout: float) -> list[str]:
        """Wait until every key's entry is written (by this process's store: its file and its
        host-RAM copy; by another process: its file, seen within 50 ms), at most ``timeout``
        seconds; the keys still missing then (``[]``: all there). A put of this process that
        failed to write one of them (e.g. :class:`StoreFullError`) is raised here at once,
        instead of waiting out the timeout for an entry that will not come."""
        deadline = time.monotonic() + timeout

        def missing_of(candidates: Sequence[str]) -> list[str]:
            with self._lock:
                writing = set(self._writing)
                failed = [self._failed.pop(key) for key in candidates if key in self._failed]
            if failed:
                raise failed[0]
            return [key for key in candidates if key in writing or not self.has(key)]

        missing = missing_of(keys)
        while missing:
            left = deadline - time.monotonic()
            if left <= 0:
                return missing
            with self._written:
                self._written.wait(min(left, 0.05))
            missing = missing_of(missing)
        return []

    def delete(self, key: str) -> bool:
        """Forget an entry: every tier at once, then the file. True if a file was removed."""
        path = self.path(key)
        with self._lock:
            self._invalidate(key)
        try:
            path.unlink()
        except FileNotFoundError:
            return False
        fsync_dir(self.root)  # a forgotten entry must not come back after a crash
        return True

    # ---- reads ----
    def has(self, key: str) -> bool:
        return os.path.exists(self._file(key))

    def fastest_tiers(self, keys: Iterable[str]) -> dict[str, str]:
        """:meth:`fastest_tier` of each key, under one lock (the scheduler asks for ~50 keys
        per request; when all are in the device pool, as they are in the steady state, the
        answer is made in C)."""
        device, host = self.device_tier, self.host_tier
        keys = list(keys)
        with self._lock:
            if device is not None and device.holds_all(keys):
                return dict.fromkeys(keys, "device")
            return {
                key: "device"
                if device is not None and key in device
                else "host"
                if key in host
                else "disk"
                for key in keys
            }

    def keys(self) -> list[str]:
        return sorted(p.stem for p in self.root.glob(f"*{SUFFIX}") if not p.name.startswith("."))

    def header(self, key: str) -> EntryHeader:
        """The entry's header; a cached one is checked against the file (another process may
        have deleted it), so the scheduler refuses forgotten entries.

        An entry seen for the first time is read whole and checked (shapes, checksum) before
        its header is trusted, and kept in host RAM for the injection that follows: a damaged
        file is refused here, as missing (:class:`EntryCorruptError`), never loaded."""
        file = self._file(key)
        with self._lock:
            cached = self._headers.get(key)
            version = self._versions.get(key, 0)
        if cached is not None:
            try:
                stamp = _stamp(file)
            except FileNotFoundError:
                with self._lock:
                    if self._versions.get(key, 0) == version:
                        self._invalidate(key)
                raise EntryMissingError(key) from None
            if self._stamps.get(key, stamp) == stamp:
                return cached
            with self._lock:  # rewritten on disk since it was checked: check it again
                if self._versions.get(key, 0) == version:
                    self._invalidate(key)
                version = self._versions.get(key, 0)
        path = Path(file)
        try:
            stamp = _stamp(file)
            header = read_header(key, path)
            entry = None
            if key not in self.host_tier:
                entry = read_entry(header, path, self.host_tier.pin)
        except EntryCorruptError:
            self._set_aside(key, version)
            raise
        except FileNotFoundError:
            raise EntryMissingError(key) from None
        with self._lock:
            if self._versions.get(key, 0) == version:
                self._headers[key] = header
                self._stamps[key] = stamp
                if entry is not None:
                    self.host_tier.put(entry)
        return header

    def header_reader(self) -> Callable[[Sequence[str]], list[EntryHeader]]:
        """:meth:`header` for the keys of one request, in order, statting the folder once
        instead of every cached entry's file, under one lock for the cached ones.

        A cached header whose file was seen while the folder's mtime was M is trusted while the
        mtime still is M: deleting a file (another process forgetting a fact) changes it. An
        mtime younger than ``_RACY_NS`` is never trusted, since a change within the same
        clock tick would leave it as it was (git's "racily clean" rule). Raises
        :class:`EntryMissingError` for the first key that is gone.
        """
        try:
            folder: int | None = os.stat(self._root_str).st_mtime_ns
        except OSError:  # the folder is gone: nothing is trusted, every read says so
            folder = None
        stamp = folder if folder is not None and time.time_ns() - folder > _RACY_NS else None

        def read(keys: Sequence[str]) -> list[EntryHeader]:
            # C-level passes over the keys (~50 a request, inside vLLM's step).
            if stamp is not None:
                with self._lock:
                    cached = list(map(self._headers.get, keys))
                    seen = list(map(self._seen_at.get, keys))
                if all(cached) and seen.count(stamp) == len(keys):  # a header is always true
                    return cached  # type: ignore[return-value]
                found = [h if at == stamp else None for h, at in zip(cached, seen, strict=True)]
            else:
                found = [None] * len(keys)
            out = []
            for key, header in zip(keys, found, strict=True):
                if header is None:
                    header = self.header(key)  # the file existed after the folder was statted
                    if stamp is not None:
                        with self._lock:
                            self._seen_at[key] = stamp
                out.append(header)
            return out

        return read

    def get(self, key: str, fingerprint: str | None = None) -> FactKV:
        """The entry from the fastest tier holding it (which marks it recently used).

        An entry read from disk is kept in host RAM; only :meth:`prefetch` moves entries to the
        device pool (so entries returned by a series of ``get`` never evict one another).
        Raises :class:`FingerprintMismatchError` if the entry belongs to another model than
        ``fingerprint`` (default: the store's own fingerprint, if it has one).
        """
        expected = fingerprint or self.fingerprint
        self.path(key)
        with self._lock:
            entry, tier = self._lookup(key)
            if entry is not None:
                self._hits[tier] += 1
            version = self._versions.get(key, 0)
        if entry is None:
            try:
                entry = to_host(self._read(key), self.host_tier.pin)
            except EntryMissingError:
                with self._lock:
                    self._misses += 1
                raise
            with self._lock:
                self._hits["disk"] += 1
                if self._versions.get(key, 0) == version:
                    self.host_tier.put(entry)
        if expected is not None and entry.fingerprint != expected:
            raise FingerprintMismatchError(key, entry.fingerprint, expected)
        return entry

    def get_many(self, keys: Sequence[str], fingerprint: str | None = None) -> list[FactKV]:
        """``[get(key) for key in keys]``, with one lock for all entries held in memory (the
        connector reads ~50 per request); entries on disk only are read as :meth:`get` does."""
        expected = fingerprint or self.fingerprint
        found: list[FactKV | None] = []
        with self._lock:
            for key in keys:
                entry, tier = self._lookup(key)
                if entry is not None:
                    self._hits[tier] += 1
                found.append(entry)
        out = []
        for key, entry in zip(keys, found, strict=True):
            if entry is None:
                entry = self.get(key, fingerprint)
            elif expected is not None and entry.fingerprint != expected:
                raise FingerprintMismatchError(key, entry.fingerprint, expected)
            out.append(entry)
        return out

    def device_spans(
        self, keys: Sequence[str]
    ) -> tuple[torch.Tensor, np.ndarray, EntryLayout] | MixedSpans | None:
        """Where ``keys`` sit in the device pool, for the load kernels to read them in place:
        plain entries of one layout as :meth:`DeviceTier.spans` gives them, a request with
        compressed entries as :class:`MixedSpans`. None unless all are there, readable in place
        together, with this store's fingerprint (then :meth:`get_many` serves them, or says
        what is wrong)."""
        tier = self.device_tier
        if tier is None:
            return None
        with self._lock:
            found = tier.spans(keys, self.fingerprint)
            if found is None:
                found = tier.mixed_spans(keys, self.fingerprint)
            if found is not None:
                self._hits["device"] += len(keys)
        return found

    def prefetch(self, keys: Iterable[str]) -> PrefetchReport:
        """Move ``keys`` to the fastest tier before an injection; missing keys are reported.

        On CUDA the copies run on a side stream; a later ``get`` on the current stream waits
        for them. Entries of this call are never evicted by one another: if they do not all
        fit, the rest stay in (and are served from) a slower tier.
        """
        wanted = list(dict.fromkeys(keys))
        device = self.device_tier
        report = PrefetchReport("device" if device is not None else "host")
        if device is not None:
            with self._lock:  # the common case, once per request: all already in the pool
                if all(key in device for key in wanted):  # keys checked when they were put
                    for key in wanted:
                        device.touch(key)
                    report.already = len(wanted)
                    return report
        for key in wanted:
            self._file(key)  # validates the key
        with self._lock:
            versions = {key: self._versions.get(key, 0) for key in wanted}
            from_disk = [
                k for k in wanted if k not in self.host_tier and (device is None or k not in device)
            ]
        loaded: dict[str, FactKV] = {}
        # File reads, outside the lock, several at once: a cold read waits on the disk (and
        # the raw reads into the region and the checksum release the GIL), so one file at a
        # time leaves the disk's queue nearly empty, most of all for small compressed entries.
        pool = self._readers() if len(from_disk) > 1 else None
        reads = (
            pool.map(self._read_hosted, from_disk) if pool else map(self._read_hosted, from_disk)
        )
        for key, entry in zip(from_disk, reads, strict=True):
            if entry is None:
                report.missing.append(key)
            else:
                loaded[key] = entry
        with self._lock:
            for key, entry in loaded.items():
                if self._versions.get(key, 0) == versions[key]:
                    self.host_tier.put(entry)
            if device is None:
                if loaded:
                    report.moved["disk"] = sum(e.nbytes for e in loaded.values())
                report.already = len(wanted) - len(from_disk)
                for key in wanted:
                    self.host_tier.get(key)  # most recently used, in request order
                return report
            keep = {key for key in wanted if key in device}
            to_place: list[tuple[str, FactKV]] = []  # (source tier, entry)
            for key in wanted:
                if key in device:
                    device.touch(key)
                    report.already += 1
                    continue
                hosted = self.host_tier.get(key)  # also marks it recently used there
                source, entry = ("disk", loaded[key]) if key in loaded else ("host", hosted)
                if entry is None or self._versions.get(key, 0) != versions[key]:
                    continue  # missing, or deleted/replaced meanwhile
                to_place.append((source, entry))
            placed = device.place_many([entry for _, entry in to_place], keep, self._demote)
            for (source, entry), done in zip(to_place, placed, strict=True):
                if done:
                    report.moved[source] = report.moved.get(source, 0) + entry.nbytes
                else:
                    report.skipped.append(entry.key)
        return report

    def where(self, key: str) -> list[str]:
        """The tiers holding ``key``, fastest first (for tests and diagnostics)."""
        with self._lock:
            tiers = [
                name
                for name, tier in (("device", self.device_tier), ("host", self.host_tier))
                if tier is not None and key in tier
            ]
        return [*tiers, "disk"] if self.has(key) else tiers

    def demote(self, keys: Iterable[str], to: str, pin: bool | None = None) -> int:
        """Leave ``keys`` in tier ``to`` and the slower ones only (benchmarks of the tiers).

        ``to="disk"`` drops their memory copies (the files stay); ``to="host"`` drops their
        device copies and holds them in host RAM, pinned if ``pin`` (default: the host tier's
        own setting; pinning needs CUDA). Returns the entries' K+V bytes.
        """
        if to not in ("host", "disk"):
            raise ValueError(f"demote to 'host' or 'disk', not {to!r}")
        wanted = list(dict.fromkeys(keys))
        with self._lock:
            for key in wanted:
                if self.device_tier is not None:
                    self.device_tier.remove(key)
                if to == "disk":
                    self.host_tier.pop(key)
        if to == "host":
            pin = self.host_tier.pin if pin is None else pin
            for key in wanted:
                entry = self.get(key)  # from host RAM, or read into it
                if entry.k.is_pinned() != pin:
                    with self._lock:
                        self.host_tier.put(to_host(entry, pin, copy=True))
        return sum(self.header(key).nbytes for key in wanted)

    def stats(self) -> StoreStats:
        """Bytes and entries per tier, hits per tier, bytes per token and per fact."""
        entries, file_bytes, payload, tokens = scan(self.root)
        tiers: dict[str, TierStats] = {}
        with self._lock:
            dev = self.device_tier
            if dev is not None:
                tiers["device"] = TierStats(len(dev), dev.used, dev.budget, self._hits["device"])
            host = self.host_tier
            tiers["host"] = TierStats(len(host), host.used, host.budget, self._hits["host"])
            tiers["disk"] = TierStats(entries, file_bytes, None, self._hits["disk"])
            misses = self._misses
        return StoreStats(
            tiers,
            misses,
            tokens,
            payload / tokens if tokens else 0.0,
            payload / entries if entries else 0.0,
        )

    # ---- helpers (the ones ending in _locked / called under the lock say so) ----
    def _lookup(self, key: str) -> tuple[FactKV | None, str]:
        """Under the lock: the entry from the fastest memory tier holding it."""
        if self.device_tier is not None:
            entry = self.device_tier.get(key)
            if entry is not None:
                return entry, "device"
        return self.host_tier.get(key), "host"

    def _invalidate(self, key: str) -> int:
        """Under the lock: drop ``key`` from every memory tier; returns its new version."""
        version = self._versions[key] = next(self._clock)
        self._headers.pop(key, None)
        self._stamps.pop(key, None)
        self._seen_at.pop(key, None)
        self.host_tier.pop(key)
        if self.device_tier is not None:
            self.device_tier.remove(key)
        return version

    def _demote(self, key: str, views: FactKV) -> None:
        """Under the lock: an entry leaving the device pool goes to host RAM (copied out)."""
        if key not in self.host_tier:
            self.host_tier.put(to_host(views, self.host_tier.pin, copy=True))

    def _readers(self) -> ThreadPoolExecutor:
        """The threads that read a prefetch's files (made on first use)."""
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(READ_THREADS, thread_name_prefix="kv-read")
            return self._pool

    def _read_hosted(self, key: str) -> FactKV | None:
        """:meth:`_read` into host RAM (one region, pinned as the host tier is); None if it is
        missing or damaged (set aside)."""
        try:
            return self._read(key)  # host RAM's own copy, or read into a region as it is
        except EntryMissingError:
            return None

    def _read(self, key: str) -> FactKV:
        with self._lock:
            version = self._versions.get(key, 0)
        try:
            header = self.header(key)  # a first sight reads it whole, into host RAM
            with self._lock:
                hosted = self.host_tier.get(key)
            if hosted is not None and self._versions.get(key, 0) == version:
                return hosted
            return read_entry(header, self.path(key), self.host_tier.pin)  # a host region
        except EntryCorruptError:
            self._set_aside(key, version)
            raise

    def _set_aside(self, key: str, version: int) -> None:
        """A damaged entry's file is deleted (unless it was replaced meanwhile): its fact goes
        in as text, and is encoded again (:meth:`lost`)."""
        log.warning("KV entry %s is damaged; deleting it (its fact is encoded again)", key)
        with self._lock:
            if self._versions.get(key, 0) != version:
                return
            self._invalidate(key)
            self._lost.add(key)
        with contextlib.suppress(FileNotFoundError):
            self.path(key).unlink()

    def lost(self) -> list[str]:
        """The keys of damaged entries deleted since the last call (whoever records which
        fact an entry encodes forgets those rows, so the facts are encoded again)."""
        with self._lock:
            keys, self._lost = sorted(self._lost), set()
        return keys


def _stamp(file: str) -> tuple[int, int]:
    """``(size, mtime_ns)`` of a file: a rewrite by anyone changes it."""
    st = os.stat(file)
    return st.st_size, st.st_mtime_ns
