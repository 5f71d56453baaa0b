"""``inferscale-assistant ask``: the assistant from the shell.

By default a question goes through the profile's chat :class:`~inferscale_core.session.Session`,
like a chat message: its memories are retrieved and injected, and the exchange is logged in the
profile's "shell" conversation (one, reused by every ``ask``). Before it exits, ``ask`` waits
(bounded) until the facts it was told are extracted and encoded, so the next ``ask`` injects
them instead of pasting them as text.

``--no-log`` answers through the same session without writing anything (the memory read only,
the worker not started). ``--fact`` answers from its ad-hoc memories alone and logs nothing.
Every turn runs on the profile's :class:`~inferscale_core.desk.Desk`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import date
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from app.user_config import load_config
from inferscale_core.config import AppConfig

if TYPE_CHECKING:
    from inferscale_core import wiring
    from inferscale_core.desk import Desk
    from inferscale_core.desk_socket import RemoteDesk
    from inferscale_core.session import SessionConfig

SHELL = "shell"  # title, source and source id of the conversation `ask` logs into
REMEMBER_TIMEOUT_S = 60.0
EMPTY_QUESTION = "the question is empty: nothing to ask"


@dataclass(slots=True)
class AskOptions:
    max_tokens: int | None = None  # None: the config's, as in the chat
    prompt_injection: bool = False  # memories as prompt text (the baseline), not KV
    memory: bool = True  # retrieve and inject the profile's memories
    log: bool = True  # log the exchange in the shell conversation (and remember it)
    remember_timeout_s: float = REMEMBER_TIMEOUT_S  # 0: don't wait for the memory worker
    as_json: bool = False
    verbose: bool = False  # the engine's logs


def run_ask(
    question: str,
    facts: list[tuple[str, date | None]],
    *,
    config: AppConfig,
    options: AskOptions,
    console: Console,
    assistant: wiring.Assistant | None = None,
    model_given: bool = False,
) -> int:
    """Answer ``question`` and print it; the exit code. Through the running assistant when
    there is one (the app, the daemon) and neither ``assistant`` nor ``model_given`` (--model)
    asks for another engine; else through an engine of its own: ``assistant`` (tests pass
    theirs), or one built from ``config``. Memory lives in ``paths.memory_db()``."""
    from inferscale_core import paths, wiring
    from inferscale_core.composer import TurnRejected
    from inferscale_core.desk import Desk

    if not question.strip():
        return _refuse(console, EMPTY_QUESTION)
    shown = console if options.verbose else Console(quiet=True)  # steps, table, figures
    log = options.log and not facts  # --fact logs nothing
    adhoc = [(text, day.isoformat() if day else None) for text, day in facts] or None
    if assistant is None and not model_given:
        from app.resident import connect

        remote = connect(config)
        if remote is not None:
            with remote:
                shown.print(f"[dim]through the running assistant (pid {remote.hello()['pid']})")
                return _answer(remote, question, adhoc, log, options, console, shown)
        shown.print("[dim]no assistant running for this memory: starting an engine[/dim]")
    try:
        _check_fits(question, config, options, assistant)
    except TurnRejected as exc:  # before the engine starts (~25 s on a CPU)
        return _refuse(console, str(exc))
    if assistant is None:
        from app.startup import open_assistant

        assistant = open_assistant(config, shown, verbose=options.verbose)
    settings = _settings(assistant, config, options)
    db_path = paths.memory_db()
    desk = Desk(
        db_path,
        config.profile,
        lambda on_step: wiring.open_session(
            assistant, config, db_path, session_config=settings, start_worker=log
        ),
    )
    try:
        with shown.status("opening the memory…"):
            desk.start().result()
        return _answer(desk, question, adhoc, log, options, console, shown)
    finally:
        desk.close()


def _answer(
    door: Desk | RemoteDesk,
    question: str,
    adhoc: list[tuple[str, str | None]] | None,
    log: bool,
    options: AskOptions,
    console: Console,
    shown: Console,
) -> int:
    """One turn through ``door``: this process's desk, or the one the running assistant (the
    app, the daemon) serves; this command's options for this reply. The exit code."""
    from inferscale_core.composer import TurnRejected

    per_reply = {
        "k": None if options.memory else 0,
        "mode": "prompt" if options.prompt_injection else None,
        "max_tokens": options.max_tokens,
    }
    try:
        conversation_id = door.conversation(SHELL) if log else None
        items = door.ask_plain(
            question, conversation_id=conversation_id, log=log, facts=adhoc, **per_reply
        )
        data = _stream_text(items, not options.as_json)
        remembered = None
        if log:
            turns = [t for t in (data["user_turn_id"], data["assistant_turn_id"]) if t]
            with shown.status("remembering…"):
                remembered = door.wait_remembered(turns, options.remember_timeout_s)
    except TurnRejected as exc:
        return _refuse(console, str(exc))
    _print(_report(data, remembered), options.as_json, shown)
    return 0


