"""Builds the running parts from a model folder: engine, encoder, store, prompt builder.

The only place in ``app`` that constructs the vLLM engine; everything else gets it passed in.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from assets import read_asset
from inferscale_core import paths
from inferscale_core.composer import ChatLayout
from inferscale_core.encoder import HFReferenceEncoder
from inferscale_core.fingerprint import model_fingerprint
from inferscale_core.kvstore import KVStore
from inferscale_core.models import resolve_model
from inferscale_core.prompt_builder import PromptBuilder
from inferscale_core.vllm_plugin.vllm_engine import EngineOptions, VllmEngine


@dataclass(slots=True)
class Runtime:
    model_dir: Path
    fingerprint: str
    store: KVStore
    builder: PromptBuilder
    engine: VllmEngine


def kv_store_path(fingerprint: str) -> Path:
    return paths.data_dir() / "kv" / fingerprint


def open_runtime(model: str | None, console: Console, verbose: bool = False) -> Runtime:
    if not verbose:
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        logging.getLogger("vllm").setLevel(logging.WARNING)
    with console.status("preparing the model…"):
        model_dir = resolve_model(model)
        fingerprint = model_fingerprint(model_dir)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    layout = ChatLayout(tokenizer, read_asset("prompts", "system.txt"))
    store = KVStore(kv_store_path(fingerprint))
    with console.status("loading the encoder…"):
        encoder = HFReferenceEncoder(model_dir, fingerprint)
    builder = PromptBuilder(layout, encoder, store)
    with console.status("starting the engine (about 30 s on a CPU)…"):
        engine = VllmEngine(EngineOptions(model_dir, store.root, fingerprint))
    return Runtime(model_dir, fingerprint, store, builder, engine)
