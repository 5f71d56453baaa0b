"""``inferscale-assistant daemon``: the resident assistant with no window.

Opens the memory and the engine, serves them on the desk's private socket (``ask``, ``memory``,
``import`` and ``mcp`` then answer at once, with no engine of their own), watches the inbox and
encodes the backlog, until SIGTERM or Ctrl+C. ``packaging/inferscale-assistant.service`` runs it as
a systemd user unit.
"""

from __future__ import annotations

import argparse
import signal
import threading

from rich.console import Console
from rich.markup import escape

from app.user_config import load_config

LOG_NAME = "daemon.log"  # in the cache folder: the engine's output, unless --verbose


def run_daemon(config, console: Console, verbose: bool = False) -> int:
    from app.resident import Resident, connect
    from app.startup import quiet_engine_logs
    from inferscale_core.desk_socket import DeskBusyError
    from inferscale_core.importers.pipeline import FileResult

    remote = connect(config)
    if remote is not None:
        with remote:
            pid = remote.hello()["pid"]
        console.print(f"the assistant already runs for this memory (pid {pid})")
        return 1
    if not verbose:
        quiet_engine_logs()

    def told(result: FileResult) -> None:
        why = f": {result.reason}" if result.reason else ""
        console.print(f"inbox: {result.path.name} {result.status}{escape(why)}")

    try:
        resident = Resident(config, verbose=verbose, watch_inbox=True, on_result=told)
    except DeskBusyError as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}")
        return 1
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, lambda *_: stop.set())
    try:
        resident.start()
        console.print(
            f"serving the memory at {resident.server.path}; watching {resident.inbox}",
            soft_wrap=True,
        )
        try:
            resident.desk.start().result()
        except Exception as exc:  # noqa: BLE001 - said in one line; the socket tells callers
            console.print(f"[red]error:[/red] the engine did not start: {escape(str(exc))}")
            return 1
        console.print("ready")
        stop.wait()
    finally:
        console.print("stopping (the memory worker finishes its batch)")
        resident.close()
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    daemon = sub.add_parser(
        "daemon",
        help="run the assistant with no window (ask, memory, import and mcp use it)",
        description="The resident assistant without the chat window: it starts the engine once,"
        " serves the memory on a private socket in the user's runtime folder (0600; other users"
        " are refused), watches the inbox and encodes new memories, until SIGTERM or Ctrl+C."
        " `ask`, `memory`, `import` and `mcp` then answer through it in about a second instead"
        " of starting an engine each. packaging/inferscale-assistant.service runs it as a"
        " systemd user unit.",
    )
    daemon.set_defaults(func=_run)


def _run(args: argparse.Namespace, console: Console) -> int:
    config = load_config(console)
    if config is None:
        return 2
    if args.verbose:
        return run_daemon(config, console, verbose=True)
    from app.startup import quiet_stderr
    from inferscale_core import paths

    log = paths.cache_dir() / LOG_NAME
    with quiet_stderr(log) as stderr:  # its own lines here; the engine's in the log file
        console = Console(file=stderr, stderr=True)
        console.print(f"engine output goes to {log} (--verbose: here)", soft_wrap=True)
        return run_daemon(config, console)
