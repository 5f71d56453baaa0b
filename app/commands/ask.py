"""``inferscale-assistant ask``: the assistant from the shell.

By default a question goes through the profile's chat :class:`~inferscale_core.session.Session`,
like a chat message: its memories are retrieved and injected, and the exchange is logged in the
profile's "shell" conversation (one, reused by every ``ask``). Before it exits, ``ask`` waits
(bounded) until the facts it was told are extracted and encoded, so the next ``ask`` injects
them instead of pasting them as text.

``--no-log`` answers through the same session without writing anything (the memory read only,
the worker not started). ``--fact`` answers from its ad-hoc memories alone, composed here with
the prompt builder, and logs nothing.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, field, replace
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from app.user_config import load_config
from inferscale_core.config import AppConfig

if TYPE_CHECKING:
    from inferscale_core import wiring
    from inferscale_core.factlog import FactLog
    from inferscale_core.session import Reply, Session, SessionConfig
    from inferscale_core.types import GenerationResult

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


@dataclass(slots=True)
class Answer:
    """What ``ask`` prints: the reply, the memories it used (JSON rows) and the engine's
    figures."""

    text: str
    mode: str  # "inject" or "prompt"
    facts: list[dict[str, Any]] = field(default_factory=list)
    ttft_s: float | None = None
    prompt_tokens: int = 0
    injected_tokens: int = 0
    prefix_cached_tokens: int = 0
    computed_tokens: int = 0
    refused: str | None = None
    notes: list[str] = field(default_factory=list)  # e.g. what was trimmed to fit
    conversation_id: int | None = None  # the shell conversation, when logged
    remembered: bool | None = None  # its facts encoded before exit (None: not logged)

    def as_dict(self) -> dict[str, Any]:
        from inferscale_core.session import INJECTED  # "how" is the session's InjectedFact.how

        return {
            "answer": self.text,
            "ttft_s": self.ttft_s,
            "facts": self.facts,
            "injected_fact_ids": [f["id"] for f in self.facts if f["how"] == INJECTED],
            "injected_tokens": self.injected_tokens,
            "prompt_tokens": self.prompt_tokens,
            "prefix_cached_tokens": self.prefix_cached_tokens,
            "computed_tokens": self.computed_tokens,
            "mode": self.mode,
            "refused": self.refused,
            "notes": self.notes,
            "conversation_id": self.conversation_id,
            "remembered": self.remembered,
        }


def run_ask(
    question: str,
    facts: list[tuple[str, date | None]],
    *,
    config: AppConfig,
    options: AskOptions,
    console: Console,
    assistant: wiring.Assistant | None = None,
) -> int:
    """Answer ``question`` and print it; the exit code. ``assistant``: an already started one
    (tests pass theirs), else it is built from ``config``. Memory lives in
    ``paths.memory_db()``."""
    from inferscale_core import paths
    from inferscale_core.composer import TurnRejected

    if not question.strip():
        return _refuse(console, EMPTY_QUESTION)
    if assistant is None:
        from app.startup import open_assistant

        assistant = open_assistant(config, console, verbose=options.verbose)
    db_path = paths.memory_db()
    try:
        if facts:
            answer = _ask_with_facts(assistant, config, question, facts, options, console)
        else:
            answer = _ask_session(assistant, config, db_path, question, options, console)
    except TurnRejected as exc:
        return _refuse(console, str(exc))
    _print(answer, options.as_json, console)
    return 0


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


# ---- the default: the profile's session, logged in the shell conversation ----


def shell_conversation(log: FactLog, profile_id: int) -> int:
    """The profile's "shell" conversation, created on first use (found by source, so a title
    the user gave it in the chat is kept)."""
    from inferscale_core.types import Conversation

    found = log.conversation_by_source(profile_id, SHELL, SHELL)
    if found is not None:
        return found
    conversation = Conversation(title=SHELL, source=SHELL, source_id=SHELL)
    return log.add_conversation(profile_id, conversation)[0]


def _ask_session(
    assistant: wiring.Assistant,
    config: AppConfig,
    db_path: Path,
    question: str,
    options: AskOptions,
    console: Console,
) -> Answer:
    from inferscale_core import wiring

    session_config = _settings(assistant, config, options)
    with console.status("opening the memory…"):
        session = wiring.open_session(
            assistant, config, db_path, session_config=session_config, start_worker=options.log
        )
    try:
        conversation_id = (
            shell_conversation(session.factlog, session.profile_id) if options.log else None
        )
        with console.status("answering…"):
            reply = session.ask_all(conversation_id, question, log=options.log)
        remembered = (
            _remember(session, reply, options.remember_timeout_s, console) if options.log else None
        )
    finally:
        session.close()
    answer = _answer(reply.text, reply.mode, reply.result)
    answer.facts = [
        {
            "id": f.fact_id,
            "text": f.text,
            "date": f.refers_to,
            "score": round(f.score, 4),
            "how": f.how,
            "tier": f.tier,
        }
        for f in reply.facts
    ]
    answer.notes = reply.notes
    answer.conversation_id, answer.remembered = conversation_id, remembered
    return answer


def _remember(session: Session, reply: Reply, timeout_s: float, console: Console) -> bool:
    """Wait until the memory worker has extracted this exchange and encoded the facts it told
    (then the next ``ask`` injects them); False if ``timeout_s`` passed first (the worker
    finishes it the next time the assistant runs: the fact log is its queue)."""
    turns = {t for t in (reply.user_turn_id, reply.assistant_turn_id) if t is not None}
    if session.worker is None or not turns or timeout_s <= 0:
        return False
    log, profile_id, last = session.factlog, session.profile_id, max(turns)
    fingerprint, w = session.builder.fingerprint, session.config.w
    deadline = time.monotonic() + timeout_s
    with console.status("remembering…"):
        while True:
            if log.extraction_cursor(profile_id) >= last and not any(
                turns.intersection(fact.source_turn_ids)
                for fact in log.facts_without_kv(profile_id, fingerprint, w, session.encoding)
            ):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)


# ---- --fact: these memories only, composed here, nothing logged ----


def _ask_with_facts(
    assistant: wiring.Assistant,
    config: AppConfig,
    question: str,
    facts: list[tuple[str, date | None]],
    options: AskOptions,
    console: Console,
) -> Answer:
    """Answer from ``facts`` alone (encoded here into the store, as ad-hoc memories); a
    question or memories that do not fit the context are refused, as the session does."""
    from inferscale_core.composer import TurnRejected, fact_line
    from inferscale_core.prompt_budget import fit_turn
    from inferscale_core.prompt_builder import MemoryFact
    from inferscale_core.session import INJECTED, TEXT

    builder, engine = assistant.builder, assistant.engine
    settings = _settings(assistant, config, options)
    memory = [MemoryFact(text, when) for text, when in facts]
    lengths = [len(builder.layout.fact_ids(fact_line(f.text, f.when))) for f in memory]
    fit = fit_turn(
        builder.layout,
        question,
        (),
        lengths,
        context=engine.max_model_len,
        reply_tokens=settings.max_tokens,
    )
    if fit.dropped_memories:
        raise TurnRejected(
            f"the --fact memories ({sum(lengths):,} tokens) do not fit the model's context"
            f" with the question and {settings.max_tokens} tokens for the reply"
        )
    with console.status("encoding memories…"):
        entries = builder.encode_many(memory)
    if options.prompt_injection:
        prompt: Any = builder.prompt_injection_ids(memory, question)
    else:
        prompt = builder.compose(entries, question)
    result = engine.generate(
        prompt, max_tokens=settings.max_tokens, **settings.sampling.engine_kwargs()
    )
    injected = not options.prompt_injection and not result.refused and result.injected_tokens > 0
    answer = _answer(result.text, "prompt" if options.prompt_injection else "inject", result)
    answer.facts = [
        {
            "id": key,
            "text": fact.text,
            "date": fact.when.isoformat() if fact.when else None,
            "score": None,
            "how": INJECTED if injected else TEXT,  # the session's names for it
            "tier": result.entry_tiers.get(key) if injected else None,
        }
        for fact, (key, _) in zip(memory, entries, strict=True)
    ]
    return answer


def _answer(text: str, mode: str, result: GenerationResult | None) -> Answer:
    answer = Answer(text.strip(), mode)
    if result is not None:
        answer.ttft_s = result.ttft_s
        answer.prompt_tokens = result.prompt_tokens
        answer.injected_tokens = result.injected_tokens
        answer.prefix_cached_tokens = result.prefix_cached_tokens
        answer.computed_tokens = result.computed_tokens
        answer.refused = result.refused
    return answer


# ---- output ----


def _print(answer: Answer, as_json: bool, console: Console) -> None:
    if as_json:
        print(json.dumps(answer.as_dict()))
        return
    print(answer.text)  # as is: no wrapping, for pipes
    if answer.facts:
        table = Table(title="memory", header_style="bold", title_justify="left")
        for column in ("#", "id", "date", "score", "how", "fact"):
            table.add_column(column, justify="right" if column in ("#", "score") else "left")
        for i, fact in enumerate(answer.facts, 1):
            score = "" if fact["score"] is None else f"{fact['score']:.2f}"
            how = fact["how"] + (f" ({fact['tier']})" if fact.get("tier") else "")
            ident = fact["id"] if isinstance(fact["id"], int) else "--fact"
            table.add_row(str(i), str(ident), fact["date"] or "", score, how, escape(fact["text"]))
        console.print(table)
    mode = "prompt injection" if answer.mode == "prompt" else "KV injection"
    ttft = f"{answer.ttft_s * 1e3:.0f} ms" if answer.ttft_s is not None else "n/a"
    console.print(
        f"[dim]{mode}: TTFT {ttft}; prompt {answer.prompt_tokens} tokens, injected"
        f" {answer.injected_tokens}, from prefix cache {answer.prefix_cached_tokens},"
        f" computed {answer.computed_tokens}[/dim]"
    )
    if answer.refused and answer.mode != "prompt":
        console.print(f"[yellow]injection refused:[/yellow] {escape(answer.refused)}")
    for note in answer.notes:
        console.print(f"[dim]{escape(note)}[/dim]")
    if answer.remembered is False:
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
        " was told are extracted and encoded, so the next `ask` injects them. Prints the answer,"
        " the memories used, TTFT and token counts.",
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
    return run_ask(args.question, facts, config=config, options=options, console=console)
