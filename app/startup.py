"""Starting the assistant from the command line and the UI: quiet engine logs, shown progress.

The objects come from :func:`inferscale_core.wiring.build`, the one place that builds them;
this only reports its steps (a spinner in the shell, a progress bar in the chat).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

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
