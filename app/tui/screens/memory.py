"""The memory browser: search facts, see where each came from and its audit, edit, forget,
and undo a replacement (a fact a later one closed: "true until 2025-03")."""

from __future__ import annotations

from rich.text import Text
from textual import work
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Input, Static

from app.tui.screens.dialogs import ConfirmDialog, TextDialog
from app.tui.widgets.status import StatusBar
from inferscale_core import paths
from inferscale_core.footprint import footprint, summary
from inferscale_core.types import AuditEntry, Fact, Turn

ALL_STATUSES = ("active", "superseded", "forgotten")


def _when(value) -> str:
    return value.strftime("%Y-%m-%d %H:%M") if value is not None else "unknown time"


def fact_detail(fact: Fact, turns: list[tuple[int, Turn]], audit: list[AuditEntry]) -> Text:
    """The right-hand pane: the fact, its source turns, its audit trail."""
    text = Text()
    text.append(f"Memory #{fact.id}", style="bold")
    text.append(f" · {fact.status}", style="red" if fact.status == "forgotten" else "green")
    if fact.refers_to:
        text.append(f" · about {fact.refers_to.isoformat()}", style="cyan")
    if fact.valid_until is not None:
        text.append(f" · true until {fact.valid_until.isoformat()}", style="yellow")
        text.append(f", replaced by #{fact.ended_by} (u: undo)", style="dim")
    text.append("\n")
    text.append(fact.text or "(forgotten: the text is kept only in the audit below)")
    text.append(f"\nadded {_when(fact.created_at)} UTC", style="dim")
    if fact.supersedes:
        text.append(f" · replaces #{fact.supersedes}", style="dim")
    text.append("\n\nSource turns\n", style="bold underline")
    if not fact.source_turn_ids:
        how = f"edited from #{fact.supersedes}" if fact.supersedes else "added by hand"
        text.append(f"none ({how})\n", style="dim")
    for turn_id, turn in turns:
        text.append(f"#{turn_id} {turn.speaker}", style="bold")
        text.append(f" · {_when(turn.timestamp)}\n", style="dim")
        text.append(f"{turn.text}\n")
    missing = set(fact.source_turn_ids) - {turn_id for turn_id, _ in turns}
    if missing:
        text.append(f"(turns {sorted(missing)} were deleted)\n", style="dim")
    text.append("\nAudit\n", style="bold underline")
    for entry in audit:
        text.append(f"{_when(entry.at)} ", style="dim")
        text.append(f"{entry.action}", style="bold")
        text.append(f" · {entry.cause}\n")
        if entry.action in ("update", "forget", "delete") and entry.old_text:
            text.append(f"  was: {entry.old_text}\n", style="dim")
        if entry.action == "close" and entry.new_text:
            text.append(f"  by: {entry.new_text}\n", style="dim")
    return text


def query_misses(query: str, text: str) -> bool:
    return bool(query.strip()) and query.strip().casefold() not in text.casefold()


