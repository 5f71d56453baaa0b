"""``inferscale-assistant import PATH`` and ``inferscale-assistant watch [INBOX]``.

Both use the fact log at ``data_dir()/memory.db`` and the config's profile ("default"). Files
directly in the inbox (the config's ``inbox``, else ``data_dir()/inbox``; ``watch`` may be given
another) are moved to its ``imported/`` or ``quarantine/`` folder; files named elsewhere are only
read.
"""

from __future__ import annotations

import argparse
import dataclasses
import threading
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from app.user_config import load_config
from inferscale_core import paths
from inferscale_core.desk import Desk
from inferscale_core.importers.pipeline import (
    REASON_SUFFIX,
    FileResult,
    ImportReport,
    ProgressEvent,
)
from inferscale_core.importers.watcher import InboxWatcher

PROFILE = "default"


def run_import(
    path: Path, console: Console, profile: str = PROFILE, inbox: Path | None = None
) -> tuple[int, int]:
    """Import a file or a folder: (0 when no file was quarantined, else 1; the turns added).
    Files from ``inbox`` (default: the data folder's) are moved out of it when done."""
    desk = Desk(paths.memory_db(), profile)
    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.fields[turns]:>7,} turns"),
        TimeElapsedColumn(),
        console=console,
    ) as progress:
        report = desk.import_path(path, inbox or paths.inbox_dir(), _ProgressBars(progress))
    desk.close()
    console.print(report_table(report))
    console.print(summary(report))
    return (1 if report.quarantined else 0), report.turns_added


def run_watch(inbox: Path, console: Console, profile: str = PROFILE) -> int:
    """Import what lands in ``inbox`` until Ctrl-C; one line per file."""
    inbox = Path(inbox).expanduser()
    desk = Desk(paths.memory_db(), profile)

    def on_error(path: Path, exc: Exception) -> None:
        console.print(f"[red]error[/red] {escape(path.name)}: {escape(str(exc))} (left in place)")

    def on_result(result: FileResult) -> None:
        console.print(line(result))

    watcher = InboxWatcher(
        inbox, lambda: desk.importer(inbox), on_result=on_result, on_error=on_error
    )
    with watcher:
        console.print(f"watching {escape(str(watcher.inbox))} (Ctrl-C to stop)")
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            console.print("stopping…")
    desk.close()
    return 0


class _ProgressBars:
    """``on_progress`` for :meth:`Importer.import_path`: one bar per file plus a total."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.total: TaskID | None = None
        self.task: TaskID | None = None

    def __call__(self, event: ProgressEvent) -> None:
        progress = self.progress
        if self.total is None and event.file_count > 1:
            self.total = progress.add_task("all files", total=event.file_count, turns=0)
        if event.kind == "start":
            name = f"[{event.file_index}/{event.file_count}] {escape(event.path.name)}"
            self.task = progress.add_task(name, total=None, turns=0)
        assert self.task is not None
        progress.update(self.task, turns=event.file_turns)
        if self.total is not None:
            progress.update(self.total, turns=event.total_turns)
        if event.kind == "done":
            assert event.result is not None
            status = _STYLES[event.result.status]
            description = progress.tasks[self.task].description
            progress.update(self.task, total=1, completed=1, description=f"{description} {status}")
            if self.total is not None:
                progress.advance(self.total)


_STYLES = {
    "imported": "[green]imported[/green]",
    "skipped": "[dim]skipped (already imported)[/dim]",
    "quarantined": "[red]quarantined[/red]",
}


def report_table(report: ImportReport) -> Table:
    """One row per file: status, format, conversations, turns added, reason."""
    table = Table(title="import", title_justify="left")
    table.add_column("file")
    table.add_column("status")
    table.add_column("format")
    table.add_column("conversations", justify="right")
    table.add_column("turns added", justify="right")
    memories = report.facts_added > 0
    if memories:
        table.add_column("memories added", justify="right")
    table.add_column("reason / moved to")
    for f in report.files:
        note = f.reason if f.reason else (str(f.moved_to) if f.moved_to else "")
        table.add_row(
            escape(f.path.name),
            _STYLES[f.status],
            f.format or "",
            f"{f.conversations:,}",
            f"{f.turns_added:,}",
            *([f"{f.facts_added:,}"] if memories else []),
            escape(note),
        )
    return table


def summary(report: ImportReport) -> str:
    """``N files: … imported, … skipped, … quarantined; … turns in … s (… turns/s)``."""
    return (
        f"{report.files_seen} files: {len(report.imported)} imported, "
        f"{len(report.skipped)} skipped, {len(report.quarantined)} quarantined; "
        f"{report.conversations:,} conversations, {report.turns_added:,} turns added "
        + (f"and {report.facts_added:,} memories " if report.facts_added else "")
        + f"in {report.seconds:.2f} s ({report.turns_per_s:,.0f} turns/s)"
    )


def line(result: FileResult) -> str:
    """One line for the watcher's log of a file."""
    name = escape(result.path.name)
    if result.status == "quarantined":
        first = (result.reason or "").splitlines()[0] if result.reason else ""
        where = f" (details in {result.moved_to}{REASON_SUFFIX})" if result.moved_to else ""
        return f"{_STYLES['quarantined']} {name}: {escape(first)}{escape(where)}"
    if result.format == "memories":
        return f"{_STYLES[result.status]} {name}: {result.facts_added:,} new memories"
    return (
        f"{_STYLES[result.status]} {name}: {result.conversations:,} conversations, "
        f"{result.turns_added:,} new turns"
    )