def _check_fits(
    question: str, config: AppConfig, options: AskOptions, assistant: wiring.Assistant | None
) -> None:
    """Raise :class:`~inferscale_core.composer.PromptTooLong` for a question that cannot fit
    the model's context with the system prompt and the reply (the tokenizer only: no engine).
    Without a started ``assistant`` the context is the model's own length, the engine's at
    most: a question just under it is refused by the session, after the engine starts."""
    from inferscale_core.prompt_budget import fit_turn

    if assistant is not None:
        layout, context = assistant.builder.layout, assistant.engine.max_model_len
    else:
        from transformers import AutoConfig

        from inferscale_core.model_files import resolve_model
        from inferscale_core.prompt_builder import model_layout

        model_dir = resolve_model(config.model, progress=options.verbose, weights=config.weights)
        layout = model_layout(model_dir)
        model = AutoConfig.from_pretrained(str(model_dir), local_files_only=True)
        context = getattr(model, "max_position_embeddings", None)
        if context is None:
            return
    reply_tokens = options.max_tokens or config.max_tokens
    fit_turn(layout, question, (), [], context=context, reply_tokens=reply_tokens)


def _refuse(console: Console, message: str) -> int:
    console.print(f"[red]error:[/red] {escape(' '.join(message.split()))}", soft_wrap=True)
    return 2


def _settings(assistant: wiring.Assistant, config: AppConfig, options: AskOptions) -> SessionConfig:
    """The chat's settings (sampling, reply length, history, k) with the options'."""
    from inferscale_core import wiring

    settings = wiring.session_settings(config, assistant.model_dir)
    return replace(
        settings,
        k=settings.k if options.memory else 0,
        max_tokens=options.max_tokens or settings.max_tokens,
        mode="prompt" if options.prompt_injection else "inject",
    )


def _stream_text(items: Iterator[str | dict[str, Any]], show: bool) -> dict[str, Any]:
    """Text deltas (str) to stdout as they come (``show``), without the leading blanks the
    model may start with; returns the last item (a dict: the finished reply's plain form)."""
    started, end = False, None
    for item in items:
        if isinstance(item, dict):
            end = item
            continue
        if show and item:
            text = item if started else item.lstrip()
            started = started or bool(text)
            sys.stdout.write(text)
            sys.stdout.flush()
    if show:
        sys.stdout.write("\n")
    assert end is not None
    return end


def _report(data: dict[str, Any], remembered: bool | None) -> dict[str, Any]:
    """What ``--json`` prints: the reply (``reply_json``'s form), the memories it used and the
    engine's figures."""
    from inferscale_core.types import INJECTED

    return {
        "answer": data["text"],
        "ttft_s": data["ttft_s"],
        "facts": data["facts"],
        "injected_fact_ids": [f["id"] for f in data["facts"] if f["how"] == INJECTED],
        **{key: data[key] for key in TOKEN_COUNTS},
        "mode": data["mode"],
        "refused": data["refused"],
        "notes": data["notes"],
        "conversation_id": data["conversation_id"],
        "remembered": remembered,
    }


TOKEN_COUNTS = ("injected_tokens", "prompt_tokens", "prefix_cached_tokens", "computed_tokens")


# ---- output ----