class MemoryScreen(Screen):
    BINDINGS = [
        Binding("escape", "app.pop_screen", "Back"),
        Binding("ctrl+f", "focus_search", "Search"),
        Binding("e", "edit", "Edit"),
        Binding("f,delete", "forget", "Forget"),
        Binding("u", "reopen", "Undo replaced"),
        Binding("a", "toggle_all", "Show all"),
    ]

    def __init__(self) -> None:
        super().__init__(id="memories")
        self.statuses: tuple[str, ...] = ("active",)
        self.facts: dict[int, Fact] = {}

    def compose(self):
        yield Header()
        with Horizontal(id="memory-body"):
            with Vertical(id="facts-pane"):
                yield Input(placeholder="search memories (Ctrl+F)", id="fact-search")
                yield Static("measuring what memory takes…", id="footprint")
                yield DataTable(id="facts", cursor_type="row", zebra_stripes=True)
            with VerticalScroll(id="fact-detail-pane"):
                yield Static("Select a memory to see its source and audit.", id="fact-detail")
        yield StatusBar()
        yield Footer()

    async def on_mount(self) -> None:
        table = self.query_one("#facts", DataTable)
        table.add_column("#", key="id")
        table.add_column("about", key="date")
        table.add_column("status", key="status")
        table.add_column("memory", key="text")
        table.focus()
        await self.reload()
        self.show_footprint()

    @work(exclusive=True, group="footprint")
    async def show_footprint(self) -> None:
        """One line over the list: memories, KV on disk per stored dtype and the budget, what
        each memory tier holds, how many wait to be encoded (``memory stats`` in full)."""
        session = getattr(self.app.host, "session", None)
        store = getattr(session, "store", None)
        config = self.app.config

        def measure(log, pid):
            return summary(footprint(log, pid, paths.kv_dir(), config, store))

        try:
            line = await self.app.read(measure)
        except Exception as exc:  # noqa: BLE001 - shown in its place
            line = f"what memory takes is unknown: {exc}"
        self.query_one("#footprint", Static).update(Text(line, style="dim"))

    def action_focus_search(self) -> None:
        self.query_one("#fact-search").focus()

    async def on_input_changed(self, event: Input.Changed) -> None:
        if event.input.id == "fact-search":
            await self.reload()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id == "fact-search":
            self.query_one("#facts").focus()

    async def action_toggle_all(self) -> None:
        self.statuses = ALL_STATUSES if self.statuses == ("active",) else ("active",)
        shown = "all memories" if len(self.statuses) > 1 else "active memories"
        self.notify(f"Showing {shown}.")
        await self.reload()

    async def reload(self, select: int | None = None) -> None:
        query = self.query_one("#fact-search", Input).value
        statuses = self.statuses
        facts = await self.app.read(lambda log, pid: log.search_facts(pid, query, statuses))
        table = self.query_one("#facts", DataTable)
        current = select if select is not None else self.selected_id
        table.clear()
        self.facts = {f.id: f for f in facts}
        for fact in facts:
            date = fact.refers_to.isoformat() if fact.refers_to else ""
            text = fact.text or "(forgotten)"
            status = fact.status
            if fact.valid_until is not None:  # true of its time, replaced since
                status = f"until {fact.valid_until.strftime('%Y-%m')}"
            table.add_row(str(fact.id), date, status, text[:200], key=str(fact.id))
        if current in self.facts:
            table.move_cursor(row=table.get_row_index(str(current)))
        self.border_subtitle = f"{len(facts)} shown"
        if facts:
            await self.show_detail(self.selected_id)
        else:
            self.query_one("#fact-detail", Static).update("No memories match.")

    @property
    def selected_id(self) -> int | None:
        table = self.query_one("#facts", DataTable)
        if table.row_count == 0:
            return None
        key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key
        return int(key.value) if key.value is not None else None

    async def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.row_key.value is not None:
            await self.show_detail(int(event.row_key.value))

    async def show_detail(self, fact_id: int | None) -> None:
        fact = self.facts.get(fact_id) if fact_id is not None else None
        if fact is None:
            return

        def load(log, pid):
            return log.get_turns(fact.source_turn_ids), log.audit(pid, fact.id)

        turns, audit = await self.app.read(load)
        self.query_one("#fact-detail", Static).update(fact_detail(fact, turns, audit))

    @work(exclusive=True, group="memory-dialog")
    async def action_forget(self) -> None:
        fact = self.facts.get(self.selected_id or -1)
        if fact is None or fact.status == "forgotten":
            self.notify("Select an active memory to forget.")
            return
        body = (
            f"#{fact.id}: {fact.text}\n\nIt is removed from the memory, the search index and "
            "every KV tier, and is never injected again. The audit keeps a record of it."
        )
        dialog = ConfirmDialog("Forget this memory?", body, "Forget")
        if not await self.app.push_screen_wait(dialog):
            return
        try:
            await self.app.call(lambda session: session.forget(fact.id))
        except Exception as exc:  # noqa: BLE001 - told to the user
            self.notify(f"Could not forget #{fact.id}: {exc}", severity="error")
            return
        self.notify(f"Forgot memory #{fact.id}.")
        await self.reload()

    @work(exclusive=True, group="memory-dialog")
    async def action_edit(self) -> None:
        fact = self.facts.get(self.selected_id or -1)
        if fact is None or fact.status != "active":
            self.notify("Select an active memory to edit.")
            return
        text = await self.app.push_screen_wait(TextDialog(f"Edit memory #{fact.id}", fact.text))
        if not text or text == fact.text:
            return
        try:
            new_id = await self.app.call(lambda session: session.edit(fact.id, text))
        except Exception as exc:  # noqa: BLE001 - told to the user
            self.notify(f"Could not edit #{fact.id}: {exc}", severity="error")
            return
        self.notify(f"Memory #{fact.id} is now #{new_id}.")
        search = self.query_one("#fact-search", Input)
        if query_misses(search.value, text):  # keep the edited memory in view
            with search.prevent(Input.Changed):
                search.value = ""
        await self.reload(select=new_id)

    @work(exclusive=True, group="memory-dialog")
    async def action_reopen(self) -> None:
        """Undo a replacement: the selected fact is true now again (audit 'reopen')."""
        fact = self.facts.get(self.selected_id or -1)
        if fact is None or fact.status != "active" or fact.valid_until is None:
            self.notify("Select a memory that a later one replaced (status 'until ...').")
            return
        try:
            await self.app.call(lambda session: session.reopen(fact.id))
        except Exception as exc:  # noqa: BLE001 - told to the user
            self.notify(f"Could not undo #{fact.id}: {exc}", severity="error")
            return
        self.notify(f"Memory #{fact.id} is true now again (replaced by #{fact.ended_by} undone).")
        await self.reload(select=fact.id)
