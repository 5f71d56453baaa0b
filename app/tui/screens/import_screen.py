"""The import screen: pick an export file or folder, watch a bar per file, see what failed."""

from __future__ import annotations

from pathlib import Path

from textual import work
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import Screen
from textual.widgets import (
    Button,
    DataTable,
    DirectoryTree,
    Footer,
    Header,
    Input,
    Label,
    ProgressBar,
)

from app.tui.widgets.status import StatusBar
from inferscale_core.factlog import FactLog
from inferscale_core.importers.pipeline import Importer, ImportReport, ProgressEvent, is_candidate

STATUS_WORDS = {"imported": "imported", "skipped": "already imported", "quarantined": "quarantined"}


def outcome(report: ImportReport) -> str:
    """``N files: … imported, … already imported, … quarantined; … conversations, … turns``."""
    return (
        f"{report.files_seen} files: {len(report.imported)} imported, "
        f"{len(report.skipped)} already imported, {len(report.quarantined)} quarantined; "
        f"{report.conversations:,} conversations, {report.turns_added:,} turns added"
    )


class ExportTree(DirectoryTree):
    """Folders and export candidates only (no dotfiles or partial downloads)."""

    def filter_paths(self, paths):
        return [p for p in paths if is_candidate(p)]


class FileProgress(Horizontal):
    """One file's row: name, bar, what happened."""

    def __init__(self, event: ProgressEvent) -> None:
        super().__init__(classes="file-progress")
        self.path = event.path
        self.label = f"[{event.file_index}/{event.file_count}] {event.path.name}"

    def compose(self):
        yield Label(self.label, classes="file-name", markup=False)
        yield ProgressBar(total=None, show_eta=False, classes="file-bar")
        yield Label("reading…", classes="file-status", markup=False)

    def update_from(self, event: ProgressEvent) -> None:
        status = self.query_one(".file-status", Label)
        if event.kind == "done" and event.result is not None:
            self.query_one(ProgressBar).update(total=1, progress=1)
            result = event.result
            status.update(
                f"{STATUS_WORDS[result.status]} · {result.conversations} conv, "
                f"{result.turns_added:,} turns"
            )
            self.add_class(result.status)
        else:
            status.update(f"{event.conversations} conv, {event.file_turns:,} turns")


class ImportScreen(Screen):
    BINDINGS = [
        Binding("escape", "app.pop_screen", "Back"),
        Binding("ctrl+s", "start", "Import"),
    ]

    def __init__(self, root: Path) -> None:
        super().__init__(id="import")
        self.root = Path(root)
        self.rows: dict[Path, FileProgress] = {}
        self.report: ImportReport | None = None

    def compose(self):
        yield Header()
        with Horizontal(id="import-body"):
            with Vertical(id="import-pick"):
                yield Label("Pick an export file or a folder of them", classes="section")
                yield ExportTree(self.root, id="import-tree")
                yield Input(placeholder="path to a file or folder", id="import-path")
                yield Button("Import (Ctrl+S)", id="import-go", variant="primary")
            with Vertical(id="import-run"):
                yield Label("Nothing imported yet.", id="import-summary", markup=False)
                yield ProgressBar(id="import-total", show_eta=False)
                yield VerticalScroll(id="import-files")
                yield Label("Quarantined files", classes="section")
                yield DataTable(id="quarantine", cursor_type="row")
        yield StatusBar()
        yield Footer()

    def on_mount(self) -> None:
        tree = self.query_one(ExportTree)
        tree.root.set_label(f"{self.root.name or self.root}/")
        table = self.query_one("#quarantine", DataTable)
        table.add_column("file", key="file")
        table.add_column("reason", key="reason")
        self.query_one("#import-total").display = False
        self.query_one("#import-path").focus()

    def on_directory_tree_file_selected(self, event: DirectoryTree.FileSelected) -> None:
        self.query_one("#import-path", Input).value = str(event.path)

    def on_directory_tree_directory_selected(self, event: DirectoryTree.DirectorySelected) -> None:
        self.query_one("#import-path", Input).value = str(event.path)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id == "import-path":
            event.stop()
            self.action_start()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "import-go":
            event.stop()
            self.action_start()

    async def action_start(self) -> None:
        value = self.query_one("#import-path", Input).value.strip()
        if not value:
            self.notify("Pick a file or folder first.", severity="warning")
            return
        path = Path(value).expanduser()
        if not path.exists():
            self.notify(f"{path} does not exist.", severity="error")
            return
        if self.is_importing:
            self.notify("An import is running.", severity="warning")
            return
        await self.query_one("#import-files").remove_children()
        self.rows.clear()
        self.query_one("#quarantine", DataTable).clear()
        total = self.query_one("#import-total", ProgressBar)
        total.update(total=None, progress=0)
        total.display = True
        self.query_one("#import-summary", Label).update(f"Importing {path.name}…")
        self.run_import(path)

    @property
    def is_importing(self) -> bool:
        return any(w.group == "import" and w.is_running for w in self.workers)

    @work(thread=True, exclusive=True, group="import")
    def run_import(self, path: Path) -> None:
        """The import runs here, on its own fact-log connection; progress is pushed to the UI."""
        app = self.app
        log = FactLog.open(app.host.db_path)
        try:
            importer = Importer(log, log.profile(app.config.profile), app.inbox)
            report = importer.import_path(
                path, on_progress=lambda event: app.call_from_thread(self.on_progress, event)
            )
        except Exception as exc:  # noqa: BLE001 - told to the user
            app.call_from_thread(self.failed, f"{type(exc).__name__}: {exc}")
            return
        finally:
            log.close()
        app.call_from_thread(self.finished, report)

    async def on_progress(self, event: ProgressEvent) -> None:
        total = self.query_one("#import-total", ProgressBar)
        if event.kind == "start":
            row = FileProgress(event)
            self.rows[event.path] = row
            await self.query_one("#import-files").mount(row)
            total.update(total=event.file_count, progress=event.file_index - 1)
            return
        row = self.rows.get(event.path)
        if row is not None:
            row.update_from(event)
        if event.kind == "done":
            total.update(progress=event.file_index)

    def failed(self, error: str) -> None:
        self.query_one("#import-summary", Label).update(f"Import failed: {error}")
        self.notify(error, severity="error")

    def finished(self, report: ImportReport) -> None:
        self.report = report
        self.query_one("#import-summary", Label).update(outcome(report))
        table = self.query_one("#quarantine", DataTable)
        for result in report.quarantined:
            reason = (result.reason or "").splitlines()[0] if result.reason else ""
            for long in {str(result.path.resolve()), str(result.path)}:  # the name says it
                reason = reason.replace(long, result.path.name)
            table.add_row(result.path.name, reason)
        session = self.app.host.session
        if session is not None and getattr(session, "worker", None) is not None:
            session.worker.wake()  # new turns: extract and encode them now
        self.notify(
            f"Import done: {len(report.imported)} imported, {len(report.quarantined)} quarantined."
        )