def register(sub: argparse._SubParsersAction) -> None:
    imp = sub.add_parser(
        "import",
        help="import chat exports (ChatGPT, Claude, WhatsApp, JSONL, Markdown, LoCoMo) or a"
        " memory export",
        description="Import a file or a folder of chat exports into the memory. Files already"
        " imported (same content) are skipped; a grown export imports only what is new. Bad"
        " files are reported with the reason (and quarantined when they come from the inbox)."
        " A file written by `memory export` adds its memories (text, the day each is about,"
        " when it was learnt) to the profile: --profile moves memories between profiles;"
        " memories the profile has already are not added twice.",
    )
    imp.add_argument("path", type=Path, help="an export file or a folder of them")
    imp.add_argument("--profile", help="into whose memory (default: the config's profile)")
    imp.add_argument(
        "--encode",
        action="store_true",
        help="then extract facts from the new turns and encode their KV now, with progress"
        " (otherwise the assistant does it in the background when it runs; a running one,"
        " the app or `daemon`, is told to start at once, with or without --encode)",
    )
    imp.set_defaults(func=_run_import)
    watch = sub.add_parser(
        "watch",
        help="watch a folder and import every export dropped into it",
        description="Import files dropped into INBOX once they are completely written; imported"
        " files move to INBOX/imported/, bad ones to INBOX/quarantine/ with a .reason.txt.",
    )
    watch.add_argument("inbox", type=Path, nargs="?", help="the folder (default: the data inbox)")
    watch.set_defaults(func=_run_watch)


def _run_import(args: argparse.Namespace, console: Console) -> int:
    config = load_config(console)
    if config is None:
        return 2
    profile = args.profile or config.profile
    code, added = run_import(args.path, console, profile, paths.inbox_dir(config.inbox))
    config = dataclasses.replace(config, profile=profile)
    if _wake_resident(config, console):
        return code  # the running assistant encodes them: no second engine
    if not args.encode:
        if added:
            console.print(
                "their memories are extracted and encoded when the assistant next runs"
                " (`inferscale-assistant`, or `inferscale-assistant daemon`); until then"
                " `memory list` shows none of them. `import --encode` does it now."
            )
        return code
    from app.commands.encode import encode_pending

    return max(code, encode_pending(config, console))


def _wake_resident(config, console: Console) -> bool:
    """Tell the running assistant (the app, the daemon) of the config's profile that new
    turns are in: its memory worker extracts and encodes them now. False when none runs."""
    from app.resident import connect

    remote = connect(config)
    if remote is None:
        return False
    with remote:
        remote.wake()
        pid = remote.hello()["pid"]
    console.print(f"the running assistant (pid {pid}) extracts and encodes them now")
    return True


def _run_watch(args: argparse.Namespace, console: Console) -> int:
    config = load_config(console)
    if config is None:
        return 2
    return run_watch(args.inbox or paths.inbox_dir(config.inbox), console, config.profile)
