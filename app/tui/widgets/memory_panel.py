"""The memory panel: what memory a reply used, and the last reply of each mode side by side."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.containers import VerticalScroll
from textual.widgets import Static

from inferscale_core.session import INJECTED, RECOMPUTED, REENCODING, Reply

MODE_NAMES = {"inject": "KV injection", "prompt": "prompt injection"}

EMPTY = (
    "No reply selected.\n\nFor each reply this shows the facts it used (text, date, score, the "
    "store tier their KV came from), k, the injected tokens and the time to first token.\n\n"
    "Ctrl+T switches the next reply between KV injection and prompt injection; the table at "
    "the bottom then compares the last reply of each."
)


def _ms(seconds: float | None) -> str:
    return "–" if seconds is None else f"{seconds * 1e3:,.0f} ms"


def numbers(reply: Reply, k: int | None) -> Text:
    """The reply's figures: k, facts, injected tokens, TTFT, prompt/computed tokens."""
    result = reply.result
    injected = sum(1 for f in reply.facts if f.how == INJECTED)
    recomputed = sum(1 for f in reply.facts if f.how == RECOMPUTED)
    as_text = len(reply.facts) - injected - recomputed
    text = Text()
    text.append(f"{MODE_NAMES.get(reply.mode, reply.mode)}\n", style="bold")
    text.append(f"k {k if k is not None else '?'} · {len(reply.facts)} facts retrieved")
    if reply.mode == "inject":
        text.append(f" ({injected} injected, {recomputed} recomputed, {as_text} as text)")
    text.append("\n")
    if result is None:
        return text
    text.append(f"injected tokens  {result.injected_tokens:,}\n")
    text.append(f"TTFT             {_ms(result.ttft_s)}\n")
    text.append(f"prompt tokens    {result.prompt_tokens:,}\n")
    text.append(f"computed         {result.computed_tokens:,}\n")
    text.append(f"prefix cache     {result.prefix_cached_tokens:,}\n")
    if result.refused:
        text.append(f"not injected: {result.refused}\n", style="bold red")
    for note in reply.notes:
        text.append(f"{note}\n", style="yellow")
    return text


def facts(reply: Reply) -> Text | Table:
    """One entry per fact: rank, date, score, where its KV came from, id; then the text."""
    if not reply.facts:
        return Text("No memory was used for this reply.", style="dim")
    grid = Table.grid(padding=(0, 1))
    grid.add_column(justify="right", style="bold")
    grid.add_column()
    for i, fact in enumerate(reply.facts, 1):
        source = {
            INJECTED: fact.tier or "?",
            RECOMPUTED: "recomputed",
            REENCODING: "as text (re-encoding)",
        }.get(fact.how, "as text")
        head = Text()
        head.append(f"{fact.refers_to or 'no date'} ", style="cyan")
        head.append(f"{fact.score:.2f} ", style="green")
        head.append(f"{source} ", style="magenta")
        head.append(f"#{fact.fact_id}", style="dim")
        grid.add_row(str(i), Text.assemble(head, "\n", fact.text))
    return grid


def comparison(last: dict[str, tuple[Reply, int | None]]) -> Table:
    table = Table(title="last reply per mode", title_justify="left", expand=True, box=None)
    table.add_column("")
    table.add_column("inject", justify="right")
    table.add_column("prompt", justify="right")

    def cell(mode: str, get) -> str:
        if mode not in last or last[mode][0].result is None:
            return "–"
        return get(last[mode][0])

    rows = {
        "TTFT": lambda r: _ms(r.result.ttft_s),
        "prompt tok": lambda r: f"{r.result.prompt_tokens:,}",
        "computed": lambda r: f"{r.result.computed_tokens:,}",
        "injected": lambda r: f"{r.result.injected_tokens:,}",
        "facts": lambda r: str(len(r.facts)),
    }
    for name, get in rows.items():
        table.add_row(name, cell("inject", get), cell("prompt", get))
    return table


class MemoryPanel(VerticalScroll):
    """Shows :meth:`show`'s reply; :meth:`record` keeps the last reply of each mode."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.border_title = "Memory"
        self.last: dict[str, tuple[Reply, int | None]] = {}
        self.shown: Reply | None = None

    def compose(self):
        yield Static(EMPTY, id="memory-numbers")
        yield Static("", id="memory-facts")
        yield Static("", id="memory-compare")

    def record(self, reply: Reply, k: int | None) -> None:
        self.last[reply.mode] = (reply, k)
        compare = self.query_one("#memory-compare", Static)
        compare.update(comparison(self.last))
        compare.display = True

    def show(self, reply: Reply | None, k: int | None = None) -> None:
        self.shown = reply
        if reply is None:
            self.query_one("#memory-numbers", Static).update(EMPTY)
            self.query_one("#memory-facts", Static).update("")
            return
        self.query_one("#memory-numbers", Static).update(numbers(reply, k))
        self.query_one("#memory-facts", Static).update(facts(reply))
