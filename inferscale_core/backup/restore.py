"""Restoring a backup: into folders beside the targets, checked, then swapped in by rename.

1. The header is read (not a backup, a newer format, a missing or wrong passphrase: refused
   before anything is written), and each target folder must be empty unless ``force``.
2. The payload is unpacked into ``.<folder name>.restore-<pid>-…`` beside each target (folders
   0700, files 0600; only regular files under the known roots are accepted).
3. Checks: every chunk authenticated to the end, the manifest's members exactly the files
   unpacked, each one's size and SHA-256, each database's ``PRAGMA integrity_check`` and row
   counts. Any failure removes the unpacked folders and leaves the targets as they were.
4. Swap, one root at a time (the data folder first): an existing folder with files is renamed
   ``<name>.before-restore-<time>`` (kept), an empty one removed, and the unpacked folder is
   renamed into place. A crash or ``kill -9`` before this step leaves the targets untouched.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tarfile
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path, PurePosixPath

from inferscale_core.backup.archive import Progress, sweep_leftovers
from inferscale_core.backup.manifest import MANIFEST_NAME, Manifest, check_name
from inferscale_core.backup.sealed import (
    BackupError,
    DamagedBackupError,
    SealedReader,
    read_header,
)
from inferscale_core.backup.snapshot import integrity_problem, row_counts
from inferscale_core.files import fsync_dir, fsync_tree

RESTORE = ".restore-"  # beside a target: .<folder name>.restore-<pid>-<random>
ASIDE = ".before-restore-"  # an old folder kept: <folder name>.before-restore-<time>


class HomeNotEmptyError(BackupError):
    pass


@dataclass(slots=True)
class RestoreReport:
    manifest: Manifest
    restored: dict[str, Path]  # root name -> the folder now holding it
    kept_aside: dict[str, Path] = field(default_factory=dict)  # root -> the old folder


def has_files(folder: Path) -> bool:
    """True when ``folder`` holds a file anywhere under it (empty folders do not count)."""
    return folder.is_dir() and any(not p.is_dir() for p in folder.rglob("*"))


def restore_backup(
    path: Path | str,
    roots: Mapping[str, Path],
    *,
    passphrase: Callable[[], str | None] = lambda: None,
    force: bool = False,
    on_progress: Progress | None = None,
) -> RestoreReport:
    """Restore the backup at ``path`` into ``roots`` (``{"data": data folder, "config": ...}``).

    ``passphrase()`` is asked only when the file is encrypted. Raises :class:`BackupError`
    (one-line message) when the file cannot be restored or a root is not empty without
    ``force``; then no root was changed.
    """
    path = Path(path).expanduser()
    name = str(path)
    roots = {root: Path(folder).expanduser().absolute() for root, folder in roots.items()}
    try:
        src = open(path, "rb")  # noqa: SIM115 - closed below
    except FileNotFoundError as exc:
        raise BackupError(f"no file {name}") from exc
    with src:
        header = read_header(src, name)
        busy = [r for r in roots.values() if has_files(r)]
        if busy and not force:
            raise HomeNotEmptyError(
                f"{busy[0]} is not empty: restore --force keeps it aside"
                f" ({busy[0].name}{ASIDE}<time>) and restores into its place"
            )
        reader = SealedReader(src, header, passphrase() if header.encrypted else None, name)
        total = os.fstat(src.fileno()).st_size
        folders = _distinct(roots)
        stages = {folder: _stage_folder(folder) for folder in folders}
        staged = {root: stages[folder] for root, folder in roots.items()}
        try:
            manifest = _unpack(reader, staged, name, lambda: src.tell(), total, on_progress)
            _check(manifest, staged, name)
            for stage in stages.values():
                fsync_tree(stage)
            aside = _swap(stages)
        except BaseException:
            for stage in stages.values():
                shutil.rmtree(stage, ignore_errors=True)
            raise
    if on_progress is not None:
        on_progress("done", total, total)
    kept = {root: aside[folder] for root, folder in roots.items() if folder in aside}
    return RestoreReport(manifest, roots, kept)


def _distinct(roots: Mapping[str, Path]) -> list[Path]:
    """The target folders, each once (macOS keeps data and config in one folder); in order."""
    folders = list(dict.fromkeys(roots.values()))
    for a in folders:
        for b in folders:
            if a != b and a.is_relative_to(b):
                raise ValueError(f"cannot restore into {a}: it is inside {b}, also restored")
    return folders


def _stage_folder(target: Path) -> Path:
    target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    prefix = f".{target.name}{RESTORE}"
    sweep_leftovers(target.parent, prefix)
    return Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=target.parent))  # 0700


def _unpack(
    reader: SealedReader,
    staged: Mapping[str, Path],
    name: str,
    position: Callable[[], int],
    total: int,
    on_progress: Progress | None,
) -> Manifest:
    """Write every member into its staged folder; the manifest (the last member)."""
    found: dict[str, tuple[int, str]] = {}  # member name -> (size, sha256)
    manifest_raw: bytes | None = None
    try:
        with tarfile.open(fileobj=reader, mode="r|") as tar:
            for info in tar:
                if manifest_raw is not None:
                    raise DamagedBackupError(f"{name} has members after its manifest")
                if not info.isreg():
                    raise DamagedBackupError(f"{name} holds {info.name!r}, not a plain file")
                fileobj = tar.extractfile(info)
                assert fileobj is not None
                if info.name == MANIFEST_NAME:
                    manifest_raw = fileobj.read()
                    continue
                found[info.name] = _write_member(fileobj, info, staged, name)
                if on_progress is not None:
                    on_progress(f"restoring {info.name}", position(), total)
    except tarfile.TarError as exc:
        raise DamagedBackupError(f"{name} is damaged ({exc})") from exc
    if reader.read().strip(b"\0"):  # past tar's zero padding: to the authenticated end
        raise DamagedBackupError(f"{name} has data after its end")
    if manifest_raw is None:
        raise DamagedBackupError(f"{name} has no manifest")
    try:
        manifest = Manifest.from_json(manifest_raw)
    except (ValueError, KeyError, TypeError) as exc:
        raise DamagedBackupError(f"{name} has a damaged manifest ({exc})") from exc
    listed = {m.name: (m.size, m.sha256) for m in manifest.members}
    if set(listed) != set(found):
        odd = sorted(set(listed) ^ set(found))[:3]
        raise DamagedBackupError(f"{name}: its manifest and members differ ({', '.join(odd)})")
    for member, stored in listed.items():
        if found[member] != stored:
            raise DamagedBackupError(f"{name}: {member} differs from its manifest (size/sha256)")
    return manifest


def _write_member(
    fileobj, info: tarfile.TarInfo, staged: Mapping[str, Path], name: str
) -> tuple[int, str]:
    try:
        check_name(info.name)
    except ValueError as exc:
        raise DamagedBackupError(f"{name}: {exc}") from exc
    root, *rest = PurePosixPath(info.name).parts
    if root not in staged:
        raise DamagedBackupError(f"{name} holds {info.name!r}, outside the folders it restores")
    target = staged[root].joinpath(*rest)
    for folder in reversed(target.parents):
        if folder.is_relative_to(staged[root]) and not folder.exists():
            folder.mkdir(mode=0o700)
    digest = hashlib.sha256()
    size = 0
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        while block := fileobj.read(1 << 20):
            digest.update(block)
            size += len(block)
            out.write(block)
    return size, digest.hexdigest()


def _check(manifest: Manifest, staged: Mapping[str, Path], name: str) -> None:
    """Each database's integrity and row counts against the manifest."""
    for member in manifest.members:
        if member.kind not in ("factlog", "sqlite"):
            continue
        root, *rest = PurePosixPath(member.name).parts
        db = staged[root].joinpath(*rest)
        problem = integrity_problem(db)
        if problem is not None:
            raise DamagedBackupError(f"{name}: {member.name} fails integrity_check ({problem})")
        if row_counts(db) != (member.rows or {}):
            raise DamagedBackupError(f"{name}: {member.name} has other row counts than listed")


def _swap(stages: Mapping[Path, Path]) -> dict[Path, Path]:
    """Rename each staged folder into its target's place; ``{target: where it was kept}``."""
    aside: dict[Path, Path] = {}
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    for target, stage in stages.items():
        if has_files(target):
            kept = target.with_name(f"{target.name}{ASIDE}{stamp}")
            n = 1
            while kept.exists():
                n += 1
                kept = target.with_name(f"{target.name}{ASIDE}{stamp}-{n}")
            target.rename(kept)
            aside[target] = kept
        elif target.is_dir():
            _remove_empty(target)
        stage.rename(target)
        fsync_dir(target.parent)
    return aside


def _remove_empty(folder: Path) -> None:
    """Remove a tree of empty folders (it holds no file: :func:`has_files`)."""
    for sub in sorted(folder.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        with contextlib.suppress(OSError):
            sub.rmdir()
    folder.rmdir()
