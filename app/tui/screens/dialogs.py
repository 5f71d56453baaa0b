"""Small modal dialogs: a yes/no confirmation and a one-line text entry."""

from __future__ import annotations

from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Static


class ConfirmDialog(ModalScreen[bool]):
    """Dismisses with True (Y, or the confirm button) or False (N, Esc)."""

    BINDINGS = [
        Binding("y", "answer(True)", "Yes"),
        Binding("n,escape", "answer(False)", "No"),
    ]

    def __init__(self, title: str, body: str, confirm: str = "Yes") -> None:
        super().__init__(classes="dialog-screen")
        self.title_text = title
        self.body = body
        self.confirm = confirm

    def compose(self):
        with Vertical(classes="dialog"):
            yield Label(self.title_text, classes="dialog-title", markup=False)
            yield Static(self.body, classes="dialog-body", markup=False)
            with Horizontal(classes="dialog-buttons"):
                yield Button(f"{self.confirm} (y)", variant="error", id="yes")
                yield Button("Cancel (n)", id="no")

    def on_mount(self) -> None:
        self.query_one("#no", Button).focus()

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.dismiss(event.button.id == "yes")


class TextDialog(ModalScreen[str | None]):
    """Asks for one line of text; Enter returns it (None when empty), Esc returns None."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, title: str, value: str = "", placeholder: str = "") -> None:
        super().__init__(classes="dialog-screen")
        self.title_text = title
        self.value = value
        self.placeholder = placeholder

    def compose(self):
        with Vertical(classes="dialog"):
            yield Label(self.title_text, classes="dialog-title", markup=False)
            yield Input(self.value, placeholder=self.placeholder, id="dialog-input")
            yield Label("Enter to save · Esc to cancel", classes="dim")

    def on_mount(self) -> None:
        self.query_one(Input).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.dismiss(event.value.strip() or None)

    def action_cancel(self) -> None:
        self.dismiss(None)


class KeysDialog(ModalScreen[None]):
    """The key bindings of the screen it was opened on, and the app's; ?, F1 or Esc closes."""

    BINDINGS = [Binding("escape,f1,question_mark,q", "close", "Close")]

    def __init__(self, title: str, groups: list[tuple[str, list[tuple[str, str]]]]) -> None:
        super().__init__(classes="dialog-screen")
        self.title_text = title
        self.groups = groups

    def compose(self):
        from rich.table import Table

        table = Table.grid(padding=(0, 2))
        table.add_column(style="bold", justify="right")
        table.add_column()
        for heading, keys in self.groups:
            table.add_row("", f"[b underline]{heading}[/]")
            for key, description in keys:
                table.add_row(key, description)
            table.add_row("", "")
        with Vertical(classes="dialog keys"):
            yield Label(self.title_text, classes="dialog-title", markup=False)
            yield Static(table, classes="dialog-body")
            yield Label("Ctrl+P: every command, searchable · Esc closes", classes="dim")

    def action_close(self) -> None:
        self.dismiss(None)
