"""``inferscale-assistant``: the command line.

Each command lives in its own module with a ``register(subparsers)`` that adds its parser and
sets ``func(args, console) -> exit code``. Heavy imports (torch, vLLM) happen inside the
commands that need them, so ``--help`` is instant.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from rich.console import Console
from rich.markup import escape

from app.commands import (
    ask,
    backup,
    bench,
    chat,
    daemon,
    doctor,
    imports,
    mcp,
    memory,
    models,
    serve,
)

DESCRIPTION = """\
A private, local, long-term assistant. Memories are kept as KV tensors and injected
straight into vLLM's KV cache, so a question costs about as much as the question alone, however
many memories it uses. Nothing leaves this machine: no model hub, no telemetry.
"""

EPILOG = """\
examples:
  inferscale-assistant                      # the chat (same as `inferscale-assistant chat`)
  inferscale-assistant ask "My sister Ines moved to Lisbon in March 2024."   # remembered
  inferscale-assistant ask --json "Where does my sister live?"               # injected
  inferscale-assistant ask --fact "2023-05-08 I adopted a cat named Miso" "What is my cat called?"
  inferscale-assistant import ~/Downloads/conversations.json
  inferscale-assistant bench ttft --k 0,5,20,50 --runs 5 --json ttft.json
  inferscale-assistant memory search "Where does my sister live?" --k 5   # what is retrieved
  inferscale-assistant memory forget 12
  inferscale-assistant doctor
  inferscale-assistant models prepare
  inferscale-assistant models add llama3.2:1b && inferscale-assistant ask --model llama3.2:1b "…"
  inferscale-assistant models list
  inferscale-assistant users add ana && inferscale-assistant serve --port 8000
  inferscale-assistant backup --encrypt ~/memory.isbak   # later: restore ~/memory.isbak
  inferscale-assistant daemon      # resident, no window: ask/memory/import answer through it
  inferscale-assistant mcp         # the memory for MCP clients (stdio)
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="inferscale-assistant",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="show engine logs")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for register in (
        chat.register,
        ask.register,
        imports.register,
        memory.register,
        bench.register,
        doctor.register,
        models.register,
        serve.register,
        backup.register,
        daemon.register,
        mcp.register,
    ):
        register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    console = Console(stderr=True)
    if args.command is None:  # no command: the chat
        args = parser.parse_args([*(["--verbose"] if args.verbose else []), "chat"])
    from inferscale_core.model_files import ModelSetupError, enforce_offline

    enforce_offline()
    try:
        return int(args.func(args, console))
    except ModelSetupError as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}", soft_wrap=True)
        return 2
    except KeyboardInterrupt:
        console.print("[dim]interrupted[/dim]")
        return 130


if __name__ == "__main__":
    sys.exit(main())
