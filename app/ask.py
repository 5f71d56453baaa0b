"""``inferscale-assistant ask``: one question, one answer, and what memory it used."""

from __future__ import annotations

import json
from datetime import date

from rich.console import Console
from rich.table import Table

from inferscale_core.prompt_builder import MemoryFact


def run_ask(
    question: str,
    facts: list[tuple[str, date | None]],
    *,
    model: str | None,
    max_tokens: int,
    prompt_injection: bool,
    verbose: bool,
    console: Console,
    as_json: bool = False,
) -> int:
    from app.runtime import open_runtime

    runtime = open_runtime(model, console, verbose=verbose)
    memory = [MemoryFact(text, when) for text, when in facts]
    with console.status("encoding memories…"):
        composed = runtime.builder.build(memory, question)
    if prompt_injection:
        ids = runtime.builder.prompt_injection_ids(memory, question)
        result = runtime.engine.generate(ids, max_tokens=max_tokens)
    else:
        result = runtime.engine.generate(composed, max_tokens=max_tokens)
    injected_facts = composed.fact_keys if result.injected_tokens and not prompt_injection else []
    if as_json:
        print(
            json.dumps(
                {
                    "answer": result.text.strip(),
                    "ttft_s": result.ttft_s,
                    "injected_fact_ids": injected_facts,
                    "injected_tokens": result.injected_tokens,
                    "prompt_tokens": result.prompt_tokens,
                    "prefix_cached_tokens": result.prefix_cached_tokens,
                    "computed_tokens": result.computed_tokens,
                    "mode": "prompt" if prompt_injection else "inject",
                    "refused": result.refused,
                }
            )
        )
        return 0
    out = Console()
    out.print(result.text.strip())
    table = Table(title="memory", show_header=True, header_style="bold", title_justify="left")
    table.add_column("#", justify="right")
    table.add_column("date")
    table.add_column("fact")
    for i, fact in enumerate(memory, 1):
        table.add_row(str(i), fact.when.isoformat() if fact.when else "", fact.text)
    if memory:
        console.print(table)
    mode = "prompt injection" if prompt_injection else "KV injection"
    ttft = f"{result.ttft_s * 1e3:.0f} ms" if result.ttft_s is not None else "n/a"
    console.print(
        f"[dim]{mode}: TTFT {ttft}; prompt {result.prompt_tokens} tokens, injected"
        f" {result.injected_tokens}, from prefix cache {result.prefix_cached_tokens},"
        f" computed {result.computed_tokens}[/dim]"
    )
    if result.refused and not prompt_injection:
        console.print(f"[yellow]injection refused:[/yellow] {result.refused}")
    return 0
