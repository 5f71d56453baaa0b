"""The status line above the footer: engine state, background encoding, mode and k."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static


def status_text(app) -> Text:
    """One line from the app's state (see :class:`app.tui.app.AssistantApp`)."""
    text = Text(no_wrap=True, overflow="ellipsis")
    if app.load_error is not None:
        text.append(f" engine failed: {app.load_error} ", style="bold red")
    elif not app.host.ready:
        text.append(f" engine: {app.load_step}… ", style="bold yellow")
    else:
        text.append(f" {app.model_label} ready ", style="bold green")
    text.append("│ ")
    session = app.host.session
    stats = getattr(getattr(session, "worker", None), "stats", None)
    if stats is None:
        text.append("memory: waiting for the engine ", style="dim")
    else:
        text.append("memory: ")
        text.append(f"{stats.pending_turns} turns, {stats.pending_facts} facts queued")
        text.append(f" · {stats.encoded_facts:,} encoded · {stats.encode_rate:.1f} facts/s")
        if stats.paused:
            text.append(" · paused while answering", style="dim")
        if stats.errors:
            text.append(f" · {stats.errors} errors", style="bold red")
        text.append(" ")
    text.append("│ ")
    text.append(f"{app.mode} · k {app.config.k}", style="bold")
    return text


class StatusBar(Static):
    """Refreshes itself twice a second; every screen shows one above its footer."""

    def on_mount(self) -> None:
        self.refresh_status()
        self.set_interval(0.5, self.refresh_status)

    def refresh_status(self) -> None:
        self.update(status_text(self.app))
