"""What every model-file module needs and none should import the others for: the offline
switches, the GGUF magic, the setup errors, and the tokenizer-config clean-up.

:mod:`inferscale_core.model_files` (finding, building and caching model folders),
:mod:`inferscale_core.weights_plan` (how the weights reach the engine) and
:mod:`inferscale_core.gguf_int4` (a GGUF's 4-bit codes as a folder) all use these; keeping them
here lets the planner and the converter stand below ``model_files`` instead of in a circle
with it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

GGUF_MAGIC = b"GGUF"
OFFLINE_ENV = (
    "HF_HUB_OFFLINE",
    "TRANSFORMERS_OFFLINE",
    "HF_DATASETS_OFFLINE",
    "VLLM_NO_USAGE_STATS",
    "VLLM_DO_NOT_TRACK",
    "DO_NOT_TRACK",
)


class ModelSetupError(RuntimeError):
    """A model is missing or unusable; the message says what to do about it."""


class UnsupportedArchitectureError(ModelSetupError):
    """A model whose architecture cannot be served with memory injection (one line: which
    model, and :class:`~inferscale_core.model_spec.UnsupportedModelError`'s reason)."""


def enforce_offline() -> None:
    """Force every hub and telemetry switch we know of to "1".

    Overwrites existing values on purpose: a user's ``HF_HUB_OFFLINE=0`` must not make a
    private assistant talk to a hub or send usage statistics.
    """
    for name in OFFLINE_ENV:
        os.environ[name] = "1"


def is_gguf(path: Path) -> bool:
    """Whether ``path`` is a file that starts with the GGUF magic bytes."""
    try:
        with open(path, "rb") as fh:
            return fh.read(len(GGUF_MAGIC)) == GGUF_MAGIC
    except OSError:
        return False


def drop_load_kwargs(tokenizer_config: Path) -> None:
    """Remove the loading options transformers echoes into the saved tokenizer config."""
    data = json.loads(tokenizer_config.read_text(encoding="utf-8"))
    for key in ("local_files_only", "is_local", "gguf_file"):
        data.pop(key, None)
    tokenizer_config.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", "utf-8")
