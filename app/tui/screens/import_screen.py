"""The import screen: pick an export file or folder, watch a bar per file, see what failed."""

from __future__ import annotations

from pathlib import Path

from rich.cells import cell_len
from textual import work
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.content import Content
from textual.screen import Screen
from textual.widget import Widget
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

from app.tui.inbox import quarantine_reason
from app.tui.widgets.status import StatusBar
from inferscale_core.importers.pipeline import (
    ImportReport,
    ProgressEvent,
    is_candidate,
)

#: The most cells a file name takes in the quarantine table (longer ones: :func:`fit_name`).
NAME_CELLS = 24

STATUS_WORDS = {"imported": "imported", "skipped": "already imported", "quarantined": "quarantined"}


def outcome(report: ImportReport) -> str:
    """``N files: … imported, … already imported, … quarantined; … conversations, … turns``."""
    return (
        f"{report.files_seen} files: {len(report.imported)} imported, "
        f"{len(report.skipped)} already imported, {len(report.quarantined)} quarantined; "
        f"{report.conversations:,} conversations, {report.turns_added:,} turns added"
    )


def fit_name(name: str, width: int) -> str:
    """``name`` in at most ``width`` cells, cut in the middle with "…"; the extension stays.

    ``claude_conversations.json`` in 20 cells is ``claude_con…ions.json``.
    """
    if cell_len(name) <= width:
        return name
    if width <= 1:
        return "…"[:width]
    room = width - 1  # cells for the two ends
    dot = name.rfind(".")
    extension = cell_len(name[dot:]) if dot > 0 else 0
    tail = min(max(extension, room // 2), room - 1)
    head = room - tail
    return _first_cells(name, head) + "…" + _first_cells(name[::-1], tail)[::-1]


def _first_cells(text: str, cells: int) -> str:
    """The longest start of ``text`` that fits in ``cells`` (wide characters count 2)."""
    used = 0
    for i, char in enumerate(text):
        used += cell_len(char)
        if used > cells:
            return text[:i]
    return text


class FileName(Widget):
    """``[i/n] name``: the name fitted to the widget's width by :func:`fit_name`."""

    DEFAULT_CSS = "FileName { height: 1; }"

    def __init__(self, counter: str, file_name: str, classes: str = "") -> None:
        super().__init__(classes=classes)
        self.counter = counter
        self.file_name = file_name

    def render(self) -> Content:
        room = self.content_size.width - cell_len(self.counter)
        return Content(self.counter + fit_name(self.file_name, room))


class ExportTree(DirectoryTree):
    """Folders and export candidates only (no dotfiles or partial downloads)."""

    def filter_paths(self, paths):
        return [p for p in paths if is_candidate(p)]


class FileProgress(Horizontal):
    """One file's row: name, bar, what happened."""

    def __init__(self, event: ProgressEvent) -> None:
        super().__init__(classes="file-progress")
        self.path = event.path
        self.counter = f"[{event.file_index}/{event.file_count}] "

    def compose(self):
        yield FileName(self.counter, self.path.name, classes="file-name")
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

    async def on_mount(self) -> None:
        tree = self.query_one(ExportTree)
        tree.root.set_label(f"{self.root.name or self.root}/")
        table = self.query_one("#quarantine", DataTable)
        table.add_column("file", key="file")
        table.add_column("reason", key="reason")
        self.query_one("#import-total").display = False
        self.query_one("#import-path").focus()
        await self.show_earlier_quarantined()

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
        """The import runs here, on its own fact-log connection; progress is pushed to the UI,
        and the memory worker is woken for the new turns."""
        app = self.app
        try:
            report = app.host.import_path(
                path, app.inbox, lambda event: app.call_from_thread(self.on_progress, event)
            )
        except Exception as exc:  # noqa: BLE001 - told to the user
            app.call_from_thread(self.failed, f"{type(exc).__name__}: {exc}")
            return
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

    def show_quarantined(self, files: list[tuple[Path, str]]) -> None:
        """One row per ``(path, reason)``: the file's name, and the first line of its reason
        (what is wrong, what to do) wrapped to the table's width."""
        table = self.query_one("#quarantine", DataTable)
        names = [fit_name(path.name, NAME_CELLS) for path, _ in files]
        name_width = max(map(cell_len, ["file", *names]))
        # each column gets cell_padding on both sides; 2 more cells for the scrollbar
        spare = table.scrollable_content_region.width - name_width - 4 * table.cell_padding - 2
        table.clear(columns=True)
        table.add_column("file", key="file", width=name_width)
        table.add_column("reason", key="reason", width=max(spare, 20))
        for (path, reason), name in zip(files, names, strict=True):
            table.add_row(name, quarantine_reason(path, reason), height=None)

    async def show_earlier_quarantined(self) -> None:
        """Files quarantined before (from the inbox too), until an import here shows its own."""
        files = await self.app.read(lambda log, pid: log.quarantined_imports(pid))
        if files and not self.rows:
            self.show_quarantined(files)

    def failed(self, error: str) -> None:
        self.query_one("#import-summary", Label).update(f"Import failed: {error}")
        self.notify(error, severity="error")

    def finished(self, report: ImportReport) -> None:
        self.report = report
        self.query_one("#import-summary", Label).update(outcome(report))
        self.show_quarantined([(r.path, r.reason or "") for r in report.quarantined])
        self.notify(
            f"Import done: {len(report.imported)} imported, {len(report.quarantined)} quarantined."
        )
