"""Wires a model folder into the running parts: layout, encoder, KV store, builder, engine."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inferscale_core.kvstore import KVStore
from inferscale_core.prompt_builder import PromptBuilder
from inferscale_core.vllm_plugin.vllm_engine import EngineOptions, VllmEngine


@dataclass(slots=True)
class Runtime:
    model_dir: Path
    fingerprint: str
    store: KVStore
    builder: PromptBuilder
    engine: VllmEngine


def build_runtime(
    model_dir: Path,
    store_root: Path,
    system_prompt: str,
    on_step: Callable[[str], None] = lambda step: None,
    **engine_options: Any,
) -> Runtime:
    """Everything needed to answer with injected memories (store in ``store_root/<fp>``)."""
    on_step("loading the encoder")
    builder = PromptBuilder.for_model(model_dir, store_root, system_prompt)
    store, fingerprint = builder.store, builder.fingerprint
    on_step("starting the engine")
    engine = VllmEngine(EngineOptions(model_dir, store.root, fingerprint, **engine_options))
    on_step("warming up the engine")
    engine.warm_up()
    return Runtime(model_dir, fingerprint, store, builder, engine)
