"""Opens the runtime (engine, encoder, store) for the CLI and the UI, with progress shown.

The only place in ``app`` that starts the vLLM engine; everything else gets it passed in.
"""

from __future__ import annotations

import logging
import os

from rich.console import Console

from assets import read_asset
from inferscale_core import paths
from inferscale_core.models import resolve_model
from inferscale_core.vllm_plugin.runtime import Runtime, build_runtime

STEP_HINTS = {"starting the engine": "starting the engine (about 25 s on a CPU)…"}


def open_runtime(model: str | None, console: Console, verbose: bool = False) -> Runtime:
    if not verbose:
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
        logging.getLogger("vllm").setLevel(logging.ERROR)
    with console.status("preparing the model…") as status:
        model_dir = resolve_model(model)
        return build_runtime(
            model_dir,
            paths.data_dir() / "kv",
            read_asset("prompts", "system.txt"),
            on_step=lambda step: status.update(STEP_HINTS.get(step, step + "…")),
        )