def _print(report: dict[str, Any], as_json: bool, console: Console) -> None:
    if as_json:
        print(json.dumps(report))
        return
    if report["facts"]:
        table = Table(title="memory", header_style="bold", title_justify="left")
        for column in ("#", "id", "date", "score", "how", "fact"):
            table.add_column(column, justify="right" if column in ("#", "score") else "left")
        for i, fact in enumerate(report["facts"], 1):
            score = "" if fact["score"] is None else f"{fact['score']:.2f}"
            how = fact["how"] + (f" ({fact['tier']})" if fact.get("tier") else "")
            ident = fact["id"] if isinstance(fact["id"], int) else "--fact"
            table.add_row(str(i), str(ident), fact["date"] or "", score, how, escape(fact["text"]))
        console.print(table)
    mode = "prompt injection" if report["mode"] == "prompt" else "KV injection"
    ttft = f"{report['ttft_s'] * 1e3:.0f} ms" if report["ttft_s"] is not None else "n/a"
    console.print(
        f"[dim]{mode}: TTFT {ttft}; prompt {report['prompt_tokens']} tokens, injected"
        f" {report['injected_tokens']}, from prefix cache {report['prefix_cached_tokens']},"
        f" computed {report['computed_tokens']}[/dim]"
    )
    if report["refused"] and report["mode"] != "prompt":
        console.print(f"[yellow]injection refused:[/yellow] {escape(report['refused'])}")
    for note in report["notes"]:
        console.print(f"[dim]{escape(note)}[/dim]")
    if report["remembered"] is False:
        console.print(
            "[dim]not remembered yet: the memory worker finishes it the next time the"
            " assistant runs[/dim]"
        )


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
        help="ask the assistant one question from the shell, with its memory",
        description="Answer one question on the local model, as the chat does: the profile's"
        " memories it retrieves are injected as KV cache, and the exchange is logged in the"
        ' profile\'s "shell" conversation, so what you tell it is remembered. Before exiting,'
        ' `ask` waits ("remembering…", at most --remember-timeout seconds) until the facts it'
        " was told are extracted and encoded, so the next `ask` injects them. Prints only the"
        " answer, as it is generated (or one error line); --verbose adds the engine's logs, the"
        " memories used, TTFT and token counts.",
    )
    ask.add_argument("question", help="the question to answer")
    ask.add_argument(
        "--fact",
        action="append",
        default=[],
        metavar="[YYYY-MM-DD ]TEXT",
        help="answer with this ad-hoc memory instead of the profile's (repeatable; an optional"
        " leading ISO date is the date it refers to); nothing is retrieved or logged",
    )
    ask.add_argument(
        "--no-memory",
        dest="memory",
        action="store_false",
        help="retrieve and inject no memories (the exchange is still logged and remembered)",
    )
    ask.add_argument(
        "--no-log",
        dest="log",
        action="store_false",
        help="don't log the exchange: it is not remembered (the memory is still used, read only)",
    )
    ask.add_argument(
        "--remember-timeout",
        type=float,
        default=REMEMBER_TIMEOUT_S,
        metavar="SECONDS",
        help=f"wait at most this long for the new facts to be encoded ({REMEMBER_TIMEOUT_S:.0f};"
        " 0: don't wait, the worker finishes them the next time the assistant runs)",
    )
    ask.add_argument(
        "--model",
        help="a name from `models list`, a .gguf file (dequantized once) or a local Hugging Face"
        " model folder (default: the config's, else the embedded SmolLM2)",
    )
    ask.add_argument(
        "--max-tokens", type=int, help="answer length limit (default: the config's max_tokens)"
    )
    ask.add_argument(
        "--prompt-injection",
        action="store_true",
        help="put the memories into the prompt as text instead of injecting their KV (baseline)",
    )
    ask.add_argument(
        "--json",
        action="store_true",
        help='print {"answer", "facts": [{"id", "text", "date", "score", "how", "tier"}],'
        ' "injected_fact_ids", "ttft_s", "prompt_tokens", "injected_tokens", ...} as JSON;'
        ' "how" is "injected" (KV), "recomputed" (a best hit prefilled with the question),'
        ' "text" (KV not ready: prefilled) or "text (re-encoding)" (its KV was dropped for'
        " kv_disk_budget: prefilled, and encoded again in the background); a --fact memory's"
        " id is its KV key",
    )
    ask.set_defaults(func=_run)


def _run(args: argparse.Namespace, console: Console) -> int:
    if args.max_tokens is not None and args.max_tokens < 1:
        return _refuse(console, f"--max-tokens must be 1 or more, got {args.max_tokens}")
    config = load_config(console)
    if config is None:
        return 2
    if args.model:
        config.model = args.model
    options = AskOptions(
        max_tokens=args.max_tokens,
        prompt_injection=args.prompt_injection,
        memory=args.memory,
        log=args.log,
        remember_timeout_s=args.remember_timeout,
        as_json=args.json,
        verbose=args.verbose,
    )
    facts = [_parse_fact(f) for f in args.fact]
    from app.startup import quiet_stderr

    with contextlib.ExitStack() as stack:
        if not args.verbose:  # the answer, or one error line: no engine noise
            console = Console(file=stack.enter_context(quiet_stderr()), stderr=True)
        return run_ask(
            args.question,
            facts,
            config=config,
            options=options,
            console=console,
            model_given=bool(args.model),
        )
