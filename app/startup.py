"""Starting the assistant from the command line and the UI: quiet engine logs, shown progress.

The objects come from :func:`inferscale_core.wiring.build`, the one place that builds them;
this only reports its steps (a spinner in the shell, a progress bar in the chat).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TextIO

from rich.console import Console

from inferscale_core import wiring
from inferscale_core.config import AppConfig

STEP_HINTS = {"starting the engine": "starting the engine (about 25 s on a CPU)…"}
STEPS = wiring.STEPS
OPEN_MEMORY_STEP = "opening the memory"  # the chat's last start-up step, after STEPS


def quiet_engine_logs() -> None:
    """vLLM's logs at ERROR, unless VLLM_LOGGING_LEVEL says otherwise (e.g. INFO, for its
    running / waiting counts in a server's log)."""
    level = os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    logging.getLogger("vllm").setLevel(level.upper())


@contextlib.contextmanager
def quiet_stderr(log: Path | None = None) -> Iterator[TextIO]:
    """Drop what third parties write to stderr: vLLM's and torch's warnings, logs (below
    ERROR) and progress bars, from Python, C and the engine's child processes (fd 2) alike;
    with ``log`` (a long-running command: the daemon), append all of it there instead (0600).
    Yields the real stderr, for the command's own lines (its one error line); restored on
    the way out, so an unexpected traceback is still seen."""
    sys.stderr.flush()
    try:  # sys.stderr may be another stream (a test's capture): then it is the real one
        ours = sys.stderr.fileno() != 2
    except (AttributeError, OSError, ValueError):
        ours = True
    saved = os.dup(2)
    real = sys.stderr if ours else os.fdopen(os.dup(saved), "w", buffering=1, errors="replace")
    if log is None:
        sink = os.open(os.devnull, os.O_WRONLY)
    else:
        log.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        sink = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        with (
            os.fdopen(os.dup(sink), "w", buffering=1, errors="replace") as dropped,
            contextlib.redirect_stderr(dropped),
            warnings.catch_warnings(),
        ):
            if log is None:
                warnings.simplefilter("ignore")
                logging.disable(logging.WARNING)
            os.dup2(sink, 2)
            try:
                yield real
            finally:
                os.dup2(saved, 2)
                logging.disable(logging.NOTSET)
    finally:
        os.close(sink)
        os.close(saved)
        if real is not sys.stderr:
            real.close()


def build_assistant(
    config: AppConfig,
    on_step: Callable[[str], None] = lambda step: None,
    *,
    verbose: bool = False,
    model_progress: bool = False,
) -> wiring.Assistant:
    """:func:`wiring.build` with the engine's logs quiet unless ``verbose``."""
    if not verbose:
        quiet_engine_logs()
    return wiring.build(config, on_step=on_step, model_progress=model_progress)


def open_assistant(config: AppConfig, console: Console, verbose: bool = False) -> wiring.Assistant:
    """:func:`build_assistant` with a spinner on ``console`` naming each step."""
    with console.status("preparing the model…") as status:
        return build_assistant(
            config,
            lambda step: status.update(STEP_HINTS.get(step, step + "…")),
            verbose=verbose,
            model_progress=True,
        )
