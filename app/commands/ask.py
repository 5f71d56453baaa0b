"""``inferscale-assistant ask``: one question, one answer, and what memory it used."""

from __future__ import annotations

import argparse
import json
from datetime import date

from rich.console import Console
from rich.table import Table

from app.user_config import load_config
from inferscale_core.config import AppConfig
from inferscale_core.prompt_builder import MemoryFact


def run_ask(
    question: str,
    facts: list[tuple[str, date | None]],
    *,
    config: AppConfig,
    max_tokens: int,
    prompt_injection: bool,
    verbose: bool,
    console: Console,
    as_json: bool = False,
) -> int:
    from app.startup import open_assistant

    runtime = open_assistant(config, console, verbose=verbose)
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


def _parse_fact(value: str) -> tuple[str, date | None]:
    """``"YYYY-MM-DD text"`` or plain ``"text"``."""
    head, _, rest = value.partition(" ")
    try:
        return rest.strip(), date.fromisoformat(head)
    except ValueError:
        return value.strip(), None


def register(sub: argparse._SubParsersAction) -> None:
    ask = sub.add_parser(
        "ask",
        help="ask one question and print the answer with the memories injected",
        description="Answer one question on the local model, injecting the given memories as"
        " KV cache, and print the answer, the injected facts, TTFT and token counts.",
    )
    ask.add_argument("question", help="the question to answer")
    ask.add_argument(
        "--fact",
        action="append",
        default=[],
        metavar="[YYYY-MM-DD ]TEXT",
        help="a memory to inject (repeatable; an optional leading ISO date is the date it"
        " refers to)",
    )
    ask.add_argument(
        "--model", help="local Hugging Face model folder (default: the config's, else SmolLM2)"
    )
    ask.add_argument("--max-tokens", type=int, default=128, help="answer length limit (128)")
    ask.add_argument(
        "--prompt-injection",
        action="store_true",
        help="put the memories into the prompt as text instead of injecting their KV (baseline)",
    )
    ask.add_argument(
        "--json",
        action="store_true",
        help='print {"answer", "ttft_s", "injected_fact_ids", "injected_tokens", ...} as JSON',
    )
    ask.set_defaults(func=_run)


def _run(args: argparse.Namespace, console: Console) -> int:
    config = load_config(console)
    if config is None:
        return 2
    if args.model:
        config.model = args.model
    return run_ask(
        args.question,
        [_parse_fact(f) for f in args.fact],
        config=config,
        max_tokens=args.max_tokens,
        prompt_injection=args.prompt_injection,
        verbose=args.verbose,
        console=console,
        as_json=args.json,
    )
