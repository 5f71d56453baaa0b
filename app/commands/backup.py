"""``inferscale-assistant backup FILE`` and ``restore FILE``: the whole memory in one file.

What goes in (``home_members``): the fact log (``data/memory.db``), the server's fact log and
users (``data/serve/memory.db``, ``users.db``; ``app/commands/serve.py``), the settings
(``config/config.toml``) and the registered models (``config/models.json``:
``inferscale_core/model_registry.py``), and with ``--with-kv`` the KV entry files of both fact
logs. The work is :mod:`inferscale_core.backup`'s; this module finds the files, the passphrase,
and tells the user what was done and what happens next.
"""

from __future__ import annotations

import argparse
import getpass
import os
import sys
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TransferSpeedColumn,
)

from inferscale_core import paths
from inferscale_core.backup import BackupError, Manifest, Member, PassphraseNeededError

PASSPHRASE_ENV = "INFERSCALE_BACKUP_PASSPHRASE"
SERVE_FOLDER = "serve"  # the server's folder in the data folder (app/commands/serve.py)

BACKUP_HELP = """\
Write the whole memory into the one file FILE:
  - the fact log: conversations, turns, facts with their history and audit trail, embeddings,
    copied live with SQLite's online backup API (the app, `serve` and the memory worker may
    keep running: the copy is the database as of one moment, never half a change);
  - the settings (config.toml) and the registered model names (models.json: where each model
    came from; the model files themselves are not copied);
  - the server's memory and users (<data>/serve/memory.db, users.db: token hashes, not tokens);
  - KV entries only with --with-kv; without them the memory worker rebuilds them from the text
    after a restore (smaller file, some minutes of encoding).
Not in it: model files, the cache, the inbox's already imported exports.

FILE is written beside its final name and renamed when complete: an interrupted backup never
leaves a partial FILE. Mode 0600. Every 1 MiB chunk is authenticated, so restore refuses a
damaged, cut or changed file. --encrypt also encrypts it (AES-256-GCM under a key derived from
a passphrase by scrypt): asked twice on the terminal, or read from --passphrase-file PATH or
the environment variable INFERSCALE_BACKUP_PASSPHRASE. A lost passphrase cannot be recovered.
"""

RESTORE_HELP = """\
Restore a backup made by `backup` into this machine's data and config folders (under
INFERSCALE_HOME when set, else the platform's folders).

The file is unpacked beside them and checked before anything is replaced: every chunk
authenticated, each member's size and SHA-256 against the manifest, each database's SQLite
integrity_check and row counts. Only then is it swapped in by rename, so a refused or
interrupted restore leaves the folders as they were. Folders that already hold files are
refused without --force; with it they are kept aside, renamed <name>.before-restore-<time>.
Quit the app and `serve` first.

An encrypted backup asks for its passphrase (or --passphrase-file PATH, or
INFERSCALE_BACKUP_PASSPHRASE). KV entries that are not in the backup are encoded again by the
memory worker, in the background, when the assistant next runs with each profile; until then
replies use those memories as text.
"""


def home_members() -> list[Member]:
    """What ``backup`` copies, and under which names (missing files are left out)."""
    from inferscale_core.model_registry import registry_file

    serve = paths.data_dir() / SERVE_FOLDER
    return [
        Member("config/config.toml", paths.config_file(), "file"),
        Member("config/models.json", registry_file(), "file"),
        Member("data/memory.db", paths.memory_db(), "factlog", paths.kv_dir(), "data/kv"),
        Member(
            "data/serve/memory.db", serve / "memory.db", "factlog", serve / "kv", "data/serve/kv"
        ),
        Member("data/serve/users.db", serve / "users.db", "sqlite"),
    ]


def home_roots() -> dict[str, Path]:
    """Where ``restore`` puts each root of a backup (the data folder first: it is swapped first)."""
    return {"data": paths.data_dir(), "config": paths.config_dir()}


def passphrase(args: argparse.Namespace, what: str, confirm: bool) -> str:
    """The passphrase from ``--passphrase-file``, the environment, or the terminal (asked twice
    when ``confirm``); :class:`PassphraseNeededError` if none can be had."""
    if args.passphrase_file is not None:
        try:
            text = Path(args.passphrase_file).expanduser().read_text(encoding="utf-8")
        except OSError as exc:
            raise BackupError(f"cannot read the passphrase file: {exc}") from exc
        text = text.removesuffix("\n").removesuffix("\r")
    elif os.environ.get(PASSPHRASE_ENV):
        text = os.environ[PASSPHRASE_ENV]
    elif sys.stdin.isatty():
        text = getpass.getpass(f"passphrase for {what}: ")
        if confirm and getpass.getpass("again: ") != text:
            raise BackupError("the two passphrases differ; nothing was written")
    else:
        raise PassphraseNeededError(
            f"{what} needs a passphrase: --passphrase-file PATH or {PASSPHRASE_ENV}"
            " (or run it on a terminal to be asked)"
        )
    if not text:
        raise BackupError("the passphrase is empty")
    return text


def run_backup(args: argparse.Namespace, console: Console) -> int:
    from inferscale_core.backup import write_backup

    target = Path(args.file).expanduser().absolute()
    try:
        if args.passphrase_file is not None and not args.encrypt:
            raise BackupError("--passphrase-file goes with --encrypt")
        secret = passphrase(args, str(target), confirm=True) if args.encrypt else None
        with _ByteProgress(console) as progress:
            manifest = write_backup(
                target,
                home_members(),
                with_kv=args.with_kv,
                passphrase=secret,
                about={"models": _model_names(console)},
                on_progress=progress,
            )
    except (BackupError, OSError) as exc:
        return _refused(console, exc)
    size = target.stat().st_size
    kv = manifest.rows("kv_entries")
    console.print(
        f"wrote {escape(str(target))} ({_size(size)}{', encrypted' if args.encrypt else ''}):"
        f" {_contents(manifest)}; KV entries: "
        + (f"{kv:,}" if args.with_kv else "none (rebuilt from the text after a restore)"),
        soft_wrap=True,
        highlight=False,
    )
    return 0


