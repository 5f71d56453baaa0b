"""The status line above the footer: engine state, background encoding, mode and k, the inbox."""

from __future__ import annotations

from pathlib import Path

from rich.text import Text
from textual.widgets import Static


def short_path(path: Path, limit: int = 24) -> str:
    """``path`` with ``~`` for the home folder; past ``limit`` characters only its last name is
    kept: ``~/…/inbox`` (or ``/…/inbox`` outside the home folder)."""
    path = Path(path)
    home = Path.home()
    shown = f"~/{path.relative_to(home)}" if path.is_relative_to(home) else str(path)
    if len(shown) <= limit:
        return shown
    return f"{'~' if shown.startswith('~') else ''}/…/{path.name}"


def _name(name: str, limit: int = 28) -> str:
    return name if len(name) <= limit else name[: limit - 1] + "…"


def inbox_text(app) -> Text:
    """``inbox: watching ~/…/inbox``, ``inbox: importing x.json`` or ``inbox: off (why)``."""
    state = app.inbox_state
    text = Text("inbox: ")
    if state.state == "watching":
        text.append(f"watching {short_path(app.inbox)}")
    elif state.state == "importing":
        text.append(f"importing {_name(state.detail)}", style="bold yellow")
    elif state.state == "off":
        text.append(f"off ({state.detail})", style="bold red")
    else:
        text.append("starting…", style="dim")
    return text


def status_text(app) -> Text:
    """One line from the app's state (see :class:`app.tui.app.AssistantApp`)."""
    text = Text(no_wrap=True, overflow="ellipsis")
    if app.load_error is not None:
        text.append(f" engine failed: {app.load_error} ", style="bold red")
    elif not app.host.ready:
        text.append(f" engine: {app.load_step}… ", style="bold yellow")
    else:  # the model's name is in the header
        text.append(" engine ready ", style="bold green")
    text.append("│ ")
    session = app.host.session
    stats = getattr(getattr(session, "worker", None), "stats", None)
    if stats is None:
        text.append("memory: waiting for the engine ", style="dim")
    else:
        text.append("memory: ")
        text.append(f"{stats.pending_turns} turns, {stats.pending_facts} facts queued")
        text.append(f" · {stats.encoded_facts:,} encoded · {stats.encode_rate:.1f} facts/s")
        if stats.reencoding:  # a new model: its memories go in as text until encoded
            text.append(f" · re-encoding for this model, {stats.reencoding:,} left")
        if stats.to_convert:
            text.append(f" · converting, {stats.to_convert:,} left")
        if stats.paused:
            text.append(" · paused while answering", style="dim")
        if stats.disk_full:  # the worker's last_error says where and how much
            text.append(" · disk full: new memories go in as text", style="bold red")
        elif stats.errors:
            plural = "" if stats.errors == 1 else "s"
            text.append(f" · {stats.errors} error{plural}", style="bold red")
        text.append(" ")
    text.append("│ ")
    text.append(f"{app.mode} · k {app.config.k}", style="bold")
    text.append(" │ ")
    text.append_text(inbox_text(app))  # last: a long reason is what the ellipsis cuts
    return text


class StatusBar(Static):
    """Refreshes itself twice a second (and when the app says so); every screen shows one above
    its footer."""

    def on_mount(self) -> None:
        self.refresh_status()
        self.set_interval(0.5, self.refresh_status)

    def refresh_status(self) -> None:
        self.update(status_text(self.app))
