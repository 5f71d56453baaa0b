"""Writing a backup: one file, written whole or not at all.

The payload (inside the sealed envelope of :mod:`~inferscale_core.backup.sealed`) is a tar
stream: the plain files, then the KV entry files (``with_kv``), then the databases, then
``manifest.json`` with each member's size and SHA-256 and each database's row counts.

Order of the work:

1. Every database is copied live (:func:`~inferscale_core.backup.snapshot.snapshot`) into a
   private folder beside the target (``.<name>.part-<pid>-…``, removed afterwards), and the
   copy must pass ``PRAGMA integrity_check`` (a damaged database is refused now, not when the
   backup is needed).
2. A fact log's copy keeps its ``kv_entries`` rows only for entries copied with it: without
   ``with_kv`` none are (so after a restore its facts count as not encoded and the memory
   worker encodes them again); with it, the files its rows name, each read through one open
   descriptor (entries are replaced by rename, never rewritten in place), and the rows of files
   gone meanwhile (evicted, forgotten) are dropped from the copy. Facts encoded after the copy
   are simply not in it.
3. The file is written in that folder, flushed, renamed over the target and the folder flushed:
   a crash or ``kill -9`` at any point leaves the target as it was (the next backup beside it
   removes what a dead one left).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import shutil
import tarfile
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, BinaryIO

from inferscale_core.backup.manifest import MANIFEST_NAME, Manifest, Member, Stored
from inferscale_core.backup.sealed import FORMAT_VERSION, BackupError, SealedWriter
from inferscale_core.backup.snapshot import (
    database_bytes,
    integrity_problem,
    row_counts,
    snapshot,
)
from inferscale_core.files import fsync_dir

ENTRY_SUFFIX = ".safetensors"  # a KV entry file: <kv root>/<fingerprint>/<key>.safetensors
PART = ".part-"  # the work folder beside the target: .<target name>.part-<pid>-<random>

#: ``on_progress(what, done, total)``: bytes done of about ``total`` in all, and what is being done.
Progress = Callable[[str, int, int], None]


@dataclass(slots=True)
class _Planned:
    """A member as it goes into the file: where its bytes are read from now."""

    name: str
    kind: str
    path: Path  # the snapshot for a database, else the file itself
    rows: dict[str, int] | None = None


def tool_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("inferscale-assistant")
    except PackageNotFoundError:
        return "unknown"


def write_backup(
    target: Path | str,
    members: Sequence[Member],
    *,
    with_kv: bool = False,
    passphrase: str | None = None,
    about: dict[str, Any] | None = None,
    on_progress: Progress | None = None,
) -> Manifest:
    """Back ``members`` up into the file ``target`` (replaced atomically, mode 0600).

    Args:
        target: the backup file; its folder must exist.
        members: what to copy (a member whose path does not exist is left out).
        with_kv: also copy each fact log's KV entry files (else they are rebuilt after restore).
        passphrase: encrypt with it (AES-256-GCM, scrypt); None writes a plain file.
        about: notes for the manifest (registered model names, user names).
        on_progress: told how far the work is, in bytes.
    Returns the manifest written.
    """
    target = Path(target).expanduser().absolute()
    if not target.parent.is_dir():
        raise FileNotFoundError(f"no folder {target.parent} to write {target.name} in")
    if target.is_dir():
        raise IsADirectoryError(f"{target} is a folder; name the backup file")
    sweep_leftovers(target.parent, f".{target.name}{PART}")
    work = Path(tempfile.mkdtemp(prefix=f".{target.name}{PART}{os.getpid()}-", dir=target.parent))
    try:
        present = [m for m in members if m.path.is_file()]
        total = sum(database_bytes(m.path) if m.kind != "file" else 0 for m in present)
        meter = _Meter(on_progress, total)
        planned, kv_files = _copy_databases(present, work, with_kv, meter)
        meter.total += sum(p.path.stat().st_size for p in planned)
        meter.total += sum(f.stat().st_size for _, f in kv_files)
        manifest = Manifest(
            format=FORMAT_VERSION,
            created_at=datetime.now(UTC).isoformat(timespec="seconds"),
            tool_version=tool_version(),
            with_kv=with_kv,
            about=dict(about or {}),
        )
        part = work / "backup"
        fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as out:
            _write_payload(out, passphrase, planned, kv_files, manifest, meter)
            out.flush()
            os.fsync(out.fileno())
        os.replace(part, target)
        fsync_dir(target.parent)
        meter.done("done")
        return manifest
    finally:
        shutil.rmtree(work, ignore_errors=True)


def sweep_leftovers(folder: Path, prefix: str) -> None:
    """Remove ``prefix<pid>-…`` entries of ``folder`` whose process is gone (a killed backup's
    or restore's work folder)."""
    for path in folder.glob(f"{glob_escape(prefix)}*"):
        pid = path.name[len(prefix) :].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    path.unlink()


def glob_escape(text: str) -> str:
    return "".join(f"[{c}]" if c in "*?[" else c for c in text)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's
        return True
    return True


class _Meter:
    def __init__(self, on_progress: Progress | None, total: int) -> None:
        self.report = on_progress
        self.total = total
        self.base = 0  # bytes of the steps finished
        self.last = 0.0

    def at(self, what: str, done: int, force: bool = False) -> None:
        now = time.monotonic()
        if self.report is not None and (force or now - self.last > 0.1):
            self.last = now
            self.report(what, min(self.base + done, self.total), self.total)

    def step_done(self, size: int) -> None:
        self.base += size

    def done(self, what: str) -> None:
        if self.report is not None:
            self.report(what, self.total, self.total)


def _copy_databases(
    members: Sequence[Member], work: Path, with_kv: bool, meter: _Meter
) -> tuple[list[_Planned], list[tuple[str, Path]]]:
    """The members as they go into the file (databases as their snapshots in ``work``), and
    the KV entry files ``(name, path)`` to copy with them."""
    planned: list[_Planned] = []
    kv_files: list[tuple[str, Path]] = []
    for i, member in enumerate(members):
        if member.kind == "file":
            planned.append(_Planned(member.name, member.kind, member.path))
            continue
        copy = work / f"{i}.db"
        what = f"copying {member.name}"
        snapshot(member.path, copy, lambda n, what=what: meter.at(what, n))
        meter.step_done(copy.stat().st_size)
        problem = integrity_problem(copy)  # a restore would refuse it: say so now
        if problem is not None:
            raise BackupError(
                f"{member.path} is damaged (SQLite integrity_check: {problem}); no backup was"
                " written, since it could not be restored"
            )
        if member.kind == "factlog":
            kv_files += _keep_kv_rows(copy, member, with_kv)
        planned.append(_Planned(member.name, member.kind, copy, row_counts(copy)))
    return planned, kv_files


def _keep_kv_rows(copy: Path, member: Member, with_kv: bool) -> list[tuple[str, Path]]:
    """Drop from the fact log ``copy`` the ``kv_entries`` rows of entries not copied with it;
    the entry files to copy, ``(name, path)``."""
    from sqlite_utils import Database

    from inferscale_core.factlog import FactLog

    files: list[tuple[str, Path]] = []
    drop: list[str] = []
    with FactLog(Database(copy)) as log:
        for fingerprint, keys in log.kv_locations().items():
            for key in keys:
                path = None
                if with_kv and member.kv_root is not None and _plain_key(key):
                    path = member.kv_root / fingerprint / f"{key}{ENTRY_SUFFIX}"
                if path is not None and path.is_file():
                    files.append((f"{member.kv_name}/{fingerprint}/{path.name}", path))
                else:
                    drop.append(key)
        if drop:
            log.drop_kv_locations(drop)
    return files


def _plain_key(key: str) -> bool:
    return bool(key) and "/" not in key and "\\" not in key and not key.startswith(".")


def _write_payload(
    out: BinaryIO,
    passphrase: str | None,
    planned: list[_Planned],
    kv_files: list[tuple[str, Path]],
    manifest: Manifest,
    meter: _Meter,
) -> None:
    sealed = SealedWriter(out, passphrase)
    with tarfile.open(fileobj=sealed, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        files = [p for p in planned if p.kind == "file"]
        databases = [p for p in planned if p.kind != "file"]
        for item in files:
            _add(tar, item.name, item.kind, item.path, manifest, meter, item.rows)
        kv_dropped: list[str] = []
        for name, path in kv_files:
            if not _add(tar, name, "kv", path, manifest, meter, None, missing_ok=True):
                kv_dropped.append(path.stem)
        for item in databases:
            if kv_dropped and item.kind == "factlog":  # gone since the copy: the rows go too
                _drop_rows(item, kv_dropped)
            _add(tar, item.name, item.kind, item.path, manifest, meter, item.rows)
        raw = manifest.to_json()
        info = _info(MANIFEST_NAME, len(raw))
        tar.addfile(info, io.BytesIO(raw))
    sealed.close()


def _drop_rows(item: _Planned, keys: list[str]) -> None:
    from sqlite_utils import Database

    from inferscale_core.factlog import FactLog

    with FactLog(Database(item.path)) as log:
        log.drop_kv_locations(keys)
    item.rows = row_counts(item.path)


def _add(
    tar: tarfile.TarFile,
    name: str,
    kind: str,
    path: Path,
    manifest: Manifest,
    meter: _Meter,
    rows: dict[str, int] | None,
    *,
    missing_ok: bool = False,
) -> bool:
    """Stream ``path`` into ``tar`` as ``name``, hashing it; False if it vanished (and
    ``missing_ok``)."""
    try:
        src = open(path, "rb")  # noqa: SIM115 - closed below
    except FileNotFoundError:
        if missing_ok:
            return False
        raise
    with src:
        size = os.fstat(src.fileno()).st_size
        reader = _Hashing(src, lambda n: meter.at(f"writing {name}", n))
        tar.addfile(_info(name, size), reader)
    meter.step_done(size)
    manifest.members.append(Stored(name, kind, size, reader.sha256.hexdigest(), rows))
    return True


def _info(name: str, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size = size
    info.mode = 0o600
    info.mtime = int(time.time())
    return info


class _Hashing:
    """Reads a file through SHA-256, telling ``on_read`` the bytes read so far."""

    def __init__(self, src: BinaryIO, on_read: Callable[[int], None]) -> None:
        self.src = src
        self.sha256 = hashlib.sha256()
        self.count = 0
        self.on_read = on_read

    def read(self, n: int = -1) -> bytes:
        data = self.src.read(n)
        self.sha256.update(data)
        self.count += len(data)
        self.on_read(self.count)
        return data