def run_restore(args: argparse.Namespace, console: Console) -> int:
    from inferscale_core.backup import restore_backup

    path = Path(args.file).expanduser().absolute()
    try:
        with _ByteProgress(console) as progress:
            report = restore_backup(
                path,
                home_roots(),
                passphrase=lambda: passphrase(args, str(path), confirm=False),
                force=args.force,
                on_progress=progress,
            )
    except (BackupError, OSError) as exc:
        return _refused(console, exc)
    manifest = report.manifest
    where = ", ".join(escape(str(p)) for p in dict.fromkeys(report.restored.values()))
    console.print(
        f"restored {escape(str(path))} (made {manifest.created_at} by version"
        f" {escape(manifest.tool_version)}) into {where}: {_contents(manifest)}",
        soft_wrap=True,
        highlight=False,
    )
    for kept in dict.fromkeys(report.kept_aside.values()):
        console.print(f"the folder that was there is kept as {escape(str(kept))}", soft_wrap=True)
    for line in _next_steps(manifest):
        console.print(line, soft_wrap=True, highlight=False)
    return 0


def _refused(console: Console, exc: BaseException) -> int:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    console.print(f"[red]error:[/red] {escape(text)}", soft_wrap=True, highlight=False)
    return 2


def _model_names(console: Console) -> list[str]:
    from inferscale_core.model_registry import RegistryError, load_registry

    try:
        return sorted(load_registry())
    except RegistryError as exc:  # the file is still copied as it is
        console.print(f"[yellow]warning:[/yellow] {escape(str(exc))}", soft_wrap=True)
        return []


def _contents(manifest: Manifest) -> str:
    users = manifest.rows("users", "sqlite")
    names = {m.name for m in manifest.members}
    parts = [
        f"{manifest.rows('facts'):,} facts (every version)",
        f"{manifest.rows('turns'):,} turns in {manifest.rows('conversations'):,} conversations",
        f"{manifest.rows('profiles'):,} profiles",
        f"{users:,} server users",
        f"{len(manifest.about.get('models', [])):,} registered models",
        "settings" if "config/config.toml" in names else "no settings file",
    ]
    return ", ".join(parts)


def _next_steps(manifest: Manifest) -> list[str]:
    """What happens next to the memory: how many facts wait for KV, per profile."""
    from inferscale_core.factlog import FactLog

    lines: list[str] = []
    for member in manifest.members:
        if member.kind != "factlog":
            continue
        with FactLog.open(paths.data_dir() / member.name.removeprefix("data/")) as log:
            counts = []
            for name, pid in log.profiles().items():
                active = log.count_facts(pid).get("active", 0)
                deferred = sum(log.deferred_kv(pid).values())
                counts.append(f"{escape(name)} {active:,} active ({deferred:,} deferred)")
        kv = (member.rows or {}).get("kv_entries", 0)
        lines.append(f"{escape(member.name)}: {', '.join(counts) or 'no profiles'}")
        lines.append(
            f"  KV entries: {kv:,} restored. " if kv else "  KV entries: none in the backup. "
        )
        lines[-1] += (
            "The memory worker encodes, in the background, every active fact without an entry"
            " for the configured model when the assistant next runs with its profile (deferred"
            " ones when first retrieved); until then replies use them as text."
        )
    registered = manifest.about.get("models", [])
    if registered:
        lines.append(
            f"registered models: {escape(', '.join(registered))} (`models list` shows whether"
            " their files are on this machine; `models add` them again if not)"
        )
    return lines


def _size(n: int) -> str:
    from inferscale_core.footprint import size_text

    return size_text(n)


class _ByteProgress:
    """A byte progress bar on stderr for ``on_progress(what, done, total)``."""

    def __init__(self, console: Console) -> None:
        self.bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        )
        self.task = self.bar.add_task("starting", total=None)

    def __enter__(self) -> _ByteProgress:
        self.bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.bar.stop()

    def __call__(self, what: str, done: int, total: int) -> None:
        self.bar.update(self.task, description=escape(what), completed=done, total=total)


def register(sub: argparse._SubParsersAction) -> None:
    backup = sub.add_parser(
        "backup",
        help="write the whole memory, settings and users into one file (--encrypt)",
        description=BACKUP_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    backup.add_argument("file", type=Path, help="the backup file to write (replaced if it exists)")
    backup.add_argument(
        "--with-kv",
        action="store_true",
        help="also copy the KV entries (larger; saves re-encoding after a restore)",
    )
    backup.add_argument(
        "--encrypt", action="store_true", help="encrypt with a passphrase (AES-256-GCM, scrypt)"
    )
    _passphrase_file(backup)
    backup.set_defaults(func=run_backup)
    restore = sub.add_parser(
        "restore",
        help="restore a backup into the data and config folders (checked before replacing)",
        description=RESTORE_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    restore.add_argument("file", type=Path, help="a file written by `backup`")
    restore.add_argument(
        "--force",
        action="store_true",
        help="restore over folders that hold files, keeping them aside (<name>.before-restore-…)",
    )
    _passphrase_file(restore)
    restore.set_defaults(func=run_restore)


def _passphrase_file(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--passphrase-file",
        type=Path,
        metavar="PATH",
        help=f"read the passphrase from PATH (without its final newline; else ${PASSPHRASE_ENV},"
        " else it is asked)",
    )
