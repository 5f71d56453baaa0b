"""``inferscale-assistant`` (no command) and ``inferscale-assistant chat``: the Textual UI.

Builds what :class:`app.tui.app.AssistantApp` needs from the config file: a session opener that
starts the engine (on the app's session thread, while the chat screen is already up), the fact
log and inbox paths. While the UI runs, whatever the engine writes to the process's stdout and
stderr from C or Python goes to ``cache_dir()/chat.log`` instead of the screen. The app watches
the config's inbox (``data_dir()/inbox`` unless set) while it runs.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

from rich.console import Console

from app.user_config import load_config
from inferscale_core import paths
from inferscale_core.config import AppConfig
from inferscale_core.model_files import SMOLLM2_NAME, is_embedded

LOG_NAME = "chat.log"


def model_label(model: str | None) -> str:
    return SMOLLM2_NAME if is_embedded(model) else Path(model).expanduser().name


def make_opener(config: AppConfig, db_path: Path, verbose: bool = False):
    """The session opener the app runs on its session thread (it starts the engine)."""

    def open_session(on_step: Callable[[str], None]):
        from app.startup import OPEN_MEMORY_STEP, build_assistant
        from inferscale_core import wiring

        assistant = build_assistant(config, on_step, verbose=verbose)
        on_step(OPEN_MEMORY_STEP)
        return wiring.open_session(assistant, config, db_path)

    return open_session


@contextlib.contextmanager
def output_to_log(log_path: Path) -> Iterator[None]:
    """Send fds 1 and 2 to ``log_path``; Textual draws on copies of the terminal's fds.

    vLLM, torch and oneDNN write to the process's stdout/stderr from C, which would garble a
    full-screen UI. Textual writes to ``sys.__stderr__`` and sizes itself from
    ``sys.__stdout__``, so those two become the copies.
    """
    if not (sys.__stdout__ and sys.__stderr__ and os.isatty(1) and os.isatty(2)):
        yield
        return
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    term_out = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8", errors="replace")
    term_err = os.fdopen(os.dup(2), "w", buffering=1, encoding="utf-8", errors="replace")
    old = sys.__stdout__, sys.__stderr__, sys.stdout, sys.stderr
    log_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(log_fd)
    sys.__stdout__, sys.__stderr__ = term_out, term_err
    sys.stdout, sys.stderr = term_out, term_err
    try:
        yield
    finally:
        sys.__stdout__, sys.__stderr__, sys.stdout, sys.stderr = old
        for fd, target in zip(saved, (1, 2), strict=True):
            os.dup2(fd, target)
            os.close(fd)
        term_out.close()
        term_err.close()


def run_chat(config: AppConfig, *, verbose: bool = False) -> int:
    from app.tui.app import AssistantApp

    db_path = paths.memory_db()
    app = AssistantApp(
        config,
        make_opener(config, db_path, verbose),
        db_path=db_path,
        config_path=paths.config_file(),
        inbox=paths.inbox_dir(config.inbox),
        model_label=model_label(config.model),
    )
    try:
        with output_to_log(paths.cache_dir() / LOG_NAME):
            app.run()
    finally:
        app.stop_serving()
        app.host.close()
    return app.return_code or 0


def register(sub: argparse._SubParsersAction) -> None:
    chat = sub.add_parser(
        "chat",
        help="open the chat (the default when no command is given)",
        description="The full-screen chat: conversations, the memory each reply used, the "
        "memory browser, import and settings. The screen is usable at once; the engine loads "
        "behind it (about 25 s on a CPU) and a message typed meanwhile is sent when it is ready."
        " Engine output goes to the log file in the cache folder.",
    )
    chat.add_argument(
        "--model",
        help="a name from `models list`, a .gguf file or a local Hugging Face model folder"
        " (overrides the config; default: the embedded SmolLM2)",
    )
    chat.set_defaults(func=_run)


def _run(args: argparse.Namespace, console: Console) -> int:
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        console.print(
            "the chat needs a terminal; `inferscale-assistant --help` lists the commands that"
            " work without one (ask, import, memory, doctor, …)"
        )
        return 2
    config = load_config(console)
    if config is None:
        return 2
    model = getattr(args, "model", None)
    if model:
        config.model = model
    if not is_embedded(config.model):
        # Before the screen opens: a bad or unsupported model is told here in one line, and a
        # GGUF is dequantized with its progress on the terminal.
        from inferscale_core.model_files import resolve_model

        resolve_model(config.model, progress=True, weights=config.weights)
    return run_chat(config, verbose=args.verbose)
