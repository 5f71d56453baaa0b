"""Opens the runtime (engine, encoder, store) for the CLI and the UI, with progress shown.

The only place in ``app`` that starts the vLLM engine; everything else gets it passed in.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

from rich.console import Console

from assets import read_asset
from inferscale_core import paths
from inferscale_core.models import resolve_model
from inferscale_core.vllm_plugin.runtime import Runtime, build_runtime

STEP_HINTS = {"starting the engine": "starting the engine (about 25 s on a CPU)…"}
#: The steps :func:`load_runtime` reports, in order (the TUI's start-up progress bar).
STEPS = (
    "preparing the model",
    "loading the encoder",
    "starting the engine",
    "warming up the engine",
)
OPEN_MEMORY_STEP = "opening the memory"  # the chat's last start-up step, after STEPS


def quiet_engine_logs() -> None:
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    logging.getLogger("vllm").setLevel(logging.ERROR)


def load_runtime(
    model: str | None,
    on_step: Callable[[str], None] = lambda step: None,
    *,
    gpu_pool_gib: float = 0,
    verbose: bool = False,
    model_progress: bool = False,
) -> Runtime:
    """Resolve the model and build the runtime, telling ``on_step`` each step (see STEPS).

    ``model_progress`` shows the one-time unpacking of the embedded model on stderr (CLI only).
    """
    if not verbose:
        quiet_engine_logs()
    on_step(STEPS[0])
    model_dir = resolve_model(model, progress=model_progress)
    runtime = build_runtime(
        model_dir, paths.kv_dir(), read_asset("prompts", "system.txt"), on_step=on_step
    )
    if gpu_pool_gib > 0:  # the store is shared: this adds the device tier to it
        from inferscale_core.kvstore import open_shared

        open_shared(runtime.store.root, gpu_bytes=int(gpu_pool_gib * (1 << 30)))
    return runtime


def open_runtime(
    model: str | None, console: Console, verbose: bool = False, gpu_pool_gib: float = 0
) -> Runtime:
    with console.status("preparing the model…") as status:
        return load_runtime(
            model,
            lambda step: status.update(STEP_HINTS.get(step, step + "…")),
            gpu_pool_gib=gpu_pool_gib,
            verbose=verbose,
            model_progress=True,
        )
